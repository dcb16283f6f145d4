"""The run manifest, its objective block and the local role graph (docs/design.md §5.2).

``manifest.json`` records identity, hardware, objective and provenance of a run. Every
value it holds arrives through :class:`ManifestInputs` (the resolved run, the built
models, the counters at the time of writing), never by reading a trainer's attributes,
so the manifest of a run is a function of what the run *is* and can be built and
tested without one.

:class:`LocalRoleGraph` names the boundaries of a verl-like workflow (actor, rollout,
teacher, reference, reward/verifier, target builder, update, evaluation, artifact
bridge) and maps the miniverl objects that play them, so the manifest says who did
what. It is a local single-device ownership graph, not Ray workers, DataProto or FSDP.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl import __version__
from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import ToolEnvironment
from miniverl.environments.tasks_file import task_file_digest
from miniverl.models.base import CausalLMBackend
from miniverl.models.runtime import ModelRuntime
from miniverl.schemas.text import TokenizerLike
from miniverl.teachers.local import LocalTeacherScorer
from miniverl.training.resolve import ResolvedRun
from miniverl.training.run_state import RunState
from miniverl.utils import gpu
from miniverl.utils.env import collect_environment
from miniverl.utils.logging import utc_now

ROLES = (
    "ActorPolicy",
    "RolloutRuntime",
    "TeacherPolicy",
    "ReferencePolicy",
    "RewardOrVerifier",
    "TargetBuilder",
    "UpdateRuntime",
    "EvaluationRuntime",
    "ArtifactBridge",
)


def _name(obj: Any) -> str | None:
    if obj is None:
        return None
    return type(obj).__name__ if not isinstance(obj, str) else obj


@dataclass
class LocalRoleGraph:
    """Typed roles -> the local objects bound to them."""

    bindings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def bind(self, role: str, obj: Any, **details: Any) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        self.bindings[role] = {"bound_to": _name(obj), **details}

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": {role: self.bindings.get(role, {"bound_to": None}) for role in ROLES},
            "note": "local single-device ownership graph; not Ray workers, DataProto or FSDP placement",
        }

    @classmethod
    def local(
        cls,
        *,
        runtime: ModelRuntime,
        runner: RolloutRunner,
        environment: ToolEnvironment,
        scorer: LocalTeacherScorer | None,
        cache_directory: Path | None,
        recipe: str,
    ) -> LocalRoleGraph:
        """Bind one local run: its models, rollout runner, verifier, scorer and cache.

        ``recipe`` names the class that runs the update and the evaluation (the trainer);
        ``cache_directory`` is ``None`` when the run keeps no teacher cache.
        """
        graph = cls()
        graph.bind(
            "ActorPolicy",
            runtime.student,
            model_id=runtime.student.capabilities.model_id,
            runtime=runtime.kind,
        )
        graph.bind("RolloutRuntime", runner, sampler="models.sampling.run_generation")
        graph.bind(
            "TeacherPolicy",
            runtime.teacher,
            model_id=None if runtime.teacher is None else runtime.teacher.capabilities.model_id,
        )
        graph.bind(
            "ReferencePolicy",
            runtime.reference,
            note="no objective in miniverl requests a reference policy",
        )
        graph.bind(
            "RewardOrVerifier",
            environment,
            method="verify",
            note="exact verifier; reported, never optimized",
        )
        graph.bind("TargetBuilder", scorer, shape=None if scorer is None else scorer.shape)
        graph.bind("UpdateRuntime", recipe, method="loss_step")
        graph.bind("EvaluationRuntime", recipe, method="evaluate")
        graph.bind(
            "ArtifactBridge",
            "RunPaths + TeacherCache",
            cache=None if cache_directory is None else str(cache_directory.name),
        )
        return graph


def supervision_shape(config: RunConfig, scorer_shape: str | None) -> str:
    """What the student is trained against: oracle tokens, exact hidden states or buckets."""
    if not config.mode().uses_teacher:
        return "oracle_tokens"
    return "exact_hidden" if scorer_shape == "exact_hidden" else "bucketed_topk_plus_tail"


def objective_block(
    config: RunConfig, resolved: ResolvedRun, scorer_shape: str | None
) -> dict[str, Any]:
    """The manifest's ``objective``: the loss the run optimizes, as resolved.

    ``scorer_shape`` is the teacher scorer's target shape (``None`` without a scorer).
    """
    cfg = config
    supervision = supervision_shape(cfg, scorer_shape)
    mode = cfg.mode()
    distills = mode.teacher_targets
    entropy_aware = cfg.loss.divergence == "entropy_aware"
    return {
        "label": cfg.objective_label(),
        "mode": cfg.run.mode,
        "loss_mode": cfg.loss.mode,
        "divergence": cfg.loss.divergence if distills else "cross_entropy",
        "jsd_beta": cfg.loss.jsd_beta if cfg.loss.divergence == "jsd" else None,
        "temperature": cfg.loss.temperature,
        "loss_temperature": cfg.loss.temperature if distills else None,
        "sampling_temperature": cfg.rollout.temperature,
        "eval_temperature": cfg.eval.temperature,
        "top_k": resolved.top_k if supervision == "bucketed_topk_plus_tail" else None,
        "supervision_shape": supervision,
        "sampled_token_nll_weight": cfg.loss.sampled_token_nll_weight,
        "entropy_threshold": cfg.loss.entropy_threshold if entropy_aware else None,
        "entropy_forward_weight": cfg.loss.entropy_forward_weight if entropy_aware else None,
        "selector": cfg.selection.selector,
        "selection_ratio": cfg.selection.ratio,
        "teacher_mode": cfg.teacher.mode,
        "opd_freshness": cfg.train.opd_freshness,
        "replay_passes": cfg.train.replay_passes,
        "group_size": resolved.group_size,
        "trajectory_batch_size": resolved.trajectory_batch_size,
        "sft_warmup_cycles": cfg.train.sft_warmup_cycles if mode.warmup else 0,
    }


@dataclass(frozen=True)
class ManifestInputs:
    """Everything ``manifest.json`` says, passed explicitly.

    - ``resolved``: the run's decisions (:func:`~miniverl.training.resolve.resolve_run`).
    - ``student`` / ``teacher``: the built backends; their capabilities are read when the
      manifest is written (a swapped teacher reports where it is now).
    - ``split_sizes``: tasks per split (``{"train": 24, "eval": 8, ...}``).
    - ``scorer_shape``: the teacher scorer's shape, ``None`` without a scorer.
    - ``cache_in_use``: the run writes a teacher cache.
    - ``state``: the run's counters now (``training/run_state.py``): optimizer step,
      parameter and rollout policy versions, fingerprint, and the live ``chunk_size`` /
      ``trajectory_batch_size`` (an OOM retry may have shrunk them below the resolved plan).
    """

    config: RunConfig
    resolved: ResolvedRun
    run_id: str
    environment: ToolEnvironment
    split_sizes: Mapping[str, int]
    tokenizer: TokenizerLike
    student: CausalLMBackend
    teacher: CausalLMBackend | None
    role_graph: LocalRoleGraph
    scorer_shape: str | None
    cache_in_use: bool
    state: RunState
    teacher_record: dict[str, Any] | None
    teacher_checkpoint: dict[str, Any] | None = None


def build_manifest(inputs: ManifestInputs) -> dict[str, Any]:
    """Identity, hardware, objective and provenance of the run (docs/design.md §5.2)."""
    cfg = inputs.config
    resolved = inputs.resolved
    env = collect_environment()
    models = {}
    for role, backend in (("student", inputs.student), ("teacher", inputs.teacher)):
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
    if not inputs.cache_in_use and cfg.mode().uses_teacher:
        cache_note = "cache disabled" if not cfg.cache.enabled else None
    return {
        "miniverl_version": __version__,
        "run_id": inputs.run_id,
        "created_at": utc_now(),
        "git_commit": git_commit(),
        "python": env["python"],
        "os": env["os"],
        "packages": env["packages"],
        "gpu": env["gpu"],
        "mode": cfg.run.mode,
        "seed": cfg.run.seed,
        "deterministic": True,
        "config_digest": cfg.digest(),
        "environment": {
            **inputs.environment.describe(),
            "difficulty": cfg.environment.difficulty,
            "split_sizes": dict(inputs.split_sizes),
            "tasks_sha256": task_file_digest(cfg.environment.tasks),
        },
        "models": models,
        "tokenizer": {
            "fingerprint": inputs.tokenizer.fingerprint,
            "vocab_size": inputs.tokenizer.vocab_size,
        },
        "objective": objective_block(cfg, resolved, inputs.scorer_shape),
        "memory_plan": resolved.memory_plan.to_dict(),
        "projection_chunk_size": inputs.state.chunk_size,
        "batching": {
            "rollout_batch_size": cfg.rollout.batch_size or cfg.train.rollouts_per_cycle,
            "eval_batch_size": cfg.eval.batch_size,
            "teacher_batch_size": cfg.teacher.batch_size,
            "trajectory_batch_size": inputs.state.trajectory_batch_size,
            "trajectory_batch_planned": resolved.trajectory_batch_size,
            "trajectory_batch_reason": resolved.trajectory_batch_reason,
            "cpu_threads": resolved.cpu_threads,
            "cpu_threads_reason": resolved.cpu_threads_reason,
            "rollout_dtype": resolved.rollout_dtype,
            "rollout_dtype_reason": resolved.rollout_dtype_reason,
        },
        "role_graph": inputs.role_graph.to_dict(),
        "global_optimizer_step": inputs.state.global_step,
        "parameter_version": inputs.state.parameter_version,
        "policy_version": inputs.state.parameter_version,
        "rollout_policy_version": inputs.state.rollout_version,
        "policy_fingerprint": inputs.state.policy_fingerprint,
        "measurement_status": {
            "gpu_memory": "measured" if gpu.cuda_available() else gpu.NOT_RUN_NO_CUDA,
            "cache": cache_note or ("enabled" if inputs.cache_in_use else "not_used"),
        },
        "teacher": inputs.teacher_record,
        **({"teacher_checkpoint": inputs.teacher_checkpoint} if inputs.teacher_checkpoint else {}),
    }


def git_commit() -> str | None:
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


__all__ = [
    "ROLES",
    "LocalRoleGraph",
    "ManifestInputs",
    "build_manifest",
    "git_commit",
    "objective_block",
    "supervision_shape",
]
