"""A teacher that is another run's trained student (``models.teacher.checkpoint``).

Why: a teacher is a model someone trained, and the simplest honest way to get one is to
train it with the same recipe code a student is trained with (for example ``miniverl train``
in ``sft`` mode on oracle and corrective traces) and point the next run at it. The core then
needs no teacher-fitting code of its own, a teacher is fitted once and shared by every seed
and arm that uses it, and the benchmark's negative control (the cold-start student scoring
itself) is the same mechanism with the cold start as the checkpoint.

What a checkpoint is here (:func:`resolve_teacher_weights`): a run directory (its
``checkpoints/final``), one checkpoint directory (``adapter.safetensors`` verified against
``checkpoint.json``), a benchmark cold start (``student.safetensors`` against
``cold_start.json``), or a bare ``.safetensors`` file. Its tensors are the student's
trainable state: the whole toy model, or the LoRA adapter of an hf student, which the
teacher gets as a frozen adapter of the same shape (``models.teacher.lora``) on
``models.teacher.model_id``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from miniverl.errors import CheckpointError
from miniverl.models.hf import TEACHER_ADAPTER
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import read_json

CHECKPOINT_ADAPTER = "adapter.safetensors"
CHECKPOINT_MARKER = "checkpoint.json"
COLD_START_STUDENT = "student.safetensors"
COLD_START_MARKER = "cold_start.json"
_ADAPTER_NAME = re.compile(r"\.(lora_[AB]|lora_embedding_[AB])\.([^.]+)\.")
_HINT = (
    "point models.teacher.checkpoint at a run directory written by 'miniverl train', one of its "
    "checkpoints/NAME directories, or a benchmark seed's cold-start directory"
)


def resolve_teacher_weights(path: str | Path) -> tuple[Path, str]:
    """``(safetensors file, SHA-256)`` of the trained student at ``path``, verified against
    the record its writer kept; :class:`CheckpointError` when there is none or it differs."""
    root = Path(path).expanduser()
    if (root / "checkpoints" / "final").is_dir():
        root = root / "checkpoints" / "final"
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
                hint="a toy teacher checkpoint is a toy student trained without LoRA; set "
                "models.teacher.model_id (or its toy block) to that student's",
            )
        wrong = [k for k in state if tuple(state[k].shape) != tuple(full[k].shape)]
        if wrong:
            raise CheckpointError(
                f"{weights} holds a toy model of another shape than models.teacher "
                f"({wrong[0]}: {tuple(state[wrong[0]].shape)} against {tuple(full[wrong[0]].shape)})",
                hint="set models.teacher.model_id (or its toy block) to the checkpoint's student",
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
                hint="set models.teacher.lora (r, alpha, target_modules) and model_id to the "
                "checkpoint's student",
            )
        wrong = [k for k in renamed if tuple(renamed[k].shape) != tuple(live[k].shape)]
        if wrong:
            raise CheckpointError(
                f"{weights} holds adapter tensors of another shape than models.teacher.lora "
                f"({wrong[0]})",
                hint="set models.teacher.lora.r to the checkpoint student's rank",
            )
        import torch

        with torch.no_grad():
            for key, value in renamed.items():
                live[key].copy_(value.to(live[key].device, live[key].dtype))
    for param in teacher.trainable_parameters():
        param.requires_grad_(False)
    return {"path": str(path), "weights": str(weights), "sha256": digest, "tensors": len(state)}


__all__ = ["TEACHER_ADAPTER", "load_teacher_checkpoint", "resolve_teacher_weights"]
