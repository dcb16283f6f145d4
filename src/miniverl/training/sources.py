"""Sample sources: where one cycle's training samples come from (docs/design.md §3).

The trainer's cycle is the same for every mode: tasks -> ``source.samples`` -> optimize ->
commit. What differs between the modes is only *where the trajectories come from* and
*whether the teacher scores them*; each way of getting data is one small class here, built
by :func:`build_source` (the only place that reads the mode):

- ``sft``: oracle traces, hard labels (:class:`OracleSource`);
- ``kd_oracle``: oracle traces, teacher targets (:class:`OracleSource` with targets);
- ``seqkd``: fresh teacher samples every cycle, hard labels
  (:class:`~miniverl.training.teacher_sources.TeacherSampleSource`);
- ``offline_kd``: one fixed pool of teacher samples, teacher targets (:class:`OfflinePoolSource`);
- ``opd``: fresh student rollouts, teacher targets (:class:`OnPolicySource`);
- ``gkd_mix``: per batch a fraction λ of student rollouts and the rest fresh teacher samples,
  teacher targets (:class:`~miniverl.training.teacher_sources.MixedPrefixSource`).

Two pieces compose:

- a **prefix provider** chooses the trajectories (the table's middle column);
- :class:`~miniverl.training.targets.TeacherTargets` (``training/targets.py``) turns trajectories into teacher-scored samples (select -> privileged
  render -> align -> score -> cache write -> read back through the cache's checks). A source
  without it trains on hard labels (the trajectory's own tokens, cross-entropy).

Every collaborator is a constructor argument (runners, scorer, cache, paths, event log,
callables for the live counters); no source sees the trainer. A source's
:class:`Supervision` tells the optimizer what its samples mean (phase name, teacher targets
or hard labels, replay passes, the strict on-policy check), so the optimizer never reads
the mode either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.onpolicy import check_on_policy
from miniverl.training.samples import (
    CycleSamples,
    Supervision,
    TrainingSample,
    hard_label_sample,
    summarize_rollouts,
)
from miniverl.training.targets import (
    RESIDENT_ROUND_TRIP_REASON,
    TeacherTargets,
    cache_key,
    make_select_and_align,
)
from miniverl.training.teacher_sources import (
    MixedPrefixSource,
    TeacherSampleSource,
    oom_splitter,
    teacher_rollouts,
)
from miniverl.trajectory.io import append_trajectories, read_trajectories
from miniverl.utils.logging import EventLog
from miniverl.utils.seeding import derive_seed

OFFLINE_POOL_CYCLE = -1
"""Cache keys of the offline_kd pool carry this cycle: it is scored once, before cycle 0."""


class SampleSource(Protocol):
    """Produces the :class:`TrainingSample` s of one cycle; checkpointable for resume."""

    supervision: Supervision
    tasks_per_cycle: int
    """Fresh training tasks the trainer draws (and hands to :meth:`samples`) each cycle."""

    def samples(self, cycle: int, tasks: Sequence[Task]) -> CycleSamples: ...

    def finish_cycle(self, cycle: int) -> None:
        """After the cycle's update: housekeeping of the source's own storage."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# ====================================================================== sources


class OracleSource:
    """``sft``, the SFT warm-up and ``kd_oracle``: the environment's oracle traces.

    Without ``targets`` the samples are hard labels (cross-entropy on the oracle's tokens).
    With ``targets`` (``kd_oracle``) the teacher scores the oracle's states and the student
    matches its distribution there (forward KL at ``loss.temperature``); those trajectories
    are named ``<task>:kd-oracle:c<cycle>`` so budgets count them as teacher-scored.
    """

    def __init__(
        self,
        *,
        runner: RolloutRunner,
        version: Callable[[], int],
        trajectory_log: Path,
        tasks_per_cycle: int,
        targets: TeacherTargets | None = None,
    ) -> None:
        self.runner = runner
        self.version = version
        self.trajectory_log = trajectory_log
        self.tasks_per_cycle = tasks_per_cycle
        self.targets = targets
        self.supervision = (
            Supervision(phase="sft", teacher_targets=False)
            if targets is None
            else Supervision(phase="kd_oracle", teacher_targets=True)
        )

    def samples(self, cycle: int, tasks: Sequence[Task]) -> CycleSamples:
        version = self.version()
        kind = "oracle" if self.targets is None else "kd-oracle"
        trajectories = [
            self.runner.oracle_rollout(
                t, trajectory_id=f"{t.task_id}:{kind}:c{cycle}", policy_version=version
            )
            for t in tasks
        ]
        append_trajectories(self.trajectory_log, trajectories)
        if self.targets is None:
            return CycleSamples([hard_label_sample(traj) for traj in trajectories])
        scored = self.targets.score(
            trajectories, cycle=cycle, version=version, expect_version=version
        )
        return CycleSamples(scored)

    def finish_cycle(self, cycle: int) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class OnPolicySource:
    """``opd``: fresh student rollouts every cycle, scored by the teacher at those states.

    Strict freshness: the cache read expects the *current* parameter version, and every
    sample is checked against the student's current fingerprint (:func:`check_on_policy`)
    before it leaves the source; the optimizer checks again before each group.
    """

    def __init__(
        self,
        *,
        runner: RolloutRunner,
        student: Any,
        targets: TeacherTargets,
        config: RunConfig,
        version: Callable[[], int],
        step: Callable[[], int],
        fingerprint: Callable[[], str | None],
        events: EventLog,
        progress: Any,
        trajectory_log: Path,
    ) -> None:
        self.runner = runner
        self.student = student
        self.targets = targets
        self.config = config
        self.version = version
        self.step = step
        self.fingerprint = fingerprint
        self.events = events
        self.progress = progress
        self.trajectory_log = trajectory_log
        train = config.train
        strict = train.opd_freshness == "strict"
        self.tasks_per_cycle = train.rollouts_per_cycle
        self.supervision = Supervision(
            phase="opd",
            teacher_targets=True,
            passes=train.replay_passes if train.opd_freshness == "replay" else 1,
            strict_on_policy=strict,
        )

    def expected_version(self, rollout_version: int) -> int:
        """Strict OPD: the current parameters; replay: the data's version."""
        if self.supervision.strict_on_policy:
            return self.version()
        return rollout_version

    def collect(self, tasks: Sequence[Task], cycle: int) -> list[Trajectory]:
        """Sample one rollout per task from the current student."""
        cfg = self.config
        self.student.set_train(False)
        version = self.version()
        requests = [
            EpisodeRequest(
                task, cfg.run.seed + self.step() * 1013 + offset, extra_metadata={"cycle": cycle}
            )
            for offset, task in enumerate(tasks)
        ]
        size = cfg.rollout.batch_size or len(requests)
        trajectories: list[Trajectory] = []
        with self.progress.task(f"rollouts cycle {cycle}", len(tasks)) as advance:
            for start in range(0, len(requests), size):
                batch = self.runner.rollout_batch(
                    requests[start : start + size],
                    batch_size=size,
                    policy_version=version,
                    split=oom_splitter(self.events, "rollout"),
                )
                trajectories.extend(batch)
                for _ in batch:
                    advance()
        append_trajectories(self.trajectory_log, trajectories)
        stats = summarize_rollouts(trajectories)
        self.events.emit(
            "rollouts_collected",
            echo=f"cycle {cycle}: {stats['solved']}/{stats['tasks']} solved at version {version}",
            cycle=cycle,
            policy_version=version,
            **stats,
        )
        return trajectories

    def samples(self, cycle: int, tasks: Sequence[Task]) -> CycleSamples:
        version = self.version()
        trajectories = self.collect(tasks, cycle)
        samples = self.targets.score(
            trajectories,
            cycle=cycle,
            version=version,
            expect_version=self.expected_version(version),
        )
        if self.supervision.strict_on_policy:
            check_on_policy([s for s in samples if s.trainable], self.fingerprint())
        return CycleSamples(samples, summarize_rollouts(trajectories), rollout_version=version)

    def finish_cycle(self, cycle: int) -> None:
        """Keep only the newest ``cache.keep_versions`` policy versions of targets."""
        cache, keep = self.targets.cache, self.config.cache.keep_versions
        if cache is None or keep is None:
            return
        present = sorted(int(v) for v in cache.stats().get("versions", {}))
        keep_set = set(present[-keep:])
        if set(present) - keep_set:
            report = cache.prune(keep_versions=keep_set)
            self.events.emit("cache_pruned", kept_versions=sorted(keep_set), report=report)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class OfflinePoolSource:
    """``offline_kd``: one fixed pool of teacher rollouts over all training tasks, scored once
    into a frozen cache, walked with a cursor (``rollouts_per_cycle`` samples a cycle).

    Its state (pool ids, the version they were sampled at, the cursor) is checkpointed; on
    resume the pool's trajectories come back from the trajectory log and their targets from
    the cache, so the walk continues at the same position.
    """

    supervision = Supervision(phase="offline_kd", teacher_targets=True)
    tasks_per_cycle = 0

    def __init__(
        self,
        *,
        teacher_runner: Callable[[], RolloutRunner],
        targets: TeacherTargets,
        pool_tasks: Sequence[Task],
        config: RunConfig,
        version: Callable[[], int],
        events: EventLog,
        trajectory_log: Path,
        vocab_size: int | None = None,
    ) -> None:
        self.teacher_runner = teacher_runner
        self.targets = targets
        self.pool_tasks = list(pool_tasks)
        self.config = config
        self.version = version
        self.events = events
        self.trajectory_log = trajectory_log
        self.vocab_size = vocab_size
        self.pool: list[str] = []
        self.pool_version: int | None = None
        self.cursor = 0
        self._samples: dict[str, TrainingSample] = {}

    def _build_pool(self, cycle: int) -> int:
        cfg = self.config
        version = self.version()
        trajectories = self.teacher_runner().rollout_batch(
            [
                EpisodeRequest(
                    t,
                    derive_seed(cfg.run.seed, "offline", i),
                    extra_metadata={"offline_kd_pool": True},
                )
                for i, t in enumerate(self.pool_tasks)
            ],
            batch_size=cfg.rollout.batch_size or cfg.train.rollouts_per_cycle,
            policy_version=version,
            split=oom_splitter(self.events, "offline rollout"),
        )
        append_trajectories(self.trajectory_log, trajectories)
        self.pool_version = version
        samples = self.targets.score(
            trajectories, cycle=OFFLINE_POOL_CYCLE, version=version, expect_version=version
        )
        self.pool = [s.trajectory_id for s in samples]
        self._samples = {s.trajectory_id: s for s in samples}
        self.events.emit(
            "rollouts_collected",
            echo=f"offline_kd: {len(trajectories)} fixed teacher rollouts",
            cycle=cycle,
            offline_kd_pool=True,
            **summarize_rollouts(trajectories),
        )
        return version

    def samples(self, cycle: int, tasks: Sequence[Task]) -> CycleSamples:
        rollout_version = None
        if not self.pool:
            rollout_version = self._build_pool(cycle)
        else:
            self.events.emit(
                "offline_kd_reuse",
                echo=f"cycle {cycle}: reusing the frozen cache",
                cycle=cycle,
                pool=len(self.pool),
                cache_policy_version=self.pool_version,
                parameter_version=self.version(),
            )
        return CycleSamples(list(self._walk()), rollout_version=rollout_version)

    def _walk(self) -> Iterator[TrainingSample]:
        for _ in range(self.config.train.rollouts_per_cycle):
            yield self._samples[self.pool[self.cursor % len(self.pool)]]
            self.cursor += 1

    def finish_cycle(self, cycle: int) -> None:
        """The frozen cache is never pruned."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"pool": list(self.pool), "version": self.pool_version, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore position; re-read the pool's rollouts from the log and targets from the cache."""
        self.pool = list(state.get("pool") or [])
        self.pool_version = state.get("version")
        self.cursor = int(state.get("cursor") or 0)
        if not self.pool:
            self._samples = {}
            return
        by_id = {
            t.trajectory_id: t
            for t in read_trajectories(self.trajectory_log, vocab_size=self.vocab_size)
            if t.metadata.get("offline_kd_pool")
        }
        version = int(self.pool_version or 0)
        samples = {}
        for tid in self.pool:
            sample, _ = self.targets.select_and_align(by_id[tid], version)
            if sample.num_positions and self.targets.cache is not None:
                sample.cache_key = cache_key(tid, OFFLINE_POOL_CYCLE)
            samples[tid] = sample
        self.targets.reload(list(samples.values()), expect_policy_version=version)
        self._samples = samples


def build_source(
    mode: str,
    *,
    config: RunConfig,
    student_runner: RolloutRunner,
    student: Any,
    teacher_runner: Callable[[], RolloutRunner],
    targets: TeacherTargets,
    train_tasks: Sequence[Task],
    version: Callable[[], int],
    step: Callable[[], int],
    fingerprint: Callable[[], str | None],
    events: EventLog,
    progress: Any,
    trajectory_log: Path,
    vocab_size: int | None = None,
) -> SampleSource:
    """The one place that maps ``run.mode`` to a source (the module docstring's table)."""
    if mode in ("sft", "kd_oracle"):
        return OracleSource(
            runner=student_runner,
            version=version,
            trajectory_log=trajectory_log,
            tasks_per_cycle=config.train.rollouts_per_cycle,
            targets=targets if mode == "kd_oracle" else None,
        )
    if mode == "seqkd":
        return TeacherSampleSource(
            teacher_runner=teacher_runner,
            config=config,
            version=version,
            events=events,
            trajectory_log=trajectory_log,
        )
    if mode == "offline_kd":
        return OfflinePoolSource(
            teacher_runner=teacher_runner,
            targets=targets,
            pool_tasks=train_tasks,
            config=config,
            version=version,
            events=events,
            trajectory_log=trajectory_log,
            vocab_size=vocab_size,
        )
    if mode in ("opd", "gkd_mix"):
        on_policy = OnPolicySource(
            runner=student_runner,
            student=student,
            targets=targets,
            config=config,
            version=version,
            step=step,
            fingerprint=fingerprint,
            events=events,
            progress=progress,
            trajectory_log=trajectory_log,
        )
        if mode == "opd":
            return on_policy
        return MixedPrefixSource(
            on_policy=on_policy,
            teacher_runner=teacher_runner,
            student_fraction=config.train.gkd_student_fraction,
        )
    raise ValueError(f"no sample source for run.mode {mode!r}")


__all__ = [
    "OFFLINE_POOL_CYCLE",
    "RESIDENT_ROUND_TRIP_REASON",
    "CycleSamples",
    "MixedPrefixSource",
    "OfflinePoolSource",
    "OnPolicySource",
    "OracleSource",
    "SampleSource",
    "Supervision",
    "TeacherSampleSource",
    "TeacherTargets",
    "TrainingSample",
    "build_source",
    "cache_key",
    "hard_label_sample",
    "make_select_and_align",
    "oom_splitter",
    "summarize_rollouts",
    "teacher_rollouts",
]
