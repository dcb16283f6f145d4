"""Chunk target providers: where the chunked loss gets its teacher targets (docs/design.md §2.1).

The loss asks a provider for the divergence on rows ``[start, end)`` given the student
logits of those rows; it neither knows nor cares whether the targets are rebuilt from a
resident teacher's hidden states or read from stored top-k + tail tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from miniverl.losses.bucketed import bucketed_divergence
from miniverl.losses.divergences import DivergenceSpec
from miniverl.losses.exact import exact_divergence_from_log_probs
from miniverl.losses.numerics import (
    DivergenceOutput,
    compute_dtype,
    scaled_log_softmax,
)


@runtime_checkable
class ChunkTargetProvider(Protocol):
    """Teacher targets for ``num_positions`` entries, served a chunk of rows at a time."""

    spec: DivergenceSpec

    @property
    def num_positions(self) -> int: ...

    def divergence(self, student_logits: Tensor, start: int, end: int) -> DivergenceOutput:
        """Divergence for rows ``[start, end)``; ``student_logits`` is ``[end - start, V]``."""
        ...


def _check_range(
    provider: ChunkTargetProvider, student_logits: Tensor, start: int, end: int
) -> None:
    if not 0 <= start <= end <= provider.num_positions:
        raise ValueError(f"rows [{start}, {end}) fall outside [0, {provider.num_positions})")
    if student_logits.dim() != 2 or student_logits.shape[0] != end - start:
        raise ValueError(
            f"student logits for rows [{start}, {end}) must be [{end - start}, V]; "
            f"got {tuple(student_logits.shape)}"
        )


class ExactTargetProvider:
    """Full-vocabulary targets rebuilt per chunk from teacher hidden states.

    ``teacher_hidden`` ``[N, H]`` are the teacher's final hidden states at the aligned
    positions; ``teacher_lm_head`` maps ``[c, H] -> [c, V]``. Each call rebuilds the
    chunk's teacher logits under ``torch.no_grad()`` on the teacher's device, turns them
    into log-probs on the student's device and drops them when it returns, so only
    ``[N, H]`` is ever stored. Live ``[c, V]`` buffers during a call, at most three at
    once: the student logits with, first, the teacher logits and the teacher log-probs
    being filled, then (the logits freed) the teacher log-probs and the gradient being
    filled.
    """

    def __init__(
        self,
        teacher_hidden: Tensor,
        teacher_lm_head: Callable[[Tensor], Tensor],
        spec: DivergenceSpec,
    ) -> None:
        if teacher_hidden.dim() != 2:
            raise ValueError(f"teacher_hidden must be [N, H]; got {tuple(teacher_hidden.shape)}")
        self.teacher_hidden = teacher_hidden.detach()
        self.teacher_lm_head = teacher_lm_head
        self.spec = spec

    @property
    def num_positions(self) -> int:
        return int(self.teacher_hidden.shape[0])

    def divergence(self, student_logits: Tensor, start: int, end: int) -> DivergenceOutput:
        _check_range(self, student_logits, start, end)
        with torch.no_grad():
            teacher_logits = self.teacher_lm_head(self.teacher_hidden[start:end])
            if teacher_logits.shape != student_logits.shape:
                raise ValueError(
                    f"teacher LM head gave {tuple(teacher_logits.shape)} for student logits "
                    f"{tuple(student_logits.shape)}"
                )
            teacher_logits = teacher_logits.to(student_logits.device)
            dtype = compute_dtype(student_logits, teacher_logits)
            teacher_log_probs = scaled_log_softmax(teacher_logits, self.spec.temperature, dtype)
            del teacher_logits
        return exact_divergence_from_log_probs(student_logits, teacher_log_probs, self.spec)


class BucketedTargetProvider:
    """Top-k + tail targets: ``topk_indices`` ``[N, K]``, ``topk_log_probs`` ``[N, K]``,
    ``tail_log_prob`` ``[N]`` (as :func:`~miniverl.losses.bucketed.teacher_topk_targets`
    returns them). Serializable, so it survives evicting the teacher; each chunk's slice is
    moved to the student logits' device when it is used.
    """

    def __init__(
        self,
        topk_indices: Tensor,
        topk_log_probs: Tensor,
        tail_log_prob: Tensor,
        spec: DivergenceSpec,
    ) -> None:
        if topk_indices.dim() != 2 or topk_log_probs.shape != topk_indices.shape:
            raise ValueError(
                "topk_indices and topk_log_probs must both be [N, K]; got "
                f"{tuple(topk_indices.shape)} and {tuple(topk_log_probs.shape)}"
            )
        if tail_log_prob.shape != topk_indices.shape[:1]:
            raise ValueError(
                f"tail_log_prob must be [N] = [{topk_indices.shape[0]}]; got {tuple(tail_log_prob.shape)}"
            )
        self.topk_indices = topk_indices.detach()
        self.topk_log_probs = topk_log_probs.detach()
        self.tail_log_prob = tail_log_prob.detach()
        self.spec = spec

    @property
    def num_positions(self) -> int:
        return int(self.topk_indices.shape[0])

    @property
    def k(self) -> int:
        return int(self.topk_indices.shape[1])

    def to(self, device: torch.device | str) -> BucketedTargetProvider:
        """A copy whose three tensors live on ``device``."""
        return BucketedTargetProvider(
            self.topk_indices.to(device),
            self.topk_log_probs.to(device),
            self.tail_log_prob.to(device),
            self.spec,
        )

    def divergence(self, student_logits: Tensor, start: int, end: int) -> DivergenceOutput:
        _check_range(self, student_logits, start, end)
        device = student_logits.device
        return bucketed_divergence(
            student_logits,
            self.topk_indices[start:end].to(device),
            self.topk_log_probs[start:end].to(device),
            self.tail_log_prob[start:end].to(device),
            self.spec,
        )


class ConcatenatedTargetProvider:
    """Several providers end to end; a row range is split at their boundaries.

    Used for concatenations that cannot be merged tensor-wise (mixed kinds, different K,
    different teacher LM heads). ``entropy_is_lower_bound`` of a result is true when any
    part of the range came from bucketed targets.
    """

    def __init__(self, providers: Sequence[ChunkTargetProvider]) -> None:
        self.providers = list(providers)
        if not self.providers:
            raise ValueError("ConcatenatedTargetProvider needs at least one provider")
        self.spec = self.providers[0].spec
        if any(p.spec != self.spec for p in self.providers):
            raise ValueError("providers to concatenate must share one DivergenceSpec")
        self._offsets = [0]
        for provider in self.providers:
            self._offsets.append(self._offsets[-1] + provider.num_positions)

    @property
    def num_positions(self) -> int:
        return self._offsets[-1]

    def divergence(self, student_logits: Tensor, start: int, end: int) -> DivergenceOutput:
        _check_range(self, student_logits, start, end)
        parts: list[DivergenceOutput] = []
        for provider, lo, hi in zip(self.providers, self._offsets, self._offsets[1:], strict=False):
            a, b = max(start, lo), min(end, hi)
            if a < b:
                parts.append(
                    provider.divergence(student_logits[a - start : b - start], a - lo, b - lo)
                )
        if not parts:
            parts.append(self.providers[0].divergence(student_logits, 0, 0))
        return DivergenceOutput.concat(parts)


def concat_providers(providers: Sequence[ChunkTargetProvider]) -> ChunkTargetProvider:
    """One provider over the rows of ``providers`` in order (one per trajectory, say).

    All must share one :class:`DivergenceSpec`. Bucketed providers with one K are merged by
    concatenating their tensors (on the first one's device); exact providers sharing one
    teacher LM head by concatenating their hidden states; anything else is wrapped in a
    :class:`ConcatenatedTargetProvider` that dispatches row ranges across boundaries.
    """
    providers = list(providers)
    if not providers:
        raise ValueError("concat_providers needs at least one provider")
    spec = providers[0].spec
    if any(p.spec != spec for p in providers):
        raise ValueError("providers to concatenate must share one DivergenceSpec")
    if len(providers) == 1:
        return providers[0]
    if all(isinstance(p, BucketedTargetProvider) for p in providers):
        bucketed = [p for p in providers if isinstance(p, BucketedTargetProvider)]
        if len({p.k for p in bucketed}) == 1:
            device = bucketed[0].topk_indices.device
            return BucketedTargetProvider(
                torch.cat([p.topk_indices.to(device) for p in bucketed]),
                torch.cat([p.topk_log_probs.to(device) for p in bucketed]),
                torch.cat([p.tail_log_prob.to(device) for p in bucketed]),
                spec,
            )
    if all(isinstance(p, ExactTargetProvider) for p in providers):
        exact = [p for p in providers if isinstance(p, ExactTargetProvider)]
        head = exact[0].teacher_lm_head
        if all(p.teacher_lm_head == head for p in exact):
            device = exact[0].teacher_hidden.device
            return ExactTargetProvider(
                torch.cat([p.teacher_hidden.to(device) for p in exact]), head, spec
            )
    return ConcatenatedTargetProvider(providers)


__all__ = [
    "BucketedTargetProvider",
    "ChunkTargetProvider",
    "ConcatenatedTargetProvider",
    "ExactTargetProvider",
    "concat_providers",
]
