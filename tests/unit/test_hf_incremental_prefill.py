"""HF incremental prefill: a kept ``DynamicCache`` plus new ids equals a full re-prefill.

Tiny Llama and Qwen3 checkpoints in float64, several ``generate_batch`` calls that each
extend every prompt by its sampled ids, an observation of its own length and the next
assistant header; rows leave between calls and a fresh prompt joins mid-way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.agent.protocol import format_observation  # noqa: E402
from miniverl.models.hf import HFBackend  # noqa: E402
from miniverl.models.sampling import PrefixCache  # noqa: E402
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint  # noqa: E402
from miniverl.schemas.text import ASSISTANT_HEADER  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]

SHARPEN = 8.0
TEXTS = [
    "Compute 12 * (7 - 3) and report the value.",
    "hi",
    "<tool_call>calculator 3 + 4</tool_call> and then what is the answer to it",
    "ab cd",
    "what is 9 + 10",
]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HFBackend:
    path = build_tiny_hf_checkpoint(
        tmp_path_factory.mktemp(f"tiny-inc-{request.param}"), arch=request.param, seed=1
    )
    hf = HFBackend(Path(path))
    with torch.no_grad():
        for name, param in hf.model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(SHARPEN)
    hf.model.double()
    return hf


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kept_cache_equals_full_reprefill_and_single_sequences(
    backend: HFBackend, temperature: float
) -> None:
    tok = backend.tokenizer
    header = tok.encode(ASSISTANT_HEADER)
    prompts = [tok.encode(t) + header for t in TEXTS]
    cache = PrefixCache()
    live = [0, 1, 2, 3]
    expected_prefill = [sum(len(prompts[i]) for i in live)]
    for round_ in range(4):
        if round_ == 2:
            live.append(4)
        budgets = [2 + (i + round_) % 6 for i in live]
        seeds = [i + 10 * round_ for i in live]
        batch = [prompts[i] for i in live]
        kwargs = {"max_new_tokens": budgets, "seeds": seeds, "temperature": temperature}
        warm = backend.generate_batch(batch, prefix_cache=cache, **kwargs)
        cold = backend.generate_batch(batch, **kwargs)
        alone = [
            backend.generate(p, max_new_tokens=b, seed=s, temperature=temperature)
            for p, b, s in zip(batch, budgets, seeds, strict=True)
        ]
        assert [g.token_ids for g in warm] == [g.token_ids for g in cold]
        assert [g.token_ids for g in warm] == [g.token_ids for g in alone]
        assert [g.finish_reason for g in warm] == [g.finish_reason for g in alone]
        appended = []
        for i, g in zip(live, warm, strict=True):
            observation = tok.encode(format_observation("7" * (1 + i + round_))) + header
            prompts[i] = prompts[i] + g.token_ids + observation
            appended.append((i, 1 + len(observation)))
        live = [i for i in live if (i + round_) % 4 != 0]
        if round_ < 3:
            fresh = len(prompts[4]) if round_ == 1 else 0
            expected_prefill.append(sum(n for i, n in appended if i in live) + fresh)
    assert cache.prefilled_tokens == expected_prefill


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_once_equals_per_row_prefill(backend: HFBackend, temperature: float) -> None:
    """Every prompt starts with one system prompt: it is prefilled once and copied to each row."""
    tok = backend.tokenizer
    header = tok.encode(ASSISTANT_HEADER)
    system = tok.encode(
        "<|im_start|>system\nYou are a careful assistant. Call the calculator tool, "
        "then write the answer.<|im_end|>\n<|im_start|>user\n"
    )
    prompts = [system + tok.encode(t) + header for t in TEXTS]
    shared, per_row = PrefixCache(), PrefixCache(share_prefix=False)
    for round_ in range(3):
        budgets = [2 + (i + round_) % 6 for i in range(len(prompts))]
        seeds = [i + 10 * round_ for i in range(len(prompts))]
        kwargs = {"max_new_tokens": budgets, "seeds": seeds, "temperature": temperature}
        warm = backend.generate_batch(prompts, prefix_cache=shared, **kwargs)
        rows = backend.generate_batch(prompts, prefix_cache=per_row, **kwargs)
        cold = backend.generate_batch(prompts, **kwargs)
        alone = [
            backend.generate(p, max_new_tokens=b, seed=s, temperature=temperature)
            for p, b, s in zip(prompts, budgets, seeds, strict=True)
        ]
        ids = [g.token_ids for g in warm]
        assert ids == [g.token_ids for g in rows] == [g.token_ids for g in cold]
        assert ids == [g.token_ids for g in alone]
        for i, g in enumerate(warm):
            observation = tok.encode(format_observation("7" * (1 + i + round_))) + header
            prompts[i] = prompts[i] + g.token_ids + observation
    first = shared.shared_prefix_tokens[0]
    assert first >= len(system) and shared.shared_prefix_tokens[1:] == [0, 0]
    assert shared.prefilled_tokens[0] == per_row.prefilled_tokens[0] - first * (len(TEXTS) - 1)
    assert shared.prefilled_tokens[1:] == per_row.prefilled_tokens[1:]
