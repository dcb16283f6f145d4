"""Toy-teacher persistence (lab/teachers/toy_fit.py) and the benchmark cold start
(lab/benchmark/cold_start.py writes it, training/cold_start.py and lab/teachers/prepare.py read it)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from helpers import tiny_config
from miniverl.agent.episode import Episode
from miniverl.agent.loop import RolloutRunner
from miniverl.errors import CheckpointError
from miniverl.lab.benchmark.cold_start import save_cold_start
from miniverl.lab.teachers import toy_fit
from miniverl.lab.teachers.dagger import dagger_examples
from miniverl.lab.teachers.fitting import cross_entropy_fit_step
from miniverl.lab.teachers.prepare import PreparedTeacher, prepare_teacher
from miniverl.lab.teachers.toy_fit import (
    TOY_TEACHER_FILE,
    fit_toy_model,
    fit_toy_teacher,
    load_teacher,
    teacher_bytes,
    toy_fit_traces,
)
from miniverl.losses.chunked import chunked_selected_position_loss
from miniverl.models.factory import build_student, build_teacher, build_tokenizer
from miniverl.models.toy import ToyBackend
from miniverl.training.checkpoint import save_tensors
from miniverl.training.cold_start import COLD_START_MARKER, COLD_START_STUDENT, load_cold_start
from miniverl.utils.hashing import sha256_bytes, sha256_file
from miniverl.utils.io import read_json

CONFIG = tiny_config()


def _student(seed: int) -> ToyBackend:
    config = tiny_config(f"run.seed={seed}")
    return build_student(config, build_tokenizer(config), "cpu")  # type: ignore[return-value]


def _teacher(seed: int) -> ToyBackend:
    config = tiny_config(f"run.seed={seed}")
    return build_teacher(config, build_tokenizer(config), "cpu")  # type: ignore[return-value]


def _same(a: ToyBackend, b: ToyBackend) -> bool:
    sa, sb = a.full_state_dict(), b.full_state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_reuse_key_hashes_every_file_the_fit_runs() -> None:
    """A fitted teacher is reused by digest, so the code that fits it must be in the digest."""
    package = Path(toy_fit.__file__).resolve().parents[2]
    for code in (
        fit_toy_model,
        fit_toy_teacher,
        dagger_examples,
        cross_entropy_fit_step,
        chunked_selected_position_loss,
        toy_fit_traces,
        RolloutRunner,
        Episode,
        ToyBackend,
    ):
        source = Path(inspect.getfile(code)).resolve().relative_to(package).as_posix()
        assert source in toy_fit.FIT_SOURCES, source


def test_a_saved_teacher_loads_only_against_its_hash(tmp_path: Path) -> None:
    teacher, other = _teacher(1), _teacher(2)
    data = teacher_bytes(teacher)
    (tmp_path / TOY_TEACHER_FILE).write_bytes(data)
    assert sha256_file(tmp_path / TOY_TEACHER_FILE) == sha256_bytes(data)
    assert sha256_bytes(data) == save_tensors(teacher.full_state_dict(), tmp_path / "again")
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        load_teacher(other, tmp_path / TOY_TEACHER_FILE, "0" * 64)
    assert not _same(teacher, other)
    load_teacher(other, tmp_path / TOY_TEACHER_FILE, sha256_bytes(data))
    assert _same(teacher, other)


def _export(directory: Path, student: ToyBackend, teacher: ToyBackend | None) -> Path:
    prepared = None
    if teacher is not None:
        data = teacher_bytes(teacher)
        prepared = PreparedTeacher(
            teacher=teacher,
            record={"steps": 7, "weights_sha256": sha256_bytes(data)},
            weights=data,
        )
    return save_cold_start(
        directory,
        config=CONFIG,
        student=student,
        teacher=prepared,
        parameter_version=4,
        global_step=4,
        evaluations={"after_warmup": {"success_rate": 0.5}},
    )


def test_a_cold_start_round_trips_weights_only(tmp_path: Path) -> None:
    cold = _export(tmp_path / "cold", _student(1), _teacher(2))
    marker = read_json(cold / COLD_START_MARKER)
    assert marker["parameter_version"] == 4 and marker["toy_teacher"]["steps"] == 7
    assert marker["config_digest"] == CONFIG.digest()
    student = _student(3)
    loaded = load_cold_start(cold, student=student)
    assert loaded["student_sha256"] == marker["student_sha256"]
    assert _same(student, _student(1))
    prepared = prepare_teacher(CONFIG, cold_start=cold)
    assert isinstance(prepared.teacher, ToyBackend) and _same(prepared.teacher, _teacher(2))
    assert prepared.record == {"steps": 7, "weights_sha256": marker["toy_teacher_sha256"]}
    prepared.keep(tmp_path / "run", _Events())
    assert sha256_file(tmp_path / "run" / TOY_TEACHER_FILE) == marker["toy_teacher_sha256"]


class _Events:
    def emit(self, event: str, **fields: object) -> None:
        pass


def test_a_tampered_or_incomplete_cold_start_is_refused(tmp_path: Path) -> None:
    cold = _export(tmp_path / "cold", _student(1), _teacher(2))
    (cold / TOY_TEACHER_FILE).write_bytes(teacher_bytes(_teacher(5)))
    with pytest.raises(CheckpointError, match=r"toy-teacher\.safetensors is missing or does not"):
        prepare_teacher(CONFIG, cold_start=cold)
    save_tensors(_student(5).trainable_state_dict(), cold / COLD_START_STUDENT)
    with pytest.raises(CheckpointError, match=r"student\.safetensors is missing or does not match"):
        load_cold_start(cold, student=_student(3))
    with pytest.raises(CheckpointError, match=r"cold_start\.json not found"):
        load_cold_start(tmp_path / "none", student=_student(3))


def _refit_config(*overrides: str) -> object:
    return tiny_config("models.toy_fit.reuse=false", "models.toy_fit.probe_tasks=2", *overrides)


def test_a_toy_fit_starts_from_the_trained_teacher_init_from_names(tmp_path: Path) -> None:
    """``lab.toy_fit.init_from``: with no steps the fitted teacher is the starting one, bit for
    bit; with steps it moves from there (not from a fresh initialisation), and the reuse digest
    tells the two starts apart."""
    start = tmp_path / "teacher.safetensors"
    start.write_bytes(teacher_bytes(_teacher(2)))
    began = prepare_teacher(
        _refit_config(f"models.toy_fit.init_from={start}", "models.toy_fit.max_steps=0")
    )
    assert isinstance(began.teacher, ToyBackend) and _same(began.teacher, _teacher(2))
    assert began.record is not None
    assert began.record["init_from"]["sha256"] == sha256_file(start)
    assert began.record["weights_sha256"] == sha256_file(start)

    moved = prepare_teacher(
        _refit_config(f"models.toy_fit.init_from={start}", "models.toy_fit.max_steps=2")
    )
    fresh = prepare_teacher(_refit_config("models.toy_fit.max_steps=2"))
    assert moved.record is not None and fresh.record is not None
    assert moved.record["cache_digest"] != fresh.record["cache_digest"]
    assert not _same(moved.teacher, _teacher(2))  # type: ignore[arg-type]


def test_a_toy_fit_start_that_is_no_toy_teacher_is_refused_by_its_key(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"^lab\.toy_fit\.init_from: .* holds no trained"):
        prepare_teacher(_refit_config(f"models.toy_fit.init_from={tmp_path / 'none'}"))
    wrong = tmp_path / "student.safetensors"
    save_tensors({"x": torch.zeros(2)}, wrong)
    with pytest.raises(CheckpointError, match=r"^lab\.toy_fit\.init_from: .* not a whole toy"):
        prepare_teacher(_refit_config(f"models.toy_fit.init_from={wrong}"))
