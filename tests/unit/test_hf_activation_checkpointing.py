"""``memory.activation_checkpointing`` on the hf backend: the same numbers, fewer kept activations.

A checkpointed training forward keeps each decoder layer's input and runs the layer again in
the backward. What must hold: the loss and every adapter gradient are bit-identical to the
plain forward's (so no stored result moves), the layers really are recomputed (so the
activations were not kept), decode does not recompute anything, and the recipe key reaches
the backend a run builds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from miniverl.config.models import RunConfig  # noqa: E402
from miniverl.config.sections import LoraConfig  # noqa: E402
from miniverl.errors import BackendError  # noqa: E402
from miniverl.lab.teachers.fitting import cross_entropy_fit_step  # noqa: E402
from miniverl.losses.chunked import chunked_selected_position_loss  # noqa: E402
from miniverl.models.batching import build_padded_trajectory_batch  # noqa: E402
from miniverl.models.hf import HFBackend  # noqa: E402
from miniverl.models.hf_shared import build_shared_backbone  # noqa: E402
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LORA = {"enabled": True, "r": 4, "alpha": 8}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_checkpoint(tmp_path_factory.mktemp("tiny-llama"), arch="llama", seed=3)


def _backend(path: Path, checkpointing: bool) -> HFBackend:
    backend = HFBackend(path, lora=LORA, seed=5, activation_checkpointing=checkpointing)
    with torch.no_grad():  # non-zero B matrices, so every adapter tensor gets a gradient
        generator = torch.Generator().manual_seed(11)
        for name, param in backend.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return backend


def _layer_calls(backend: HFBackend) -> list[int]:
    """A counter of calls into the decoder layers' MLPs (every layer, every call).

    The MLP runs inside the checkpointed region, so a recompute enters it again; the layer's
    own hooks stay outside that region, and a post-hook would miss the recompute, which stops
    as soon as the last tensor the backward needs is rebuilt (inside the MLP)."""
    calls = [0]
    for layer in backend._base.get_decoder().layers:
        layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _loss_and_gradients(backend: HFBackend) -> tuple[float, dict[str, torch.Tensor]]:
    ids = [backend.tokenizer.encode(t) for t in ("Compute 12 * (7 - 3) now.", "What is 5+8?")]
    batch = build_padded_trajectory_batch(
        ids, [list(range(len(row) - 1)) for row in ids], backend.tokenizer.pad_token_id, "cpu"
    )
    targets = torch.tensor([row[j + 1] for row in ids for j in range(len(row) - 1)])
    backend.set_train(True)
    hidden = backend.hidden_states_at_batch(batch, with_grad=True)
    result = chunked_selected_position_loss(
        hidden_states=hidden,
        lm_head=backend.project,
        weights=torch.ones(len(targets)),
        weight_normalizer=2.0,
        provider=None,
        target_token_ids=targets,
        ce_weight=1.0,
        chunk_size=16,
        backward=True,
        loss_scale=1.0,
    )
    backend.set_train(False)
    grads = {n: p.grad.clone() for n, p in backend.model.named_parameters() if p.requires_grad}
    return float(result.loss), grads


def test_checkpointed_update_is_bit_identical_and_recomputes_every_layer(llama_dir: Path) -> None:
    plain, checkpointed = _backend(llama_dir, False), _backend(llama_dir, True)
    layers = len(plain._base.get_decoder().layers)
    plain_calls, checkpointed_calls = _layer_calls(plain), _layer_calls(checkpointed)

    loss, grads = _loss_and_gradients(plain)
    loss_ckpt, grads_ckpt = _loss_and_gradients(checkpointed)

    assert loss_ckpt == loss
    assert grads.keys() == grads_ckpt.keys() and len(grads) > 0
    assert all(torch.equal(grads[k], grads_ckpt[k]) for k in grads)
    assert any(bool(g.abs().sum() > 0) for g in grads.values())
    # the plain forward runs each layer once; the checkpointed one again in the backward
    assert plain_calls[0] == layers and checkpointed_calls[0] == 2 * layers
    # the embedding output is no leaf that needs a gradient (only reentrant checkpoints need it)
    assert getattr(checkpointed._base, "_require_grads_hook", None) is None


def test_decode_is_not_recomputed(llama_dir: Path) -> None:
    plain, checkpointed = _backend(llama_dir, False), _backend(llama_dir, True)
    calls = _layer_calls(checkpointed)
    prompt = plain.tokenizer.encode("<|im_start|>user\nWhat is 5+8?<|im_end|>\n")
    out = plain.generate(prompt, max_new_tokens=6, temperature=0.0)
    out_ckpt = checkpointed.generate(prompt, max_new_tokens=6, temperature=0.0)
    assert out_ckpt.token_ids == out.token_ids
    steps = len(out_ckpt.token_ids)
    assert calls[0] <= steps * len(checkpointed._base.get_decoder().layers)


def test_the_recipe_key_reaches_the_shared_backbone(llama_dir: Path) -> None:
    spec = {"model_id": str(llama_dir), "lora": LORA}
    mapping = {
        "models": {"backend": "hf", "runtime": "shared_backbone", "student": spec, "teacher": spec},
        "memory": {"activation_checkpointing": True},
    }
    actor, _ = build_shared_backbone(
        RunConfig.from_mapping(mapping), _backend(llama_dir, False).tokenizer, "cpu"
    )
    assert actor.activation_checkpointing
    assert all(layer.gradient_checkpointing for layer in actor._base.get_decoder().layers)
    mapping["memory"] = {}
    actor, _ = build_shared_backbone(RunConfig.from_mapping(mapping), actor.tokenizer, "cpu")
    assert not any(layer.gradient_checkpointing for layer in actor._base.get_decoder().layers)


def _shared(llama_dir: Path, checkpointing: bool) -> tuple[HFBackend, Any]:
    """Actor and teacher adapters of the same rank: a backward recomputed under the wrong one
    would not even change a shape."""
    config = RunConfig.from_mapping(
        {
            "models": {
                "backend": "hf",
                "runtime": "shared_backbone",
                "student": {"model_id": str(llama_dir), "lora": LORA},
                "teacher": {"model_id": str(llama_dir)},
            },
            "memory": {"activation_checkpointing": checkpointing},
        }
    )
    tokenizer = HFBackend(llama_dir).tokenizer
    actor, teacher = build_shared_backbone(
        config, tokenizer, "cpu", teacher_adapter=LoraConfig(**LORA)
    )
    with torch.no_grad():
        generator = torch.Generator().manual_seed(13)
        for name, param in actor.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return actor, teacher


def _fit_step_gradients(teacher: Any) -> tuple[float, dict[str, torch.Tensor]]:
    tok = teacher.tokenizer
    rows = [
        (ids, list(range(1, len(ids)))) for ids in (tok.encode("What is 5+8?"), tok.encode("7 * 6"))
    ]
    params = teacher.unfrozen_adapter_parameters()
    for p in params:
        p.requires_grad_(True)
    captured: dict[str, torch.Tensor] = {}

    class Capture(torch.optim.Optimizer):
        def __init__(self) -> None:
            super().__init__(params, {})

        def step(self, closure: Any = None) -> None:
            names = {id(p): n for n, p in teacher.owner.model.named_parameters()}
            captured.update({names[id(p)]: p.grad.clone() for p in params})

    teacher.owner.set_train(True)
    with teacher.held():
        loss = cross_entropy_fit_step(teacher, rows, params, Capture(), chunk_size=8)
    return loss, captured


def test_a_teacher_adapter_fit_recomputes_under_the_teacher_adapter(llama_dir: Path) -> None:
    _, plain = _shared(llama_dir, False)
    _, checkpointed = _shared(llama_dir, True)
    loss, grads = _fit_step_gradients(plain)
    loss_ckpt, grads_ckpt = _fit_step_gradients(checkpointed)
    assert loss_ckpt == loss and grads.keys() == grads_ckpt.keys() and grads
    assert all(".teacher." in k for k in grads)
    assert all(torch.equal(grads[k], grads_ckpt[k]) for k in grads)


def test_a_gradient_forward_of_the_view_outside_held_is_refused(llama_dir: Path) -> None:
    _, teacher = _shared(llama_dir, True)
    ids = teacher.tokenizer.encode("What is 5+8?")
    teacher.owner.set_train(True)
    with pytest.raises(BackendError, match="recomputes its layers in the backward"):
        teacher.hidden_states_at(ids, [0, 1], with_grad=True)
    with teacher.held():
        assert teacher.hidden_states_at(ids, [0, 1], with_grad=True).requires_grad
    assert teacher.hidden_states_at(ids, [0, 1]).shape[0] == 2  # no gradients: nothing to recompute
