"""One-way supervision: a scorer hands over its compute dtype and only the cache rounds.

Values are chosen so that rounding twice is visible: fp32 -> bf16 -> fp16 and
fp32 -> fp16 -> bf16 both land on a different number than a single rounding to the
storage dtype. If the scorer (or anything between it and the cache) converted targets,
the stored bytes would differ from ``values.to(storage dtype)``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from miniverl.cache import TeacherCache
from miniverl.losses import BucketedTargetProvider, DivergenceSpec
from miniverl.schemas.cache import CacheProvenance
from miniverl.teachers.local import TeacherScoreResult

K, VOCAB = 2, 50
# fp32 values whose double rounding differs from single rounding (see module docstring).
ONE_ROUNDING = {
    # exactly representable in fp16, rounds up to 1 + 2^-7 in bf16
    "float16": -(1.0 + 2**-8 + 2**-10),
    # rounds to 1 + 2^-8 in fp16 (a bf16 tie, then to even: 1.0), but to 1 + 2^-7 in bf16
    "bfloat16": -(1.0 + 2**-8 + 2**-12),
}
OTHER = {"float16": torch.bfloat16, "bfloat16": torch.float16}


def _result(value: float) -> TeacherScoreResult:
    log_probs = torch.tensor([[value, -3.0], [-2.5, value]], dtype=torch.float32)
    tail = torch.tensor([value, -4.0], dtype=torch.float32)
    indices = torch.tensor([[1, 2], [3, 4]], dtype=torch.long)
    spec = DivergenceSpec(name="forward_kl")
    return TeacherScoreResult(
        trajectory_id="t",
        policy_version=0,
        shape="bucketed",
        provider=BucketedTargetProvider(indices, log_probs, tail, spec),
        teacher_entropy=torch.tensor([0.5, 0.25]),
        num_positions=2,
        alignment_digest="a" * 64,
        top_k=K,
        entropy_is_lower_bound=True,
        temperature=1.0,
        vocab_size=VOCAB,
        tokenizer_fingerprint="f" * 64,
        teacher_model_id="teacher",
    )


def test_the_chosen_values_expose_double_rounding() -> None:
    for dtype, value in ONE_ROUNDING.items():
        x = torch.tensor([value])
        storage = getattr(torch, dtype)
        assert not torch.equal(x.to(storage), x.to(OTHER[dtype]).to(storage)), dtype


def test_the_scorer_hands_over_its_compute_dtype_unrounded() -> None:
    result = _result(ONE_ROUNDING["float16"])
    tensors = result.cache_tensors()
    assert tensors["topk_log_probs"].dtype == torch.float32
    assert tensors["tail_log_prob"].dtype == torch.float32
    assert tensors["topk_indices"].dtype == torch.long
    assert torch.equal(tensors["topk_log_probs"], result.provider.topk_log_probs)
    assert torch.equal(tensors["tail_log_prob"], result.provider.tail_log_prob)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_cache_rounds_exactly_once_to_its_storage_dtype(tmp_path: Path, dtype: str) -> None:
    result = _result(ONE_ROUNDING[dtype])
    provenance = CacheProvenance(
        teacher_model_id="teacher",
        tokenizer_fingerprint="f" * 64,
        top_k=K,
        temperature=1.0,
        vocab_size=VOCAB,
        dtype=dtype,
    )
    cache = TeacherCache(tmp_path, provenance)
    cache.write("t", result)
    cache.flush()
    cached = TeacherCache.open(tmp_path).read("t", expect_policy_version=0)
    storage = getattr(torch, dtype)
    for name, computed in (
        ("topk_log_probs", result.provider.topk_log_probs),
        ("tail_log_prob", result.provider.tail_log_prob),
    ):
        stored = cached.tensors[name]
        assert stored.dtype == storage, name
        once = computed.to(storage)
        twice = computed.to(OTHER[dtype]).to(storage)
        assert torch.equal(stored.view(torch.uint8), once.view(torch.uint8)), name
        assert not torch.equal(stored, twice), name
    assert cached.tensors["topk_indices"].dtype == torch.int32
    assert cached.tensors["teacher_entropy"].dtype == torch.float32
