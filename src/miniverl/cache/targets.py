"""Teacher targets on their way into and out of the cache (the only dtype conversion).

:func:`to_storage` is where targets from a scorer become the stored dtypes;
:class:`CachedTargets` is one verified entry read back. torch is imported inside
functions only, so importing this module stays torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from miniverl.cache.layout import REQUIRED_TENSORS, TENSOR_ORDER, index_dtype_code
from miniverl.errors import ConfigError
from miniverl.schemas.cache import CacheEntryRecord, CacheProvenance

if TYPE_CHECKING:
    import torch

    from miniverl.losses.divergences import DivergenceSpec
    from miniverl.losses.providers import BucketedTargetProvider


class CacheableTargets(Protocol):
    """What :meth:`TeacherCache.write` needs from a score result (``TeacherScoreResult``).

    ``cache_tensors()`` returns the targets as computed (any device, the scorer's compute
    dtype); converting them to the storage dtypes is the cache's job alone.
    """

    trajectory_id: str
    policy_version: int
    alignment_digest: str

    def cache_tensors(self) -> dict[str, torch.Tensor]: ...


@dataclass(frozen=True)
class CachedTargets:
    """One entry read back: its record, the cache provenance and verified CPU tensors.

    ``tensors`` holds ``topk_indices [N, K]`` (int32 or int64), ``topk_log_probs [N, K]``
    and ``tail_log_prob [N]`` in the cache dtype and, when stored, ``teacher_entropy
    [N]`` float32, bit-identical to what was written.
    """

    record: CacheEntryRecord
    provenance: CacheProvenance
    tensors: dict[str, torch.Tensor]

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def trajectory_id(self) -> str:
        return self.record.trajectory_id

    @property
    def policy_version(self) -> int:
        return self.record.policy_version

    @property
    def alignment_digest(self) -> str:
        return self.record.alignment_digest

    @property
    def num_positions(self) -> int:
        return self.record.num_positions

    @property
    def top_k(self) -> int:
        return self.record.top_k

    @property
    def topk_indices(self) -> torch.Tensor:
        return self.tensors["topk_indices"]

    @property
    def topk_log_probs(self) -> torch.Tensor:
        return self.tensors["topk_log_probs"]

    @property
    def tail_log_prob(self) -> torch.Tensor:
        return self.tensors["tail_log_prob"]

    @property
    def teacher_entropy(self) -> torch.Tensor | None:
        """``[N]`` float32 nats; the bucket-entropy lower bound unless K = V."""
        return self.tensors.get("teacher_entropy")

    @property
    def entropy_is_lower_bound(self) -> bool:
        return self.record.top_k < self.provenance.vocab_size

    def provider(
        self, spec: DivergenceSpec, device: torch.device | str | None = None
    ) -> BucketedTargetProvider:
        """A :class:`BucketedTargetProvider` over these targets (indices as int64).

        The targets were computed at the provenance temperature, so a ``spec`` with another
        temperature would silently change the objective; it is refused.
        """
        from miniverl.losses.providers import BucketedTargetProvider

        if spec.temperature != self.provenance.temperature:
            raise ConfigError(
                f"cached targets were computed at temperature {self.provenance.temperature} but the "
                f"loss asks for {spec.temperature}",
                hint="rescore with the teacher, or set loss.temperature to the cache's temperature",
            )
        provider = BucketedTargetProvider(
            self.topk_indices.long(), self.topk_log_probs, self.tail_log_prob, spec
        )
        return provider if device is None else provider.to(device)


def check_result_matches(
    key: str, result: CacheableTargets, prov: CacheProvenance, directory: Path
) -> None:
    """Refuse a score result produced under settings other than the cache's provenance."""
    for name, expected in (
        ("temperature", prov.temperature),
        ("tokenizer_fingerprint", prov.tokenizer_fingerprint),
        ("vocab_size", prov.vocab_size),
        ("top_k", prov.top_k),
        ("teacher_model_id", prov.teacher_model_id),
    ):
        actual = getattr(result, name, None)
        if actual is not None and actual != expected:
            raise ConfigError(
                f"teacher targets for {key!r} have {name} {actual!r} but the cache at "
                f"{directory} records {expected!r}",
                hint="score with the settings the cache was created with, or use a new cache directory",
            )


def to_storage(
    key: str, tensors: Mapping[str, torch.Tensor], prov: CacheProvenance
) -> dict[str, torch.Tensor]:
    """Check ``tensors`` against ``prov`` and convert them to the stored dtypes, on the CPU.

    The one dtype conversion of teacher targets (docs/design.md §3.6): scorers hand over
    their compute dtype, and rounding happens here exactly once, to ``prov.dtype`` for the
    log-probs, int32/int64 for the ids (:func:`index_dtype_code`) and float32 for the
    entropy. Returns fresh contiguous CPU tensors in :data:`TENSOR_ORDER`.
    """
    import torch

    unknown = sorted(set(tensors) - set(TENSOR_ORDER))
    missing = [name for name in REQUIRED_TENSORS if name not in tensors]
    if unknown or missing:
        raise ValueError(f"entry {key!r}: unknown tensors {unknown}, missing {missing}")
    indices = tensors["topk_indices"]
    if indices.dim() != 2 or indices.shape[1] != prov.top_k:
        raise ValueError(
            f"entry {key!r}: topk_indices must be [N, {prov.top_k}]; got {tuple(indices.shape)}"
        )
    n = int(indices.shape[0])
    shapes = {"topk_log_probs": (n, prov.top_k), "tail_log_prob": (n,), "teacher_entropy": (n,)}
    for name, shape in shapes.items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"entry {key!r}: {name} must be {list(shape)}; got {list(tensors[name].shape)}"
            )
    if indices.dtype.is_floating_point or indices.dtype == torch.bool:
        raise ValueError(f"entry {key!r}: topk_indices must be integers; got {indices.dtype}")
    if n and (int(indices.min()) < 0 or int(indices.max()) >= prov.vocab_size):
        raise ValueError(f"entry {key!r}: topk_indices must lie in [0, {prov.vocab_size})")
    log_dtype = getattr(torch, prov.dtype)
    wanted = {
        "topk_indices": torch.int32 if index_dtype_code(prov.vocab_size) == "I32" else torch.int64,
        "topk_log_probs": log_dtype,
        "tail_log_prob": log_dtype,
        "teacher_entropy": torch.float32,
    }
    return {
        name: tensors[name].detach().to(device="cpu", dtype=wanted[name]).contiguous().clone()
        for name in TENSOR_ORDER
        if name in tensors
    }


__all__ = ["CacheableTargets", "CachedTargets", "check_result_matches", "to_storage"]
