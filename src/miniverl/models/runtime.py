"""Model runtimes and the local role graph (docs/design.md §2.3).

``dual_model`` keeps independently owned student and teacher backends.
``shared_backbone`` loads one Hugging Face base and gives the actor (student), teacher
and optional reference role-scoped adapter views of it; only actor adapter parameters
enter the optimizer.

:class:`LocalRoleGraph` names the boundaries of a verl-like workflow (actor, rollout,
teacher, reference, reward/verifier, target builder, update, evaluation, artifact
bridge) and maps the miniverl objects that play them, so the manifest says who did
what. It is a local single-device ownership graph, not Ray workers, DataProto or FSDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.models.base import CausalLMBackend
from miniverl.models.factory import build_student, build_teacher
from miniverl.schemas.text import TokenizerLike

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


@dataclass
class ModelRuntime:
    """The backends of one run and how they share (or do not share) weights."""

    kind: str
    student: CausalLMBackend
    teacher: CausalLMBackend | None
    reference: CausalLMBackend | None = None

    def describe(self) -> dict[str, Any]:
        def caps(backend: CausalLMBackend | None) -> str | None:
            return (
                None
                if backend is None
                else f"{type(backend).__name__}({backend.capabilities.model_id})"
            )

        return {
            "kind": self.kind,
            "student": caps(self.student),
            "teacher": caps(self.teacher),
            "reference": caps(self.reference),
        }


def teacher_load_device(config: RunConfig, device: str) -> str:
    """Where the dual-model teacher is first loaded.

    On an accelerator, unless the recipe asks for ``resident`` or the teacher is quantized
    (bitsandbytes weights are quantized onto the device and cannot move), the teacher is
    loaded into host memory first: ``auto`` then decides with both models' sizes known
    and moves it to the device only when resident fits, and ``swap`` brings it over per
    cycle. On the CPU there is nothing to decide.
    """
    if not device.startswith("cuda"):
        return device
    if config.memory.strategy == "resident" or config.models.teacher.quantization != "none":
        return device
    return "cpu"


def build_runtime(
    config: RunConfig, tokenizer: TokenizerLike, device: str, *, with_teacher: bool = True
) -> ModelRuntime:
    """Build the runtime ``models.runtime`` asks for (teacher placement: :func:`teacher_load_device`)."""
    if config.models.runtime == "shared_backbone":
        from miniverl.models.hf import build_shared_backbone

        student, teacher = build_shared_backbone(config, tokenizer, device)
        return ModelRuntime("shared_backbone", student, teacher if with_teacher else None)
    student = build_student(config, tokenizer, device)
    teacher = (
        build_teacher(config, tokenizer, teacher_load_device(config, device))
        if with_teacher
        else None
    )
    return ModelRuntime("dual_model", student, teacher)


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
    def for_trainer(cls, trainer: Any) -> LocalRoleGraph:
        """Bind the objects of an ``OPDTrainer`` (duck-typed to keep this layer below training)."""
        graph = cls()
        runtime: ModelRuntime = trainer.runtime
        graph.bind(
            "ActorPolicy",
            trainer.student,
            model_id=trainer.student.capabilities.model_id,
            runtime=runtime.kind,
        )
        graph.bind("RolloutRuntime", trainer.runner, sampler="models.sampling.run_generation")
        graph.bind(
            "TeacherPolicy",
            trainer.teacher,
            model_id=None if trainer.teacher is None else trainer.teacher.capabilities.model_id,
        )
        graph.bind(
            "ReferencePolicy",
            runtime.reference,
            note="no objective in miniverl requests a reference policy",
        )
        graph.bind(
            "RewardOrVerifier",
            trainer.environment,
            method="verify",
            note="exact verifier; reported, never optimized",
        )
        graph.bind(
            "TargetBuilder",
            trainer.scorer,
            shape=None if trainer.scorer is None else trainer.scorer.shape,
        )
        graph.bind("UpdateRuntime", trainer, method="_optimize")
        graph.bind("EvaluationRuntime", trainer, method="evaluate")
        graph.bind(
            "ArtifactBridge",
            "RunPaths + TeacherCache",
            cache=None if trainer.cache is None else str(trainer.cache.directory.name),
        )
        return graph
