"""Batched HF decoding: left padding, attention masks and position ids against ``generate()``."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.models.hf import HFBackend  # noqa: E402
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]

SHARPEN = 8.0
"""Query/key scale: at its random init the tiny model's attention is nearly uniform, so
wrong position ids would change its outputs by ~1e-6 and no test could see them."""

TEXTS = [
    "Compute 12 * (7 - 3) and report the value.",
    "hi",
    "<tool_call>calculator 3 + 4</tool_call> and then what is the answer to it",
    "ab cd",
]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HFBackend:
    path = build_tiny_hf_checkpoint(
        tmp_path_factory.mktemp(f"tiny-{request.param}"), arch=request.param, seed=1
    )
    hf = HFBackend(Path(path))
    with torch.no_grad():
        for name, param in hf.model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(SHARPEN)
    return hf


def _left_padded(backend: HFBackend, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    pad = backend.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def test_greedy_batch_equals_model_generate_on_the_same_padded_batch(backend: HFBackend) -> None:
    prompts = [backend.tokenizer.encode(t) for t in TEXTS]
    assert len({len(p) for p in prompts}) == len(prompts)
    ids, mask = _left_padded(backend, prompts)
    new = 16
    with torch.no_grad():
        reference = backend.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=new,
            min_new_tokens=new,
            eos_token_id=None,
            pad_token_id=backend.tokenizer.pad_token_id,
        )[:, ids.shape[1] :].tolist()
    ours = backend.generate_batch(
        prompts, max_new_tokens=[new] * len(prompts), seeds=[0] * len(prompts), temperature=0.0
    )
    for row, result in zip(reference, ours, strict=True):
        assert result.token_ids == row[: len(result.token_ids)]
        assert result.finish_reason == "eos" or len(result.token_ids) == new
    assert len({tuple(r) for r in reference}) > 1


def test_sampled_rows_equal_unbatched_generate(backend: HFBackend) -> None:
    prompts = [backend.tokenizer.encode(t) for t in TEXTS]
    budgets = [12, 5, 9, 12]
    batched = backend.generate_batch(
        prompts, max_new_tokens=budgets, seeds=[7, 8, 9, 10], temperature=1.0, top_p=0.9
    )
    alone = [
        backend.generate(p, max_new_tokens=b, seed=s, temperature=1.0, top_p=0.9)
        for p, b, s in zip(prompts, budgets, [7, 8, 9, 10], strict=True)
    ]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    assert [r.finish_reason for r in batched] == [r.finish_reason for r in alone]
    assert [len(r.token_ids) for r in batched][1] <= 5
