"""``LocalTeacherScorer``: a teacher in this process scoring the student's trajectories.

The teacher runs once per trajectory over its own render (the student's transcript, or the
privileged render with an oracle block in ``teacher.mode: privileged_context``) and only
the hidden states at the alignment's teacher prediction positions are kept (``[N, H]``,
``hidden_states_at(..., with_grad=False)``). From them it produces one of two supervision
shapes (docs/design.md §3.5):

- ``exact_hidden`` (``loss.mode: exact_full_vocab`` with a resident teacher): ``[N, H]`` is
  kept and an :class:`~miniverl.losses.ExactTargetProvider` rebuilds ``[chunk, V]`` teacher
  logits through the teacher's LM head on demand. Needs the live teacher, so it is never
  cached.
- ``bucketed``: hidden states are projected ``chunk_size`` rows at a time (never ``[N, V]``)
  and compressed by :func:`~miniverl.losses.teacher_topk_targets` to ``topk_indices [N, K]``,
  ``topk_log_probs [N, K]`` and ``tail_log_prob [N]``. Serializable, so it is the only
  shape that survives evicting the teacher. ``exact_full_vocab`` with a swapped teacher is
  served in this shape with K = V: the tail bucket is then empty and the bucketed
  divergence equals the exact one, at the price of persisting ``[N, V]``, which is why
  :meth:`LocalTeacherScorer._check_exact_is_affordable` bounds V.

Teacher entropy is recorded per entry: the exact entropy for ``exact_hidden`` (and for
K = V), otherwise the entropy of the K + 1 buckets, a lower bound flagged as such.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from miniverl.errors import AlignmentError, BackendError, ConfigError
from miniverl.losses import (
    BucketedTargetProvider,
    ChunkTargetProvider,
    DivergenceSpec,
    ExactTargetProvider,
    bucket_entropy,
    teacher_entropy,
    teacher_topk_targets,
)
from miniverl.losses.chunked import check_chunk_size
from miniverl.models.batching import build_padded_trajectory_batch
from miniverl.schemas.cache import CacheProvenance
from miniverl.trajectory.alignment import check_fingerprints

if TYPE_CHECKING:
    from miniverl.models.base import CausalLMBackend
    from miniverl.schemas.alignment import AlignmentMap
    from miniverl.schemas.trajectory import Trajectory

LossMode = Literal["bucketed", "exact_full_vocab"]
TargetMask = Callable[[Sequence[int], Sequence[int]], list[bool]]
"""``(token ids, target positions j) -> keep j?``: a teacher without a target at some positions."""
EXACT_MAX_VOCAB = 8192
"""The largest vocabulary whose exact targets a swapped teacher persists ([positions, V])."""
ScoreShape = Literal["exact_hidden", "bucketed"]
TeacherMode = Literal["standard", "privileged_context"]


@dataclass
class TeacherScoreResult:
    """Teacher targets for the ``num_positions`` entries of one alignment map.

    - ``provider``: the :class:`~miniverl.losses.ChunkTargetProvider` the loss consumes
      (``ExactTargetProvider`` for ``exact_hidden``, ``BucketedTargetProvider`` otherwise).
    - ``teacher_entropy``: ``[N]`` float32 nats on the CPU, at the divergence temperature;
      a lower bound when ``entropy_is_lower_bound``.
    - ``policy_version``: the rollout policy version of the scored trajectory.
    - ``alignment_digest``: :meth:`AlignmentMap.digest` of the map the targets follow.
    - ``top_k``: K of the bucketed shape (V for exact targets of a swapped teacher);
      ``None`` for ``exact_hidden``.
    - ``teacher_positions``: the teacher prediction positions that were scored.
    - ``policy_fingerprint``: the fingerprint of the weights that sampled the scored
      trajectory (its ``metadata["policy_fingerprint"]``); strict OPD checks it.
    """

    trajectory_id: str
    policy_version: int
    shape: ScoreShape
    provider: ChunkTargetProvider
    teacher_entropy: Tensor
    num_positions: int
    alignment_digest: str
    top_k: int | None
    entropy_is_lower_bound: bool
    temperature: float
    vocab_size: int
    tokenizer_fingerprint: str
    teacher_model_id: str
    teacher_positions: list[int] = field(default_factory=list)
    policy_fingerprint: str | None = None

    @property
    def teacher_entropy_mean(self) -> float | None:
        return float(self.teacher_entropy.double().mean()) if self.num_positions else None

    def cache_tensors(self) -> dict[str, Tensor]:
        """The bucketed targets as computed, for :meth:`TeacherCache.write` (bucketed shape only).

        ``topk_indices [N, K]`` (int64), ``topk_log_probs [N, K]`` and ``tail_log_prob [N]``
        in the scorer's compute dtype (float32 from :func:`teacher_topk_targets`) on the
        teacher's device, and ``teacher_entropy [N]`` float32 on the CPU. No storage dtype
        is applied here: the cache converts once, to its provenance dtype
        (:func:`miniverl.cache.targets.to_storage`), so targets are never rounded twice.
        """
        if self.shape != "bucketed" or not isinstance(self.provider, BucketedTargetProvider):
            raise ConfigError(
                f"teacher targets of {self.trajectory_id!r} have the exact_hidden shape, which needs the "
                "live teacher and cannot be cached",
                hint="use loss.mode: bucketed, or keep the teacher resident and do not cache exact targets",
            )
        p = self.provider
        return {
            "topk_indices": p.topk_indices.detach(),
            "topk_log_probs": p.topk_log_probs.detach(),
            "tail_log_prob": p.tail_log_prob.detach(),
            "teacher_entropy": self.teacher_entropy.detach(),
        }


class LocalTeacherScorer:
    """Score trajectories with a local teacher backend (docs/design.md §3.5).

    - ``spec``: the divergence; its temperature is applied to the teacher distribution.
    - ``loss_mode``: ``bucketed`` (top-k + tail) or ``exact_full_vocab``.
    - ``top_k``: K for ``bucketed``, in ``[1, V]``; ignored for ``exact_full_vocab``.
    - ``teacher_resident``: the teacher stays loaded while the student trains. Only then is
      the ``exact_hidden`` shape possible.
    - ``exact_max_vocab`` / ``allow_large_exact``: the largest V whose exact targets a
      swapped teacher may persist (:data:`EXACT_MAX_VOCAB`), and whether to allow more;
      see :meth:`_check_exact_is_affordable`.
    - ``student_fingerprint``: the student tokenizer's fingerprint, checked against the
      teacher's at construction and on every score.
    - ``chunk_size``: rows projected to ``[chunk, V]`` at a time while scoring.
    - ``teacher_model_id``: recorded in results and cache provenance (default: the
      backend's ``capabilities.model_id``).

    Every teacher is scored through this one class: a model, the trained student of another
    run, or a teacher that is no model at all (the lab's oracle teacher) alike. A teacher
    that has no target at some positions also implements ``target_mask(token_ids,
    positions) -> keep?`` (:attr:`target_mask`); the rest supervise every selected position.
    """

    def __init__(
        self,
        teacher: CausalLMBackend,
        *,
        spec: DivergenceSpec,
        loss_mode: LossMode,
        top_k: int,
        teacher_resident: bool = True,
        exact_max_vocab: int = EXACT_MAX_VOCAB,
        allow_large_exact: bool = False,
        student_fingerprint: str | None = None,
        chunk_size: int = 256,
        teacher_model_id: str | None = None,
    ) -> None:
        if loss_mode not in ("bucketed", "exact_full_vocab"):
            raise ConfigError(f"loss.mode must be bucketed or exact_full_vocab; got {loss_mode!r}")
        check_chunk_size(chunk_size)
        if exact_max_vocab < 1:
            raise ConfigError(f"exact_max_vocab must be >= 1; got {exact_max_vocab}")
        self.teacher = teacher
        self.spec = spec
        self.loss_mode: LossMode = loss_mode
        self.teacher_resident = teacher_resident
        self.exact_max_vocab = exact_max_vocab
        self.allow_large_exact = allow_large_exact
        self.student_fingerprint = student_fingerprint
        self.chunk_size = chunk_size
        capabilities = teacher.capabilities
        self.vocab_size = int(capabilities.vocab_size)
        self.hidden_size = int(capabilities.hidden_size)
        self.teacher_model_id = teacher_model_id or capabilities.model_id
        self.teacher_revision = capabilities.revision
        self.tokenizer_fingerprint = teacher.tokenizer.fingerprint
        if student_fingerprint is not None:
            check_fingerprints(student_fingerprint, self.tokenizer_fingerprint)
        if loss_mode == "bucketed":
            if not 1 <= top_k <= self.vocab_size:
                raise ConfigError(
                    f"loss.top_k must lie in [1, {self.vocab_size}] (the teacher vocabulary); got {top_k}"
                )
            self.shape: ScoreShape = "bucketed"
            self.top_k: int | None = top_k
        else:
            self._check_exact_is_affordable(self.vocab_size)
            self.shape = "exact_hidden" if teacher_resident else "bucketed"
            self.top_k = None if teacher_resident else self.vocab_size

    @property
    def target_mask(self) -> TargetMask | None:
        """The teacher's ``target_mask(token_ids, target_positions) -> [keep j?]``, if it has one."""
        mask = getattr(self.teacher, "target_mask", None)
        return mask if callable(mask) else None

    def _check_exact_is_affordable(self, vocab_size: int) -> None:
        """Refuse ``exact_full_vocab`` with a swapped teacher when V > ``exact_max_vocab``.

        A swapped teacher is gone when the student trains, so exact targets would have to be
        persisted as ``[positions, V]`` (K = V buckets): 6 to 8 bytes per vocabulary entry
        (int32 id plus a bf16 or float32 log-prob), 0.9 to 1.2 MB per position at V = 151,936.
        """
        if self.loss_mode != "exact_full_vocab" or self.teacher_resident:
            return
        if vocab_size > self.exact_max_vocab and not self.allow_large_exact:
            raise ConfigError(
                f"loss.mode: exact_full_vocab with a swapped (non-resident) teacher would persist "
                f"[positions, {vocab_size}] teacher targets; V = {vocab_size} exceeds "
                f"the {self.exact_max_vocab} entries a swapped teacher may persist per position",
                hint="use loss.mode: bucketed, or keep the teacher resident (memory.strategy: resident)",
            )

    def cache_provenance(
        self,
        *,
        dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        teacher_mode: TeacherMode = "standard",
    ) -> CacheProvenance:
        """The :class:`CacheProvenance` of targets this scorer produces (bucketed shape only)."""
        if self.shape != "bucketed" or self.top_k is None:
            raise ConfigError(
                "exact_hidden targets need the live teacher and cannot be cached",
                hint="use loss.mode: bucketed, or disable the cache for a resident exact teacher",
            )
        return CacheProvenance(
            teacher_model_id=self.teacher_model_id,
            teacher_revision=self.teacher_revision,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            loss_mode="bucketed",
            top_k=self.top_k,
            temperature=self.spec.temperature,
            vocab_size=self.vocab_size,
            dtype=dtype,
            teacher_mode=teacher_mode,
        )

    def score(
        self,
        trajectory: Trajectory,
        alignment: AlignmentMap,
        *,
        teacher_trajectory: Trajectory | None = None,
    ) -> TeacherScoreResult:
        """Teacher targets for ``alignment``'s entries of ``trajectory``.

        ``teacher_trajectory`` is the render the teacher reads (the privileged render in
        ``privileged_context`` mode); without it the teacher reads ``trajectory`` and the
        alignment must be the identity. Raises :class:`TokenizerMismatchError` when the
        student, trajectory or render tokenizer differs from the teacher's, and
        :class:`AlignmentError` when a teacher prediction position is not followed by its
        target token in the teacher render.
        """
        render, positions = self._checked_render(trajectory, alignment, teacher_trajectory)
        hidden = self._hidden_states(render.token_ids, positions)
        return self._result(trajectory, alignment, positions, hidden)

    def score_batch(
        self, items: Sequence[tuple[Trajectory, AlignmentMap, Trajectory | None]]
    ) -> list[TeacherScoreResult]:
        """:meth:`score` of each ``(trajectory, alignment, teacher_trajectory)``, one forward.

        Every render with positions goes into one right-padded, mask-isolated teacher
        forward (``hidden_states_at_batch``); the rest (projection, top-k, entropy) is per
        trajectory exactly as in :meth:`score`. The checks run first for every item, so a
        bad item fails the batch before any teacher compute.
        """
        checked = [self._checked_render(t, a, v) for t, a, v in items]
        rows = [k for k, (_, positions) in enumerate(checked) if positions]
        hidden: dict[int, Tensor] = {}
        if rows:
            batch = build_padded_trajectory_batch(
                [checked[k][0].token_ids for k in rows],
                [checked[k][1] for k in rows],
                pad_token_id=self.teacher.tokenizer.pad_token_id,
                device=self.teacher.device,
            )
            gathered = self.teacher.hidden_states_at_batch(batch, with_grad=False).detach()
            if gathered.dim() != 2 or gathered.shape[0] != batch.num_positions:
                raise BackendError(
                    f"teacher hidden_states_at_batch returned {tuple(gathered.shape)} for "
                    f"{batch.num_positions} positions; the backend contract is [N, H]"
                )
            for k, part in zip(rows, torch.split(gathered, batch.row_sizes), strict=True):
                hidden[k] = part
        return [
            self._result(
                trajectory,
                alignment,
                checked[k][1],
                hidden.get(k, torch.empty((0, self.hidden_size), device=self.teacher.device)),
            )
            for k, (trajectory, alignment, _) in enumerate(items)
        ]

    def _checked_render(
        self,
        trajectory: Trajectory,
        alignment: AlignmentMap,
        teacher_trajectory: Trajectory | None,
    ) -> tuple[Trajectory, list[int]]:
        """The render the teacher reads and its prediction positions, after every check."""
        check_fingerprints(trajectory.tokenizer_fingerprint, self.tokenizer_fingerprint)
        if self.student_fingerprint is not None:
            check_fingerprints(self.student_fingerprint, self.tokenizer_fingerprint)
        if alignment.trajectory_id != trajectory.trajectory_id:
            raise AlignmentError(
                f"alignment is for trajectory {alignment.trajectory_id!r}, not {trajectory.trajectory_id!r}"
            )
        if teacher_trajectory is None:
            if not alignment.is_identity():
                raise AlignmentError(
                    f"the alignment of {trajectory.trajectory_id!r} places teacher positions apart from "
                    "student positions, so the teacher must read the render it was built from",
                    hint="pass teacher_trajectory=RolloutRunner.privileged_render(...)",
                )
            render = trajectory
        else:
            check_fingerprints(teacher_trajectory.tokenizer_fingerprint, self.tokenizer_fingerprint)
            render = teacher_trajectory
        positions = list(alignment.teacher_prediction_positions)
        _check_targets(render, positions, alignment.target_token_ids)
        return render, positions

    def _result(
        self,
        trajectory: Trajectory,
        alignment: AlignmentMap,
        positions: list[int],
        hidden: Tensor,
    ) -> TeacherScoreResult:
        if self.shape == "exact_hidden":
            provider: ChunkTargetProvider = ExactTargetProvider(
                hidden, self.teacher.project, self.spec
            )
            entropy = self._exact_entropy(hidden)
            lower_bound = False
        else:
            k = self.top_k if self.top_k is not None else self.vocab_size
            indices, log_probs, tail = self._bucketed_targets(hidden, k)
            provider = BucketedTargetProvider(indices, log_probs, tail, self.spec)
            entropy = bucket_entropy(log_probs, tail)
            lower_bound = k < self.vocab_size
        return TeacherScoreResult(
            trajectory_id=trajectory.trajectory_id,
            policy_version=trajectory.policy_version,
            shape=self.shape,
            provider=provider,
            teacher_entropy=entropy.detach().to(device="cpu", dtype=torch.float32),
            num_positions=len(positions),
            alignment_digest=alignment.digest(),
            top_k=self.top_k,
            entropy_is_lower_bound=lower_bound,
            temperature=self.spec.temperature,
            vocab_size=self.vocab_size,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            teacher_model_id=self.teacher_model_id,
            teacher_positions=positions,
            policy_fingerprint=trajectory.metadata.get("policy_fingerprint"),
        )

    def _hidden_states(self, token_ids: list[int], positions: list[int]) -> Tensor:
        """Teacher final hidden states ``[N, H]`` at ``positions``, detached."""
        if not positions:
            return torch.empty((0, self.hidden_size), device=self.teacher.device)
        hidden = self.teacher.hidden_states_at(token_ids, positions, with_grad=False)
        if hidden.dim() != 2 or hidden.shape[0] != len(positions):
            raise BackendError(
                f"teacher hidden_states_at returned {tuple(hidden.shape)} for {len(positions)} positions; "
                "the backend contract is [len(positions), H]"
            )
        return hidden.detach()

    def _exact_entropy(self, hidden: Tensor) -> Tensor:
        """Full-vocabulary teacher entropy ``[N]``, projecting ``chunk_size`` rows at a time."""
        parts = [torch.empty(0, dtype=torch.float32, device=hidden.device)]
        with torch.no_grad():
            for start in range(0, hidden.shape[0], self.chunk_size):
                logits = self.teacher.project(hidden[start : start + self.chunk_size])
                parts.append(teacher_entropy(logits, self.spec.temperature).float())
                del logits
        return torch.cat(parts)

    def _bucketed_targets(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(topk_indices [N, K] long, topk_log_probs [N, K], tail_log_prob [N])``, chunked."""
        indices = [torch.empty((0, k), dtype=torch.long, device=hidden.device)]
        log_probs = [torch.empty((0, k), dtype=torch.float32, device=hidden.device)]
        tails = [torch.empty(0, dtype=torch.float32, device=hidden.device)]
        with torch.no_grad():
            for start in range(0, hidden.shape[0], self.chunk_size):
                logits = self.teacher.project(hidden[start : start + self.chunk_size])
                if logits.shape[-1] != self.vocab_size:
                    raise BackendError(
                        f"teacher project returned {logits.shape[-1]} logits per row; its capabilities say V = {self.vocab_size}"
                    )
                ids, lp, tail = teacher_topk_targets(logits, k, self.spec.temperature)
                del logits
                indices.append(ids)
                log_probs.append(lp)
                tails.append(tail)
        if len(indices) == 2:
            return indices[1], log_probs[1], tails[1]
        dtype = log_probs[-1].dtype
        return (
            torch.cat(indices),
            torch.cat([t.to(dtype) for t in log_probs]),
            torch.cat([t.to(dtype) for t in tails]),
        )


def _check_targets(render: Trajectory, positions: list[int], targets: list[int]) -> None:
    """Each teacher prediction position must be followed by its target token in the render."""
    n = len(render.token_ids)
    for position, target in zip(positions, targets, strict=True):
        if not 0 <= position < n - 1:
            raise AlignmentError(
                f"teacher prediction position {position} has no following token in the "
                f"{n}-token teacher render {render.trajectory_id!r}"
            )
        actual = render.token_ids[position + 1]
        if actual != target:
            raise AlignmentError(
                f"teacher render {render.trajectory_id!r} has token {actual} at position {position + 1}, "
                f"but the alignment targets {target} there"
            )


__all__ = ["LocalTeacherScorer", "LossMode", "ScoreShape", "TeacherScoreResult"]
