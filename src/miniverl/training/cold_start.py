"""Reading a cold start: a run's first weights taken from another run (``--cold-start DIR``).

A cold start directory holds a student's trainable weights (``student.safetensors``) and a
marker (``cold_start.json``) with their SHA-256 and what they are valid for
(:func:`cold_start_identity`). The lab writes them (a benchmark seed's shared SFT cold start,
``miniverl.lab.benchmark.cold_start``); a run loads them weights-only into its student, with
a fresh optimizer, after checking the marker against its own recipe (:func:`check_cold_start`),
so no optimizer momentum leaks between runs that start from the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError
from miniverl.models.base import CausalLMBackend
from miniverl.training.teacher_checkpoint import COLD_START_MARKER, COLD_START_STUDENT
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import read_json
from miniverl.utils.logging import EventLog

COLD_START_IDENTITY = "recipe_identity"
"""Marker key of :func:`cold_start_identity`: what the saved weights are valid for."""
COLD_START_HINT = (
    "start from a cold start exported under the same backend, student model, adapter settings "
    "and environment (a benchmark seed's cold-start directory of this recipe), or leave out "
    "--cold-start to warm up from scratch"
)


def base_identity(model_id: str) -> dict[str, Any]:
    """What identifies the base weights: the fetch marker's GGUF digest, else the id."""
    marker = Path(model_id).expanduser() / "miniverl_source.json"
    if marker.is_file():
        data = json.loads(marker.read_text(encoding="utf-8"))
        return {"gguf_sha256": data.get("gguf_sha256"), "model": data.get("model")}
    return {"model_id": model_id}


def _model_identity(model_id: str) -> dict[str, Any]:
    """The fetch marker's GGUF digest, else the resolved local directory, else the hub id.

    A relative and an absolute path to one directory are the same model.
    """
    identity = base_identity(model_id)
    path = Path(model_id).expanduser()
    if "model_id" in identity and path.is_dir():
        return {"model_dir": str(path.resolve())}
    return identity


def cold_start_identity(cfg: RunConfig) -> dict[str, Any]:
    """What a cold start's student weights only make sense under, as JSON-ready values.

    The backend, the student's base model (:func:`_model_identity`), revision, tokenizer and
    adapter shape decide which tensors the weights are and what they sit on; the environment
    and its params decide the protocol the warm-up taught. Objective, learning rates, cycles
    and seeds may differ (benchmark arms vary exactly those).
    """
    student = cfg.models.student
    return {
        "backend": cfg.models.backend,
        "student_model": _model_identity(student.model_id),
        "student_revision": student.revision,
        "student_tokenizer": student.tokenizer_id,
        "student_lora": student.lora.model_dump(mode="json"),
        "environment": cfg.environment.name,
        "environment_params": json.loads(json.dumps(dict(cfg.environment.params))),
    }


def check_cold_start(directory: Path, cfg: RunConfig) -> dict[str, Any]:
    """The marker of the cold start in ``directory``, refused unless it fits ``cfg``.

    Reads only ``cold_start.json``, so a run can call it before writing anything. Raises
    :class:`CheckpointError` when the marker is missing or unreadable, or when its
    :func:`cold_start_identity` differs from ``cfg``'s (every differing field is named).
    A marker without an identity is checked only by the name and shape checks of the
    weights load.
    """
    marker_path = directory / COLD_START_MARKER
    if not marker_path.is_file():
        raise CheckpointError(
            f"{marker_path} not found: {directory} is not a cold start",
            hint="pass a directory holding cold_start.json and student.safetensors, e.g. "
            "<benchmark output>/seed-<n>/cold-start",
        )
    marker = read_json(marker_path, error=CheckpointError)
    recorded = marker.get(COLD_START_IDENTITY)
    if recorded is None:
        return marker
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{marker_path}: {COLD_START_IDENTITY} is not a mapping")
    expected = cold_start_identity(cfg)
    differ = [
        f"{key}: cold start {recorded.get(key)!r}, this run {value!r}"
        for key, value in expected.items()
        if recorded.get(key) != value
    ]
    if differ:
        raise CheckpointError(
            f"cold start {directory} was made for another recipe or base model: "
            + "; ".join(differ),
            hint=COLD_START_HINT,
        )
    return marker


def load_cold_start(
    directory: Path, *, student: CausalLMBackend, events: EventLog | None = None
) -> dict[str, Any]:
    """Load a cold start's student weights into ``student`` (verified); its marker.

    Raises :class:`CheckpointError` when the marker or the weights file is missing or does
    not match its SHA-256. With ``events``, records ``benchmark_cold_start_loaded``.
    """
    from safetensors.torch import load_file

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
    if events is not None:
        events.emit(
            "benchmark_cold_start_loaded",
            echo=f"weights-only cold start from {directory.name}",
            student_sha256=marker["student_sha256"],
            toy_teacher_sha256=marker.get("toy_teacher_sha256"),
            cold_start_parameter_version=marker.get("parameter_version"),
        )
    return marker


__all__ = [
    "COLD_START_HINT",
    "COLD_START_IDENTITY",
    "COLD_START_MARKER",
    "COLD_START_STUDENT",
    "base_identity",
    "check_cold_start",
    "cold_start_identity",
    "load_cold_start",
]
