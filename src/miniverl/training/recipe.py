"""``OPDTrainer``: the on-policy distillation recipe, ``setup()`` / ``train()`` / ``loss_step()``.

Read :meth:`OPDTrainer.train` top to bottom: every cycle draws its tasks, gets its samples
from the mode's source (rollouts, then teacher targets), and for every optimizer group runs
:meth:`OPDTrainer.loss_step` (the loss and its ``backward()``) and :func:`apply_update`
(clip, ``optimizer.step()``); a committed step is a new policy version. The same loop runs
the SFT warm-up's cycles (numbered negative) before the recipe's.

The modes (``run.mode``, ``config/modes.py``) differ only in where a cycle's trajectories
come from and whether the teacher scores them, and that is the
:class:`~miniverl.training.sources.SampleSource` built once in :meth:`OPDTrainer.setup`
(``training/sources.py``): the cycle has no mode branch. :meth:`OPDTrainer.setup` builds
every collaborator from explicit inputs (``training/assembly.py``); the counters they share
are :class:`~miniverl.training.run_state.RunState` (``trainer.state``).

What a study adds is passed in, never built here: the ``teacher`` (a ready backend such as
the lab's oracle or fitted teacher, or the path of a teacher checkpoint) with the
``teacher_record`` to keep about it, ``initial_weights`` (a cold start), ``warmup_until``
(a criterion that ends the warm-up early, :class:`WarmupUntil`) and ``stop_after_cycle``
(a budget that ends training early, :class:`CycleStop`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.errors import CheckpointError, RunStorageError
from miniverl.losses import (
    chunked_selected_position_loss,
    concat_providers,
    normalize_trajectory_weights,
)
from miniverl.models.base import CausalLMBackend
from miniverl.models.batching import build_padded_trajectory_batch, length_buckets
from miniverl.models.factory import build_tokenizer
from miniverl.schemas.records import CycleRecord, StepRecord, check_state_cycle
from miniverl.schemas.trajectory import Trajectory
from miniverl.selection.selectors import aggregate_selection_stats
from miniverl.training import assembly
from miniverl.training.checkpoint import (
    ResumeCounters,
    choose_resume_checkpoint,
    load_training_checkpoint,
    prepare_resume,
    prune_cycle_checkpoints,
    restore_logs,
    run_logs,
    source_state,
    verify_logs,
    write_training_checkpoint,
)
from miniverl.training.cold_start import check_cold_start, load_cold_start
from miniverl.training.evaluate import (
    eval_summary,
    evaluate_policy,
    record_evaluation,
    relabel_evaluation,
)
from miniverl.training.live import (
    LiveSinks,
    ProgressReporter,
    cycle_scalars,
    cycle_summary,
    format_live_line,
    step_scalars,
    write_token_analysis,
)
from miniverl.training.manifest import LocalRoleGraph, ManifestInputs, build_manifest
from miniverl.training.optim import Schedule, build_optimizer, load_optimizer_state, scheduled_lr
from miniverl.training.optim import set_lr as set_learning_rate
from miniverl.training.resolve import ResolvedRun, after_oom, resolve_device
from miniverl.training.run_state import RunState, shuffled_order
from miniverl.training.sources import (
    CycleSamples,
    OracleSource,
    SampleSource,
    Supervision,
    TrainingSample,
    build_source,
    check_on_policy,
    oom_splitter,
    temperature_fields,
)
from miniverl.utils import gpu
from miniverl.utils.env import collect_environment
from miniverl.utils.gpu import is_oom_error
from miniverl.utils.io import write_json
from miniverl.utils.logging import EventLog, MetricsLog, make_console
from miniverl.utils.runlock import run_lock
from miniverl.utils.runs import RunPaths
from miniverl.utils.seeding import restore_rng_state, seed_everything


class WarmupUntil(Protocol):
    """Ends the SFT warm-up early: the lab's "until greedy validation success >= t".

    The warm-up runs at most ``max_cycles`` cycles (instead of ``train.sft_warmup_cycles``).
    After warm-up cycle ``k`` (0-based; ``last`` for the final one) :meth:`check` measures
    the student behind ``runner`` or returns ``None`` when this cycle is not measured; the
    warm-up stops after the first measured cycle whose value ``reached`` the criterion.
    """

    max_cycles: int

    def settings(self) -> dict[str, Any]:
        """The criterion as the ``sft_warmup_start`` / ``sft_warmup_end`` events record it."""
        ...

    def describe(self) -> str:
        """One phrase for the console, e.g. ``validation success at k=1 >= 0.8``."""
        ...

    def check(
        self,
        k: int,
        *,
        last: bool,
        runner: RolloutRunner,
        splits: Mapping[str, Sequence[Task]],
        version: int,
        events: EventLog,
    ) -> tuple[float, bool] | None:
        """``(value, reached)`` after warm-up cycle ``k``, or ``None`` (not measured)."""
        ...


class CycleStop(Protocol):
    """Ends training early after a cycle: the lab's compute cap (``lab/benchmark/budgets.py``).

    :meth:`begin` is called once, just before the first cycle this process runs;
    :meth:`after_cycle` after every cycle, with the optimizer steps it took. The final
    evaluation and checkpoint still run after a stop.
    """

    def begin(self, paths: RunPaths, events: EventLog) -> None: ...

    def after_cycle(self, cycle: int, *, steps: int, global_step: int) -> bool: ...


class OPDTrainer:
    """Runs one ``RunConfig`` into one run directory; its sample source is the mode."""

    def __init__(
        self,
        config: RunConfig,
        *,
        output_dir: str | Path | None = None,
        submitted_recipe: bytes | None = None,
        resume: bool = False,
        resume_from: str | None = None,
        quiet: bool = False,
        progress: bool | None = None,
        verbose: bool = False,
        teacher: CausalLMBackend | str | Path | None = None,
        teacher_record: Mapping[str, Any] | None = None,
        initial_weights: str | Path | None = None,
        warmup_until: WarmupUntil | None = None,
        stop_after_cycle: CycleStop | None = None,
    ) -> None:
        """``teacher``: a ready backend to score with (placed per the memory plan), or the path
        of a teacher checkpoint (like ``models.teacher.checkpoint``); default: the teacher the
        recipe describes. ``teacher_record``: what the caller keeps about it (its fit report),
        written to the manifest, ``eval.json`` and every checkpoint. ``initial_weights``: a cold
        start directory loaded weights-only into the student instead of the warm-up
        (``training/cold_start.py``). ``resume`` / ``resume_from``: continue the run in
        ``output_dir`` from its latest (or the named) checkpoint.
        """
        self.config = config
        self.paths = RunPaths(output_dir or Path("runs") / config.run.name)
        self.submitted_recipe = submitted_recipe
        self.resume = resume or resume_from is not None
        self.resume_from = resume_from
        self.given_teacher = teacher
        self.teacher_record = dict(teacher_record) if teacher_record is not None else None
        self.initial_weights = Path(initial_weights) if initial_weights is not None else None
        if self.initial_weights is not None:
            check_cold_start(self.initial_weights, config)
        self.warmup_until = warmup_until
        self.stop_after_cycle = stop_after_cycle
        self.console = make_console(quiet)
        self.progress = ProgressReporter(self.console, progress)
        self.events = EventLog(self.paths.events, self.console, verbose=verbose)
        self.metrics = MetricsLog(self.paths.metrics)
        self.logs = run_logs(self.paths)
        self.state = RunState()
        self.live: LiveSinks | None = None
        self.last_cycle_summary: dict[str, Any] = {}
        self.ready = False
        self._stop = False
        self._advance: Any = lambda n=1, stats=None: None
        self._warmup_outcome: dict[str, Any] | None = None
        self._last_eval: tuple[tuple[Any, ...], dict[str, Any], list[Trajectory]] | None = None

    # ================================================================== setup

    def setup(self) -> None:
        """Build everything a run needs; every ``auto`` is decided once, by ``resolve_run``.

        A fresh run refuses a directory that already holds one and writes its config files
        and manifest; a resumed run first puts its directory back to its last checkpoint
        (:func:`~miniverl.training.checkpoint.prepare_resume`).
        """
        cfg, paths, state = self.config, self.paths, self.state
        with run_lock(paths.root):
            if self.resume:
                self.resume = prepare_resume(
                    paths, cfg, resume_from=self.resume_from, events=self.events
                )
            else:
                assembly.refuse_existing_run(paths)
        seed_everything(cfg.run.seed)
        device = resolve_device(cfg, cuda_available=torch.cuda.is_available())
        self.tokenizer = build_tokenizer(cfg)
        self.environment = make_environment(cfg.environment.name, **cfg.environment.params)
        self.splits = build_splits(self.environment, cfg.environment)
        self.tasks_by_id = {t.task_id: t for split in self.splits.values() for t in split}
        self.task_order = shuffled_order(len(self.splits["train"]), cfg.run.seed)
        self.runtime = assembly.build_run_runtime(
            cfg,
            self.tokenizer,
            device,
            with_teacher=cfg.mode().uses_teacher,
            teacher=self.given_teacher,
        )
        self.student: CausalLMBackend = self.runtime.student
        self.teacher: CausalLMBackend | None = self.runtime.teacher
        planned = assembly.recorded_host_decisions(cfg, paths) if self.resume else cfg
        self.resolved: ResolvedRun = assembly.plan_run(
            planned, device=device, student=self.student, teacher=self.teacher
        )
        self.resolved_config = self.resolved.to_config(cfg)
        self.device = self.resolved.device
        state.chunk_size = self.resolved.chunk_size
        state.trajectory_batch_size = self.resolved.trajectory_batch_size
        self.runner = RolloutRunner(self.student, self.environment, cfg.rollout)
        self.scorer, self.cache = assembly.build_supervision(
            cfg,
            self.resolved,
            teacher=self.teacher,
            tokenizer_fingerprint=self.tokenizer.fingerprint,
            paths=paths,
        )
        self.optimizer = build_optimizer(self.student.trainable_parameters(), cfg.train)
        self.schedule = Schedule.for_train(cfg.train, self.resolved.planned_steps)
        self.teacher_targets = assembly.teacher_targets(
            cfg,
            self.resolved,
            scorer=self.scorer,
            cache=self.cache,
            runner=self.runner,
            tasks_by_id=self.tasks_by_id,
            events=self.events,
            swap=partial(
                assembly.teacher_on_device, self.student, self.teacher, self.optimizer, self.device
            ),
        )
        self.source = build_source(
            cfg.run.mode,
            config=cfg,
            student_runner=self.runner,
            student=self.student,
            teacher_runner=partial(RolloutRunner, self.teacher, self.environment, cfg.rollout),
            targets=self.teacher_targets,
            train_tasks=self.splits["train"],
            version=lambda: state.parameter_version,
            step=lambda: state.global_step,
            fingerprint=lambda: state.policy_fingerprint,
            events=self.events,
            progress=self.progress,
            trajectory_log=paths.trajectories,
            vocab_size=self.resolved.vocab_size,
        )
        self.warmup_source = OracleSource(
            runner=self.runner,
            version=lambda: state.parameter_version,
            trajectory_log=paths.trajectories,
            tasks_per_cycle=cfg.train.rollouts_per_cycle,
        )
        self.role_graph = LocalRoleGraph.local(
            runtime=self.runtime,
            runner=self.runner,
            environment=self.environment,
            scorer=self.scorer,
            cache_directory=None if self.cache is None else self.cache.directory,
            recipe=type(self).__name__,
        )
        state.refresh_fingerprint(self.student)
        self.ready = True
        if not self.resume:
            assembly.write_config_files(paths, cfg, self.resolved, self.submitted_recipe)
            write_json(paths.environment, collect_environment())
            write_json(paths.manifest, self.build_manifest())

    def build_manifest(self) -> dict[str, Any]:
        """``manifest.json`` as of now (training/manifest.py; docs/design.md §5.2)."""
        return build_manifest(
            ManifestInputs(
                config=self.config,
                resolved=self.resolved,
                run_id=self.paths.root.name,
                environment=self.environment,
                split_sizes={k: len(v) for k, v in self.splits.items()},
                tokenizer=self.tokenizer,
                student=self.student,
                teacher=self.teacher,
                role_graph=self.role_graph,
                scorer_shape=None if self.scorer is None else self.scorer.shape,
                cache_in_use=self.cache is not None,
                state=self.state,
                teacher_record=self.teacher_record,
                teacher_checkpoint=self.runtime.teacher_checkpoint,
            )
        )

    # ================================================================== the run

    def train(self) -> dict[str, Any]:
        """The whole run under the run directory's write lock; returns the ``eval.json`` summary.

        Tasks -> rollouts -> teacher targets -> loss -> ``backward()`` -> ``optimizer.step()``
        -> commit, cycle after cycle: the SFT warm-up's cycles first (when the run warms up),
        then the recipe's. The run's logs reach the disk at the durability points (the end of
        every cycle and of the warm-up, every checkpoint, the end), not on every append.
        """
        if not self.ready:
            self.setup()
        with run_lock(self.paths.root), self._deferred_log_sync():
            started = time.perf_counter()
            self._begin()
            try:
                for cycle, source in self._cycles():
                    state, supervision = self.state, source.supervision
                    state.cycle = cycle
                    before = (
                        time.perf_counter(),
                        state.parameter_version,
                        state.policy_fingerprint,
                    )
                    tasks = self.next_tasks(source.tasks_per_cycle)
                    batch = source.samples(cycle, tasks)  # rollouts and their teacher targets
                    steps = []
                    for group in self._groups(batch.samples, supervision):
                        step_started = time.perf_counter()
                        gpu.reset_peak(self.device if self.device.startswith("cuda") else None)
                        loss = self.loss_step(group, teacher_targets=supervision.teacher_targets)
                        update = apply_update(  # clip, lr, optimizer.step()
                            self.optimizer,
                            self.student.trainable_parameters(),
                            lr=self._lr(),
                            max_grad_norm=self.config.train.max_grad_norm,
                            events=self.events,
                            global_step=state.global_step,
                        )
                        if update.committed:  # a new policy version
                            state.global_step += 1
                            state.parameter_version += 1
                            state.refresh_fingerprint(self.student)
                        steps.append(
                            self._log_step(
                                group, supervision, cycle, len(steps), loss, update, step_started
                            )
                        )
                    self._end_cycle(cycle, source, batch, steps, before)  # logs durable
                    self._after_cycle(cycle, steps)  # held-out evaluation, checkpoint, stop
                return self._finish(started)
            except KeyboardInterrupt:
                self.events.emit(
                    "run_end",
                    echo="interrupted; resume with --resume",
                    status="interrupted",
                    global_optimizer_step=self.state.global_step,
                )
                raise
            finally:
                if self.live is not None:
                    self.live.close()

    def loss_step(self, group: Sequence[TrainingSample], *, teacher_targets: bool) -> GroupResult:
        """The gradient of one optimizer group's loss, accumulated into the ``.grad`` buffers.

        The group's rows are padded into length-bucketed micro-batches of at most
        ``state.trajectory_batch_size`` trajectories; each micro-batch's hidden states at the
        selected positions go through the chunked loss (``losses/chunked.py``), which projects
        ``state.chunk_size`` rows at a time and calls ``backward()``. Each micro-batch is scaled
        by rows / G, so the sum is the group mean. Without teacher targets the loss is plain
        cross-entropy (weight 1); with them the cross-entropy weight is
        ``loss.sampled_token_nll_weight``.

        Out of memory: the whole group is recomputed from zeroed gradients with the chunk
        halved; once the chunk cannot shrink, with the trajectory batch halved and the chunk
        back at its size before this step (:func:`~miniverl.training.resolve.after_oom`).
        Neither size changes the loss or the gradient; both stay shrunk for the rest of the run.
        """
        state = self.state
        ce_weight = self.config.loss.sampled_token_nll_weight if teacher_targets else 1.0
        step_chunk, halvings = state.chunk_size, 0
        while True:
            self.optimizer.zero_grad(set_to_none=True)
            out = GroupResult()
            try:
                lengths = [s.trajectory.length for s in group]
                for bucket in length_buckets(lengths, int(state.trajectory_batch_size)):
                    rows = [group[i] for i in bucket]
                    batch = build_padded_trajectory_batch(
                        token_ids=[r.trajectory.token_ids for r in rows],
                        selected_positions=[r.alignment.student_prediction_positions for r in rows],
                        pad_token_id=self.tokenizer.pad_token_id,
                        device=self.student.device,
                    )
                    hidden = self.student.hidden_states_at_batch(batch, with_grad=True)  # [N, H]
                    weights = torch.cat(
                        normalize_trajectory_weights([r.alignment.token_weights for r in rows])
                    ).to(hidden.device)
                    targets = torch.tensor(
                        [t for r in rows for t in r.alignment.target_token_ids],
                        dtype=torch.long,
                        device=hidden.device,
                    )
                    out.add(
                        chunked_selected_position_loss(
                            hidden_states=hidden,
                            lm_head=self.student.project,
                            weights=weights,
                            weight_normalizer=float(len(rows)),
                            provider=concat_providers([r.provider for r in rows])
                            if teacher_targets
                            else None,
                            target_token_ids=targets,
                            ce_weight=ce_weight,
                            chunk_size=state.chunk_size,
                            backward=True,
                            loss_scale=len(rows) / len(group),
                            span_types=[t for r in rows for t in r.alignment.span_types],
                        )
                    )
                return out
            except Exception as exc:
                if not is_oom_error(exc):
                    raise
                halvings, state.chunk_size, state.trajectory_batch_size = after_oom(
                    exc,
                    halvings=halvings,
                    chunk_size=state.chunk_size,
                    batch_rows=state.trajectory_batch_size,
                    step_chunk_size=step_chunk,
                    events=self.events,
                )

    # ================================================================== around the cycles

    def _begin(self) -> None:
        """Before the first cycle: ``run_start``, the live sinks, then where the weights come
        from: a checkpoint (resume), a cold start (``initial_weights``), or the recipe's
        initialisation; a fresh start evaluates the baseline."""
        cfg = self.config
        assembly.announce_run(
            self.events,
            cfg,
            self.resolved,
            run_dir=self.paths.root,
            resume=self.resume,
            targets=None if self.scorer is None else self.teacher_targets,
        )
        self.live = LiveSinks(
            cfg.logging, self.paths.root, run_name=self.paths.root.name, run_config=cfg.to_dict()
        )
        if self.resume:
            self.load_from_checkpoint()
            return
        if self.initial_weights is not None:
            self.load_initial_weights()
        if cfg.eval.baseline:
            self.evaluate("baseline")

    def load_initial_weights(self) -> None:
        """Load the cold start given as ``initial_weights`` into the student and take the
        student's policy fingerprint from those weights. ``train()`` does this before its first
        cycle; a study that drives the recipe's pieces itself (one batch, one gate) calls it
        instead, so the on-policy check sees the weights that sample."""
        if self.initial_weights is None:
            raise CheckpointError(
                "this trainer was given no cold start to load",
                hint="pass initial_weights (the lab's start_run: cold_start=DIR)",
            )
        load_cold_start(self.initial_weights, student=self.student, events=self.events)
        self.state.refresh_fingerprint(self.student)

    def _warms_up(self) -> bool:
        """A fresh run of a mode with a teacher warms up on oracle traces first (a resumed run
        or a cold start already did)."""
        fresh = not self.resume and self.initial_weights is None
        return fresh and self.config.mode().warmup and self._warmup_cycles() > 0

    def _warmup_cycles(self) -> int:
        until = self.warmup_until
        return until.max_cycles if until is not None else self.config.train.sft_warmup_cycles

    def _cycles(self) -> Iterator[tuple[int, SampleSource]]:
        """``(cycle, source)`` in the order they run: the SFT warm-up's cycles (numbered
        ``-N .. -1``, oracle traces at the warm-up learning rate) when the run warms up, then
        the recipe's cycles from ``state.start_cycle``.

        Between the two: the warm-up's end (its criterion's verdict, the after-warm-up
        evaluation, the ``warmup`` checkpoint). :meth:`_end_cycle` may stop either phase early.
        """
        cfg, state = self.config, self.state
        if self._warms_up():
            n = self._warmup_cycles()
            self._warmup_start(n)
            state.in_warmup = True
            with self.progress.task("SFT warm-up", n) as advance:
                self._advance = advance
                for k in range(n):
                    yield k - n, self.warmup_source
                    if self._stop:
                        break
            state.in_warmup, self._stop = False, False
            state.main_start_step = state.global_step
            self._warmup_end(n)
            if cfg.eval.after_warmup:
                self.evaluate("after_warmup")
            self.save_checkpoint("warmup", cycle=-1)
        if state.finished:
            return
        if self.stop_after_cycle is not None:
            self.stop_after_cycle.begin(self.paths, self.events)
        with self.progress.task("cycles", cfg.train.cycles - state.start_cycle) as advance:
            self._advance = advance
            for cycle in range(state.start_cycle, cfg.train.cycles):
                yield cycle, self.source
                if self._stop:
                    break

    def _groups(
        self, samples: Sequence[TrainingSample], supervision: Supervision
    ) -> Iterator[list[TrainingSample]]:
        """A cycle's optimizer groups: ``train.group_size()`` trainable rows each (rows with
        nothing selected are removed first), over ``supervision.passes`` passes. With strict
        on-policy supervision each group is checked against the student's weights now."""
        rows = [s for s in samples if s.trainable]
        size = self.config.train.group_size()
        self.student.set_train(True)
        for _ in range(supervision.passes):
            for start in range(0, len(rows), size):
                group = rows[start : start + size]
                if supervision.strict_on_policy:
                    self.state.refresh_fingerprint(self.student)
                    check_on_policy(group, self.state.policy_fingerprint)
                yield group
        self.student.set_train(False)

    def _lr(self) -> float:
        state = self.state
        return scheduled_lr(
            self.schedule,
            self.config.train,
            global_step=state.global_step,
            main_start_step=state.main_start_step,
            in_warmup=state.in_warmup,
        )

    def _log_step(
        self,
        group: Sequence[TrainingSample],
        supervision: Supervision,
        cycle: int,
        step: int,
        result: GroupResult,
        update: UpdateOutcome,
        started: float,
    ) -> dict[str, Any]:
        """The step record of one optimizer group, written to ``metrics.jsonl`` and the sinks."""
        state = self.state
        seconds = time.perf_counter() - started
        record = StepRecord.build(
            phase=supervision.phase,
            cycle=cycle,
            step=step,
            global_optimizer_step=state.global_step,
            parameter_version=state.parameter_version,
            policy_version=state.parameter_version,
            rollout_policy_version=group[0].rollout_policy_version,
            policy_fingerprint=state.policy_fingerprint,
            rollout_policy_fingerprint=group[0].rollout_fingerprint,
            committed=update.committed,
            grad_norm=update.grad_norm,
            lr=update.lr,
            trajectories_in_step=len(group),
            **result.step_fields(),
            **temperature_fields(self.config, supervision.phase),
            seconds=round(seconds, 4),
            train_selected_tokens_per_second=round(result.positions / seconds, 2)
            if seconds > 0
            else None,
            projection_chunk_size=state.chunk_size,
            gpu=gpu.snapshot(self.device),
        ).to_json()
        self.metrics.write(record)
        if self.live is not None:
            self.live.scalars(state.global_step, step_scalars(record))
        return record

    def _end_cycle(
        self,
        cycle: int,
        source: SampleSource,
        batch: CycleSamples,
        steps: list[dict[str, Any]],
        before: tuple[float, int, str | None],
    ) -> None:
        """After a cycle's updates: a warm-up cycle's event and criterion, or a recipe cycle's
        record; the cycle's logs reach the disk. ``before``: the cycle's start time, parameter
        version and policy fingerprint."""
        if cycle < 0:
            self._end_warmup_cycle(cycle, steps)
            return
        cfg, state = self.config, self.state
        started, version_before, fingerprint_before = before
        if batch.rollout_version is not None:
            state.rollout_version = batch.rollout_version
        record: dict[str, Any] = {
            "cycle": cycle,
            "mode": source.supervision.phase,
            "parameter_version_before": version_before,
            "policy_fingerprint_before": fingerprint_before,
            **temperature_fields(cfg, source.supervision.phase),
            "rollouts": batch.rollout_stats,
            "selection": aggregate_selection_stats(s.selection for s in batch.samples),
        }
        if not steps:
            self.events.emit(
                "cycle_skipped_no_selected_positions",
                echo=f"cycle {cycle}: the selector found nothing to supervise",
                cycle=cycle,
                selector=cfg.selection.selector,
                trajectories=len(batch.samples),
            )
            record.update(skipped=True, steps=0, parameter_version=state.parameter_version)
            self._write_cycle(record, started)
            self.sync_logs()
        else:
            if cycle == cfg.train.cycles - 1:
                write_token_analysis(
                    self.paths.token_analysis,
                    self.student,
                    self.tokenizer,
                    batch.samples,
                    cycle=cycle,
                    events=self.events,
                )
            source.finish_cycle(cycle)
            live = cycle_summary(steps, batch.rollout_stats)
            record.update(
                skipped=False,
                steps=len(steps),
                parameter_version=state.parameter_version,
                policy_fingerprint=state.policy_fingerprint,
                loss=steps[-1]["loss"],
                mean_loss=live["mean_loss"],
                mean_divergence=live["mean_divergence"],
            )
            self._write_cycle(record, started)
            self.last_cycle_summary = live
            if self.live is not None:
                self.live.scalars(state.global_step, cycle_scalars(live))
            self.events.emit(
                "cycle_end", echo=f"cycle {cycle}: {format_live_line(live)}", cycle=cycle, **live
            )
            self.sync_logs()

    def _after_cycle(self, cycle: int, steps: list[dict[str, Any]]) -> None:
        """A recipe cycle's held-out evaluation (``eval.every``), checkpoint
        (``train.checkpoint_every``, and the last cycle) and stop condition."""
        if cycle < 0:
            return
        cfg, state = self.config, self.state
        last = cycle == cfg.train.cycles - 1
        held_out = None
        if cfg.eval.every and not last and (cycle + 1) % cfg.eval.every == 0:
            held_out = self.evaluate(f"cycle-{cycle:04d}")
        if last or (cycle + 1) % cfg.train.checkpoint_every == 0:
            self.save_checkpoint(f"cycle-{cycle:04d}", cycle=cycle)
        self._advance(stats=format_live_line(self.last_cycle_summary, held_out))
        budget = self.stop_after_cycle
        if budget is not None and budget.after_cycle(
            cycle, steps=len(steps), global_step=state.global_step
        ):
            self._stop = True

    def _write_cycle(self, record: dict[str, Any], started: float) -> None:
        record["seconds"] = round(time.perf_counter() - started, 3)
        self.metrics.write(CycleRecord.build(**record).to_json())

    # ================================================================== the warm-up

    def _warmup_start(self, cycles: int) -> None:
        until = self.warmup_until
        start: dict[str, Any] = {"cycles": cycles}
        if until is not None:
            start["until"] = until.settings()
        echo = (
            f"{cycles} cycles"
            if until is None
            else f"until {until.describe()} (at most {cycles} cycles)"
        )
        self.events.emit("sft_warmup_start", echo=echo, **start)
        self._warmup_outcome = {"cycles": cycles, "stopped_by": "cycles", "value": None}

    def _end_warmup_cycle(self, cycle: int, steps: list[dict[str, Any]]) -> None:
        """``sft_warmup_cycle``, with the criterion's value when it was measured."""
        n = self._warmup_cycles()
        k = cycle + n
        fields: dict[str, Any] = {
            "cycle": cycle,
            "steps": len(steps),
            "loss": steps[-1]["loss"] if steps else None,
        }
        measured = None
        if self.warmup_until is not None:
            measured = self.warmup_until.check(
                k,
                last=k + 1 == n,
                runner=self.runner,
                splits=self.splits,
                version=self.state.parameter_version,
                events=self.events,
            )
        if measured is not None:
            fields["validation_success"] = measured[0]
        self.events.emit("sft_warmup_cycle", **fields)
        self._advance()
        if measured is None:
            return
        value, reached = measured
        if reached:
            self._warmup_outcome = {"cycles": k + 1, "stopped_by": "criterion", "value": value}
            self._stop = True
        elif k + 1 == n:
            self._warmup_outcome = {"cycles": n, "stopped_by": "cap", "value": value}

    def _warmup_end(self, cycles: int) -> None:
        """``sft_warmup_end`` (warm-up by criterion only), then the warm-up's durability point."""
        until, outcome = self.warmup_until, self._warmup_outcome or {}
        if until is not None:
            reached = outcome.get("stopped_by") == "criterion"
            value = outcome.get("value")
            shown = "n/a" if value is None else f"{value:.3f}"
            self.events.emit(
                "sft_warmup_end",
                echo=f"{until.describe()} {'reached' if reached else 'not reached'}: "
                f"{shown} after {outcome.get('cycles')} cycles",
                **{**until.settings(), **outcome, "max_cycles": cycles},
            )
        self.sync_logs()

    # ================================================================== after the cycles

    def _finish(self, started: float) -> dict[str, Any]:
        """The final greedy evaluation and checkpoint, then the summary files; ``eval.json``
        last: its presence marks the run finished (a run killed before it is completed by a
        resume from ``checkpoints/final``)."""
        cfg, state = self.config, self.state
        if not state.finished:
            self.evaluate("final", temperature=0.0, reuse=True)
            if self.cache is not None:
                self.cache.close()
            self.save_checkpoint("final", cycle=cfg.train.cycles - 1)
        summary = self.eval_summary(seconds=time.perf_counter() - started)
        write_json(self.paths.manifest, self.build_manifest())
        self.events.emit(
            "run_end",
            echo=f"final success {summary['final']['success_rate']:.3f}",
            status="completed",
            seconds=round(time.perf_counter() - started, 2),
            global_optimizer_step=state.global_step,
        )
        self.sync_logs()
        write_json(self.paths.eval_json, summary)
        return summary

    @contextmanager
    def _deferred_log_sync(self) -> Iterator[None]:
        """Events and metrics reach the operating system on every append and the disk at the
        durability points (:meth:`sync_logs`); outside a run every append is fsynced again.
        A run that stops on an error still syncs what it wrote (the error is the news)."""
        self.events.sync = self.metrics.sync = False
        try:
            yield
        except BaseException:
            with suppress(OSError, RunStorageError):
                self.sync_logs()
            raise
        finally:
            self.events.sync = self.metrics.sync = True

    def sync_logs(self) -> None:
        """One durability point: fsync the run's append-only logs (``utils.io.DurableLogs``)."""
        self.logs.sync()

    def next_tasks(self, count: int) -> list[Task]:
        """The next ``count`` training tasks of the shuffled order (``RunState.next_tasks``)."""
        return self.state.next_tasks(self.splits["train"], self.task_order, count)

    # ================================================================== evaluation

    def evaluate(
        self,
        tag: str,
        *,
        temperature: float | None = None,
        split: str | None = None,
        write: bool = True,
        reuse: bool = False,
    ) -> dict[str, Any]:
        """Roll out the held-out split (greedy by default), summarize and record it.

        ``reuse``: when this process's previous evaluation saw the same weights (parameter
        version), split, tasks and temperature, record its episodes again under ``tag``
        (``relabel_evaluation``; an ``eval_reused`` event says so) instead of rolling out.
        """
        cfg, state = self.config, self.state
        split = split or cfg.eval.split
        tasks = self.splits[split][: cfg.eval.max_tasks]
        temperature = cfg.eval.temperature if temperature is None else temperature
        key = (split, tuple(t.task_id for t in tasks), temperature, state.parameter_version)
        if reuse and self._last_eval is not None and self._last_eval[0] == key:
            _, earlier, episodes = self._last_eval
            result, trajectories = relabel_evaluation(earlier, episodes, tag)
            self.events.emit(
                "eval_reused",
                echo=f"{tag}: the weights of {earlier['tag']}, unchanged since; its episodes reused",
                tag=tag,
                from_tag=earlier["tag"],
                parameter_version=state.parameter_version,
            )
        else:
            result, trajectories = evaluate_policy(
                self.runner,
                tasks,
                tag=tag,
                split=split,
                seed=cfg.run.seed,
                temperature=temperature,
                batch_size=cfg.eval.batch_size,
                parameter_version=state.parameter_version,
                global_step=state.global_step,
                progress=self.progress,
                on_oom=oom_splitter(self.events, "eval rollout"),
            )
        self._last_eval = (key, result, trajectories)
        state.eval_results[tag] = result
        record_evaluation(
            result,
            trajectories,
            cycle=state.cycle,
            global_step=state.global_step,
            trajectory_log=self.paths.eval_trajectories if write else None,
            events=self.events,
            metrics=self.metrics,
            live=self.live,
        )
        return result

    def eval_summary(self, seconds: float | None = None) -> dict[str, Any]:
        """The ``eval.json`` payload (training/evaluate.py ``eval_summary``)."""
        return eval_summary(
            self.config,
            run_id=self.paths.root.name,
            global_step=self.state.global_step,
            parameter_version=self.state.parameter_version,
            evaluations=self.state.eval_results,
            teacher=self.teacher_record,
            seconds=seconds,
        )

    # ================================================================== checkpoints

    def save_checkpoint(self, name: str, *, cycle: int) -> Path:
        """Trainable weights, optimizer moments and every counter needed to resume."""
        path = write_training_checkpoint(
            self.paths.checkpoint(name),
            counters=self.state.counters(cycle),
            student=self.student,
            optimizer=self.optimizer,
            schedule=self.schedule,
            source=self.source,
            teacher=self.teacher_record,
            paths=self.paths,
            config_digest=self.config.digest(),
            logs=self.logs,
        )
        if name.startswith("cycle-"):
            prune_cycle_checkpoints(self.paths.checkpoints, keep=self.config.checkpoint.keep)
        self.events.emit(
            "checkpoint_saved", name=name, cycle=cycle, global_optimizer_step=self.state.global_step
        )
        return path

    def load_from_checkpoint(self, path: str | Path | None = None) -> None:
        """Resume: skip baseline eval and warm-up, continue at ``state.cycle + 1``.

        Without ``path``: ``checkpoints/<resume_from>`` when given, else the latest
        checkpoint, which must verify (:func:`choose_resume_checkpoint`). The teacher given
        now must be the one the run started with (the record's ``weights_sha256``), and the
        checkpoint's teacher record is kept.
        """
        path = choose_resume_checkpoint(self.paths, self.resume_from, path)
        loaded = load_training_checkpoint(
            path, device=self.student.device, config_digest=self.config.digest()
        )
        saved = loaded.state
        check_state_cycle(saved, str(path / "state.json"), cycles=self.config.train.cycles)
        verify_logs(self.paths, saved, path)
        recorded = saved.get("teacher")
        given = self.teacher_record or {}
        if recorded is not None and given.get("weights_sha256") != recorded.get("weights_sha256"):
            raise CheckpointError(
                f"the teacher given to this resume is not the one {self.paths.root} started with "
                f"(weights {str(given.get('weights_sha256'))[:12]}, checkpoint "
                f"{str(recorded.get('weights_sha256'))[:12]})",
                hint="resume with the recipe and teacher the run started with",
            )
        self.teacher_record = recorded
        self.student.load_trainable_state_dict(loaded.trainable)
        load_optimizer_state(self.optimizer, loaded.optimizer, saved["optimizer"])
        state = self.state
        state.refresh_fingerprint(self.student)
        state.restore(ResumeCounters.from_state(saved))
        restore_logs(
            self.paths, saved, path, explicit=self.resume_from is not None, events=self.events
        )
        restore_rng_state(saved["rng"])
        # Killed after the final checkpoint: only eval.json and the manifest remain to write.
        state.finished = path.name == "final"
        self.source.load_state_dict(source_state(saved))
        self.events.emit(
            "checkpoint_loaded", name=path.name, global_optimizer_step=state.global_step
        )
        self.events.emit(
            "resumed",
            echo=f"from {path.name}: continuing at cycle {state.start_cycle}",
            start_cycle=state.start_cycle,
            parameter_version=state.parameter_version,
        )


@dataclass
class GroupResult:
    """Sums over one group's micro-batches; the step record divides them by ``positions``.

    ``loss``, ``divergence_loss`` and ``sampled_token_nll`` are already the group mean (each
    micro-batch was scaled by rows / G). ``entropy_sum`` and ``high_entropy_sum`` are
    position-weighted over the ``entropy_positions`` that had teacher targets.
    """

    loss: float = 0.0
    divergence_loss: float = 0.0
    sampled_token_nll: float = 0.0
    positions: int = 0
    entropy_sum: float = 0.0
    entropy_positions: int = 0
    entropy_lower_bound: bool = False
    high_entropy_sum: float = 0.0
    loss_by_span_type: dict[str, float] = field(default_factory=dict)

    def add(self, res: Any) -> None:
        """Add one micro-batch's ``ChunkedLossResult``."""
        self.loss += res.loss
        self.divergence_loss += res.divergence_loss
        self.sampled_token_nll += res.sampled_token_nll
        self.positions += res.num_positions
        if res.teacher_entropy_mean is not None:
            self.entropy_sum += res.teacher_entropy_mean * res.num_positions
            self.high_entropy_sum += (res.high_entropy_fraction or 0.0) * res.num_positions
            self.entropy_positions += res.num_positions
            self.entropy_lower_bound |= res.teacher_entropy_is_lower_bound
        for key, value in res.loss_by_span_type.items():
            self.loss_by_span_type[key] = self.loss_by_span_type.get(key, 0.0) + value

    def step_fields(self) -> dict[str, Any]:
        """The loss fields of a ``StepRecord``; entropy means are None without teacher targets."""
        entropy = self.entropy_positions
        return {
            "loss": self.loss,
            "divergence_loss": self.divergence_loss,
            "sampled_token_nll": self.sampled_token_nll,
            "selected_positions": self.positions,
            "teacher_entropy_mean": self.entropy_sum / entropy if entropy else None,
            "teacher_entropy_is_lower_bound": self.entropy_lower_bound if entropy else None,
            "high_entropy_fraction": self.high_entropy_sum / entropy if entropy else None,
            "loss_by_span_type": self.loss_by_span_type,
        }


@dataclass(frozen=True)
class UpdateOutcome:
    """One commit attempt: ``committed`` is False when a non-finite gradient skipped it."""

    committed: bool
    grad_norm: float
    lr: float


def apply_update(
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    *,
    lr: float,
    max_grad_norm: float | None,
    events: EventLog,
    global_step: int,
) -> UpdateOutcome:
    """Clip the accumulated gradient, set ``lr``, step, and clear the gradient.

    ``grad_norm`` is the total L2 norm before clipping. A NaN/inf norm means the loss
    blew up somewhere in the group: the gradient is dropped, the weights stay as they
    were and an ``update_skipped_nonfinite`` event names ``global_step``. The caller bumps
    its step and parameter version only when ``committed``.
    """
    norm = torch.nn.utils.clip_grad_norm_(
        params, max_grad_norm if max_grad_norm is not None else float("inf")
    )
    grad_norm = float(norm)
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        events.emit(
            "update_skipped_nonfinite",
            echo="non-finite gradient: update skipped",
            global_optimizer_step=global_step,
        )
        return UpdateOutcome(False, grad_norm, lr)
    set_learning_rate(optimizer, lr)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateOutcome(True, grad_norm, lr)


__all__ = [
    "CycleStop",
    "GroupResult",
    "OPDTrainer",
    "UpdateOutcome",
    "WarmupUntil",
    "apply_update",
]
