"""Toy-teacher persistence (lab/teachers/toy_fit.py) and the benchmark cold start (cold_start.py)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

from miniverl.agent.episode import Episode
from miniverl.agent.loop import RolloutRunner
from miniverl.errors import CheckpointError
from miniverl.lab.teachers.fitting import cross_entropy_fit_step
from miniverl.lab.teachers.toy_fit import (
    COLD_START_MARKER,
    COLD_START_STUDENT,
    TOY_TEACHER_FILE,
    fit_toy_model,
    load_cold_start,
    load_teacher,
    prepare_toy_teacher,
    save_cold_start,
    save_teacher,
    toy_fit_traces,
)
from miniverl.losses.chunked import chunked_selected_position_loss
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend
from miniverl.models.toy_config import TOY_STUDENT
from miniverl.training import teacher_fit
from miniverl.utils.io import read_json

SMALL = dataclasses.replace(TOY_STUDENT, hidden_size=32, intermediate_size=64)


def _backend(seed: int) -> ToyBackend:
    return ToyBackend(SMALL, ToyTokenizer(), model_id=f"toy-{seed}", seed=seed)


def _same(a: ToyBackend, b: ToyBackend) -> bool:
    sa, sb = a.full_state_dict(), b.full_state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_reuse_key_hashes_every_file_the_fit_runs() -> None:
    """A fitted teacher is reused by digest, so the code that fits it must be in the digest."""
    package = Path(teacher_fit.__file__).resolve().parents[1]
    for code in (
        fit_toy_model,
        prepare_toy_teacher,
        cross_entropy_fit_step,
        chunked_selected_position_loss,
        toy_fit_traces,
        RolloutRunner,
        Episode,
        ToyBackend,
    ):
        source = Path(inspect.getfile(code)).resolve().relative_to(package).as_posix()
        assert source in teacher_fit.FIT_SOURCES, source


def test_a_saved_teacher_loads_only_against_its_hash(tmp_path: Path) -> None:
    teacher, other = _backend(1), _backend(2)
    sha = save_teacher(teacher, tmp_path / TOY_TEACHER_FILE)
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        load_teacher(other, tmp_path / TOY_TEACHER_FILE, "0" * 64)
    assert not _same(teacher, other)
    load_teacher(other, tmp_path / TOY_TEACHER_FILE, sha)
    assert _same(teacher, other)


def _export(directory: Path, student: ToyBackend, teacher: ToyBackend | None) -> Path:
    return save_cold_start(
        directory,
        student=student,
        toy_teacher=teacher,
        parameter_version=4,
        global_step=4,
        config_digest="d",
        evaluations={"after_warmup": {"success_rate": 0.5}},
        toy_teacher_report={"steps": 7},
    )


def test_a_cold_start_round_trips_weights_only(tmp_path: Path) -> None:
    cold = _export(tmp_path / "cold", _backend(1), _backend(2))
    marker = read_json(cold / COLD_START_MARKER)
    assert (marker["parameter_version"], marker["toy_teacher"]) == (4, {"steps": 7})
    student, teacher = _backend(3), _backend(4)
    loaded = load_cold_start(cold, student=student, toy_teacher=teacher, run_dir=tmp_path)
    assert _same(student, _backend(1)) and _same(teacher, _backend(2))
    assert loaded.toy_teacher_sha256 == marker["toy_teacher_sha256"]
    assert loaded.toy_teacher_report == {"steps": 7, "weights_sha256": marker["toy_teacher_sha256"]}
    assert (tmp_path / TOY_TEACHER_FILE).is_file()  # the run keeps its own copy for resume


def test_a_tampered_or_incomplete_cold_start_is_refused(tmp_path: Path) -> None:
    cold = _export(tmp_path / "cold", _backend(1), _backend(2))
    (cold / TOY_TEACHER_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"toy-teacher\.safetensors is missing"):
        load_cold_start(cold, student=_backend(3), toy_teacher=_backend(4), run_dir=tmp_path)
    save_teacher(_backend(5), cold / COLD_START_STUDENT)
    with pytest.raises(CheckpointError, match=r"student\.safetensors is missing or does not match"):
        load_cold_start(cold, student=_backend(3), toy_teacher=None, run_dir=tmp_path)
    with pytest.raises(CheckpointError, match=r"cold_start\.json not found"):
        load_cold_start(tmp_path / "none", student=_backend(3), toy_teacher=None, run_dir=tmp_path)
