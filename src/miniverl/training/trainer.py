"""``OPDTrainer``: one recipe for every mode (docs/design.md §3, §4).

The modes differ only in where trajectories come from and where targets come from, and
that lives in a :class:`~miniverl.training.sources.SampleSource` chosen once at setup:

- ``sft``: oracle traces, cross-entropy on their tokens (:class:`OracleSource`);
- ``offline_kd``: one fixed set of teacher rollouts, one frozen teacher cache
  (:class:`OfflinePoolSource`);
- ``opd``: fresh student rollouts every cycle, scored by the teacher at exactly those
  states; targets are read back through the cache, whose policy-version check makes
  "on-policy" an enforced property rather than a convention (:class:`OnPolicySource`).

Read :meth:`OPDTrainer.train` top to bottom: it is the cycle of docs/design.md §3 in order
(tasks -> ``source.samples`` -> optimize -> commit -> log/evaluate), with no mode branch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from miniverl.agent.loop import RolloutRunner
from miniverl.cache.store import TeacherCache
from miniverl.config.loading import load_resolved_config
from miniverl.config.models import RunConfig
from miniverl.config.sections import WarmupUntilConfig
from miniverl.environments.base import Task
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.errors import CheckpointError, RunDirectoryError
from miniverl.losses import DivergenceSpec
from miniverl.models.base import CausalLMBackend
from miniverl.models.factory import build_tokenizer
from miniverl.models.fingerprint import backend_fingerprint
from miniverl.models.runtime import build_runtime
from miniverl.schemas.records import CycleRecord, EvalRecord, StepRecord
from miniverl.selection.selectors import aggregate_selection_stats
from miniverl.teachers.local import LocalTeacherScorer
from miniverl.training import toy_teacher
from miniverl.training.budget import make_cap_meter
from miniverl.training.checkpoint_retention import prune_cycle_checkpoints
from miniverl.training.checkpoint_select import select_resume_checkpoint
from miniverl.training.cold_start import (
    COLD_START_MARKER,
    COLD_START_STUDENT,
    load_cold_start,
    save_cold_start,
)
from miniverl.training.evaluate import eval_summary, evaluate_policy
from miniverl.training.gradients import GroupGradients, GroupResult
from miniverl.training.live import LiveSinks, cycle_summary, format_live_line, step_scalars
from miniverl.training.manifest import LocalRoleGraph, ManifestInputs, build_manifest
from miniverl.training.onpolicy import check_on_policy
from miniverl.training.optim import (
    Schedule,
    UpdateOutcome,
    apply_update,
    build_optimizer,
    load_optimizer_state,
    move_optimizer_state,
    scheduled_lr,
)
from miniverl.training.progress import ProgressReporter
from miniverl.training.recovery import (
    has_run_traces,
    prepare_clean_restart,
    remove_stale_temporaries,
)
from miniverl.training.resolve import (
    HostCapabilities,
    MemoryPlan,
    ResolvedRun,
    place_teacher,
    resolve_device,
    resolve_run,
)
from miniverl.training.resume import (
    ResumeCounters,
    choose_resume_checkpoint,
    load_training_checkpoint,
    restore_logs,
    source_state,
    write_training_checkpoint,
)
from miniverl.training.sources import (
    OFFLINE_POOL_CYCLE,
    CycleSamples,
    OracleSource,
    SampleSource,
    Supervision,
    TeacherTargets,
    TrainingSample,
    build_source,
    make_select_and_align,
    oom_splitter,
    summarize_rollouts,
)
from miniverl.training.teacher_adapter import prepare_teacher_adapter
from miniverl.training.temperatures import temperature_fields, temperature_mismatch
from miniverl.training.token_analysis import write_token_analysis
from miniverl.training.toy_teacher import TOY_TEACHER_FILE
from miniverl.training.warmup import (
    criterion_tasks,
    greedy_validation_success,
    run_sft_warmup,
    warmup_cycles,
)
from miniverl.trajectory.io import append_trajectories
from miniverl.utils import gpu
from miniverl.utils.env import collect_environment
from miniverl.utils.io import (
    atomic_write_bytes,
    atomic_write_text,
    repair_jsonl_tail,
    write_json,
)
from miniverl.utils.logging import EventLog, MetricsLog, make_console
from miniverl.utils.runlock import run_lock
from miniverl.utils.runs import RunPaths
from miniverl.utils.seeding import (
    restore_rng_state,
    seed_everything,
)

__all__ = [
    "COLD_START_MARKER",
    "COLD_START_STUDENT",
    "OFFLINE_POOL_CYCLE",
    "GroupResult",
    "OPDTrainer",
    "TrainingSample",
    "load_resolved_config",
    "summarize_rollouts",
]


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
        resolved: bool = False,
        cold_start: str | Path | None = None,
        resume_from: str | None = None,
    ) -> None:
        self.config = config
        self.paths = RunPaths(output_dir or config.run.output_dir or Path("runs") / config.run.name)
        self.submitted_recipe = submitted_recipe
        self.resume = resume or resume_from is not None
        self.resume_from = resume_from
        self.from_resolved = resolved
        self.cold_start = Path(cold_start) if cold_start is not None else None
        self.console = make_console(quiet)
        self.progress = ProgressReporter(self.console, progress)
        self.events = EventLog(self.paths.events, self.console)
        self.metrics = MetricsLog(self.paths.metrics)
        self.global_step = 0
        self.parameter_version = 0
        self.policy_fingerprint: str | None = None
        self.task_cursor = 0
        self.cycle = -1
        self._start_cycle = 0
        self.eval_results: dict[str, dict[str, Any]] = {}
        self.toy_teacher_report: dict[str, Any] | None = None
        self.teacher_adapter_report: dict[str, Any] | None = None
        self._in_warmup = False
        self.main_start_step = 0
        self._is_setup = False
        self.live: LiveSinks | None = None
        self.last_cycle_summary: dict[str, Any] = {}
        self._training_finished = False

    # ================================================================== setup

    def setup(self, *, write_artifacts: bool = True, with_teacher: bool = True) -> None:
        """Build everything a run needs; every ``auto`` is decided once, by ``resolve_run``."""
        if self._is_setup:
            return
        cfg = self.config
        if write_artifacts and not self.resume and self.paths.manifest.exists():
            raise RunDirectoryError(
                f"{self.paths.root} already holds a run",
                hint="pass --resume to continue it, or choose another --output directory",
            )
        seed_everything(cfg.run.seed, deterministic=cfg.run.deterministic)
        device = resolve_device(cfg, cuda_available=torch.cuda.is_available())
        self.tokenizer = build_tokenizer(cfg)
        self.environment = make_environment(cfg.environment.name, **cfg.environment.params)
        self.splits = build_splits(self.environment, cfg.environment)
        self.tasks_by_id = {t.task_id: t for split in self.splits.values() for t in split}
        self.task_order = self._build_task_order()

        needs_teacher = cfg.run.mode != "sft" and with_teacher
        self.runtime = build_runtime(cfg, self.tokenizer, device, with_teacher=needs_teacher)
        self.student: CausalLMBackend = self.runtime.student
        self.teacher: CausalLMBackend | None = self.runtime.teacher
        planned = resolve_run(
            cfg,
            device=device,
            host=HostCapabilities.probe(device),
            student=self.student.capabilities,
            teacher=None if self.teacher is None else self.teacher.capabilities,
        )
        torch.set_num_threads(planned.cpu_threads)
        self.resolved: ResolvedRun = planned.with_memory_plan(
            place_teacher(self.teacher, planned.memory_plan, device)
        )
        self.resolved_config = self.resolved.to_config(cfg)
        # The live values an OOM retry may shrink; the resolved plan keeps the planned ones.
        self.chunk_size = self.resolved.chunk_size
        self.trajectory_batch_size = self.resolved.trajectory_batch_size
        self.runner = RolloutRunner(self.student, self.environment, cfg.rollout)
        self.scorer: LocalTeacherScorer | None = None
        self.cache: TeacherCache | None = None
        if needs_teacher and self.teacher is not None:
            self._setup_supervision()
        self.optimizer = build_optimizer(self.student.trainable_parameters(), cfg.train)
        self.schedule = Schedule(
            peak_lr=cfg.train.lr,
            kind=cfg.train.schedule,
            warmup_steps=cfg.train.warmup_steps,
            total_steps=max(1, self.resolved.planned_steps),
            min_lr_ratio=cfg.train.min_lr_ratio,
        )
        self.source = self._build_source()
        self.role_graph = LocalRoleGraph.local(
            runtime=self.runtime,
            runner=self.runner,
            environment=self.environment,
            scorer=self.scorer,
            cache_directory=None if self.cache is None else self.cache.directory,
            recipe=type(self).__name__,
        )
        self._refresh_fingerprint()
        self._is_setup = True
        if write_artifacts and not self.resume:
            self._write_config_files()
            write_json(self.paths.environment, collect_environment())
            write_json(self.paths.manifest, self.build_manifest())

    # Read-only views of the resolved run (decided once in training/resolve.py).

    @property
    def device(self) -> str:
        return self.resolved.device

    @property
    def cpu_threads(self) -> int:
        return self.resolved.cpu_threads

    @property
    def vocab_size(self) -> int:
        return self.resolved.vocab_size

    @property
    def top_k(self) -> int:
        return self.resolved.top_k

    @property
    def memory_plan(self) -> MemoryPlan:
        return self.resolved.memory_plan

    @property
    def spec(self) -> DivergenceSpec:
        return self.resolved.divergence

    def _setup_supervision(self) -> None:
        cfg = self.config
        self.scorer = LocalTeacherScorer(
            self.teacher,
            spec=self.spec,
            loss_mode=cfg.loss.mode,
            top_k=self.top_k,
            teacher_resident=self.memory_plan.teacher_resident,
            exact_max_vocab=cfg.loss.exact_max_vocab,
            allow_large_exact=cfg.loss.allow_large_exact,
            student_fingerprint=self.tokenizer.fingerprint,
            chunk_size=self.chunk_size,
            teacher_model_id=cfg.models.teacher.model_id,
        )
        if cfg.cache.enabled and self.scorer.shape == "bucketed":
            directory = Path(cfg.cache.dir) if cfg.cache.dir else self.paths.teacher_cache
            self.cache = TeacherCache(
                directory,
                self.scorer.cache_provenance(dtype=cfg.cache.dtype, teacher_mode=cfg.teacher.mode),
                strict_policy_version=cfg.cache.strict_policy_version,
                reuse_across_policy_versions=cfg.cache.reuse_across_policy_versions,
                max_entries_per_shard=cfg.cache.max_entries_per_shard,
                journal=cfg.cache.journal,
            )

    def _build_source(self) -> SampleSource:
        """Where this run's samples come from; the only reader of ``run.mode`` for the cycle."""
        cfg = self.config
        runner = self.runner
        render = None
        if cfg.teacher.mode == "privileged_context":

            def render(traj: Any) -> Any:
                return runner.privileged_render(traj, self.tasks_by_id[traj.task_id])

        self.teacher_targets = TeacherTargets(
            scorer=self.scorer,
            cache=self.cache,
            spec=self.spec,
            select_and_align=make_select_and_align(cfg, render),
            batch_size=cfg.teacher.batch_size,
            events=self.events,
            swap=None if self.memory_plan.teacher_resident else self._teacher_on_device,
        )
        return build_source(
            cfg.run.mode,
            config=cfg,
            student_runner=runner,
            student=self.student,
            teacher_runner=self._teacher_runner,
            targets=self.teacher_targets,
            train_tasks=self.splits["train"],
            version=lambda: self.parameter_version,
            step=lambda: self.global_step,
            fingerprint=lambda: self.policy_fingerprint,
            events=self.events,
            progress=self.progress,
            trajectory_log=self.paths.trajectories,
            vocab_size=self.vocab_size,
        )

    def _write_config_files(self) -> None:
        if self.resume:
            return
        if self.submitted_recipe is not None:
            atomic_write_bytes(self.paths.config_submitted, self.submitted_recipe)
        validated = self.config.to_yaml()
        atomic_write_text(self.paths.config_validated, validated)
        atomic_write_text(
            self.paths.config_original,
            "# v0.2 resume-compatibility copy of the runtime input; not the submitted bytes\n"
            + validated,
        )
        atomic_write_text(self.paths.config_resolved, self.resolved.resolved_yaml(self.config))

    # ================================================================== manifest

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
                chunk_size=self.chunk_size,
                trajectory_batch_size=self.trajectory_batch_size,
                global_step=self.global_step,
                parameter_version=self.parameter_version,
                rollout_policy_version=self._last_rollout_version(),
                policy_fingerprint=self.policy_fingerprint,
                toy_teacher=self.toy_teacher_report,
            )
        )

    def _last_rollout_version(self) -> int | None:
        return getattr(self, "_rollout_version", None)

    # ================================================================== the run

    def train(self) -> dict[str, Any]:
        """Run the whole recipe under the run directory's write lock; the ``eval.json`` summary."""
        with run_lock(self.paths.root):
            if self.resume:
                traces = has_run_traces(self.paths)  # before temporaries are cleaned up
                repair_jsonl_tail(self.paths.events)
                cache_dir = Path(self.config.cache.dir) if self.config.cache.dir else None
                remove_stale_temporaries(self.paths, cache_dir)
                self._restart_if_no_checkpoint(traces)
            return self._train_locked()

    def _restart_if_no_checkpoint(self, traces: bool) -> None:
        """``--resume`` before the first checkpoint: recompute from the start (recovery.py)."""
        if self.resume_from is not None or select_resume_checkpoint(self.paths.checkpoints):
            return
        if not traces:
            raise CheckpointError(
                f"no complete checkpoint under {self.paths.checkpoints} and no run to resume "
                f"in {self.paths.root}",
                hint="start it without --resume",
            )
        removed = prepare_clean_restart(self.paths, self.config)
        self.resume = False
        self.events.emit(
            "restarted",
            echo="no checkpoint yet: restarting the run from the beginning",
            removed=removed,
        )

    def _train_locked(self) -> dict[str, Any]:
        self.setup()
        cfg = self.config
        started = time.perf_counter()
        self.events.emit(
            "run_start",
            echo=f"{cfg.run.mode} -> {self.paths.root}",
            mode=cfg.run.mode,
            run_dir=self.paths.root.name,
            resume=self.resume,
            device=self.device,
            memory_plan=self.memory_plan.to_dict(),
        )
        self.live = LiveSinks(
            cfg.logging, self.paths.root, run_name=self.paths.root.name, run_config=cfg.to_dict()
        )
        if self.scorer is not None:
            self.events.emit(
                "teacher_targets_path",
                **self.teacher_targets.describe(teacher_resident=self.memory_plan.teacher_resident),
            )
        if (mismatch := temperature_mismatch(cfg)) is not None:
            self.events.emit(
                "temperature_mismatch", echo=mismatch["explanation"], level="warning", **mismatch
            )
        try:
            if self.resume:
                self.load_from_checkpoint()
            elif self.cold_start is not None:
                self._load_cold_start()
                if cfg.eval.baseline:
                    self.evaluate("baseline")
            else:
                self._prepare_toy_teacher()
                if cfg.eval.baseline:
                    self.evaluate("baseline")
                if cfg.run.mode != "sft" and warmup_cycles(cfg.train) > 0:
                    self._run_sft_warmup()
                    if cfg.eval.after_warmup:
                        self.evaluate("after_warmup")
                    self.save_checkpoint("warmup", cycle=-1)
            if not self._training_finished:
                self.teacher_adapter_report = prepare_teacher_adapter(self)
                meter = make_cap_meter(getattr(self, "budget_cap", None), self.paths)
                with self.progress.task("cycles", cfg.train.cycles - self._start_cycle) as advance:
                    for cycle in range(self._start_cycle, cfg.train.cycles):
                        steps_before = self.global_step
                        self._run_cycle(cycle)
                        last = cycle == cfg.train.cycles - 1
                        held_out = None
                        if cfg.eval.every and not last and (cycle + 1) % cfg.eval.every == 0:
                            held_out = self.evaluate(f"cycle-{cycle:04d}")
                        if last or (cycle + 1) % cfg.train.checkpoint_every == 0:
                            self.save_checkpoint(f"cycle-{cycle:04d}", cycle=cycle)
                        advance(stats=format_live_line(self.last_cycle_summary, held_out))
                        if meter is not None and meter.after_cycle(
                            cycle=cycle,
                            steps=self.global_step - steps_before,
                            global_step=self.global_step,
                            events=self.events,
                        ):
                            break
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
                global_optimizer_step=self.global_step,
            )
            # eval.json last: its presence is what marks the run finished, so a run killed
            # before it is completed by --resume (from checkpoints/final).
            write_json(self.paths.eval_json, summary)
        except KeyboardInterrupt:
            self.events.emit(
                "run_end",
                echo="interrupted; resume with --resume",
                status="interrupted",
                global_optimizer_step=self.global_step,
            )
            raise
        finally:
            self.live.close()
        return summary

    # ---------------------------------------------------------------- tasks

    def _build_task_order(self) -> list[int]:
        order = list(range(len(self.splits["train"])))
        random.Random(self.config.run.seed ^ 0x5EED).shuffle(order)
        return order

    def _next_tasks(self, count: int) -> list[Task]:
        """Walk the shuffled training order with the checkpointed cursor (wrapping)."""
        train = self.splits["train"]
        picked = []
        for _ in range(count):
            picked.append(train[self.task_order[self.task_cursor % len(self.task_order)]])
            self.task_cursor += 1
        return picked

    # ---------------------------------------------------------------- toy teacher

    def _teacher_runner(self) -> RolloutRunner:
        assert self.teacher is not None
        return RolloutRunner(self.teacher, self.environment, self.config.rollout)

    def _greedy_success(self, runner: RolloutRunner, tasks: Sequence[Task]) -> float:
        return toy_teacher.greedy_success(
            runner,
            tasks,
            seed=self.config.run.seed,
            batch_size=self.config.eval.batch_size,
            split=self._oom_splitter("probe rollout"),
        )

    def _oom_splitter(self, what: str) -> Any:
        return oom_splitter(self.events, what)

    def _prepare_toy_teacher(self) -> None:
        """Toy backend only: fit the toy teacher until it solves its tasks (training/toy_teacher.py)."""
        if self.config.models.backend != "toy" or self.teacher is None:
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
            chunk_size=self.chunk_size,
            device=self.device,
            run_dir=self.paths.root,
            events=self.events,
            progress=self.progress,
            split=self._oom_splitter("probe rollout"),
            publish=publish,
        )

    def _fitted_toy_teacher(self) -> CausalLMBackend | None:
        """The teacher when it is the fitted toy teacher (its weights travel with the run)."""
        return self.teacher if self.config.models.backend == "toy" else None

    def export_cold_start(self, directory: str | Path) -> Path:
        """Write the student's trainable weights (and the fitted toy teacher) for benchmark arms.

        Weights only (training/cold_start.py): no optimizer state crosses into an arm.
        """
        return save_cold_start(
            Path(directory),
            student=self.student,
            toy_teacher=self._fitted_toy_teacher(),
            parameter_version=self.parameter_version,
            global_step=self.global_step,
            config_digest=self.config.digest(),
            evaluations=self.eval_results,
            toy_teacher_report=self.toy_teacher_report,
        )

    def _load_cold_start(self) -> None:
        """Load a shared cold start weights-only; the arm starts with a fresh optimizer."""
        assert self.cold_start is not None
        loaded = load_cold_start(
            self.cold_start,
            student=self.student,
            toy_teacher=self._fitted_toy_teacher(),
            run_dir=self.paths.root,
        )
        self._refresh_fingerprint()
        if loaded.toy_teacher_report is not None:
            self.toy_teacher_report = loaded.toy_teacher_report
        self.events.emit(
            "benchmark_cold_start_loaded",
            echo=f"weights-only cold start from {self.cold_start.name}",
            student_sha256=loaded.marker["student_sha256"],
            toy_teacher_sha256=loaded.toy_teacher_sha256,
            cold_start_parameter_version=loaded.marker.get("parameter_version"),
        )

    def _load_toy_teacher(self, report: dict[str, Any] | None) -> None:
        """Resume: the fitted toy teacher, verified against the hash in the checkpoint."""
        if self.config.models.backend != "toy" or self.teacher is None:
            return
        report = report or {}
        toy_teacher.load_teacher(
            self.teacher, self.paths.root / TOY_TEACHER_FILE, report.get("weights_sha256")
        )
        self.toy_teacher_report = report

    # ---------------------------------------------------------------- evaluation

    def evaluate(
        self,
        tag: str,
        *,
        temperature: float | None = None,
        split: str | None = None,
        write: bool = True,
    ) -> dict[str, Any]:
        """Roll out the held-out split (greedy by default), summarize and record it."""
        cfg = self.config
        split = split or cfg.eval.split
        result, trajectories = evaluate_policy(
            self.runner,
            self.splits[split][: cfg.eval.max_tasks],
            tag=tag,
            split=split,
            seed=cfg.run.seed,
            temperature=cfg.eval.temperature if temperature is None else temperature,
            batch_size=cfg.eval.batch_size,
            parameter_version=self.parameter_version,
            global_step=self.global_step,
            progress=self.progress,
            on_oom=self._oom_splitter("eval rollout"),
        )
        if write:
            append_trajectories(self.paths.eval_trajectories, trajectories)
        self.eval_results[tag] = result
        self.events.emit(
            "eval", echo=f"{tag}: {result['solved']}/{result['tasks']} solved", **result
        )
        self.metrics.write(EvalRecord.build(cycle=self.cycle, **result).to_json())
        if self.live is not None:
            self.live.scalars(
                self.global_step, {f"eval/{split}_success_rate": result["success_rate"]}
            )
        return result

    def eval_summary(self, seconds: float | None = None) -> dict[str, Any]:
        """The ``eval.json`` payload (training/evaluate.py ``eval_summary``)."""
        return eval_summary(
            self.config,
            run_id=self.paths.root.name,
            global_step=self.global_step,
            parameter_version=self.parameter_version,
            evaluations=self.eval_results,
            toy_teacher=self.toy_teacher_report,
            teacher_adapter=self.teacher_adapter_report,
            seconds=seconds,
        )

    # ---------------------------------------------------------------- SFT warm-up

    def _run_sft_warmup(self, cycles: int | None = None) -> None:
        """Oracle-trace cross-entropy before KD/OPD (training/warmup.py).

        ``cycles`` forces a fixed count; by default the recipe decides (a fixed count, or
        ``train.sft_warmup_until``'s criterion and cap).
        """
        until = self.config.train.sft_warmup_until if cycles is None else None
        source = OracleSource(
            runner=self.runner,
            version=lambda: self.parameter_version,
            trajectory_log=self.paths.trajectories,
            tasks_per_cycle=self.config.train.rollouts_per_cycle,
        )
        self._in_warmup = True
        try:
            run_sft_warmup(
                source,
                cycles=warmup_cycles(self.config.train) if cycles is None else cycles,
                next_tasks=self._next_tasks,
                optimize=lambda samples, supervision, c: self._optimize(
                    samples, supervision, cycle=c
                ),
                events=self.events,
                progress=self.progress,
                until=until,
                measure=self._warmup_criterion(until) if until is not None else None,
            )
        finally:
            self._in_warmup = False
        self.main_start_step = self.global_step

    def _warmup_criterion(self, until: WarmupUntilConfig) -> Callable[[], float]:
        """``until``'s metric for the current student weights: greedy, nothing written."""
        tasks = criterion_tasks(self.config, self.splits, until)
        split = self._oom_splitter("warm-up criterion rollout")

        def measure() -> float:
            self.student.set_train(False)
            return greedy_validation_success(
                self.runner,
                tasks,
                seed=self.config.run.seed,
                batch_size=self.config.eval.batch_size,
                policy_version=self.parameter_version,
                split=split,
            )

        return measure

    # ---------------------------------------------------------------- one cycle

    def _run_cycle(self, cycle: int) -> None:
        """tasks -> source samples (collect, select, align, score, cache) -> optimize -> log."""
        cfg = self.config
        self.cycle = cycle
        started = time.perf_counter()
        source = self.source
        phase = source.supervision.phase
        batch: CycleSamples = source.samples(cycle, self._next_tasks(source.tasks_per_cycle))
        if batch.rollout_version is not None:
            self._rollout_version = batch.rollout_version
        samples, rollout_stats = batch.samples, batch.rollout_stats
        selection = aggregate_selection_stats(s.selection for s in samples)
        record: dict[str, Any] = {
            "cycle": cycle,
            "mode": phase,
            "parameter_version_before": self.parameter_version,
            "policy_fingerprint_before": self.policy_fingerprint,
            **temperature_fields(cfg, phase),
            "rollouts": rollout_stats,
            "selection": selection,
        }
        if not any(s.trainable for s in samples):
            self.events.emit(
                "cycle_skipped_no_selected_positions",
                echo=f"cycle {cycle}: the selector found nothing to supervise",
                cycle=cycle,
                selector=cfg.selection.selector,
                trajectories=len(samples),
            )
            record.update(
                skipped=True,
                steps=0,
                parameter_version=self.parameter_version,
                seconds=round(time.perf_counter() - started, 3),
            )
            self.metrics.write(CycleRecord.build(**record).to_json())
            return
        steps = self._optimize(samples, source.supervision, cycle=cycle)
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
            parameter_version=self.parameter_version,
            policy_fingerprint=self.policy_fingerprint,
            loss=steps[-1]["loss"] if steps else None,
            mean_loss=live["mean_loss"],
            mean_divergence=live["mean_divergence"],
            seconds=round(time.perf_counter() - started, 3),
        )
        self.metrics.write(CycleRecord.build(**record).to_json())
        self.last_cycle_summary = live
        if self.live is not None:
            self.live.scalars(
                self.global_step,
                {
                    "cycle/mean_loss": live["mean_loss"],
                    "cycle/mean_divergence": live["mean_divergence"],
                    "rollout/success_rate": live["rollout_success_rate"],
                },
            )
        self.events.emit(
            "cycle_end", echo=f"cycle {cycle}: {format_live_line(live)}", cycle=cycle, **live
        )

    @contextmanager
    def _teacher_on_device(self) -> Iterator[None]:
        """``swap`` strategy: student and its optimizer moments to host, teacher on; then back."""
        self.student.to_device("cpu")
        move_optimizer_state(self.optimizer, "cpu")
        if self.teacher is not None:
            self.teacher.to_device(self.device)
        yield
        if self.teacher is not None:
            self.teacher.to_device("cpu")
        self.student.to_device(self.device)
        move_optimizer_state(self.optimizer, self.device)

    # ---------------------------------------------------------------- update

    def _optimize(
        self, samples: Sequence[TrainingSample], supervision: Supervision, *, cycle: int
    ) -> list[dict[str, Any]]:
        """Optimizer groups of ``group_size`` trainable rows; one commit per group."""
        cfg = self.config
        rows = [s for s in samples if s.trainable]
        group = cfg.train.group_size()
        gradients = GroupGradients(
            student=self.student,
            optimizer=self.optimizer,
            pad_token_id=self.tokenizer.pad_token_id,
            nll_weight=cfg.loss.sampled_token_nll_weight,
            min_chunk_size=cfg.memory.min_chunk_size,
            oom_retries=cfg.memory.oom_retries,
            events=self.events,
        )
        records = []
        self.student.set_train(True)
        step_in_cycle = 0
        for _ in range(supervision.passes):
            for start in range(0, len(rows), group):
                members = rows[start : start + group]
                if supervision.strict_on_policy:
                    self._refresh_fingerprint()
                    check_on_policy(members, self.policy_fingerprint)
                t0 = time.perf_counter()
                gpu.reset_peak(self.device if self.device.startswith("cuda") else None)
                result, self.chunk_size, self.trajectory_batch_size = gradients.fitting_memory(
                    members,
                    chunk_size=self.chunk_size,
                    batch_rows=self.trajectory_batch_size,
                    teacher_targets=supervision.teacher_targets,
                )
                update = self._commit_update()
                seconds = time.perf_counter() - t0
                record = StepRecord.build(
                    phase=supervision.phase,
                    cycle=cycle,
                    step=step_in_cycle,
                    global_optimizer_step=self.global_step,
                    parameter_version=self.parameter_version,
                    policy_version=self.parameter_version,
                    rollout_policy_version=members[0].rollout_policy_version,
                    policy_fingerprint=self.policy_fingerprint,
                    rollout_policy_fingerprint=members[0].rollout_fingerprint,
                    committed=update.committed,
                    grad_norm=update.grad_norm,
                    lr=update.lr,
                    trajectories_in_step=len(members),
                    **result.step_fields(),
                    **temperature_fields(cfg, supervision.phase),
                    seconds=round(seconds, 4),
                    train_selected_tokens_per_second=round(result.positions / seconds, 2)
                    if seconds > 0
                    else None,
                    projection_chunk_size=self.chunk_size,
                    gpu=gpu.snapshot(self.device),
                ).to_json()
                self.metrics.write(record)
                if self.live is not None:
                    self.live.scalars(self.global_step, step_scalars(record))
                records.append(record)
                step_in_cycle += 1
        self.student.set_train(False)
        return records

    def _commit_update(self) -> UpdateOutcome:
        """Clip, set the scheduled lr, step; a committed update is a new policy version."""
        lr = scheduled_lr(
            self.schedule,
            self.config.train,
            global_step=self.global_step,
            main_start_step=self.main_start_step,
            in_warmup=self._in_warmup,
        )
        update = apply_update(
            self.optimizer,
            self.student.trainable_parameters(),
            lr=lr,
            max_grad_norm=self.config.train.max_grad_norm,
            events=self.events,
            global_step=self.global_step,
        )
        if update.committed:
            self.global_step += 1
            self.parameter_version += 1
            self._refresh_fingerprint()
        return update

    def _refresh_fingerprint(self) -> None:
        """After every commit or weight load: the fingerprint strict OPD checks rollouts against."""
        self.policy_fingerprint = backend_fingerprint(self.student)

    # ================================================================== checkpoints

    def save_checkpoint(self, name: str, *, cycle: int) -> Path:
        """Trainable weights, optimizer moments and every counter needed to resume."""
        path = write_training_checkpoint(
            self.paths.checkpoint(name),
            counters=ResumeCounters(
                cycle=cycle,
                global_step=self.global_step,
                parameter_version=self.parameter_version,
                rollout_policy_version=self._last_rollout_version(),
                task_cursor=self.task_cursor,
                chunk_size=self.chunk_size,
                main_start_step=self.main_start_step,
                eval_results=self.eval_results,
            ),
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
            "checkpoint_saved", name=name, cycle=cycle, global_optimizer_step=self.global_step
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
        state = loaded.state
        self._load_toy_teacher(state.get("toy_teacher"))
        self.student.load_trainable_state_dict(loaded.trainable)
        self._refresh_fingerprint()
        load_optimizer_state(self.optimizer, loaded.optimizer, state["optimizer"])
        counters = ResumeCounters.from_state(state)
        self.global_step = counters.global_step
        self.parameter_version = counters.parameter_version
        self._rollout_version = counters.rollout_policy_version
        self.task_cursor = counters.task_cursor
        self.chunk_size = counters.chunk_size
        self.main_start_step = counters.main_start_step
        self.eval_results = counters.eval_results
        restore_logs(
            self.paths, state, path, explicit=self.resume_from is not None, events=self.events
        )
        restore_rng_state(state["rng"])
        self._start_cycle = counters.cycle + 1
        self.cycle = counters.cycle  # eval records after a resume name the right cycle
        # Killed after the final checkpoint: only eval.json and the manifest remain to write.
        self._training_finished = path.name == "final"
        self.source.load_state_dict(source_state(state))
        self.events.emit(
            "checkpoint_loaded", name=path.name, global_optimizer_step=self.global_step
        )
        self.events.emit(
            "resumed",
            echo=f"from {path.name}: continuing at cycle {self._start_cycle}",
            start_cycle=self._start_cycle,
            parameter_version=self.parameter_version,
        )


# ====================================================================== helpers




__all__ = ["OPDTrainer", "TrainingSample", "load_resolved_config", "summarize_rollouts"]
