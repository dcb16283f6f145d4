"""Teacher targets for any trajectories: select -> privileged render -> align -> score ->
cache write -> read back through the cache's checks (docs/design.md §3.3-§3.6).

"What targets" is separate from "which trajectories": every source that wants teacher KL
targets (offline pool, on-policy rollouts, a future oracle-prefix or mixed-prefix arm) hands
its trajectories to one :class:`TeacherTargets`; sources that train on hard labels do not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.losses import DivergenceSpec
from miniverl.schemas.trajectory import Trajectory
from miniverl.selection.selectors import select_positions
from miniverl.training.memory import split_on_oom
from miniverl.training.samples import TrainingSample
from miniverl.trajectory.alignment import build_alignment_map
from miniverl.utils.logging import EventLog

RESIDENT_ROUND_TRIP_REASON = (
    "teacher targets are read back from the cache even when the teacher is resident: the read "
    "is where the policy-version, alignment-digest and fingerprint checks run, and the update "
    "then trains on exactly the stored (storage-dtype) targets that a resume or a replay reads, "
    "so a resumed run stays bit-identical to an uninterrupted one"
)
"""Why the device -> disk -> device trip of teacher targets is kept (docs/on-policy.md)."""


SelectAndAlign = Callable[[Trajectory, int], tuple[TrainingSample, Trajectory | None]]


def make_select_and_align(
    config: RunConfig, privileged_render: Callable[[Trajectory], Trajectory] | None
) -> SelectAndAlign:
    """Selection, the privileged teacher render (if any) and the alignment of one trajectory."""

    def select_and_align(
        traj: Trajectory, version: int
    ) -> tuple[TrainingSample, Trajectory | None]:
        selection = select_positions(traj, config.selection, run_seed=config.run.seed)
        teacher_view = privileged_render(traj) if privileged_render is not None else None
        alignment = build_alignment_map(
            traj, selection.positions, selection.weights, teacher=teacher_view
        )
        sample = TrainingSample(traj, selection, alignment, version)
        sample.rollout_fingerprint = traj.metadata.get("policy_fingerprint")
        return sample, teacher_view

    return select_and_align


def cache_key(trajectory_id: str, cycle: int) -> str:
    """One cache entry per trajectory and cycle (a skipped cycle can repeat seeds)."""
    return f"{trajectory_id}@c{cycle}"


class TeacherTargets:
    """Trajectories -> teacher-scored samples: select, render, align, score, cache, read back.

    ``swap`` is entered around alignment, scoring and the cache flush (the ``swap`` memory
    strategy moves the student off the device and the teacher on); with a resident teacher
    it is a null context. With a cache, targets always come back through
    ``TeacherCache.read`` (:data:`RESIDENT_ROUND_TRIP_REASON`).
    """

    def __init__(
        self,
        *,
        scorer: Any,
        cache: Any,
        spec: DivergenceSpec,
        select_and_align: SelectAndAlign,
        batch_size: int,
        events: EventLog,
        swap: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self.scorer = scorer
        self.cache = cache
        self.spec = spec
        self.select_and_align = select_and_align
        self.batch_size = batch_size
        self.events = events
        self.swap = swap or nullcontext

    def score(
        self, trajectories: Sequence[Trajectory], *, cycle: int, version: int, expect_version: int
    ) -> list[TrainingSample]:
        """Samples of ``trajectories`` sampled at ``version``; the cache read expects ``expect_version``."""
        with self.swap():
            aligned = [self.select_and_align(traj, version) for traj in trajectories]
            to_score = [(sample, view) for sample, view in aligned if sample.num_positions]
            assert self.scorer is not None or not to_score
            for start in range(0, len(to_score), self.batch_size):
                group = to_score[start : start + self.batch_size]
                results = split_on_oom(
                    lambda items: self.scorer.score_batch(items),
                    [(s.trajectory, s.alignment, view) for s, view in group],
                    what="teacher scoring",
                    events=self.events,
                )
                for (sample, _), result in zip(group, results, strict=True):
                    sample.provider = result.provider
                    sample.teacher_entropy = [float(x) for x in result.teacher_entropy]
                    sample.target_fingerprint = result.policy_fingerprint
                    sample.entropy_is_lower_bound = result.entropy_is_lower_bound
                    if self.cache is not None and result.shape == "bucketed":
                        sample.cache_key = cache_key(sample.trajectory.trajectory_id, cycle)
                        self.cache.write(sample.cache_key, result, policy_version=version)
            if self.cache is not None:
                self.cache.flush()
        samples = [sample for sample, _ in aligned]
        self.reload(samples, expect_policy_version=expect_version)
        return samples

    def reload(self, samples: Sequence[TrainingSample], *, expect_policy_version: int) -> None:
        """Re-attach providers from disk: the policy-version check happens here."""
        if self.cache is None:
            return
        for sample in samples:
            if sample.cache_key is not None:
                cached = self.cache.read(
                    sample.cache_key,
                    expect_policy_version=expect_policy_version,
                    expect_alignment_digest=sample.alignment.digest(),
                    expect_policy_fingerprint=sample.rollout_fingerprint,
                )
                sample.provider = cached.provider(self.spec)
                sample.target_fingerprint = cached.record.policy_fingerprint
                sample.entropy_is_lower_bound = cached.entropy_is_lower_bound
                if cached.teacher_entropy is not None:
                    sample.teacher_entropy = [float(x) for x in cached.teacher_entropy]

    def describe(self, *, teacher_resident: bool) -> dict[str, Any]:
        """The recorded supervision path (event ``teacher_targets_path``)."""
        cached = self.cache is not None
        return {
            "teacher_resident": teacher_resident,
            "cache": cached,
            "disk_round_trip": cached,
            "reason": RESIDENT_ROUND_TRIP_REASON
            if cached
            else "no cache: targets stay where the scorer produced them",
        }


__all__ = [
    "RESIDENT_ROUND_TRIP_REASON",
    "SelectAndAlign",
    "TeacherTargets",
    "cache_key",
    "make_select_and_align",
]
