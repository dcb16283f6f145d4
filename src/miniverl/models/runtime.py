"""Model runtimes (docs/design.md §2.3).

``dual_model`` keeps independently owned student and teacher backends.
``shared_backbone`` loads one Hugging Face base and gives the actor (student), teacher
and optional reference role-scoped adapter views of it; only actor adapter parameters
enter the optimizer.

The local role graph that names who played which verl-like role is built from explicit
inputs in :mod:`miniverl.training.manifest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.config.sections import ModelSpec
from miniverl.models.base import CausalLMBackend
from miniverl.models.factory import build_student, build_teacher
from miniverl.schemas.text import TokenizerLike


@dataclass
class ModelRuntime:
    """The backends of one run and how they share (or do not share) weights."""

    kind: str
    student: CausalLMBackend
    teacher: CausalLMBackend | None
    reference: CausalLMBackend | None = None
    teacher_checkpoint: dict[str, Any] | None = None
    """What :func:`~miniverl.training.teacher_checkpoint.load_teacher_checkpoint` loaded into
    the teacher (``models.teacher.checkpoint``), recorded in the manifest."""

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
    config: RunConfig,
    tokenizer: TokenizerLike,
    device: str,
    *,
    with_teacher: bool = True,
    teacher_spec: ModelSpec | None = None,
) -> ModelRuntime:
    """Build the runtime ``models.runtime`` asks for (teacher placement: :func:`teacher_load_device`).

    ``teacher_spec``: the student a teacher checkpoint holds (``training/teacher_checkpoint.py``);
    on a shared backbone its LoRA shape becomes the frozen ``teacher`` adapter.
    """
    if config.models.runtime == "shared_backbone":
        from miniverl.models.hf_shared import build_shared_backbone

        adapter = teacher_spec.lora if with_teacher and teacher_spec is not None else None
        student, teacher = build_shared_backbone(config, tokenizer, device, teacher_adapter=adapter)
        return ModelRuntime("shared_backbone", student, teacher if with_teacher else None)
    student = build_student(config, tokenizer, device)
    teacher = (
        build_teacher(config, tokenizer, teacher_load_device(config, device), teacher_spec)
        if with_teacher
        else None
    )
    return ModelRuntime("dual_model", student, teacher)
