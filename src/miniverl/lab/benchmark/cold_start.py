"""Writing a benchmark seed's shared cold start: the warmed-up student and its teacher.

The benchmark trains one warmed-up student per seed and starts every arm from it. Only
weights cross: ``student.safetensors`` (the student's trainable tensors), the teacher the
lab prepared for the seed when it is a file the arms can load (``toy-teacher.safetensors``
or ``teacher-adapter.safetensors``), and ``cold_start.json`` with the SHA-256 of each and
what the student is valid for (``training/cold_start.py`` reads it back, and refuses a run
of another recipe), so no optimizer momentum leaks between arms.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.lab.teachers.prepare import COLD_START_ADAPTER, PreparedTeacher
from miniverl.lab.teachers.toy_fit import TOY_TEACHER_FILE
from miniverl.models.base import CausalLMBackend
from miniverl.training.checkpoint import save_tensors
from miniverl.training.cold_start import (
    COLD_START_IDENTITY,
    COLD_START_MARKER,
    COLD_START_STUDENT,
    cold_start_identity,
)
from miniverl.utils.hashing import sha256_bytes, sha256_file
from miniverl.utils.io import atomic_write_bytes, write_json


def save_cold_start(
    directory: Path,
    *,
    config: RunConfig,
    student: CausalLMBackend,
    teacher: PreparedTeacher | None,
    parameter_version: int,
    global_step: int,
    evaluations: dict[str, Any],
) -> Path:
    """Write ``student``'s trainable weights and ``teacher``'s file (if any) to ``directory``.

    The marker records the run's ``config_digest``, its evaluations and
    :func:`~miniverl.training.cold_start.cold_start_identity` (what a later run is checked
    against), and the teacher's fit report under ``toy_teacher`` / ``teacher_adapter``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    marker: dict[str, Any] = {
        "student_sha256": save_tensors(
            student.trainable_state_dict(), directory / COLD_START_STUDENT
        ),
        "parameter_version": parameter_version,
        "global_optimizer_step": global_step,
        "config_digest": config.digest(),
        "evaluations": evaluations,
        "toy_teacher": None,
        COLD_START_IDENTITY: cold_start_identity(config),
    }
    if teacher is not None and teacher.weights is not None:
        atomic_write_bytes(directory / TOY_TEACHER_FILE, teacher.weights)
        marker["toy_teacher"] = teacher.record
        marker["toy_teacher_sha256"] = sha256_bytes(teacher.weights)
    elif teacher is not None and isinstance(teacher.teacher, Path):
        shutil.copyfile(teacher.teacher, directory / COLD_START_ADAPTER)
        marker["teacher_adapter"] = {
            **(teacher.record or {}),
            "adapter_sha256": sha256_file(directory / COLD_START_ADAPTER),
        }
    write_json(directory / COLD_START_MARKER, marker)
    return directory


__all__ = ["save_cold_start"]
