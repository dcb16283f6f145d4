"""Sources whose trajectories the teacher samples fresh each cycle (``seqkd``, ``gkd_mix``).

Split from :mod:`miniverl.training.sources` (which builds them in ``build_source``) to keep
each module short; the contract is the same :class:`~miniverl.training.sources.SampleSource`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.memory import split_on_oom
from miniverl.training.onpolicy import check_on_policy
from miniverl.training.samples import (
    CycleSamples,
    Supervision,
    hard_label_sample,
    summarize_rollouts,
)
from miniverl.trajectory.io import append_trajectories
from miniverl.utils.logging import EventLog
from miniverl.utils.seeding import derive_seed

if TYPE_CHECKING:
    from miniverl.training.sources import OnPolicySource


def oom_splitter(events: EventLog, what: str) -> Any:
    """A ``rollout_batch`` splitter that halves a decode round on out-of-memory (recorded)."""

    def split(decode: Any, requests: list[Any]) -> Any:
        return split_on_oom(decode, requests, what=what, events=events)

    return split


def teacher_rollouts(
    runner: RolloutRunner,
    tasks: Sequence[Task],
    *,
    config: RunConfig,
    cycle: int,
    kind: str,
    version: int,
    events: EventLog,
    trajectory_log: Path,
) -> list[Trajectory]:
    """Fresh teacher samples of ``tasks`` at ``rollout.temperature``, one per task, logged.

    Seeds derive from ``(run.seed, kind, cycle, index)``, so a rerun (or a provenance test)
    regenerates exactly these ids. Each trajectory is named ``<task>:<kind>:c<cycle>:<i>``
    and carries ``teacher_sampled: true``; the ``rollouts_collected`` event with
    ``teacher_sampled`` is what the budgets count as teacher-generated tokens.
    """
    if not tasks:
        return []
    requests = [
        EpisodeRequest(
            task,
            derive_seed(config.run.seed, kind, cycle, i),
            trajectory_id=f"{task.task_id}:{kind}:c{cycle}:{i}",
            extra_metadata={"teacher_sampled": True, "cycle": cycle},
        )
        for i, task in enumerate(tasks)
    ]
    trajectories = runner.rollout_batch(
        requests,
        batch_size=config.rollout.batch_size or len(requests),
        policy_version=version,
        split=oom_splitter(events, f"{kind} teacher rollout"),
    )
    append_trajectories(trajectory_log, trajectories)
    events.emit(
        "rollouts_collected",
        echo=f"cycle {cycle}: {len(trajectories)} fresh teacher samples ({kind})",
        cycle=cycle,
        teacher_sampled=True,
        source=kind,
        **summarize_rollouts(trajectories),
    )
    return trajectories


class TeacherSampleSource:
    """``seqkd``: sequence-level KD, cross-entropy on fresh teacher samples every cycle.

    The teacher samples one rollout per task at ``rollout.temperature`` (1.0 by default)
    and the student is trained on those token ids as hard labels; the teacher scores
    nothing. Stateless: a cycle's samples are a function of (run seed, cycle, tasks).
    """

    supervision = Supervision(phase="seqkd", teacher_targets=False)

    def __init__(
        self,
        *,
        teacher_runner: Callable[[], RolloutRunner],
        config: RunConfig,
        version: Callable[[], int],
        events: EventLog,
        trajectory_log: Path,
    ) -> None:
        self.teacher_runner = teacher_runner
        self.config = config
        self.version = version
        self.events = events
        self.trajectory_log = trajectory_log
        self.tasks_per_cycle = config.train.rollouts_per_cycle

    def samples(self, cycle: int, tasks: Sequence[Task]) -> CycleSamples:
        version = self.version()
        trajectories = teacher_rollouts(
            self.teacher_runner(),
            tasks,
            config=self.config,
            cycle=cycle,
            kind="seqkd",
            version=version,
            events=self.events,
            trajectory_log=self.trajectory_log,
        )
        return CycleSamples(
            [hard_label_sample(traj) for traj in trajectories], rollout_version=version
        )

    def finish_cycle(self, cycle: int) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class MixedPrefixSource:
    """``gkd_mix``: per batch, a fraction λ (``train.gkd_student_fraction``) of the tasks get a
    fresh student rollout and the rest a fresh teacher sample; all are scored by the teacher.

    Which tasks go to the student is a seeded permutation of the batch (run seed, cycle), so
    a resumed run draws the same split. The student half goes through
    :meth:`OnPolicySource.collect` and is checked on-policy (:func:`check_on_policy`) before
    it leaves the source; the teacher half is off-policy by design, so the optimizer's
    per-group strict check does not apply (``strict_on_policy=False``) and the recipe
    allows one optimizer step per batch (config/recipe.py).
    """

    def __init__(
        self,
        *,
        on_policy: OnPolicySource,
        teacher_runner: Callable[[], RolloutRunner],
        student_fraction: float,
    ) -> None:
        self.on_policy = on_policy
        self.teacher_runner = teacher_runner
        self.student_fraction = float(student_fraction)
        self.tasks_per_cycle = on_policy.tasks_per_cycle
        self.supervision = Supervision(phase="gkd_mix", teacher_targets=True)

    def split(self, cycle: int, count: int) -> list[bool]:
        """``is_student[i]`` for the batch's ``count`` tasks: round(λ · count) of them, seeded."""
        n_student = round(self.student_fraction * count)
        order = list(range(count))
        random.Random(derive_seed(self.on_policy.config.run.seed, "gkd_mix", cycle)).shuffle(order)
        chosen = set(order[:n_student])
        return [i in chosen for i in range(count)]

    def samples(self, cycle: int, tasks: Sequence[Task]) -> CycleSamples:
        src = self.on_policy
        version = src.version()
        is_student = self.split(cycle, len(tasks))
        student_tasks = [t for t, s in zip(tasks, is_student, strict=True) if s]
        student = src.collect(student_tasks, cycle) if student_tasks else []
        teacher = teacher_rollouts(
            self.teacher_runner(),
            [t for t, s in zip(tasks, is_student, strict=True) if not s],
            config=src.config,
            cycle=cycle,
            kind="gkd-teacher",
            version=version,
            events=src.events,
            trajectory_log=src.trajectory_log,
        )
        scored = src.targets.score(
            [*student, *teacher], cycle=cycle, version=version, expect_version=version
        )
        check_on_policy([s for s in scored[: len(student)] if s.trainable], src.fingerprint())
        by_kind = iter(scored[: len(student)]), iter(scored[len(student) :])
        ordered = [next(by_kind[0]) if s else next(by_kind[1]) for s in is_student]
        return CycleSamples(ordered, summarize_rollouts(student), rollout_version=version)

    def finish_cycle(self, cycle: int) -> None:
        self.on_policy.finish_cycle(cycle)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


__all__ = ["MixedPrefixSource", "TeacherSampleSource", "oom_splitter", "teacher_rollouts"]
