"""The teacher gate of a real (tiny) run: computed from the trainer, stored in the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import tiny_config
from miniverl.errors import TeacherGateError
from miniverl.lab.benchmark.cell_runner import gate_subject
from miniverl.lab.config import lab_of
from miniverl.lab.teachers import toy_fit as teacher_fit
from miniverl.lab.teachers.gate import (
    TEACHER_GATE_FILE,
    require_teacher_gate,
    run_teacher_gate,
)
from miniverl.lab.teachers.prepare import prepare_teacher
from miniverl.training.recipe import OPDTrainer


def test_the_gate_of_a_run_is_stored_and_refuses_a_weak_teacher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(teacher_fit.CACHE_ENV, str(tmp_path / "cache"))
    config = tiny_config(
        "eval.teacher_gate_tasks=2",
        "eval.teacher_gate_threshold=0.99",
        "models.toy_fit.max_steps=2",  # a teacher that has barely started fitting
        "rollout.max_new_tokens_per_turn=40",
    )
    prepared = prepare_teacher(config)
    trainer = OPDTrainer(config, output_dir=tmp_path / "run", quiet=True, teacher=prepared.teacher)
    trainer.setup()
    result = run_teacher_gate(gate_subject(trainer, prepared))
    assert result.episodes == 2 and result.actions >= 2
    stored = json.loads((tmp_path / "run" / TEACHER_GATE_FILE).read_text())
    assert stored["value"] == result.value and stored["threshold"] == 0.99
    assert stored["passed"] is (result.value >= 0.99)
    events = [
        json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    ]
    gate = [e for e in events if e["event"] == "teacher_gate"]
    assert len(gate) == 1 and gate[0]["value"] == result.value
    assert result.value < 0.99  # two fit steps cannot reproduce every action
    with pytest.raises(TeacherGateError, match=r"under the threshold 0\.990$"):
        require_teacher_gate(result, lab_of(config).teacher_gate.threshold)
