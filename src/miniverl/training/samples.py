"""What an update consumes: :class:`TrainingSample`, what it means (:class:`Supervision`) and
one cycle's batch of them (:class:`CycleSamples`); the hard-label sample of cross-entropy arms.

Built by the sample sources (:mod:`miniverl.training.sources`) and the teacher-target
builder (:mod:`miniverl.training.targets`); read by the trainer's optimizer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from miniverl.losses import ChunkTargetProvider
from miniverl.schemas.alignment import AlignmentMap
from miniverl.schemas.trajectory import Trajectory
from miniverl.selection.selectors import SelectionResult
from miniverl.trajectory.alignment import build_alignment_map
from miniverl.trajectory.masks import model_target_positions


@dataclass
class TrainingSample:
    """One trajectory ready for an update: selection, alignment and targets."""

    trajectory: Trajectory
    selection: SelectionResult
    alignment: AlignmentMap
    rollout_policy_version: int
    provider: ChunkTargetProvider | None = None
    cache_key: str | None = None
    teacher_entropy: list[float] = field(default_factory=list)
    rollout_fingerprint: str | None = None
    target_fingerprint: str | None = None
    entropy_is_lower_bound: bool = False

    @property
    def trajectory_id(self) -> str:
        return self.trajectory.trajectory_id

    @property
    def num_positions(self) -> int:
        return self.alignment.num_positions

    @property
    def trainable(self) -> bool:
        """Rows with nothing selected are removed *before* the group size G is counted."""
        return self.alignment.num_positions > 0 and self.alignment.total_weight > 0


@dataclass(frozen=True)
class Supervision:
    """What a source's samples mean to the optimizer.

    ``teacher_targets=False`` is cross-entropy on the trajectory's own tokens with weight 1
    (no divergence term); ``passes`` is how many times the cycle's rows are optimized over
    (``opd`` replay); ``strict_on_policy`` runs :func:`check_on_policy` before every group.
    """

    phase: str
    teacher_targets: bool
    passes: int = 1
    strict_on_policy: bool = False


@dataclass
class CycleSamples:
    """One cycle's samples, the rollout statistics for the cycle record, and the version the
    trajectories were sampled at (``None`` when the source sampled nothing this cycle)."""

    samples: list[TrainingSample]
    rollout_stats: dict[str, Any] = field(default_factory=dict)
    rollout_version: int | None = None


def hard_label_sample(traj: Trajectory) -> TrainingSample:
    """Every model-generated token of ``traj``, weight 1: the sample of cross-entropy arms."""
    targets = model_target_positions(traj.model_generated_mask)
    weights = [1.0] * len(targets)
    selection = SelectionResult(
        traj.trajectory_id,
        "all_model_tokens",
        targets,
        weights,
        len(targets),
        sum(traj.critical_mask),
        traj.span_types_at(targets),
    )
    return TrainingSample(
        traj, selection, build_alignment_map(traj, targets, weights), traj.policy_version
    )


def summarize_rollouts(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Success rate, token counts and the exact failure taxonomy of a batch of rollouts."""
    n = len(trajectories)
    solved = sum(1 for t in trajectories if t.solved)
    termination = Counter(t.termination_reason.value for t in trajectories)
    failures = Counter(
        t.verification.failure_category
        for t in trajectories
        if t.verification and t.verification.failure_category
    )
    generated = [t.generated_token_count for t in trajectories]
    return {
        "tasks": n,
        "solved": solved,
        "success_rate": solved / n if n else 0.0,
        "mean_generated_tokens": sum(generated) / n if n else 0.0,
        "generated_tokens": sum(generated),
        "invalid_tool_calls": sum(t.invalid_tool_calls for t in trajectories),
        "termination": dict(sorted(termination.items())),
        "failure_categories": dict(sorted(failures.items())),
    }


__all__ = [
    "CycleSamples",
    "Supervision",
    "TrainingSample",
    "hard_label_sample",
    "summarize_rollouts",
]
