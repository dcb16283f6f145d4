"""``OPDTrainer``: one recipe for every mode, top to bottom down to ``optimizer.step()``
(docs/design.md §3, §4).

The six modes (``run.mode``) differ only in where trajectories come from and whether the
teacher scores them, and that lives in a :class:`~miniverl.training.sources.SampleSource`
chosen once at setup (``training/sources.py``):

- ``sft``: oracle traces, cross-entropy on their tokens;
- ``kd_oracle``: oracle traces, teacher targets at their states;
- ``seqkd``: fresh teacher samples every cycle, cross-entropy on them (sequence-level KD);
- ``offline_kd``: one fixed pool of teacher rollouts, one frozen teacher cache;
- ``opd``: fresh student rollouts every cycle, scored by the teacher at exactly those
  states; targets are read back through the cache, whose policy-version check makes
  "on-policy" an enforced property rather than a convention;
- ``gkd_mix``: per batch a fraction λ of student rollouts and the rest teacher samples,
  all scored by the teacher.

Read it in order: :meth:`OPDTrainer.setup` assembles the collaborators
(``training/assembly.py``); :meth:`OPDTrainer.train` runs the phases (toy teacher, baseline,
warm-up, cycles, final evaluation); :meth:`OPDTrainer.run_cycle` is the cycle of
docs/design.md §3 -- tasks -> ``source.samples`` -> optimize -> record -- with no mode
branch. :class:`PolicyUpdater` below it is the only code that changes the student's weights:
one gradient per optimizer group (:class:`GroupGradients`: the chunked loss and its
backward, with out-of-memory halving), then one commit (clip, scheduled lr,
``optimizer.step()``). The counters every collaborator shares live in
:class:`~miniverl.training.run_state.RunState` (``trainer.state``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from miniverl.agent.loop import RolloutRunner
from miniverl.config.loading import load_resolved_config
from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.errors import GpuMemoryError, RunStorageError
from miniverl.losses import (
    chunked_selected_position_loss,
    concat_providers,
    normalize_trajectory_weights,
)
from miniverl.models.base import CausalLMBackend
from miniverl.models.batching import build_padded_trajectory_batch, length_buckets
from miniverl.models.factory import build_tokenizer
from miniverl.schemas.records import CycleRecord, StepRecord, check_state_cycle
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
from miniverl.training.evaluate import eval_summary, evaluate_policy, record_evaluation
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
from miniverl.training.optim import (
    Schedule,
    build_optimizer,
    load_optimizer_state,
    scheduled_lr,
    set_lr,
)
from miniverl.training.resolve import (
    ChargeableCap,
    ResolvedRun,
    make_cap_meter,
    resolve_device,
    run_with_oom_retry,
)
from miniverl.training.run_state import RunState, shuffled_order
from miniverl.training.sources import (
    OracleSource,
    Supervision,
    TrainingSample,
    build_source,
    check_on_policy,
    mode_of,
    oom_splitter,
    temperature_fields,
)
from miniverl.training.teacher_fit import (
    COLD_START_MARKER,
    COLD_START_STUDENT,
    TOY_TEACHER_FILE,
    check_cold_start,
    cold_start_identity,
    load_cold_start,
    load_teacher,
    prepare_teacher_adapter,
    prepare_toy_teacher,
    save_cold_start,
)
from miniverl.training.warmup import criterion_measure, run_sft_warmup, warmup_cycles
from miniverl.utils import gpu
from miniverl.utils.env import collect_environment
from miniverl.utils.io import write_json
from miniverl.utils.logging import EventLog, MetricsLog, make_console
from miniverl.utils.runlock import run_lock
from miniverl.utils.runs import RunPaths
from miniverl.utils.seeding import restore_rng_state, seed_everything


class OPDTrainer:
    """Runs one ``RunConfig`` into one run directory; its sample source (``training/sources.py``) is the mode."""

    def __init__(
        self,
        config: RunConfig,
        *,
        output_dir: str | Path | None = None,
        submitted_recipe: bytes | None = None,
        resume: bool = False,
        quiet: bool = False,
        progress: bool | None = None,
        verbose: bool = False,
        cold_start: str | Path | None = None,
        resume_from: str | None = None,
        budget_cap: ChargeableCap | None = None,
    ) -> None:
        self.config = config
        self.paths = RunPaths(output_dir or config.run.output_dir or Path("runs") / config.run.name)
        self.submitted_recipe = submitted_recipe
        self.resume = resume or resume_from is not None
        self.resume_from = resume_from
        self.cold_start = Path(cold_start) if cold_start is not None else None
        if self.cold_start is not None:
            check_cold_start(self.cold_start, config)
        self.console = make_console(quiet)
        self.progress = ProgressReporter(self.console, progress)
        self.events = EventLog(self.paths.events, self.console, verbose=verbose)
        self.metrics = MetricsLog(self.paths.metrics)
        self.logs = run_logs(self.paths)
        self.state = RunState()
        self.budget_cap = budget_cap  # compute-matched benchmark arms: stop when it is spent
        self.toy_teacher_report: dict[str, Any] | None = None
        self.teacher_adapter_report: dict[str, Any] | None = None
        self.dagger_student_sha256: str | None = None
        self.live: LiveSinks | None = None
        self.last_cycle_summary: dict[str, Any] = {}
        self._is_setup = False

    # ================================================================== setup

    def setup(self, *, write_artifacts: bool = True, with_teacher: bool = True) -> None:
        """Build everything a run needs; every ``auto`` is decided once, by ``resolve_run``."""
        if self._is_setup:
            return
        cfg, paths, state = self.config, self.paths, self.state
        if write_artifacts and not self.resume:
            assembly.refuse_existing_run(paths)
        seed_everything(cfg.run.seed, deterministic=cfg.run.deterministic)
        device = resolve_device(cfg, cuda_available=torch.cuda.is_available())
        self.tokenizer = build_tokenizer(cfg)
        self.environment = make_environment(cfg.environment.name, **cfg.environment.params)
        self.splits = build_splits(self.environment, cfg.environment)
        self.tasks_by_id = {t.task_id: t for split in self.splits.values() for t in split}
        self.task_order = shuffled_order(len(self.splits["train"]), cfg.run.seed)
        with_teacher = with_teacher and mode_of(cfg).uses_teacher
        self.runtime = assembly.build_run_runtime(
            cfg, self.tokenizer, device, with_teacher=with_teacher, splits=self.splits
        )
        self.student: CausalLMBackend = self.runtime.student
        self.teacher: CausalLMBackend | None = self.runtime.teacher
        self.resolved: ResolvedRun = assembly.plan_run(
            cfg, device=device, student=self.student, teacher=self.teacher
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
        self.updater = PolicyUpdater(
            config=cfg,
            student=self.student,
            optimizer=self.optimizer,
            schedule=self.schedule,
            state=state,
            pad_token_id=self.tokenizer.pad_token_id,
            device=self.device,
            events=self.events,
            metrics=self.metrics,
        )
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
        self.role_graph = LocalRoleGraph.local(
            runtime=self.runtime,
            runner=self.runner,
            environment=self.environment,
            scorer=self.scorer,
            cache_directory=None if self.cache is None else self.cache.directory,
            recipe=type(self).__name__,
        )
        state.refresh_fingerprint(self.student)
        self._is_setup = True
        if write_artifacts and not self.resume:
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
                toy_teacher=self.toy_teacher_report,
                teacher_checkpoint=self.runtime.teacher_checkpoint,
            )
        )

    # ================================================================== the run

    def train(self) -> dict[str, Any]:
        """Run the whole recipe under the run directory's write lock; the ``eval.json`` summary."""
        with run_lock(self.paths.root):
            if self.resume:
                self.resume = prepare_resume(
                    self.paths, self.config, resume_from=self.resume_from, events=self.events
                )
            return self._train_locked()

    def _train_locked(self) -> dict[str, Any]:
        """The run with its logs' fsyncs deferred to the durability points (:meth:`sync_logs`).

        Inside it, events and metrics reach the operating system on every append and the
        disk at the end of every cycle and of the warm-up, before every checkpoint records
        their lengths, and when the run ends (completed, interrupted or failed). After it,
        events and metrics fsync each append again (a benchmark's teacher gate logs there).
        """
        self.events.sync = self.metrics.sync = False
        try:
            return self._train_deferred()
        except BaseException:
            with contextlib.suppress(OSError, RunStorageError):
                self.sync_logs()  # what the run wrote before it stopped; its error is the news
            raise
        finally:
            self.events.sync = self.metrics.sync = True

    def sync_logs(self) -> None:
        """One durability point: fsync the run's append-only logs (``utils.io.DurableLogs``)."""
        self.logs.sync()

    def _train_deferred(self) -> dict[str, Any]:
        self.setup()
        cfg, state = self.config, self.state
        started = time.perf_counter()
        assembly.announce_run(
            self.events,
            cfg,
            self.resolved,
            run_dir=self.paths.root,
            resume=self.resume,
            targets=None if self.scorer is None else self.teacher_targets,
        )
        self.live = self.updater.live = LiveSinks(
            cfg.logging, self.paths.root, run_name=self.paths.root.name, run_config=cfg.to_dict()
        )
        try:
            if self.resume:
                self.load_from_checkpoint()
            elif self.cold_start is not None:
                self.load_shared_cold_start()
                if cfg.eval.baseline:
                    self.evaluate("baseline")
            else:
                dagger = cfg.models.toy_fit.dagger.enabled
                if not dagger:
                    self._prepare_toy_teacher()
                if cfg.eval.baseline:
                    self.evaluate("baseline")
                if mode_of(cfg).warmup and warmup_cycles(cfg.train) > 0:
                    self.run_sft_warmup()
                    if cfg.eval.after_warmup:
                        self.evaluate("after_warmup")
                if dagger:
                    self._prepare_toy_teacher(student=self.student)
                if mode_of(cfg).warmup and warmup_cycles(cfg.train) > 0:
                    self.save_checkpoint("warmup", cycle=-1)
            if not state.finished:
                self.teacher_adapter_report = self.prepare_teacher_adapter()
                self._run_cycles()
                self.evaluate("final", temperature=0.0)
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
            # eval.json last: its presence is what marks the run finished, so a run killed
            # before it is completed by --resume (from checkpoints/final).
            write_json(self.paths.eval_json, summary)
        except KeyboardInterrupt:
            self.events.emit(
                "run_end",
                echo="interrupted; resume with --resume",
                status="interrupted",
                global_optimizer_step=state.global_step,
            )
            raise
        finally:
            self.live.close()
        return summary

    # ================================================================== before the cycles

    def _prepare_toy_teacher(self, student: CausalLMBackend | None = None) -> None:
        """Toy backend only: fit the toy teacher until it solves its tasks (training/teacher_fit.py).

        With ``models.toy_fit.dagger`` it runs after the warm-up and labels ``student``'s states.
        """
        if self._fitted_toy_teacher() is None:
            return

        def publish(report: dict[str, Any]) -> None:
            self.toy_teacher_report = report
            write_json(self.paths.manifest, self.build_manifest())

        prepare_toy_teacher(
            self.teacher,
            config=self.config,
            environment=self.environment,
            splits=self.splits,
            oracle_runner=self.runner,
            chunk_size=self.state.chunk_size,
            device=self.device,
            run_dir=self.paths.root,
            events=self.events,
            progress=self.progress,
            split=oom_splitter(self.events, "probe rollout"),
            publish=publish,
            student=student,
        )

    def prepare_teacher_adapter(self) -> dict[str, Any] | None:
        """HF shared backbone only: load or fit the teacher's LoRA adapter (training/teacher_fit.py).

        With ``models.teacher_fit.dagger`` the adapter labels the student's states as they are
        before the first cycle; a resumed run names that student by the checkpoint's
        ``teacher_adapter_student_sha256``.
        """
        return prepare_teacher_adapter(
            self.teacher,
            config=self.config,
            tokenizer_fingerprint=self.tokenizer.fingerprint,
            splits=self.splits,
            environment=self.environment,
            runner=self.runner,
            chunk_size=self.state.chunk_size,
            events=self.events,
            progress=self.progress,
            student=self.student,
            student_sha256=self.dagger_student_sha256,
        )

    def _adapter_student_sha256(self) -> str | None:
        report = self.teacher_adapter_report or {}
        return (report.get("payload") or {}).get("dagger_student_sha256")

    def _fitted_toy_teacher(self) -> CausalLMBackend | None:
        """The fitted toy teacher (its weights travel with the run); None for hf, an oracle or
        a teacher loaded from a checkpoint."""
        models = self.config.models
        fitted = (
            models.backend == "toy"
            and models.oracle_teacher is None
            and models.teacher.checkpoint is None
        )
        return self.teacher if fitted else None

    def run_sft_warmup(self, cycles: int | None = None) -> None:
        """Oracle-trace cross-entropy before KD/OPD (training/warmup.py).

        ``cycles`` forces a fixed count; by default the recipe decides (a fixed count, or
        ``train.sft_warmup_until``'s criterion and cap). Its end is a durability point
        (:meth:`sync_logs`), not each warm-up cycle: nothing before the first checkpoint is
        resumed from (a run killed there is recomputed from the start).
        """
        cfg, state = self.config, self.state
        until = cfg.train.sft_warmup_until if cycles is None else None
        source = OracleSource(
            runner=self.runner,
            version=lambda: state.parameter_version,
            trajectory_log=self.paths.trajectories,
            tasks_per_cycle=cfg.train.rollouts_per_cycle,
        )
        measure = None
        if until is not None:
            measure = criterion_measure(
                cfg,
                self.splits,
                until,
                runner=self.runner,
                student=self.student,
                version=lambda: state.parameter_version,
                split=oom_splitter(self.events, "warm-up criterion rollout"),
            )
        with self.updater.warmup():
            run_sft_warmup(
                source,
                cycles=warmup_cycles(cfg.train) if cycles is None else cycles,
                next_tasks=self.next_tasks,
                optimize=self.updater.optimize,
                events=self.events,
                progress=self.progress,
                until=until,
                measure=measure,
            )
        self.sync_logs()

    def export_cold_start(self, directory: str | Path) -> Path:
        """Write the student's trainable weights (and the fitted toy teacher) for benchmark arms.

        Weights only (training/teacher_fit.py): no optimizer state crosses into an arm.
        """
        return save_cold_start(
            Path(directory),
            student=self.student,
            toy_teacher=self._fitted_toy_teacher(),
            parameter_version=self.state.parameter_version,
            global_step=self.state.global_step,
            config_digest=self.config.digest(),
            evaluations=self.state.eval_results,
            toy_teacher_report=self.toy_teacher_report,
            identity=cold_start_identity(self.config),
        )

    def load_shared_cold_start(self) -> None:
        """Load a shared cold start weights-only; the arm starts with a fresh optimizer."""
        assert self.cold_start is not None
        loaded = load_cold_start(
            self.cold_start,
            student=self.student,
            toy_teacher=self._fitted_toy_teacher(),
            run_dir=self.paths.root,
            events=self.events,
        )
        self.state.refresh_fingerprint(self.student)
        if loaded.toy_teacher_report is not None:
            self.toy_teacher_report = loaded.toy_teacher_report

    # ================================================================== the cycles

    def _run_cycles(self) -> None:
        """The main phase: cycles, held-out evaluations every ``eval.every``, checkpoints."""
        cfg, state = self.config, self.state
        meter = make_cap_meter(self.budget_cap, self.paths)
        with self.progress.task("cycles", cfg.train.cycles - state.start_cycle) as advance:
            for cycle in range(state.start_cycle, cfg.train.cycles):
                steps_before = state.global_step
                self.run_cycle(cycle)
                last = cycle == cfg.train.cycles - 1
                held_out = None
                if cfg.eval.every and not last and (cycle + 1) % cfg.eval.every == 0:
                    held_out = self.evaluate(f"cycle-{cycle:04d}")
                if last or (cycle + 1) % cfg.train.checkpoint_every == 0:
                    self.save_checkpoint(f"cycle-{cycle:04d}", cycle=cycle)
                advance(stats=format_live_line(self.last_cycle_summary, held_out))
                if meter is not None and meter.after_cycle(
                    cycle=cycle,
                    steps=state.global_step - steps_before,
                    global_step=state.global_step,
                    events=self.events,
                ):
                    break

    def next_tasks(self, count: int) -> list[Any]:
        """The next ``count`` training tasks of the shuffled order (``RunState.next_tasks``)."""
        return self.state.next_tasks(self.splits["train"], self.task_order, count)

    # ================================================================== one cycle

    def run_cycle(self, cycle: int) -> None:
        """tasks -> source samples (collect, select, align, score, cache) -> optimize -> log.

        The cycle's appends reach the operating system as they happen and the disk at its
        end (:meth:`sync_logs`): one fsync per log a cycle, not one per record.
        """
        cfg, state, source = self.config, self.state, self.source
        state.cycle = cycle
        started = time.perf_counter()
        phase = source.supervision.phase
        batch = source.samples(cycle, self.next_tasks(source.tasks_per_cycle))
        if batch.rollout_version is not None:
            state.rollout_version = batch.rollout_version
        samples, rollout_stats = batch.samples, batch.rollout_stats
        record: dict[str, Any] = {
            "cycle": cycle,
            "mode": phase,
            "parameter_version_before": state.parameter_version,
            "policy_fingerprint_before": state.policy_fingerprint,
            **temperature_fields(cfg, phase),
            "rollouts": rollout_stats,
            "selection": aggregate_selection_stats(s.selection for s in samples),
        }
        if not any(s.trainable for s in samples):
            self.events.emit(
                "cycle_skipped_no_selected_positions",
                echo=f"cycle {cycle}: the selector found nothing to supervise",
                cycle=cycle,
                selector=cfg.selection.selector,
                trajectories=len(samples),
            )
            record.update(skipped=True, steps=0, parameter_version=state.parameter_version)
            self._write_cycle(record, started)
            self.sync_logs()
            return
        steps = self.updater.optimize(samples, source.supervision, cycle=cycle)
        if cycle == cfg.train.cycles - 1:
            write_token_analysis(
                self.paths.token_analysis,
                self.student,
                self.tokenizer,
                samples,
                cycle=cycle,
                events=self.events,
            )
        source.finish_cycle(cycle)
        live = cycle_summary(steps, rollout_stats)
        record.update(
            skipped=False,
            steps=len(steps),
            parameter_version=state.parameter_version,
            policy_fingerprint=state.policy_fingerprint,
            loss=steps[-1]["loss"] if steps else None,
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

    def _write_cycle(self, record: dict[str, Any], started: float) -> None:
        record["seconds"] = round(time.perf_counter() - started, 3)
        self.metrics.write(CycleRecord.build(**record).to_json())

    # ================================================================== evaluation

    def evaluate(
        self,
        tag: str,
        *,
        temperature: float | None = None,
        split: str | None = None,
        write: bool = True,
    ) -> dict[str, Any]:
        """Roll out the held-out split (greedy by default), summarize and record it."""
        cfg, state = self.config, self.state
        split = split or cfg.eval.split
        result, trajectories = evaluate_policy(
            self.runner,
            self.splits[split][: cfg.eval.max_tasks],
            tag=tag,
            split=split,
            seed=cfg.run.seed,
            temperature=cfg.eval.temperature if temperature is None else temperature,
            batch_size=cfg.eval.batch_size,
            parameter_version=state.parameter_version,
            global_step=state.global_step,
            progress=self.progress,
            on_oom=oom_splitter(self.events, "eval rollout"),
        )
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
            toy_teacher=self.toy_teacher_report,
            teacher_adapter=self.teacher_adapter_report,
            seconds=seconds,
        )

    # ================================================================== checkpoints

    def save_checkpoint(self, name: str, *, cycle: int) -> Path:
        """Trainable weights, optimizer moments and every counter needed to"""
        path = write_training_checkpoint(
            self.paths.checkpoint(name),
            counters=self.state.counters(cycle),
            student=self.student,
            optimizer=self.optimizer,
            schedule=self.schedule,
            source=self.source,
            toy_teacher=self.toy_teacher_report,
            paths=self.paths,
            teacher_adapter_student_sha256=self._adapter_student_sha256(),
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
        checkpoint, which must verify (:func:`choose_resume_checkpoint`).
        """
        path = choose_resume_checkpoint(self.paths, self.resume_from, path)
        loaded = load_training_checkpoint(
            path, device=self.student.device, config_digest=self.config.digest()
        )
        saved = loaded.state
        check_state_cycle(saved, str(path / "state.json"), cycles=self.config.train.cycles)
        verify_logs(self.paths, saved, path)
        if (fitted := self._fitted_toy_teacher()) is not None:  # verified against its hash
            self.toy_teacher_report = report = saved.get("toy_teacher") or {}
            weights = self.paths.root / TOY_TEACHER_FILE
            load_teacher(fitted, weights, report.get("weights_sha256"))
        self.dagger_student_sha256 = saved.get("teacher_adapter_student_sha256")
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


class PolicyUpdater:
    """Turns supervised samples into committed updates of ``student``; shares ``state``."""

    def __init__(
        self,
        *,
        config: RunConfig,
        student: CausalLMBackend,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        state: RunState,
        pad_token_id: int,
        device: str,
        events: EventLog,
        metrics: MetricsLog,
    ) -> None:
        self.config = config
        self.student = student
        self.optimizer = optimizer
        self.schedule = schedule
        self.state = state
        self.device = device
        self.events = events
        self.metrics = metrics
        self.live: LiveSinks | None = None
        self.gradients = GroupGradients(
            student=student,
            optimizer=optimizer,
            pad_token_id=pad_token_id,
            nll_weight=config.loss.sampled_token_nll_weight,
            min_chunk_size=config.memory.min_chunk_size,
            oom_retries=config.memory.oom_retries,
            events=events,
        )

    @contextmanager
    def warmup(self) -> Iterator[None]:
        """The SFT warm-up's updates: warm-up learning rate; the main schedule starts after it."""
        self.state.in_warmup = True
        try:
            yield
        finally:
            self.state.in_warmup = False
        self.state.main_start_step = self.state.global_step

    def optimize(
        self, samples: Sequence[TrainingSample], supervision: Supervision, *, cycle: int
    ) -> list[dict[str, Any]]:
        """``supervision.passes`` passes over the trainable rows; one step record per group."""
        rows = [s for s in samples if s.trainable]
        group = self.config.train.group_size()
        records = []
        self.student.set_train(True)
        for _ in range(supervision.passes):
            for start in range(0, len(rows), group):
                members = rows[start : start + group]
                if supervision.strict_on_policy:
                    self.state.refresh_fingerprint(self.student)
                    check_on_policy(members, self.state.policy_fingerprint)
                records.append(self._step(members, supervision, cycle, step=len(records)))
        self.student.set_train(False)
        return records

    def _step(
        self, members: Sequence[TrainingSample], supervision: Supervision, cycle: int, *, step: int
    ) -> dict[str, Any]:
        state = self.state
        t0 = time.perf_counter()
        gpu.reset_peak(self.device if self.device.startswith("cuda") else None)
        result, state.chunk_size, state.trajectory_batch_size = self.gradients.fitting_memory(
            members,
            chunk_size=state.chunk_size,
            batch_rows=state.trajectory_batch_size,
            teacher_targets=supervision.teacher_targets,
        )
        update = self.commit()
        record = self._record(members, supervision, cycle, step, result, update, t0)
        self.metrics.write(record)
        if self.live is not None:
            self.live.scalars(state.global_step, step_scalars(record))
        return record

    def commit(self) -> UpdateOutcome:
        """Clip, set the scheduled lr, step; a committed update is a new policy version."""
        state = self.state
        lr = scheduled_lr(
            self.schedule,
            self.config.train,
            global_step=state.global_step,
            main_start_step=state.main_start_step,
            in_warmup=state.in_warmup,
        )
        update = apply_update(
            self.optimizer,
            self.student.trainable_parameters(),
            lr=lr,
            max_grad_norm=self.config.train.max_grad_norm,
            events=self.events,
            global_step=state.global_step,
        )
        if update.committed:
            state.global_step += 1
            state.parameter_version += 1
            state.refresh_fingerprint(self.student)
        return update

    def _record(
        self,
        members: Sequence[TrainingSample],
        supervision: Supervision,
        cycle: int,
        step: int,
        result: GroupResult,
        update: UpdateOutcome,
        started: float,
    ) -> dict[str, Any]:
        state = self.state
        seconds = time.perf_counter() - started
        return StepRecord.build(
            phase=supervision.phase,
            cycle=cycle,
            step=step,
            global_optimizer_step=state.global_step,
            parameter_version=state.parameter_version,
            policy_version=state.parameter_version,
            rollout_policy_version=members[0].rollout_policy_version,
            policy_fingerprint=state.policy_fingerprint,
            rollout_policy_fingerprint=members[0].rollout_fingerprint,
            committed=update.committed,
            grad_norm=update.grad_norm,
            lr=update.lr,
            trajectories_in_step=len(members),
            **result.step_fields(),
            **temperature_fields(self.config, supervision.phase),
            seconds=round(seconds, 4),
            train_selected_tokens_per_second=round(result.positions / seconds, 2)
            if seconds > 0
            else None,
            projection_chunk_size=state.chunk_size,
            gpu=gpu.snapshot(self.device),
        ).to_json()


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
class GroupGradients:
    """What computing a group's gradient needs, passed in rather than read off a trainer.

    ``optimizer`` owns the ``.grad`` buffers this fills (it is zeroed before each attempt);
    ``nll_weight`` is ``loss.sampled_token_nll_weight``, the cross-entropy weight next to
    teacher targets (without teacher targets the loss is plain cross-entropy, weight 1).
    """

    student: CausalLMBackend
    optimizer: torch.optim.Optimizer
    pad_token_id: int
    nll_weight: float
    min_chunk_size: int
    oom_retries: int
    events: EventLog

    def compute(
        self,
        group: Sequence[TrainingSample],
        *,
        chunk_size: int,
        batch_rows: int,
        teacher_targets: bool,
    ) -> GroupResult:
        """Accumulate the gradient of the group loss; ``chunk_size`` rows per projection."""
        self.optimizer.zero_grad(set_to_none=True)
        ce_weight = self.nll_weight if teacher_targets else 1.0
        out = GroupResult()
        for bucket in length_buckets([s.trajectory.length for s in group], int(batch_rows)):
            rows = [group[i] for i in bucket]
            batch = build_padded_trajectory_batch(
                token_ids=[r.trajectory.token_ids for r in rows],
                selected_positions=[r.alignment.student_prediction_positions for r in rows],
                pad_token_id=self.pad_token_id,
                device=self.student.device,
            )
            hidden = self.student.hidden_states_at_batch(batch, with_grad=True)
            weights = torch.cat(
                normalize_trajectory_weights([r.alignment.token_weights for r in rows])
            ).to(hidden.device)
            provider = concat_providers([r.provider for r in rows]) if teacher_targets else None
            targets = torch.tensor(
                [t for r in rows for t in r.alignment.target_token_ids],
                dtype=torch.long,
                device=hidden.device,
            )
            res = chunked_selected_position_loss(
                hidden_states=hidden,
                lm_head=self.student.project,
                weights=weights,
                weight_normalizer=float(len(rows)),
                provider=provider,
                target_token_ids=targets,
                ce_weight=ce_weight,
                chunk_size=chunk_size,
                backward=True,
                loss_scale=len(rows) / len(group),
                span_types=[t for r in rows for t in r.alignment.span_types],
            )
            out.loss += res.loss
            out.divergence_loss += res.divergence_loss
            out.sampled_token_nll += res.sampled_token_nll
            out.positions += res.num_positions
            if res.teacher_entropy_mean is not None:
                out.entropy_sum += res.teacher_entropy_mean * res.num_positions
                out.high_entropy_sum += (res.high_entropy_fraction or 0.0) * res.num_positions
                out.entropy_positions += res.num_positions
                out.entropy_lower_bound |= res.teacher_entropy_is_lower_bound
            for key, value in res.loss_by_span_type.items():
                out.loss_by_span_type[key] = out.loss_by_span_type.get(key, 0.0) + value
        return out

    def fitting_memory(
        self,
        group: Sequence[TrainingSample],
        *,
        chunk_size: int,
        batch_rows: int,
        teacher_targets: bool,
    ) -> tuple[GroupResult, int, int]:
        """``compute`` that survives out-of-memory: ``(result, chunk_used, batch_rows_used)``.

        The OOM retry halves the loss chunk; once it cannot, the trajectory batch is halved
        and the chunk starts again from ``chunk_size``. Every change is an event; the caller
        keeps both returned sizes for the rest of the run.
        """
        while True:
            try:
                result, chunk = run_with_oom_retry(
                    lambda chunk, rows=batch_rows: self.compute(
                        group,
                        chunk_size=chunk,
                        batch_rows=rows,
                        teacher_targets=teacher_targets,
                    ),
                    chunk_size=chunk_size,
                    min_chunk_size=self.min_chunk_size,
                    retries=self.oom_retries,
                    events=self.events,
                    on_retry=lambda: self.optimizer.zero_grad(set_to_none=True),
                )
                return result, chunk, batch_rows
            except GpuMemoryError:
                if batch_rows <= 1:
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                smaller = batch_rows // 2
                self.events.emit(
                    "oom_batch_split",
                    echo=f"trajectory batch {batch_rows} -> {smaller}",
                    what="trajectory batch",
                    batch_size=batch_rows,
                    split_into=[smaller, batch_rows - smaller],
                )
                batch_rows = smaller


# ====================================================================== the step


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
    set_lr(optimizer, lr)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateOutcome(True, grad_norm, lr)


__all__ = [
    "COLD_START_MARKER",
    "COLD_START_STUDENT",
    "GroupResult",
    "OPDTrainer",
    "PolicyUpdater",
    "load_resolved_config",
]
