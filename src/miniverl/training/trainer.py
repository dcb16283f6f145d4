"""``OPDTrainer``: one recipe for every mode (docs/design.md §3, §4).

The modes differ only in where trajectories come from and where targets come from, and
that lives in a :class:`~miniverl.training.sources.SampleSource` chosen once at setup:

- ``sft``: oracle traces, cross-entropy on their tokens (:class:`OracleSource`);
- ``offline_kd``: one fixed set of teacher rollouts, one frozen teacher cache
  (:class:`OfflinePoolSource`);
- ``opd``: fresh student rollouts every cycle, scored by the teacher at exactly those
  states; targets are read back through the cache, whose policy-version check makes
  "on-policy" an enforced property rather than a convention (:class:`OnPolicySource`).

Read it top to bottom: :meth:`OPDTrainer.setup` assembles the collaborators
(``training/assembly.py``), :meth:`OPDTrainer.train` runs the phases (toy teacher, baseline,
warm-up, cycles, final evaluation), and :meth:`OPDTrainer.run_cycle` is the cycle of
docs/design.md §3 in order -- tasks -> ``source.samples`` -> optimize and commit
(``training/update.py``) -> record -- with no mode branch. The counters every collaborator
shares live in :class:`~miniverl.training.run_state.RunState` (``trainer.state``).
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from miniverl.agent.loop import RolloutRunner
from miniverl.config.loading import load_resolved_config
from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.models.base import CausalLMBackend
from miniverl.models.factory import build_tokenizer
from miniverl.schemas.records import CycleRecord
from miniverl.selection.selectors import aggregate_selection_stats
from miniverl.training import assembly, resume, toy_teacher
from miniverl.training.budget import ChargeableCap, make_cap_meter
from miniverl.training.checkpoint_retention import prune_cycle_checkpoints
from miniverl.training.cold_start import (  # the first two re-exported: their old import path
    COLD_START_MARKER,
    COLD_START_STUDENT,
    load_cold_start,
    save_cold_start,
)
from miniverl.training.evaluate import eval_summary, evaluate_policy, record_evaluation
from miniverl.training.gradients import GroupResult  # re-exported: its old import path
from miniverl.training.live import LiveSinks, cycle_scalars, cycle_summary, format_live_line
from miniverl.training.manifest import LocalRoleGraph, ManifestInputs, build_manifest
from miniverl.training.optim import Schedule, build_optimizer, load_optimizer_state
from miniverl.training.progress import ProgressReporter
from miniverl.training.recovery import prepare_resume
from miniverl.training.resolve import ResolvedRun, resolve_device
from miniverl.training.run_state import RunState, shuffled_order
from miniverl.training.sources import OracleSource, build_source, oom_splitter
from miniverl.training.teacher_adapter import prepare_teacher_adapter
from miniverl.training.temperatures import temperature_fields
from miniverl.training.token_analysis import write_token_analysis
from miniverl.training.update import PolicyUpdater
from miniverl.training.warmup import criterion_measure, run_sft_warmup, warmup_cycles
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
        cold_start: str | Path | None = None,
        resume_from: str | None = None,
    ) -> None:
        self.config = config
        self.paths = RunPaths(output_dir or config.run.output_dir or Path("runs") / config.run.name)
        self.submitted_recipe = submitted_recipe
        self.resume = resume or resume_from is not None
        self.resume_from = resume_from
        self.cold_start = Path(cold_start) if cold_start is not None else None
        self.console = make_console(quiet)
        self.progress = ProgressReporter(self.console, progress)
        self.events = EventLog(self.paths.events, self.console)
        self.metrics = MetricsLog(self.paths.metrics)
        self.state = RunState()
        self.budget_cap: ChargeableCap | None = None  # compute-matched benchmark arms set it
        self.toy_teacher_report: dict[str, Any] | None = None
        self.teacher_adapter_report: dict[str, Any] | None = None
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
        with_teacher = with_teacher and cfg.run.mode != "sft"
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
                self._prepare_toy_teacher()
                if cfg.eval.baseline:
                    self.evaluate("baseline")
                if cfg.run.mode != "sft" and warmup_cycles(cfg.train) > 0:
                    self.run_sft_warmup()
                    if cfg.eval.after_warmup:
                        self.evaluate("after_warmup")
                    self.save_checkpoint("warmup", cycle=-1)
            if not state.finished:
                self.teacher_adapter_report = prepare_teacher_adapter(self)
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
        """tasks -> source samples (collect, select, align, score, cache) -> optimize -> log."""
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

    def _write_cycle(self, record: dict[str, Any], started: float) -> None:
        record["seconds"] = round(time.perf_counter() - started, 3)
        self.metrics.write(CycleRecord.build(**record).to_json())

    # ================================================================== before the cycles

    def _prepare_toy_teacher(self) -> None:
        """Toy backend only: fit the toy teacher until it solves its tasks (training/toy_teacher.py)."""
        if self._fitted_toy_teacher() is None:
            return

        def publish(report: dict[str, Any]) -> None:
            self.toy_teacher_report = report
            write_json(self.paths.manifest, self.build_manifest())

        toy_teacher.prepare_toy_teacher(
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
        )

    def _fitted_toy_teacher(self) -> CausalLMBackend | None:
        """The fitted toy teacher (its weights travel with the run); None for hf or an oracle."""
        models = self.config.models
        fitted = models.backend == "toy" and models.oracle_teacher is None
        return self.teacher if fitted else None

    def run_sft_warmup(self, cycles: int | None = None) -> None:
        """Oracle-trace cross-entropy before KD/OPD (training/warmup.py).

        ``cycles`` forces a fixed count; by default the recipe decides (a fixed count, or
        ``train.sft_warmup_until``'s criterion and cap).
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

    def export_cold_start(self, directory: str | Path) -> Path:
        """Write the student's trainable weights (and the fitted toy teacher) for benchmark arms.

        Weights only (training/cold_start.py): no optimizer state crosses into an arm.
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
        """Trainable weights, optimizer moments and every counter needed to resume."""
        path = resume.write_training_checkpoint(
            self.paths.checkpoint(name),
            counters=self.state.counters(cycle),
            student=self.student,
            optimizer=self.optimizer,
            schedule=self.schedule,
            source=self.source,
            toy_teacher=self.toy_teacher_report,
            paths=self.paths,
            config_digest=self.config.digest(),
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
        path = resume.choose_resume_checkpoint(self.paths, self.resume_from, path)
        loaded = resume.load_training_checkpoint(
            path, device=self.student.device, config_digest=self.config.digest()
        )
        saved = loaded.state
        if (fitted := self._fitted_toy_teacher()) is not None:  # verified against its hash
            self.toy_teacher_report = report = saved.get("toy_teacher") or {}
            weights = self.paths.root / toy_teacher.TOY_TEACHER_FILE
            toy_teacher.load_teacher(fitted, weights, report.get("weights_sha256"))
        self.student.load_trainable_state_dict(loaded.trainable)
        load_optimizer_state(self.optimizer, loaded.optimizer, saved["optimizer"])
        state = self.state
        state.refresh_fingerprint(self.student)
        state.restore(resume.ResumeCounters.from_state(saved))
        resume.restore_logs(
            self.paths, saved, path, explicit=self.resume_from is not None, events=self.events
        )
        restore_rng_state(saved["rng"])
        # Killed after the final checkpoint: only eval.json and the manifest remain to write.
        state.finished = path.name == "final"
        self.source.load_state_dict(resume.source_state(saved))
        self.events.emit(
            "checkpoint_loaded", name=path.name, global_optimizer_step=state.global_step
        )
        self.events.emit(
            "resumed",
            echo=f"from {path.name}: continuing at cycle {state.start_cycle}",
            start_cycle=state.start_cycle,
            parameter_version=state.parameter_version,
        )


__all__ = [
    "COLD_START_MARKER",
    "COLD_START_STUDENT",
    "GroupResult",
    "OPDTrainer",
    "load_resolved_config",
]
