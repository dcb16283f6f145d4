"""The toy decoder and ToyBackend against the CausalLMBackend contract."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file

from miniverl.errors import BackendError, CheckpointError, TrajectoryError
from miniverl.lab.teachers.toy_fit import fit_toy_model
from miniverl.models.base import CausalLMBackend, PaddedTrajectoryBatch
from miniverl.models.sampling import recompute_step, run_generation
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend
from miniverl.models.toy_config import TOY_STUDENT, TOY_TEACHER, ToyModelConfig, toy_preset

TOK = ToyTokenizer()
PROMPT = TOK.encode(
    "<|im_start|>user\nCompute 7 - 3 and report the value.<|im_end|>\n<|im_start|>assistant\n"
)
SMALL = dataclasses.replace(TOY_STUDENT, hidden_size=32, intermediate_size=64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def full_logits(backend: ToyBackend, ids: list[int]) -> torch.Tensor:
    """Reference ``[T, V]`` logits from one plain full forward."""
    with torch.no_grad():
        hidden, _ = backend.module(torch.tensor([ids]))
        return backend.module.project(hidden)[0]


def make(config: ToyModelConfig = TOY_STUDENT, seed: int = 0) -> ToyBackend:
    return ToyBackend(config, TOK, model_id="toy-student", seed=seed)


def test_presets_sizes_and_capabilities() -> None:
    student, teacher = make(TOY_STUDENT), make(TOY_TEACHER)
    assert isinstance(student, CausalLMBackend)
    s, t = student.capabilities, teacher.capabilities
    assert 80_000 <= s.num_parameters <= 130_000
    assert 500_000 <= t.num_parameters <= 1_000_000
    assert (s.backend, s.vocab_size, s.hidden_size, s.device) == ("toy", TOK.vocab_size, 64, "cpu")
    assert s.num_trainable_parameters == s.num_parameters and s.kv_cache and not s.lora
    assert toy_preset("toy-teacher") is TOY_TEACHER
    assert s.to_dict()["extra"]["config"]["hidden_size"] == 64


def test_same_seed_same_weights_without_touching_global_rng() -> None:
    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    a, b, c = make(seed=1), make(seed=1), make(seed=2)
    assert torch.equal(torch.rand(3), before)
    for name, tensor in a.full_state_dict().items():
        assert torch.equal(tensor, b.full_state_dict()[name])
    assert not torch.equal(a.full_state_dict()["embed.weight"], c.full_state_dict()["embed.weight"])


@pytest.mark.parametrize("config", [TOY_STUDENT, TOY_TEACHER], ids=["tied", "untied"])
def test_hidden_states_at_then_project_equals_full_forward(config: ToyModelConfig) -> None:
    backend = make(config)
    ids = PROMPT + TOK.encode("<tool_call>\n{")
    positions = [0, 5, len(PROMPT) - 1, len(ids) - 1]
    hidden = backend.hidden_states_at(ids, positions)
    assert hidden.shape == (len(positions), config.hidden_size) and not hidden.requires_grad
    torch.testing.assert_close(backend.project(hidden), full_logits(backend, ids)[positions])
    with pytest.raises(BackendError, match="outside the sequence"):
        backend.hidden_states_at(ids, [len(ids)])


def test_padded_batch_equals_per_sequence_results() -> None:
    backend = make(SMALL)
    rows = [PROMPT, PROMPT[:7], TOK.encode("<final>\n4\n</final>")]
    picks = [[3, len(PROMPT) - 1], [0, 6], [1, 2, 3]]
    width = max(map(len, rows))
    ids = torch.full((3, width), TOK.pad_token_id)
    mask = torch.zeros((3, width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    batch = PaddedTrajectoryBatch(
        input_ids=ids,
        attention_mask=mask,
        row_index=torch.tensor([r for r, p in enumerate(picks) for _ in p]),
        position_index=torch.tensor([j for p in picks for j in p]),
        row_sizes=[len(p) for p in picks],
    )
    gathered = backend.hidden_states_at_batch(batch)
    expected = torch.cat(
        [backend.hidden_states_at(row, p) for row, p in zip(rows, picks, strict=True)]
    )
    torch.testing.assert_close(gathered, expected, atol=1e-5, rtol=1e-5)
    ids2 = ids.clone()
    ids2[mask == 0] = 123  # different pad content must not change real positions
    batch2 = dataclasses.replace(batch, input_ids=ids2)
    torch.testing.assert_close(
        backend.hidden_states_at_batch(batch2), gathered, atol=1e-6, rtol=1e-6
    )
    with pytest.raises(BackendError, match="right-padded"):
        backend.hidden_states_at_batch(dataclasses.replace(batch, attention_mask=mask.flip(1)))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_kv_cached_generation_matches_full_recompute(temperature: float) -> None:
    backend = make(SMALL, seed=3)
    out = backend.generate(PROMPT, max_new_tokens=40, temperature=temperature, top_p=0.95, seed=11)
    reference = run_generation(
        recompute_step(lambda ids: backend.module.project(backend.module(ids)[0])),
        PROMPT,
        tokenizer=TOK,
        max_new_tokens=40,
        temperature=temperature,
        top_p=0.95,
        seed=11,
        eos_token_id=TOK.eos_token_id,
    )
    assert out.token_ids == reference.token_ids
    assert out.finish_reason == reference.finish_reason and out.text == reference.text


def test_cached_chunks_after_a_prefix_match_one_forward() -> None:
    backend = make(SMALL)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        whole, _ = backend.module(ids)
        head, cache = backend.module(ids[:, :10])
        tail, _ = backend.module(ids[:, 10:], cache)
    torch.testing.assert_close(torch.cat([head, tail], dim=1), whole, atol=1e-5, rtol=1e-5)


def test_sampling_seeds() -> None:
    backend = make(SMALL)
    a = backend.generate(PROMPT, max_new_tokens=30, temperature=1.0, seed=1)
    b = backend.generate(PROMPT, max_new_tokens=30, temperature=1.0, seed=1)
    c = backend.generate(PROMPT, max_new_tokens=30, temperature=1.0, seed=2)
    assert a == b
    assert a.token_ids != c.token_ids
    assert a.num_generated == len(a.token_ids) <= 30 and a.num_prompt_tokens == len(PROMPT)


def test_generation_does_not_change_train_mode_or_build_graph() -> None:
    backend = make(SMALL)
    backend.set_train(True)
    backend.generate(PROMPT, max_new_tokens=3, temperature=0.0)
    assert backend.module.training
    backend.set_train(False)
    assert not backend.module.training


def test_set_train_reaches_every_module_and_dropout_follows_it() -> None:
    """``set_train`` walks a kept module list rather than ``module.train``: every module's
    flag must still follow, which is what switches the LoRA dropout on and off."""
    backend = make(dataclasses.replace(SMALL.with_lora(4, alpha=8.0), lora_dropout=0.5), seed=2)
    with torch.no_grad():
        for name, p in backend.module.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    ids = torch.tensor([PROMPT])
    for mode in (True, False, True, False):
        backend.set_train(mode)
        assert [m.training for m in backend.module.modules()] == [mode] * len(
            list(backend.module.modules())
        )
        with torch.no_grad():
            first, _ = backend.module(ids)
            second, _ = backend.module(ids)
        assert torch.equal(first, second) is not mode
    backend.set_train(True)
    in_train = backend.generate(PROMPT, max_new_tokens=6, temperature=0.0).token_ids
    assert backend.module.training
    backend.set_train(False)
    assert backend.generate(PROMPT, max_new_tokens=6, temperature=0.0).token_ids == in_train


def test_trainable_parameters_follow_requires_grad_and_release() -> None:
    backend = make(SMALL)
    everything = backend.trainable_parameters()
    assert everything == list(backend.module.parameters())
    backend.module.embed.weight.requires_grad_(False)
    assert backend.trainable_parameters() == everything[1:]
    backend.release()
    with pytest.raises(BackendError, match="released"):
        backend.trainable_parameters()


def test_lora_only_adapters_trainable_and_zero_init_is_identity() -> None:
    plain = make(SMALL, seed=4)
    lora = make(SMALL.with_lora(4, alpha=8.0), seed=4)
    names = [n for n, _ in lora.module.named_parameters()]
    trainable = list(lora.trainable_state_dict())
    assert trainable and all(".lora_A" in n or ".lora_B" in n for n in trainable)
    assert len(trainable) == 2 * 7 * SMALL.num_layers
    assert {n for n in names if ".lora_" not in n} == set(plain.full_state_dict())
    assert (
        lora.capabilities.lora
        and lora.capabilities.num_trainable_parameters < 0.5 * lora.capabilities.num_parameters
    )
    assert all(
        torch.count_nonzero(t) == 0 for n, t in lora.trainable_state_dict().items() if "lora_B" in n
    )
    base = {n: t for n, t in lora.full_state_dict().items() if ".lora_" not in n}
    plain.load_full_state_dict(base)
    torch.testing.assert_close(full_logits(lora, PROMPT), full_logits(plain, PROMPT))
    hidden = lora.hidden_states_at(PROMPT, [3, 4], with_grad=True)
    lora.project(hidden).sum().backward()
    assert all(p.grad is not None for p in lora.trainable_parameters())
    assert all(p.grad is None for n, p in lora.module.named_parameters() if ".lora_" not in n)


def test_trainable_state_round_trip_and_errors(tmp_path) -> None:
    source = make(SMALL.with_lora(4), seed=1)
    with torch.no_grad():
        for p in source.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.1)
    state = source.trainable_state_dict()
    assert all(
        t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad for t in state.values()
    )
    path = tmp_path / "adapter.safetensors"
    save_file(state, str(path))
    target = make(SMALL.with_lora(4), seed=1)
    target.load_trainable_state_dict(load_file(str(path)))
    torch.testing.assert_close(full_logits(target, PROMPT), full_logits(source, PROMPT))

    name = next(iter(state))
    with pytest.raises(CheckpointError, match="missing keys"):
        target.load_trainable_state_dict({k: v for k, v in state.items() if k != name})
    with pytest.raises(CheckpointError, match="unexpected keys"):
        target.load_trainable_state_dict({**state, "bogus": torch.zeros(1)})
    with pytest.raises(CheckpointError, match="shape mismatch"):
        target.load_trainable_state_dict({**state, name: torch.zeros(1, 1)})
    target.load_trainable_state_dict({name: state[name]}, strict=False)


def test_snapshot_is_a_copy() -> None:
    backend = make(SMALL)
    snapshot = backend.trainable_state_dict()
    with torch.no_grad():
        backend.module.embed.weight.add_(1.0)
    assert not torch.equal(snapshot["embed.weight"], backend.module.embed.weight)


def test_full_state_dict_is_safetensors_ready(tmp_path) -> None:
    teacher = make(TOY_TEACHER, seed=9)
    path = tmp_path / "teacher.safetensors"
    save_file(teacher.full_state_dict(), str(path))
    restored = make(TOY_TEACHER, seed=0)
    restored.load_full_state_dict(load_file(str(path)))
    torch.testing.assert_close(full_logits(restored, PROMPT), full_logits(teacher, PROMPT))


def test_release_and_device_errors() -> None:
    backend = make(SMALL)
    backend.to_device("cpu")
    assert backend.device == "cpu"
    backend.release()
    with pytest.raises(BackendError, match="released"):
        backend.generate(PROMPT, max_new_tokens=2)
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="CUDA is not available"):
            make(SMALL).to_device("cuda")
    with pytest.raises(BackendError, match="vocab_size"):
        ToyBackend(dataclasses.replace(SMALL, vocab_size=10), TOK, model_id="x")


def test_rotary_table_extends_beyond_max_seq_len() -> None:
    backend = make(dataclasses.replace(SMALL, max_seq_len=16))
    ids = (PROMPT * 2)[:40]
    hidden = backend.hidden_states_at(ids, [39])
    torch.testing.assert_close(backend.project(hidden), full_logits(backend, ids)[[39]])


def _memorization_examples() -> list[tuple[list[int], list[int]]]:
    examples = []
    for a, b in [(7, 3), (2, 9), (5, 5), (8, 1)]:
        context = TOK.encode(
            f"<|im_start|>user\nCompute {a} + {b}<|im_end|>\n<|im_start|>assistant\n"
        )
        answer = TOK.encode(f"<final>\n{a + b}\n</final>")
        examples.append((context + answer, list(range(len(context), len(context) + len(answer)))))
    return examples


def test_fit_toy_model_memorizes_and_stops_early() -> None:
    backend = make(SMALL.with_lora(2), seed=0)
    examples = _memorization_examples()
    report = fit_toy_model(backend, examples, steps=60, lr=1e-2, batch_size=4, chunk_size=5)
    assert report.steps_run == 60 and not report.stopped_early
    assert report.final_loss < 0.25 * report.loss_history[0]
    assert all(".lora_" in n for n in backend.trainable_state_dict())  # flags restored
    ids, targets = examples[0]
    context = ids[: targets[0]]
    out = backend.generate(
        context, max_new_tokens=10, temperature=0.0, stop_sequences=("</final>",)
    )
    assert out.token_ids == ids[targets[0] :] and out.finish_reason == "stop_sequence"

    calls: list[int] = []
    early = fit_toy_model(
        make(SMALL),
        examples,
        steps=100,
        check_every=5,
        stop_when=lambda s: calls.append(s) or s >= 10,
    )
    assert early.stopped_early and early.steps_run == 10 and calls == [5, 10]
    with pytest.raises(TrajectoryError, match="position 0"):
        fit_toy_model(make(SMALL), [([1, 2, 3], [0])], steps=1)


def test_two_continuations_of_one_cache_do_not_see_each_other() -> None:
    """A cache's new slots are written in place; a second continuation of the same cache
    must get buffers of its own, or it overwrites the first one's slots."""
    backend = make(SMALL)
    prefix, a, b, c, d = PROMPT[:12], PROMPT[12:15], PROMPT[15:18], PROMPT[18:21], PROMPT[21:24]
    with torch.no_grad():
        _, cache = backend.module(torch.tensor([prefix]))
        _, after_a = backend.module(torch.tensor([a]), cache)  # regrown: spare slots
        _, after_b = backend.module(torch.tensor([b]), after_a)  # in place
        _, _after_c = backend.module(torch.tensor([c]), after_a)  # must not write over b
        tail, extended = backend.module(torch.tensor([d]), after_b)
        whole, _ = backend.module(torch.tensor([prefix + a + b + d]))
    assert (cache.length, after_a.length, after_b.length, extended.length) == (12, 15, 18, 21)
    torch.testing.assert_close(tail[0], whole[0, 18:], atol=1e-5, rtol=1e-5)
    keys, _ = extended[0]
    assert keys.shape[2] == 21


def test_decode_appends_in_place_and_regrows_rarely() -> None:
    backend = make(SMALL)
    with torch.no_grad():
        _, cache = backend.module(torch.tensor([PROMPT[:8]]))
        storages = set()
        for token in PROMPT[8:24]:
            _, cache = backend.module(torch.tensor([[token]]), cache)
            storages.add(cache[0][0].untyped_storage().data_ptr())
    assert cache.length == 24
    assert len(storages) == 1  # one regrowth to 9 + 32 slots, then every step writes in place


def test_rotation_is_the_textbook_formula_bit_for_bit() -> None:
    from miniverl.models.toy import Rotary

    rotary = Rotary(head_dim=16, max_seq_len=8, theta=10000.0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 20, 16, generator=generator)
    x[0, 0, 0, :4] = -0.0
    rope = rotary.tables(0, 20, None, torch.float32)  # past max_seq_len: extended on demand
    t = torch.arange(20, dtype=torch.float32)
    freqs = torch.outer(t, rotary.inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    rotated = torch.cat([-x[..., 8:], x[..., :8]], dim=-1)
    expected = x * emb.cos() + rotated * emb.sin()
    assert torch.equal(Rotary.rotate(x, rope), expected)


def test_rollout_past_the_rotary_table_leaves_training_forwards_working() -> None:
    """Generation runs in inference mode; a rotary table it extends must stay usable by a
    training forward that saves slices of it for backward."""
    backend = make(dataclasses.replace(SMALL, max_seq_len=16))
    backend.generate(PROMPT[:10], max_new_tokens=30, temperature=1.0, seed=0)
    assert backend.module.rotary.cos.shape[0] >= 16
    assert not backend.module.rotary.cos.is_inference()
    ids = (PROMPT * 2)[:30]
    hidden = backend.hidden_states_at(ids, list(range(29)), with_grad=True)
    hidden.sum().backward()
    assert backend.module.layers[0].attn.q_proj.weight.grad is not None
