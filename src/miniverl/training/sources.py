"""Every way one cycle's training data arrives (docs/design.md §3).

The trainer's cycle is the same for every mode: tasks -> ``source.samples`` -> optimize ->
commit. What differs between the modes is only *where the trajectories come from* and
*whether the teacher scores them* (the mode registry's ``trajectories`` and
``teacher_targets``, ``config/modes.py``); each way of getting data is one small class here,
built by :func:`build_source` from the registry row:

- ``oracle``: the environment's oracle traces, hard labels or teacher targets (:class:`OracleSource`);
- ``teacher_samples``: fresh teacher samples every cycle, hard labels (:class:`TeacherSampleSource`);
- ``teacher_pool``: one fixed pool of teacher samples, teacher targets (:class:`OfflinePoolSource`);
- ``student``: fresh student rollouts, teacher targets (:class:`OnPolicySource`);
- ``mixed``: per batch a fraction λ of student rollouts and the rest fresh teacher samples,
  teacher targets (:class:`MixedPrefixSource`).

Two pieces compose: a source chooses the trajectories, and :class:`TeacherTargets` turns
trajectories into teacher-scored samples (select -> privileged render -> align -> score ->
cache write -> read back through the cache's checks). A source without it trains on hard
labels (the trajectory's own tokens, cross-entropy).

Every collaborator is a constructor argument (runners, scorer, cache, paths, event log,
callables for the live counters); no source sees the trainer. A source's
:class:`Supervision` tells the optimizer what its samples mean (phase name, teacher targets
or hard labels, replay passes, the strict on-policy check, :func:`check_on_policy`), so the
optimizer never reads the mode either.

A source appends its trajectories to ``trajectory_log`` without an fsync (``sync=False``,
``utils.io.append_jsonl``): it is drawn from only inside a trainer cycle or the warm-up, and
the trainer fsyncs the log at its durability points (the end of every cycle and of the
warm-up, before every checkpoint, at run end). Between them the lines have reached the
operating system, which is all a killed process needs.

Two temperatures meet in an OPD cycle and they need not agree: ``rollout.temperature`` τ_s
decides which states the sampled trajectories visit, ``loss.temperature`` τ which
distribution the divergence matches there. Both are recorded in the manifest and every
metric record (:func:`temperature_fields`), and an on-policy run where they differ logs a
``temperature_mismatch`` warning (:func:`temperature_mismatch`).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from miniverl.agent.corrective import CorrectiveTrace, noisy_oracle_trace
from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.config.modes import MODES, WARMUP_MODE, Mode, mode_of_kind
from miniverl.environments.base import Task
from miniverl.errors import OffPolicyError
from miniverl.losses import ChunkTargetProvider, DivergenceSpec
from miniverl.schemas.alignment import AlignmentMap
from miniverl.schemas.trajectory import Trajectory
from miniverl.selection.selectors import SelectionResult, select_positions
from miniverl.teachers.local import TargetMask
from miniverl.training.resolve import split_on_oom
from miniverl.trajectory.alignment import build_alignment_map
from miniverl.trajectory.io import SharedTraces, append_trajectories, read_trajectories
from miniverl.trajectory.masks import model_target_positions
from miniverl.utils.logging import EventLog
from miniverl.utils.seeding import derive_seed

# ====================================================================== what a sample is


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


def hard_label_sample(traj: Trajectory, targets: Sequence[int] | None = None) -> TrainingSample:
    """Every model-generated token of ``traj`` (or only ``targets``), weight 1: the sample of
    cross-entropy arms."""
    targets = (
        model_target_positions(traj.model_generated_mask) if targets is None else list(targets)
    )
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


class FingerprintedSample(Protocol):
    """What the check reads from a ``TrainingSample``."""

    rollout_policy_version: int
    rollout_fingerprint: str | None
    target_fingerprint: str | None

    @property
    def trajectory_id(self) -> str: ...


def check_on_policy(
    samples: Iterable[FingerprintedSample], current_fingerprint: str | None
) -> None:
    """Raise :class:`OffPolicyError` unless every sample was sampled and scored for the current weights."""
    for sample in samples:
        rollout = sample.rollout_fingerprint
        if current_fingerprint is None or rollout != current_fingerprint:
            raise OffPolicyError(
                f"strict OPD: rollout {sample.trajectory_id!r} (policy_version "
                f"{sample.rollout_policy_version}) was sampled by weights with policy fingerprint "
                f"{rollout}, but the student about to be updated has fingerprint {current_fingerprint}"
            )
        if sample.target_fingerprint != rollout:
            raise OffPolicyError(
                f"strict OPD: the teacher targets of {sample.trajectory_id!r} were produced for "
                f"policy fingerprint {sample.target_fingerprint}, but the rollout has {rollout}",
                hint="rescore the rollout with the teacher; do not reuse targets across weights",
            )


# ====================================================================== temperatures


def temperature_fields(config: RunConfig, phase: str | None = None) -> dict[str, float | None]:
    """``sampling_temperature`` and ``loss_temperature`` for a metric record of ``phase``.

    A temperature that does not apply is ``None``: SFT steps (and the warm-up, phase
    ``sft``) train on oracle traces with cross-entropy; ``seqkd`` samples but trains with
    cross-entropy; ``kd_oracle`` matches the teacher but samples nothing.
    """
    mode = WARMUP_MODE if phase == WARMUP_MODE.name else config.mode()
    return {
        "sampling_temperature": config.rollout.temperature if mode.samples else None,
        "loss_temperature": config.loss.temperature if mode.teacher_targets else None,
    }


def temperature_mismatch(config: RunConfig) -> dict[str, Any] | None:
    """The warning event's fields when an on-policy recipe samples and matches at different τ."""
    sampling, loss = config.rollout.temperature, config.loss.temperature
    if not config.mode().on_policy or sampling == loss:
        return None
    return {
        "sampling_temperature": sampling,
        "loss_temperature": loss,
        "explanation": (
            f"the student samples its rollouts at rollout.temperature {sampling:g} and the loss "
            f"matches teacher and student at loss.temperature {loss:g}: a valid objective (sharper "
            "rollouts, full-temperature targets), not a fault, and nothing to fix unless you want "
            f"the loss to match the very distribution it samples from; then set "
            f"loss.temperature={sampling:g} (docs/on-policy.md)"
        ),
    }


# ====================================================================== teacher targets

RESIDENT_ROUND_TRIP_REASON = (
    "teacher targets are read back from the cache even when the teacher is resident: the read "
    "is where the policy-version, alignment-digest and fingerprint checks run, and the update "
    "then trains on exactly the stored (storage-dtype) targets that a resume or a replay reads, "
    "so a resumed run stays bit-identical to an uninterrupted one"
)
"""Why the device -> disk -> device trip of teacher targets is kept (docs/on-policy.md)."""


SelectAndAlign = Callable[[Trajectory, int], tuple[TrainingSample, Trajectory | None]]


def make_select_and_align(
    config: RunConfig,
    privileged_render: Callable[[Trajectory], Trajectory] | None,
    target_mask: TargetMask | None = None,
) -> SelectAndAlign:
    """Selection, the privileged teacher render (if any) and the alignment of one trajectory.

    With ``target_mask`` the positions it rejects leave the selection before alignment, so
    they are neither scored nor in the loss (its token mean runs over the kept positions).
    """

    def select_and_align(
        traj: Trajectory, version: int
    ) -> tuple[TrainingSample, Trajectory | None]:
        selection = select_positions(traj, config.selection, run_seed=config.run.seed)
        if target_mask is not None and selection.positions:
            keep = target_mask(traj.token_ids, selection.positions)
            pairs = [
                (j, w)
                for j, w, k in zip(selection.positions, selection.weights, keep, strict=True)
                if k
            ]
            selection = dataclasses.replace(
                selection,
                positions=[j for j, _ in pairs],
                weights=[w for _, w in pairs],
                span_types=traj.span_types_at([j for j, _ in pairs]),
            )
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


# ====================================================================== sources


def _oracle_with_targets() -> Mode:
    """The mode that scores the oracle's traces with the teacher."""
    return next(m for m in MODES.values() if m.trajectories == "oracle" and m.teacher_targets)


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


class OracleSource:
    """``sft``, the SFT warm-up and ``kd_oracle``: the environment's oracle traces.

    With ``noise_fraction`` (``sft`` only: ``train.sft_noise_fraction``) a seeded share of the
    traces are corrective traces (``agent/corrective.py``): one call corrupted, the
    environment's answer, the oracle's re-call; the corrupted call is not a target.

    Without ``targets`` the samples are hard labels (cross-entropy on the oracle's tokens),
    and the log stores each distinct oracle trace once (:class:`SharedTraces`: later draws of
    a task are reference lines). With ``targets`` every line is written in full, since
    budgets count each scored trajectory's tokens from its own line.
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
        noise_fraction: float = 0.0,
        seed: int = 0,
        mode: Mode | None = None,
    ) -> None:
        self.runner = runner
        self.version = version
        self.trajectory_log = trajectory_log
        self.tasks_per_cycle = tasks_per_cycle
        self.targets = targets
        self.noise_fraction = noise_fraction
        self.seed = seed
        self.shared = SharedTraces(trajectory_log) if targets is None else None
        if mode is None:
            mode = WARMUP_MODE if targets is None else _oracle_with_targets()
        self.supervision = Supervision(phase=mode.name, teacher_targets=targets is not None)

    def _corrective(self, cycle: int, index: int, task: Task) -> CorrectiveTrace | None:
        """A corrective trace in place of task ``index``'s oracle trace, for a seeded
        ``noise_fraction`` of the tasks (``train.sft_noise_fraction``)."""
        if self.noise_fraction <= 0:
            return None
        rng = random.Random(f"sft-noise/{self.seed}/{cycle}/{index}")
        if rng.random() >= self.noise_fraction:
            return None
        return noisy_oracle_trace(
            self.runner, task, rng, trajectory_id=f"{task.task_id}:corrective:c{cycle}:{index}"
        )

    def samples(self, cycle: int, tasks: Sequence[Task]) -> CycleSamples:
        version = self.version()
        kind = "oracle" if self.targets is None else "kd-oracle"
        corrective = [self._corrective(cycle, i, t) for i, t in enumerate(tasks)]
        trajectories = [
            c.trajectory
            if c is not None
            else self.runner.oracle_rollout(
                t, trajectory_id=f"{t.task_id}:{kind}:c{cycle}", policy_version=version
            )
            for c, t in zip(corrective, tasks, strict=True)
        ]
        append_trajectories(self.trajectory_log, trajectories, shared=self.shared, sync=False)
        if self.targets is None:
            return CycleSamples(
                [
                    hard_label_sample(traj, None if c is None else c.targets)
                    for c, traj in zip(corrective, trajectories, strict=True)
                ]
            )
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
        mode: Mode | None = None,
    ) -> None:
        mode = mode or mode_of_kind("student")
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
            phase=mode.name,
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
        append_trajectories(self.trajectory_log, trajectories, sync=False)
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
        mode: Mode | None = None,
        vocab_size: int | None = None,
    ) -> None:
        mode = mode or mode_of_kind("teacher_pool")
        self.supervision = Supervision(phase=mode.name, teacher_targets=True)
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
        append_trajectories(self.trajectory_log, trajectories, sync=False)
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


class TeacherSampleSource:
    """``seqkd``: sequence-level KD, cross-entropy on fresh teacher samples every cycle.

    The teacher samples one rollout per task at ``rollout.temperature`` (1.0 by default)
    and the student is trained on those token ids as hard labels; the teacher scores
    nothing. Stateless: a cycle's samples are a function of (run seed, cycle, tasks).
    """

    def __init__(
        self,
        *,
        teacher_runner: Callable[[], RolloutRunner],
        config: RunConfig,
        version: Callable[[], int],
        events: EventLog,
        trajectory_log: Path,
        mode: Mode | None = None,
    ) -> None:
        mode = mode or mode_of_kind("teacher_samples")
        self.supervision = Supervision(phase=mode.name, teacher_targets=False)
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
            kind=self.supervision.phase,
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
    allows one optimizer step per batch (config/models.py).
    """

    def __init__(
        self,
        *,
        on_policy: OnPolicySource,
        teacher_runner: Callable[[], RolloutRunner],
        student_fraction: float,
        mode: Mode | None = None,
    ) -> None:
        mode = mode or mode_of_kind("mixed")
        self.on_policy = on_policy
        self.teacher_runner = teacher_runner
        self.student_fraction = float(student_fraction)
        self.tasks_per_cycle = on_policy.tasks_per_cycle
        self.supervision = Supervision(phase=mode.name, teacher_targets=True)

    def split(self, cycle: int, count: int) -> list[bool]:
        """``is_student[i]`` for the batch's ``count`` tasks: round(λ · count) of them, seeded."""
        n_student = round(self.student_fraction * count)
        order = list(range(count))
        salt = self.supervision.phase
        random.Random(derive_seed(self.on_policy.config.run.seed, salt, cycle)).shuffle(order)
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


# ====================================================================== helpers


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
    append_trajectories(trajectory_log, trajectories, sync=False)
    events.emit(
        "rollouts_collected",
        echo=f"cycle {cycle}: {len(trajectories)} fresh teacher samples ({kind})",
        cycle=cycle,
        teacher_sampled=True,
        source=kind,
        **summarize_rollouts(trajectories),
    )
    return trajectories


# ====================================================================== the dispatch


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
    """The source of ``MODES[mode]`` (``config/modes.py``): its ``trajectories`` pick the
    class, and ``teacher_targets`` whether the teacher scores them."""
    if mode not in MODES:
        raise ValueError(f"no sample source for run.mode {mode!r}")
    spec = MODES[mode]
    scored = targets if spec.teacher_targets else None
    if spec.trajectories == "oracle":
        return OracleSource(
            runner=student_runner,
            version=version,
            trajectory_log=trajectory_log,
            tasks_per_cycle=config.train.rollouts_per_cycle,
            targets=scored,
            noise_fraction=config.train.sft_noise_fraction if spec.oracle_sft else 0.0,
            seed=config.run.seed,
            mode=spec,
        )
    if spec.trajectories == "teacher_samples":
        return TeacherSampleSource(
            teacher_runner=teacher_runner,
            config=config,
            version=version,
            events=events,
            trajectory_log=trajectory_log,
            mode=spec,
        )
    if spec.trajectories == "teacher_pool":
        return OfflinePoolSource(
            teacher_runner=teacher_runner,
            targets=targets,
            pool_tasks=train_tasks,
            config=config,
            version=version,
            events=events,
            trajectory_log=trajectory_log,
            mode=spec,
            vocab_size=vocab_size,
        )
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
        mode=spec,
    )
    if spec.trajectories == "student":
        return on_policy
    return MixedPrefixSource(
        on_policy=on_policy,
        teacher_runner=teacher_runner,
        student_fraction=config.train.gkd_student_fraction,
        mode=spec,
    )


__all__ = [
    "OFFLINE_POOL_CYCLE",
    "RESIDENT_ROUND_TRIP_REASON",
    "CycleSamples",
    "FingerprintedSample",
    "MixedPrefixSource",
    "OfflinePoolSource",
    "OnPolicySource",
    "OracleSource",
    "SampleSource",
    "SelectAndAlign",
    "Supervision",
    "TargetMask",
    "TeacherSampleSource",
    "TeacherTargets",
    "TrainingSample",
    "build_source",
    "cache_key",
    "check_on_policy",
    "hard_label_sample",
    "make_select_and_align",
    "oom_splitter",
    "summarize_rollouts",
    "teacher_rollouts",
    "temperature_fields",
    "temperature_mismatch",
]
