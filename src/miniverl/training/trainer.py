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

import math
import random
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from miniverl import __version__
from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.cache.store import TeacherCache
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task, sample_extra_tasks
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits, task_file_digest
from miniverl.errors import CheckpointError, ConfigError, GpuMemoryError, RunDirectoryError
from miniverl.losses import (
    DivergenceSpec,
    chunked_selected_position_loss,
    concat_providers,
    normalize_trajectory_weights,
)
from miniverl.models.base import CausalLMBackend
from miniverl.models.batching import build_padded_trajectory_batch, length_buckets
from miniverl.models.factory import build_tokenizer, resolve_device
from miniverl.models.fingerprint import backend_fingerprint
from miniverl.models.runtime import LocalRoleGraph, build_runtime
from miniverl.schemas.records import CycleRecord, EvalRecord, StepRecord
from miniverl.schemas.trajectory import Trajectory
from miniverl.selection.selectors import aggregate_selection_stats
from miniverl.teachers.local import LocalTeacherScorer
from miniverl.training.budget import make_cap_meter
from miniverl.training.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    save_tensors,
)
from miniverl.training.checkpoint_retention import prune_cycle_checkpoints
from miniverl.training.checkpoint_select import select_resume_checkpoint, supersede_newer
from miniverl.training.live import LiveSinks, cycle_summary, format_live_line, step_scalars
from miniverl.training.memory import (
    MemoryPlan,
    resolve_chunk_size,
    resolve_strategy,
    resolve_trajectory_batch_size,
    run_with_oom_retry,
)
from miniverl.training.noisy_traces import toy_fit_traces
from miniverl.training.onpolicy import check_on_policy
from miniverl.training.optim import (
    Schedule,
    build_optimizer,
    load_optimizer_state,
    move_optimizer_state,
    optimizer_state_tensors,
    set_lr,
)
from miniverl.training.progress import ProgressReporter
from miniverl.training.recovery import (
    has_run_traces,
    prepare_clean_restart,
    remove_stale_temporaries,
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
from miniverl.trajectory.io import append_trajectories
from miniverl.utils import gpu
from miniverl.utils.env import collect_environment
from miniverl.utils.io import (
    append_jsonl,
    atomic_write_bytes,
    atomic_write_text,
    read_json,
    repair_jsonl_tail,
    sha256_file,
    write_json,
)
from miniverl.utils.logging import EventLog, MetricsLog, make_console, utc_now
from miniverl.utils.runlock import run_lock
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import load_yaml_file
from miniverl.utils.seeding import (
    capture_rng_state,
    derive_seed,
    restore_rng_state,
    seed_everything,
)

TOY_TEACHER_FILE = "toy-teacher.safetensors"
COLD_START_STUDENT = "student.safetensors"
COLD_START_MARKER = "cold_start.json"
DEFAULT_TOP_K = 64
__all__ = [
    "OFFLINE_POOL_CYCLE",
    "GroupResult",
    "OPDTrainer",
    "TrainingSample",
    "load_resolved_config",
    "summarize_rollouts",
]


@dataclass
class GroupResult:
    loss: float = 0.0
    divergence_loss: float = 0.0
    sampled_token_nll: float = 0.0
    positions: int = 0
    entropy_sum: float = 0.0
    entropy_positions: int = 0
    entropy_lower_bound: bool = False
    high_entropy_sum: float = 0.0
    loss_by_span_type: dict[str, float] = field(default_factory=dict)


class OPDTrainer:
    """Runs ``sft``, ``offline_kd`` or ``opd`` for one ``RunConfig`` into one run directory."""

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
        """Build everything a run needs and resolve every ``auto`` value."""
        if self._is_setup:
            return
        cfg = self.config
        if write_artifacts and not self.resume and self.paths.manifest.exists():
            raise RunDirectoryError(
                f"{self.paths.root} already holds a run",
                hint="pass --resume to continue it, or choose another --output directory",
            )
        seed_everything(cfg.run.seed, deterministic=cfg.run.deterministic)
        self.device = resolve_device(cfg)
        self.cpu_threads = self._resolve_cpu_threads()
        self.tokenizer = build_tokenizer(cfg)
        self.environment = make_environment(cfg.environment.name, **cfg.environment.params)
        self.splits = build_splits(self.environment, cfg.environment)
        self.tasks_by_id = {t.task_id: t for split in self.splits.values() for t in split}
        self.task_order = self._build_task_order()

        needs_teacher = cfg.run.mode != "sft" and with_teacher
        self.runtime = build_runtime(cfg, self.tokenizer, self.device, with_teacher=needs_teacher)
        self.student: CausalLMBackend = self.runtime.student
        self.teacher: CausalLMBackend | None = self.runtime.teacher
        self.runner = RolloutRunner(self.student, self.environment, cfg.rollout)
        vocab = self.student.capabilities.vocab_size
        self.vocab_size = vocab
        self.chunk_size = resolve_chunk_size(cfg.loss.chunk_size, vocab, cfg.memory.min_chunk_size)
        self.top_k = self._resolve_top_k(vocab)
        self.memory_plan: MemoryPlan = resolve_strategy(
            cfg, device=self.device, model_bytes=self._model_bytes()
        )
        self._place_teacher()
        caps = self.student.capabilities
        self.trajectory_batch_size, self.trajectory_batch_reason = resolve_trajectory_batch_size(
            cfg.train.trajectory_batch_size,
            group_size=cfg.train.group_size(),
            device=self.device,
            max_total_tokens=cfg.rollout.max_total_tokens,
            hidden_size=caps.hidden_size,
            num_layers=caps.num_layers,
        )
        self.spec = DivergenceSpec(
            name=cfg.loss.divergence,
            temperature=cfg.loss.temperature,
            jsd_beta=cfg.loss.jsd_beta if cfg.loss.divergence == "jsd" else 0.5,
            entropy_threshold=cfg.loss.entropy_threshold,
            entropy_forward_weight=cfg.loss.entropy_forward_weight,
        )
        self.scorer: LocalTeacherScorer | None = None
        self.cache: TeacherCache | None = None
        if needs_teacher and self.teacher is not None:
            self._setup_supervision()
        self.optimizer = build_optimizer(self.student.trainable_parameters(), cfg.train)
        self.schedule = Schedule(
            peak_lr=cfg.train.lr,
            kind=cfg.train.schedule,
            warmup_steps=cfg.train.warmup_steps,
            total_steps=max(1, self._planned_steps()),
            min_lr_ratio=cfg.train.min_lr_ratio,
        )
        self.source = self._build_source()
        self.resolved_config = self._resolved_config()
        self.role_graph = LocalRoleGraph.for_trainer(self)
        self._refresh_fingerprint()
        self._is_setup = True
        if write_artifacts and not self.resume:
            self._write_config_files()
            write_json(self.paths.environment, collect_environment())
            write_json(self.paths.manifest, self.build_manifest())

    def _resolve_cpu_threads(self) -> int:
        threads = self.config.run.cpu_threads
        if threads == "auto":
            threads = (
                1
                if self.config.models.backend == "toy" and self.device == "cpu"
                else torch.get_num_threads()
            )
        torch.set_num_threads(int(threads))
        return int(threads)

    def _place_teacher(self) -> None:
        """Resident plan: move a host-loaded teacher onto the device; fall back to swap on OOM.

        Only ``auto`` may fall back, and the plan's reason says so; a requested
        ``resident`` that does not fit is a :class:`GpuMemoryError`.
        """
        teacher = self.teacher
        if (
            teacher is None
            or not self.memory_plan.teacher_resident
            or teacher.device == self.device
        ):
            return
        try:
            teacher.to_device(self.device)
        except Exception as exc:
            if not gpu.is_oom_error(exc):
                raise
            teacher.to_device("cpu")
            if self.memory_plan.requested != "auto":
                raise GpuMemoryError(
                    f"the teacher does not fit on {self.device} next to the student (memory.strategy: resident)",
                    hint="use memory.strategy: swap or auto, or quantize the student",
                ) from exc
            self.memory_plan = MemoryPlan(
                "swap",
                "auto",
                f"auto -> swap: loading the teacher onto {self.device} ran out of memory ({self.memory_plan.reason})",
                False,
            )

    def _resolve_top_k(self, vocab: int) -> int:
        top_k = self.config.loss.top_k
        if self.config.loss.mode == "exact_full_vocab":
            return vocab
        return min(vocab, DEFAULT_TOP_K) if top_k in ("auto", None) else min(vocab, int(top_k))

    def _model_bytes(self) -> int:
        total = 0
        for backend in (self.student, self.teacher):
            if backend is None:
                continue
            caps = backend.capabilities
            bytes_per = 2 if caps.precision in ("bfloat16", "float16") else 4
            if caps.quantization == "nf4":
                bytes_per = 1
            total += caps.num_parameters * bytes_per
        return total

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

    def _planned_steps(self) -> int:
        tr = self.config.train
        if self.config.run.mode == "opd":
            return tr.cycles * tr.steps_per_rollout_batch()
        return tr.cycles * math.ceil(tr.rollouts_per_cycle / tr.group_size())

    def _resolved_config(self) -> RunConfig:
        data = self.config.to_dict()
        data["models"]["device"] = self.device
        data["run"]["cpu_threads"] = self.cpu_threads
        data["memory"]["strategy"] = self.memory_plan.strategy
        data["loss"]["chunk_size"] = self.chunk_size
        if self.config.environment.tasks is not None:
            data["environment"]["tasks"] = str(Path(self.config.environment.tasks).resolve())
        if self.config.loss.mode == "bucketed":
            data["loss"]["top_k"] = self.top_k
        tr = data["train"]
        tr["gradient_accumulation_steps"] = self.config.train.group_size()
        tr["trajectory_batch_size"] = self.trajectory_batch_size
        return RunConfig.from_mapping(data, source="<resolved>")

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
        header = (
            f"# every 'auto' replaced by its decision\n# memory plan: {self.memory_plan.reason}\n"
            f"# trajectory batch: {self.trajectory_batch_reason}\n"
        )
        atomic_write_text(self.paths.config_resolved, header + self.resolved_config.to_yaml())

    # ================================================================== manifest

    def build_manifest(self) -> dict[str, Any]:
        """Identity, hardware, objective and provenance of the run (docs/design.md §5.2)."""
        cfg = self.config
        env = collect_environment()
        models = {}
        for role, backend in (("student", self.student), ("teacher", self.teacher)):
            if backend is None:
                continue
            spec = getattr(cfg.models, role)
            models[role] = {
                "model_id": spec.model_id,
                "revision": spec.revision,
                "quantization": spec.quantization,
                "precision": backend.capabilities.precision,
                "capabilities": backend.capabilities.to_dict(),
            }
        cache_note = None
        if self.cache is None and cfg.run.mode != "sft":
            cache_note = "cache disabled" if not cfg.cache.enabled else None
        return {
            "miniverl_version": __version__,
            "run_id": self.paths.root.name,
            "created_at": utc_now(),
            "git_commit": _git_commit(),
            "python": env["python"],
            "os": env["os"],
            "packages": env["packages"],
            "gpu": env["gpu"],
            "mode": cfg.run.mode,
            "seed": cfg.run.seed,
            "deterministic": cfg.run.deterministic,
            "config_digest": cfg.digest(),
            "environment": {
                **self.environment.describe(),
                "difficulty": cfg.environment.difficulty,
                "split_sizes": {k: len(v) for k, v in self.splits.items()},
                "tasks_sha256": task_file_digest(cfg.environment.tasks),
            },
            "models": models,
            "tokenizer": {
                "fingerprint": self.tokenizer.fingerprint,
                "vocab_size": self.tokenizer.vocab_size,
            },
            "objective": self.objective_block(),
            "memory_plan": self.memory_plan.to_dict(),
            "projection_chunk_size": self.chunk_size,
            "batching": {
                "rollout_batch_size": cfg.rollout.batch_size or cfg.train.rollouts_per_cycle,
                "eval_batch_size": cfg.eval.batch_size,
                "teacher_batch_size": cfg.teacher.batch_size,
                "trajectory_batch_size": self.trajectory_batch_size,
                "trajectory_batch_planned": self.resolved_config.train.trajectory_batch_size,
                "trajectory_batch_reason": self.trajectory_batch_reason,
                "cpu_threads": self.cpu_threads,
            },
            "role_graph": self.role_graph.to_dict(),
            "global_optimizer_step": self.global_step,
            "parameter_version": self.parameter_version,
            "policy_version": self.parameter_version,
            "rollout_policy_version": self._last_rollout_version(),
            "policy_fingerprint": self.policy_fingerprint,
            "measurement_status": {
                "gpu_memory": "measured" if gpu.cuda_available() else gpu.NOT_RUN_NO_CUDA,
                "cache": cache_note or ("enabled" if self.cache is not None else "not_used"),
            },
            "toy_teacher": self.toy_teacher_report,
        }

    def objective_block(self) -> dict[str, Any]:
        cfg = self.config
        supervision = "oracle_tokens"
        if cfg.run.mode != "sft":
            supervision = (
                "exact_hidden"
                if self.scorer is not None and self.scorer.shape == "exact_hidden"
                else "bucketed_topk_plus_tail"
            )
        return {
            "label": cfg.objective_label(),
            "mode": cfg.run.mode,
            "loss_mode": cfg.loss.mode,
            "divergence": cfg.loss.divergence if cfg.run.mode != "sft" else "cross_entropy",
            "jsd_beta": cfg.loss.jsd_beta if cfg.loss.divergence == "jsd" else None,
            "temperature": cfg.loss.temperature,
            "loss_temperature": cfg.loss.temperature if cfg.run.mode != "sft" else None,
            "sampling_temperature": cfg.rollout.temperature,
            "eval_temperature": cfg.eval.temperature,
            "top_k": self.top_k if supervision == "bucketed_topk_plus_tail" else None,
            "supervision_shape": supervision,
            "sampled_token_nll_weight": cfg.loss.sampled_token_nll_weight,
            "entropy_threshold": cfg.loss.entropy_threshold
            if cfg.loss.divergence == "entropy_aware"
            else None,
            "entropy_forward_weight": cfg.loss.entropy_forward_weight
            if cfg.loss.divergence == "entropy_aware"
            else None,
            "selector": cfg.selection.selector,
            "selection_ratio": cfg.selection.ratio,
            "teacher_mode": cfg.teacher.mode,
            "opd_freshness": cfg.train.opd_freshness,
            "replay_passes": cfg.train.replay_passes,
            "group_size": cfg.train.group_size(),
            "trajectory_batch_size": self.resolved_config.train.trajectory_batch_size,
            "sft_warmup_cycles": cfg.train.sft_warmup_cycles if cfg.run.mode != "sft" else 0,
        }

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
                if cfg.run.mode != "sft" and cfg.train.sft_warmup_cycles > 0:
                    self._run_sft_warmup(cfg.train.sft_warmup_cycles)
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
        if not tasks:
            return 0.0
        requests = [
            EpisodeRequest(task, derive_seed(self.config.run.seed, "probe", i))
            for i, task in enumerate(tasks)
        ]
        trajectories = runner.rollout_batch(
            requests,
            batch_size=self.config.eval.batch_size,
            temperature=0.0,
            split=self._oom_splitter("probe rollout"),
        )
        return sum(int(t.solved) for t in trajectories) / len(tasks)

    def _oom_splitter(self, what: str) -> Any:
        return oom_splitter(self.events, what)

    def _prepare_toy_teacher(self) -> None:
        """Toy backend only: fit the toy teacher on oracle traces until it solves its tasks."""
        if self.config.models.backend != "toy" or self.teacher is None:
            return
        from miniverl.models.toy import fit_toy_model
        from miniverl.training import teacher_reuse as reuse
        from miniverl.training.teacher_reuse import toy_teacher_digest_inputs

        fit = self.config.models.toy_fit
        env_cfg = self.config.environment
        train = self.splits["train"]
        extra = sample_extra_tasks(
            self.environment,
            fit.extra_tasks,
            derive_seed(env_cfg.split_seed, "toy-teacher-pool"),
            env_cfg.difficulty,
            exclude=[t for split in self.splits.values() for t in split],
        )
        pool = train + extra
        examples = [
            trace.example
            for trace in toy_fit_traces(
                self.runner,
                pool,
                noise_fraction=fit.noise_fraction,
                seed=derive_seed(self.config.run.seed, "toy-teacher-noise"),
            )
        ]
        runner = self._teacher_runner()
        probe = random.Random(derive_seed(self.config.run.seed, "toy-teacher-probe")).sample(
            pool, min(len(pool), fit.probe_tasks)
        )
        eval_tasks = self.splits[self.config.eval.split][: self.config.eval.max_tasks]
        inputs = toy_teacher_digest_inputs(
            self.teacher,
            examples=examples,
            probe=probe,
            train=train,
            eval_tasks=eval_tasks,
            fit=fit.model_dump(mode="json", exclude={"reuse"}),
            rollout=self.config.rollout.model_dump(mode="json"),
            chunk_size=self.chunk_size,
            seed=self.config.run.seed,
            device=self.device,
        )
        digest = reuse.teacher_digest(inputs)
        cached = reuse.load_cached_teacher(digest) if fit.reuse else None
        if cached is not None:
            self.teacher.load_full_state_dict(cached[0])
            self._freeze_toy_teacher()
            self.toy_teacher_report = {
                **cached[1],
                "reused": True,
                "cache_digest": digest,
                "weights_sha256": self._save_toy_teacher(self.paths.root / TOY_TEACHER_FILE),
            }
            write_json(self.paths.manifest, self.build_manifest())
            self.events.emit(
                "toy_teacher_reused",
                echo=f"cached fit {digest[:12]} from {reuse.cache_root()} (saved {cached[1].get('seconds', 0):.0f}s of fitting)",
                **self.toy_teacher_report,
            )
            return
        checks: list[dict[str, float]] = []
        rng_before = capture_rng_state()

        with self.progress.task("fitting toy teacher", max(1, fit.max_steps)) as advance:
            last = {"probe": None}

            def solved_enough(step: int) -> bool:
                rate = self._greedy_success(runner, probe)
                checks.append({"step": step, "probe_success": rate})
                last["probe"] = rate
                return rate >= fit.target_success

            def on_step(step: int, loss: float) -> None:
                probe_text = (
                    "" if last["probe"] is None else f" | probe accuracy {last['probe']:.0%}"
                )
                advance(stats=f"step {step} | loss {loss:.3f}{probe_text}")

            report = fit_toy_model(
                self.teacher,
                examples,
                steps=fit.max_steps,
                lr=fit.lr,
                batch_size=fit.batch_size,
                seed=derive_seed(self.config.run.seed, "toy-teacher-fit"),
                chunk_size=max(1, self.chunk_size),
                stop_when=solved_enough,
                check_every=fit.check_every,
                on_step=on_step,
            )
        self._freeze_toy_teacher()
        train_success = self._greedy_success(runner, train)
        eval_success = self._greedy_success(runner, eval_tasks)
        restore_rng_state(rng_before)
        weights_sha256 = self._save_toy_teacher(self.paths.root / TOY_TEACHER_FILE)
        fitted = {
            "steps": report.steps_run,
            "final_loss": report.final_loss,
            "stopped_early": report.stopped_early,
            "seconds": round(report.seconds, 2),
            "fit_tasks": len(pool),
            "extra_tasks": len(extra),
            "train_success": train_success,
            "heldout_success": eval_success,
            "checks": checks,
        }
        if fit.reuse:
            reuse.store_teacher(digest, self.teacher.full_state_dict(), fitted, inputs)
        self.toy_teacher_report = {
            **fitted,
            "reused": False,
            "cache_digest": digest,
            "weights_sha256": weights_sha256,
        }
        write_json(self.paths.manifest, self.build_manifest())
        self.events.emit(
            "toy_teacher_fitted",
            echo=f"{report.steps_run} steps, greedy success train {train_success:.2f} / held-out {eval_success:.2f}",
            **self.toy_teacher_report,
        )

    def _freeze_toy_teacher(self) -> None:
        assert self.teacher is not None
        for p in self.teacher.trainable_parameters():
            p.requires_grad_(False)
        self.teacher.set_train(False)

    def _save_toy_teacher(self, path: Path) -> str:
        assert self.teacher is not None
        return save_tensors(self.teacher.full_state_dict(), path)

    def export_cold_start(self, directory: str | Path) -> Path:
        """Write the student's trainable weights (and the fitted toy teacher) for benchmark arms.

        Weights only: no optimizer state crosses into an arm, so no momentum leaks
        between arms that share this cold start.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        marker: dict[str, Any] = {
            "student_sha256": save_tensors(
                self.student.trainable_state_dict(), directory / COLD_START_STUDENT
            ),
            "parameter_version": self.parameter_version,
            "global_optimizer_step": self.global_step,
            "config_digest": self.config.digest(),
            "evaluations": self.eval_results,
            "toy_teacher": self.toy_teacher_report,
        }
        if self.config.models.backend == "toy" and self.teacher is not None:
            marker["toy_teacher_sha256"] = self._save_toy_teacher(directory / TOY_TEACHER_FILE)
        write_json(directory / COLD_START_MARKER, marker)
        return directory

    def _load_cold_start(self) -> None:
        """Load a shared cold start weights-only; the arm starts with a fresh optimizer."""
        assert self.cold_start is not None
        marker_path = self.cold_start / COLD_START_MARKER
        if not marker_path.is_file():
            raise CheckpointError(
                f"{marker_path} not found", hint="run the benchmark cold start first"
            )
        marker = read_json(marker_path, error=CheckpointError)
        student_path = self.cold_start / COLD_START_STUDENT
        if not student_path.is_file() or sha256_file(student_path) != marker.get("student_sha256"):
            raise CheckpointError(f"{student_path} is missing or does not match {marker_path}")
        self.student.load_trainable_state_dict(
            {k: v.to(self.student.device) for k, v in load_file(str(student_path)).items()}
        )
        self._refresh_fingerprint()
        teacher_sha = None
        if self.config.models.backend == "toy" and self.teacher is not None:
            teacher_path = self.cold_start / TOY_TEACHER_FILE
            teacher_sha = sha256_file(teacher_path) if teacher_path.is_file() else None
            if teacher_sha is None or teacher_sha != marker.get("toy_teacher_sha256"):
                raise CheckpointError(f"{teacher_path} is missing or does not match {marker_path}")
            self.teacher.load_full_state_dict(load_file(str(teacher_path)))
            self.toy_teacher_report = {
                **(marker.get("toy_teacher") or {}),
                "weights_sha256": self._save_toy_teacher(self.paths.root / TOY_TEACHER_FILE),
            }
        self.events.emit(
            "benchmark_cold_start_loaded",
            echo=f"weights-only cold start from {self.cold_start.name}",
            student_sha256=marker["student_sha256"],
            toy_teacher_sha256=teacher_sha,
            cold_start_parameter_version=marker.get("parameter_version"),
        )

    def _load_toy_teacher(self, report: dict[str, Any] | None) -> None:
        """Resume: the fitted toy teacher, verified against the hash in the checkpoint."""
        if self.config.models.backend != "toy" or self.teacher is None:
            return
        path = self.paths.root / TOY_TEACHER_FILE
        report = report or {}
        if not path.is_file() or sha256_file(path) != report.get("weights_sha256"):
            raise CheckpointError(
                f"{path} is missing or does not match its SHA-256 in the checkpoint",
                hint="start a new run",
            )
        self.teacher.load_full_state_dict(load_file(str(path)))
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
        """Roll out the held-out split (greedy by default) and summarize it."""
        cfg = self.config
        split = split or cfg.eval.split
        tasks = self.splits[split][: cfg.eval.max_tasks]
        temp = cfg.eval.temperature if temperature is None else temperature
        self.student.set_train(False)
        trajectories: list[Trajectory] = []
        size = cfg.eval.batch_size
        with self.progress.task(f"eval {tag}", len(tasks)) as advance:
            for start in range(0, len(tasks), size):
                requests = [
                    EpisodeRequest(
                        task,
                        derive_seed(cfg.run.seed, "eval", i),
                        trajectory_id=f"{task.task_id}:eval-{tag}:v{self.parameter_version}",
                        extra_metadata={"eval_tag": tag},
                    )
                    for i, task in enumerate(tasks[start : start + size], start=start)
                ]
                batch = self.runner.rollout_batch(
                    requests,
                    batch_size=size,
                    policy_version=self.parameter_version,
                    temperature=temp,
                    split=self._oom_splitter("eval rollout"),
                )
                trajectories.extend(batch)
                for _ in batch:
                    advance()
        if write:
            append_trajectories(self.paths.eval_trajectories, trajectories)
        result = summarize_rollouts(trajectories)
        result.update(
            tag=tag,
            split=split,
            temperature=temp,
            parameter_version=self.parameter_version,
            global_optimizer_step=self.global_step,
        )
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
        final = self.eval_results.get("final", {})
        summary: dict[str, Any] = {
            "run_id": self.paths.root.name,
            "mode": self.config.run.mode,
            "objective": self.config.objective_label(),
            "config_digest": self.config.digest(),
            "global_optimizer_step": self.global_step,
            "parameter_version": self.parameter_version,
            "evaluations": self.eval_results,
            "baseline": self.eval_results.get("baseline"),
            "after_warmup": self.eval_results.get("after_warmup"),
            "final": final,
            "toy_teacher": self.toy_teacher_report,
            "teacher_adapter": self.teacher_adapter_report,
        }
        if seconds is not None:
            summary["seconds"] = round(seconds, 2)
        return summary

    # ---------------------------------------------------------------- SFT warm-up

    def _run_sft_warmup(self, cycles: int) -> None:
        """Oracle-trace cross-entropy before KD/OPD: gets the policy emitting valid calls."""
        self.events.emit("sft_warmup_start", echo=f"{cycles} cycles", cycles=cycles)
        source = OracleSource(
            runner=self.runner,
            version=lambda: self.parameter_version,
            trajectory_log=self.paths.trajectories,
            tasks_per_cycle=self.config.train.rollouts_per_cycle,
        )
        self._in_warmup = True
        try:
            with self.progress.task("SFT warm-up", cycles) as advance:
                for k in range(cycles):
                    cycle = k - cycles
                    batch = source.samples(cycle, self._next_tasks(source.tasks_per_cycle))
                    records = self._optimize(batch.samples, source.supervision, cycle=cycle)
                    self.events.emit(
                        "sft_warmup_cycle",
                        cycle=cycle,
                        steps=len(records),
                        loss=records[-1]["loss"] if records else None,
                    )
                    advance()
        finally:
            self._in_warmup = False
        self.main_start_step = self.global_step

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
            self._write_token_analysis(samples, cycle)
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
        phase = supervision.phase
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
                result, used_chunk = self._group_gradients_fitting_memory(
                    members, supervision.teacher_targets
                )
                self.chunk_size = used_chunk
                committed, grad_norm, lr = self._commit_update()
                seconds = time.perf_counter() - t0
                positions = result.positions
                record = StepRecord.build(
                    phase=phase,
                    cycle=cycle,
                    step=step_in_cycle,
                    global_optimizer_step=self.global_step,
                    parameter_version=self.parameter_version,
                    policy_version=self.parameter_version,
                    rollout_policy_version=members[0].rollout_policy_version,
                    policy_fingerprint=self.policy_fingerprint,
                    rollout_policy_fingerprint=members[0].rollout_fingerprint,
                    committed=committed,
                    loss=result.loss,
                    divergence_loss=result.divergence_loss,
                    sampled_token_nll=result.sampled_token_nll,
                    grad_norm=grad_norm,
                    lr=lr,
                    selected_positions=positions,
                    trajectories_in_step=len(members),
                    teacher_entropy_mean=(result.entropy_sum / result.entropy_positions)
                    if result.entropy_positions
                    else None,
                    teacher_entropy_is_lower_bound=result.entropy_lower_bound
                    if result.entropy_positions
                    else None,
                    **temperature_fields(cfg, phase),
                    high_entropy_fraction=(result.high_entropy_sum / result.entropy_positions)
                    if result.entropy_positions
                    else None,
                    loss_by_span_type=result.loss_by_span_type,
                    seconds=round(seconds, 4),
                    train_selected_tokens_per_second=round(positions / seconds, 2)
                    if seconds > 0
                    else None,
                    projection_chunk_size=used_chunk,
                    gpu=gpu.snapshot(self.device),
                ).to_json()
                self.metrics.write(record)
                if self.live is not None:
                    self.live.scalars(self.global_step, step_scalars(record))
                records.append(record)
                step_in_cycle += 1
        self.student.set_train(False)
        return records

    def _group_gradients_fitting_memory(
        self, members: Sequence[TrainingSample], teacher_targets: bool
    ) -> tuple[GroupResult, int]:
        """The OOM retry halves the loss chunk; once it cannot, halve the trajectory batch.

        Both are exactly neutral for the loss and gradients; every change is recorded as an
        event and the smaller trajectory batch is kept for the rest of the run.
        """
        cfg = self.config
        while True:
            try:
                return run_with_oom_retry(
                    lambda chunk: self._compute_group_gradients(members, chunk, teacher_targets),
                    chunk_size=self.chunk_size,
                    min_chunk_size=cfg.memory.min_chunk_size,
                    retries=cfg.memory.oom_retries,
                    events=self.events,
                    on_retry=lambda: self.optimizer.zero_grad(set_to_none=True),
                )
            except GpuMemoryError:
                if self.trajectory_batch_size <= 1:
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                smaller = self.trajectory_batch_size // 2
                self.events.emit(
                    "oom_batch_split",
                    echo=f"trajectory batch {self.trajectory_batch_size} -> {smaller}",
                    what="trajectory batch",
                    batch_size=self.trajectory_batch_size,
                    split_into=[smaller, self.trajectory_batch_size - smaller],
                )
                self.trajectory_batch_size = smaller

    def _compute_group_gradients(
        self, group: Sequence[TrainingSample], chunk_size: int, teacher_targets: bool
    ) -> GroupResult:
        """Accumulate the gradient of L = (1/G) sum_r L_r over length-bucketed micro-batches.

        Without teacher targets the loss is cross-entropy on the trajectory's tokens (weight 1).
        """
        cfg = self.config
        self.optimizer.zero_grad(set_to_none=True)
        batch_rows = self.trajectory_batch_size
        ce_weight = cfg.loss.sampled_token_nll_weight if teacher_targets else 1.0
        out = GroupResult()
        for bucket in length_buckets([s.trajectory.length for s in group], int(batch_rows)):
            rows = [group[i] for i in bucket]
            batch = build_padded_trajectory_batch(
                token_ids=[r.trajectory.token_ids for r in rows],
                selected_positions=[r.alignment.student_prediction_positions for r in rows],
                pad_token_id=self.tokenizer.pad_token_id,
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

    def _current_lr(self) -> float:
        """Warm-up: constant ``train.sft_lr`` (default ``train.lr``); then the schedule.

        The schedule counts optimizer steps since the main phase began, so a longer or
        shorter warm-up does not shift the KD/OPD learning-rate curve.
        """
        if self._in_warmup:
            return self.config.train.sft_lr or self.config.train.lr
        return self.schedule.lr_at(self.global_step - self.main_start_step)

    def _commit_update(self) -> tuple[bool, float, float]:
        """Clip, set the scheduled lr, step. A non-finite gradient skips the step."""
        params = self.student.trainable_parameters()
        max_norm = self.config.train.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(
            params, max_norm if max_norm is not None else float("inf")
        )
        grad_norm = float(norm)
        lr = self._current_lr()
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            self.events.emit(
                "update_skipped_nonfinite",
                echo="non-finite gradient: update skipped",
                global_optimizer_step=self.global_step,
            )
            return False, grad_norm, lr
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        self.parameter_version += 1
        self._refresh_fingerprint()
        return True, grad_norm, lr

    def _refresh_fingerprint(self) -> None:
        """After every commit or weight load: the fingerprint strict OPD checks rollouts against."""
        self.policy_fingerprint = backend_fingerprint(self.student)

    # ---------------------------------------------------------------- analysis

    @torch.no_grad()
    def _write_token_analysis(self, samples: Sequence[TrainingSample], cycle: int) -> None:
        """Per-token divergence at the positions the policy emitted (after the update)."""
        records = []
        self.student.set_train(False)
        for sample in samples:
            al = sample.alignment
            if not al.num_positions:
                continue
            hidden = self.student.hidden_states_at(
                sample.trajectory.token_ids, al.student_prediction_positions
            )
            logits = self.student.project(hidden).float()
            log_probs = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(al.target_token_ids, dtype=torch.long, device=logits.device)
            student_lp = log_probs.gather(1, targets[:, None])[:, 0].tolist()
            divergence: list[float | None] = [None] * al.num_positions
            if sample.provider is not None:
                divergence = sample.provider.divergence(
                    logits, 0, al.num_positions
                ).divergence.tolist()
            for i, pred in enumerate(al.student_prediction_positions):
                records.append(
                    {
                        "trajectory_id": sample.trajectory.trajectory_id,
                        "cycle": cycle,
                        "measured": "after_update",
                        "target_position": pred + 1,
                        "prediction_position": pred,
                        "token_id": al.target_token_ids[i],
                        "token_text": self.tokenizer.decode([al.target_token_ids[i]]),
                        "span_type": al.span_types[i],
                        "weight": al.token_weights[i],
                        "divergence": divergence[i],
                        "student_log_prob": student_lp[i],
                        "teacher_entropy": sample.teacher_entropy[i]
                        if i < len(sample.teacher_entropy)
                        else None,
                        "teacher_entropy_is_lower_bound": sample.entropy_is_lower_bound
                        if i < len(sample.teacher_entropy)
                        else None,
                    }
                )
        self.paths.token_analysis.unlink(missing_ok=True)
        append_jsonl(self.paths.token_analysis, records)
        self.events.emit("token_analysis_written", cycle=cycle, positions=len(records))

    # ================================================================== checkpoints

    def _jsonl_sizes(self) -> dict[str, int]:
        sizes = {}
        for name in ("metrics", "trajectories", "eval_trajectories", "token_analysis"):
            path = getattr(self.paths, name)
            sizes[name] = path.stat().st_size if path.exists() else 0
        return sizes

    def save_checkpoint(self, name: str, *, cycle: int) -> Path:
        """Trainable weights, optimizer moments and every counter needed to resume."""
        tensors, optimizer_meta = optimizer_state_tensors(self.optimizer)
        state = {
            "cycle": cycle,
            "global_step": self.global_step,
            "parameter_version": self.parameter_version,
            "rollout_policy_version": self._last_rollout_version(),
            "task_cursor": self.task_cursor,
            "chunk_size": self.chunk_size,
            "schedule": self.schedule.to_dict(),
            "main_start_step": self.main_start_step,
            "rng": capture_rng_state(),
            "optimizer": optimizer_meta,
            "eval_results": self.eval_results,
            "jsonl_sizes": self._jsonl_sizes(),
            "source": self.source.state_dict(),
            "toy_teacher": self.toy_teacher_report,
            "miniverl_version": __version__,
        }
        path = save_checkpoint(
            self.paths.checkpoint(name),
            trainable=self.student.trainable_state_dict(),
            optimizer_tensors=tensors,
            state=state,
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
        checkpoint, which must verify (:func:`select_resume_checkpoint`).
        """
        if path is None:
            path = select_resume_checkpoint(self.paths.checkpoints, self.resume_from)
        path = Path(path) if path is not None else None
        if path is None:
            raise CheckpointError(
                f"no complete checkpoint under {self.paths.checkpoints}",
                hint="the run stopped before its first checkpoint; start it again without --resume",
            )
        if path.name == "final" and self.paths.eval_json.exists():
            raise CheckpointError(
                f"{self.paths.root} already finished (checkpoints/final and eval.json exist)",
                hint="nothing to resume; use 'miniverl eval --run' to re-evaluate",
            )
        loaded = load_checkpoint(path, device=self.student.device)
        if loaded.state["config_digest"] != self.config.digest():
            raise CheckpointError(
                f"checkpoint {path} was written by a different config (digest {loaded.state['config_digest'][:12]} vs {self.config.digest()[:12]})",
                hint="resume with exactly the recipe and overrides of the original run (see config.validated.yaml)",
            )
        self._load_toy_teacher(loaded.state.get("toy_teacher"))
        self.student.load_trainable_state_dict(loaded.trainable)
        self._refresh_fingerprint()
        load_optimizer_state(self.optimizer, loaded.optimizer, loaded.state["optimizer"])
        state = loaded.state
        self.global_step = int(state["global_step"])
        self.parameter_version = int(state["parameter_version"])
        self._rollout_version = state.get("rollout_policy_version")
        self.task_cursor = int(state["task_cursor"])
        self.chunk_size = int(state["chunk_size"])
        self.main_start_step = int(state.get("main_start_step", 0))
        self.eval_results = dict(state.get("eval_results") or {})
        sizes = {
            getattr(self.paths, n): int(v) for n, v in (state.get("jsonl_sizes") or {}).items()
        }
        if self.resume_from is not None:
            moved = supersede_newer(self.paths.checkpoints, path, sizes)
            if moved:
                self.events.emit(
                    "checkpoints_superseded",
                    echo=f"--resume-from {path.name}: newer checkpoints and log tails moved to checkpoints/{moved['folder']}",
                    **moved,
                )
        for log, size in sizes.items():
            _truncate(log, size)
        restore_rng_state(state["rng"])
        self._start_cycle = int(state["cycle"]) + 1
        self.cycle = int(state["cycle"])  # eval records after a resume name the right cycle
        # Killed after the final checkpoint: only eval.json and the manifest remain to write.
        self._training_finished = path.name == "final"
        # Checkpoints before sample sources kept the offline pool under "offline_kd".
        self.source.load_state_dict(state.get("source") or state.get("offline_kd") or {})
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


def _truncate(path: Path, size: int) -> None:
    """Cut an append-only log back to the length recorded at the checkpoint."""
    if path.exists() and path.stat().st_size > size:
        with open(path, "r+b") as handle:
            handle.truncate(size)


def _git_commit() -> str | None:
    """The miniverl source commit when running from a git checkout, else None."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def load_resolved_config(run_dir: str | Path) -> RunConfig:
    """``config.resolved.yaml`` of a run (what ``miniverl eval --run`` rebuilds from)."""
    paths = RunPaths(run_dir)
    if not paths.config_resolved.exists() and not paths.config_resolved.is_symlink():
        raise RunDirectoryError(
            f"{paths.config_resolved} not found",
            hint="point --run at a directory written by 'miniverl train'",
        )
    data = load_yaml_file(paths.config_resolved, error=RunDirectoryError)
    if not isinstance(data, dict):
        raise RunDirectoryError(f"{paths.config_resolved} is not a mapping of config sections")
    try:
        return RunConfig.from_mapping(data, source=str(paths.config_resolved))
    except ConfigError as exc:
        raise RunDirectoryError(exc.message, hint="the file was edited; re-run training") from None


__all__ = ["OPDTrainer", "TrainingSample", "load_resolved_config", "summarize_rollouts"]
