"""A teacher that is another run's trained student (``models.teacher.checkpoint``).

Why: a teacher is a model someone trained, and the simplest honest way to get one is to
train it with the same recipe code a student is trained with (for example ``miniverl train``
with oracle-trace cross-entropy on oracle and corrective traces) and point the next run at
it. The core then needs no teacher-fitting code of its own, a teacher is fitted once and
shared by every seed and arm that uses it, and the benchmark's negative control (the
cold-start student scoring itself) is the same mechanism with the cold start as the checkpoint.

What a checkpoint is here (:func:`resolve_teacher_weights`): a run directory (its
``checkpoints/final``), one checkpoint directory (``adapter.safetensors`` verified against
``checkpoint.json``), a benchmark cold start (``student.safetensors`` against
``cold_start.json``), or a ``.safetensors`` file. Its tensors are the student's trainable
state: the whole toy model, or the LoRA adapter of an hf student, which the teacher gets as a
frozen adapter on ``models.teacher.model_id``. The checkpoint describes itself
(:func:`recorded_student`): the student's model id and adapter shape come from the run's
``config.validated.yaml``, the cold start's ``cold_start.json``, or the file's own
safetensors metadata (:data:`STUDENT_METADATA`, written by whoever saves a bare file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.config.sections import LoraConfig, ModelSpec
from miniverl.errors import CheckpointError
from miniverl.models.hf import TEACHER_ADAPTER
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import read_json
from miniverl.utils.safe_load import load_yaml_file

CHECKPOINT_ADAPTER = "adapter.safetensors"
CHECKPOINT_MARKER = "checkpoint.json"
COLD_START_STUDENT = "student.safetensors"
COLD_START_MARKER = "cold_start.json"
STUDENT_METADATA = "miniverl.student"
"""Safetensors metadata key of a bare teacher file: JSON ``{"model_id", "lora"}`` of the
student whose trainable tensors it holds."""
_ADAPTER_NAME = re.compile(r"\.(lora_[AB]|lora_embedding_[AB])\.([^.]+)\.")
_HINT = (
    "point models.teacher.checkpoint at a run directory written by 'miniverl train', one of its "
    "checkpoints/NAME directories, or a benchmark seed's cold-start directory"
)


def resolve_teacher_weights(path: str | Path) -> tuple[Path, str]:
    """``(safetensors file, SHA-256)`` of the trained student at ``path``, verified against
    the record its writer kept; :class:`CheckpointError` when there is none or it differs."""
    root = _checkpoint_root(path)
    if (root / CHECKPOINT_MARKER).is_file():
        weights = root / CHECKPOINT_ADAPTER
        expected = (
            read_json(root / CHECKPOINT_MARKER, error=CheckpointError).get("files") or {}
        ).get(CHECKPOINT_ADAPTER)
    elif (root / COLD_START_MARKER).is_file():
        weights = root / COLD_START_STUDENT
        expected = read_json(root / COLD_START_MARKER, error=CheckpointError).get("student_sha256")
    elif root.is_file() and root.suffix == ".safetensors":
        return root, sha256_file(root)
    else:
        raise CheckpointError(f"{path} holds no trained student to use as the teacher", hint=_HINT)
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found", hint=_HINT)
    digest = sha256_file(weights)
    if digest != expected:
        raise CheckpointError(
            f"{weights} does not match the SHA-256 its directory records",
            hint="the weights were changed after they were written; use an intact checkpoint",
        )
    return weights, digest


def _checkpoint_root(path: str | Path) -> Path:
    root = Path(path).expanduser()
    return root / "checkpoints" / "final" if (root / "checkpoints" / "final").is_dir() else root


def recorded_student(path: str | Path, config: RunConfig) -> ModelSpec:
    """The teacher to build for the checkpoint at ``path``: its student's model id and adapter
    shape as the checkpoint records them, on ``config.models.teacher``'s revision, precision
    and quantization (an hf teacher's base stays ``models.teacher.model_id``).

    A file without a record is a whole toy model of ``models.teacher.model_id``'s preset; an
    hf adapter must say its shape (:class:`CheckpointError` otherwise).
    """
    root = _checkpoint_root(path)
    record: dict[str, Any] = {}
    if (root / CHECKPOINT_MARKER).is_file():
        config_file = root.parent.parent / "config.validated.yaml"
        if config_file.is_file():
            models = (load_yaml_file(config_file, error=CheckpointError) or {}).get("models")
            record = dict((models or {}).get("student") or {})
    elif (root / COLD_START_MARKER).is_file():
        marker = read_json(root / COLD_START_MARKER, error=CheckpointError)
        identity = marker.get("recipe_identity") or {}
        if identity:
            model = identity.get("student_model") or {}
            record = {"model_id": model.get("model_id"), "lora": identity.get("student_lora")}
    elif root.is_file():
        from safetensors import safe_open

        with safe_open(str(root), framework="pt") as handle:
            raw = (handle.metadata() or {}).get(STUDENT_METADATA)
        record = json.loads(raw) if raw else {}
    teacher = config.models.teacher
    lora = record.get("lora") or {"enabled": False}
    if config.models.backend == "hf" and not lora.get("enabled", True):
        raise CheckpointError(
            f"{path} does not record the LoRA adapter an hf teacher checkpoint holds",
            hint="point models.teacher.checkpoint at a run directory or cold start, or save the "
            f"adapter file with its {STUDENT_METADATA} metadata",
        )
    toy = config.models.backend == "toy"
    return ModelSpec(
        model_id=str(record.get("model_id") or teacher.model_id) if toy else teacher.model_id,
        revision=teacher.revision,
        precision=teacher.precision,
        quantization=teacher.quantization,
        lora=LoraConfig.model_validate(lora),
    )


def _renamed(state: dict[str, Any], adapter: str) -> dict[str, Any]:
    """Adapter tensors with their peft adapter name (``...lora_A.<name>.weight``) set to ``adapter``."""
    return {
        _ADAPTER_NAME.sub(lambda m: f".{m.group(1)}.{adapter}.", k): v for k, v in state.items()
    }


def load_teacher_checkpoint(teacher: Any, path: str | Path, *, backend: str) -> dict[str, Any]:
    """Load the trained student at ``path`` into ``teacher`` and freeze it; returns the record
    (path, SHA-256, tensor count) a run keeps in its manifest and events.

    Toy: the tensors are the whole model (a toy student trained without LoRA) and must match
    ``teacher``'s shape. hf: they are a LoRA adapter; ``teacher`` must carry a frozen adapter
    named :data:`TEACHER_ADAPTER` of the same shape, into which they are copied.
    """
    from safetensors.torch import load_file

    weights, digest = resolve_teacher_weights(path)
    state = load_file(str(weights))
    if backend == "toy":
        full = teacher.full_state_dict()
        if set(state) != set(full):
            missing = sorted(set(full) - set(state))[:3]
            raise CheckpointError(
                f"{weights} is not a whole toy model of models.teacher's shape (missing {missing})",
                hint="a toy teacher checkpoint is a toy student trained without LoRA (its "
                "whole model)",
            )
        wrong = [k for k in state if tuple(state[k].shape) != tuple(full[k].shape)]
        if wrong:
            raise CheckpointError(
                f"{weights} holds a toy model of another shape than models.teacher "
                f"({wrong[0]}: {tuple(state[wrong[0]].shape)} against {tuple(full[wrong[0]].shape)})",
                hint="the checkpoint records another toy preset than its tensors have; use an intact checkpoint",
            )
        teacher.load_full_state_dict(state)
    else:
        owner = getattr(teacher, "owner", teacher)
        live = {k: p for k, p in owner.model.named_parameters() if f".{TEACHER_ADAPTER}." in k}
        renamed = _renamed(state, TEACHER_ADAPTER)
        if not live or set(renamed) != set(live):
            raise CheckpointError(
                f"{weights} is not a LoRA adapter of models.teacher's shape "
                f"({len(renamed)} tensors against {len(live)})",
                hint="set models.teacher.model_id to the base the checkpoint's student was trained on",
            )
        wrong = [k for k in renamed if tuple(renamed[k].shape) != tuple(live[k].shape)]
        if wrong:
            raise CheckpointError(
                f"{weights} holds adapter tensors of another shape than its record says "
                f"({wrong[0]})",
                hint="the checkpoint's record and its tensors disagree; use an intact checkpoint",
            )
        import torch

        with torch.no_grad():
            for key, value in renamed.items():
                live[key].copy_(value.to(live[key].device, live[key].dtype))
    for param in teacher.trainable_parameters():
        param.requires_grad_(False)
    return {"path": str(path), "weights": str(weights), "sha256": digest, "tensors": len(state)}


__all__ = [
    "STUDENT_METADATA",
    "TEACHER_ADAPTER",
    "load_teacher_checkpoint",
    "recorded_student",
    "resolve_teacher_weights",
]
