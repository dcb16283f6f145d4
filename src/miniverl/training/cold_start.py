"""A benchmark cold start: the warmed-up student (and fitted toy teacher) shared by every arm.

The benchmark trains one cold start per seed and starts every arm from it
(``evaluation/cell_runner.py``). Only weights cross: no optimizer state, so no momentum
leaks between arms that share a cold start. A directory holds

    student.safetensors        the student's trainable weights
    toy-teacher.safetensors    the fitted toy teacher (toy backend only)
    cold_start.json            SHA-256 of both, the versions and evaluations it left with

and both files are checked against the marker before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from miniverl.errors import CheckpointError
from miniverl.models.base import CausalLMBackend
from miniverl.training.checkpoint import save_tensors
from miniverl.training.toy_teacher import TOY_TEACHER_FILE, save_teacher
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import read_json, write_json
from miniverl.utils.logging import EventLog

COLD_START_STUDENT = "student.safetensors"
COLD_START_MARKER = "cold_start.json"


def save_cold_start(
    directory: Path,
    *,
    student: CausalLMBackend,
    toy_teacher: CausalLMBackend | None,
    parameter_version: int,
    global_step: int,
    config_digest: str,
    evaluations: dict[str, Any],
    toy_teacher_report: dict[str, Any] | None,
) -> Path:
    """Write the student's trainable weights (and ``toy_teacher``, when given) to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    marker: dict[str, Any] = {
        "student_sha256": save_tensors(
            student.trainable_state_dict(), directory / COLD_START_STUDENT
        ),
        "parameter_version": parameter_version,
        "global_optimizer_step": global_step,
        "config_digest": config_digest,
        "evaluations": evaluations,
        "toy_teacher": toy_teacher_report,
    }
    if toy_teacher is not None:
        marker["toy_teacher_sha256"] = save_teacher(toy_teacher, directory / TOY_TEACHER_FILE)
    write_json(directory / COLD_START_MARKER, marker)
    return directory


@dataclass(frozen=True)
class LoadedColdStart:
    """What :func:`load_cold_start` read; ``toy_teacher_report`` is ``None`` without a toy teacher."""

    marker: dict[str, Any]
    toy_teacher_sha256: str | None
    toy_teacher_report: dict[str, Any] | None


def load_cold_start(
    directory: Path,
    *,
    student: CausalLMBackend,
    toy_teacher: CausalLMBackend | None,
    run_dir: Path,
    events: EventLog | None = None,
) -> LoadedColdStart:
    """Load a cold start weights-only into ``student`` (and ``toy_teacher``), verified.

    The toy teacher is also saved into ``run_dir`` so the run resumes from its own copy.
    Raises :class:`CheckpointError` when the marker or a weights file is missing or does
    not match its SHA-256. With ``events``, records ``benchmark_cold_start_loaded``.
    """
    loaded = _load_cold_start(directory, student=student, toy_teacher=toy_teacher, run_dir=run_dir)
    if events is not None:
        events.emit(
            "benchmark_cold_start_loaded",
            echo=f"weights-only cold start from {directory.name}",
            student_sha256=loaded.marker["student_sha256"],
            toy_teacher_sha256=loaded.toy_teacher_sha256,
            cold_start_parameter_version=loaded.marker.get("parameter_version"),
        )
    return loaded


def _load_cold_start(
    directory: Path,
    *,
    student: CausalLMBackend,
    toy_teacher: CausalLMBackend | None,
    run_dir: Path,
) -> LoadedColdStart:
    marker_path = directory / COLD_START_MARKER
    if not marker_path.is_file():
        raise CheckpointError(f"{marker_path} not found", hint="run the benchmark cold start first")
    marker = read_json(marker_path, error=CheckpointError)
    student_path = directory / COLD_START_STUDENT
    if not student_path.is_file() or sha256_file(student_path) != marker.get("student_sha256"):
        raise CheckpointError(f"{student_path} is missing or does not match {marker_path}")
    student.load_trainable_state_dict(
        {k: v.to(student.device) for k, v in load_file(str(student_path)).items()}
    )
    if toy_teacher is None:
        return LoadedColdStart(marker, None, None)
    teacher_path = directory / TOY_TEACHER_FILE
    teacher_sha = sha256_file(teacher_path) if teacher_path.is_file() else None
    if teacher_sha is None or teacher_sha != marker.get("toy_teacher_sha256"):
        raise CheckpointError(f"{teacher_path} is missing or does not match {marker_path}")
    toy_teacher.load_full_state_dict(load_file(str(teacher_path)))
    report = {
        **(marker.get("toy_teacher") or {}),
        "weights_sha256": save_teacher(toy_teacher, run_dir / TOY_TEACHER_FILE),
    }
    return LoadedColdStart(marker, teacher_sha, report)


__all__ = [
    "COLD_START_MARKER",
    "COLD_START_STUDENT",
    "LoadedColdStart",
    "load_cold_start",
    "save_cold_start",
]
