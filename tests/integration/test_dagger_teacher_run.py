"""A tiny cold start with a DAgger teacher: the lab fits it after the warm-up on the warmed-up
student's labelled states, keeps it (and its cost) with the cold start, then gates it on
held-out student states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import export_cold_start, tiny_config
from miniverl.lab.benchmark.cell_runner import gate_subject
from miniverl.lab.teachers import toy_fit as teacher_fit
from miniverl.lab.teachers.gate import STATE_GATE_FILE, cold_start_teacher_gate
from miniverl.lab.teachers.prepare import prepare_teacher
from miniverl.training.cold_start import COLD_START_MARKER
from miniverl.training.recipe import OPDTrainer


def test_a_dagger_teacher_is_fitted_on_student_states_and_gated_on_held_out_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(teacher_fit.CACHE_ENV, str(tmp_path / "cache"))
    seen: list[int] = []
    real = teacher_fit.dagger_examples

    def spy(student, environment, train, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(len(train))
        return real(student, environment, train, *args, **kwargs)

    monkeypatch.setattr(teacher_fit, "dagger_examples", spy)
    with pytest.raises(Exception, match="only a benchmark's cold start has one"):
        prepare_teacher(tiny_config("models.toy_fit.dagger.enabled=true"))
    config = tiny_config(
        "models.toy_fit.dagger.enabled=true",
        "models.toy_fit.dagger.rollouts_per_task=2",
        "models.toy_fit.dagger.temperatures=[1.0,2.0]",
        "eval.teacher_gate_tasks=2",
        "eval.teacher_gate_on_path=0.0",
        "eval.teacher_gate_recovery=1.0",
        "eval.teacher_gate_privileged=teacher_departs",
        "train.cycles=0",
        "rollout.max_new_tokens_per_turn=40",
    )
    trainer = OPDTrainer(config, output_dir=tmp_path / "run", quiet=True)
    trainer.train()
    assert seen == []  # the run itself fits nothing
    prepared = prepare_teacher(config, student=trainer.student)
    assert seen == [len(trainer.splits["train"])]
    report = prepared.record
    assert report is not None and report["dagger_episodes"] == 2 * len(trainer.splits["train"])
    assert report["cost"]["examples"] > report["fit_tasks"] and report["cost"]["cpu_seconds"] > 0
    cold = export_cold_start(trainer, tmp_path / "cold-start", prepared)
    marker = json.loads((cold / COLD_START_MARKER).read_text())
    assert marker["toy_teacher"]["cost"] == report["cost"]

    gate = cold_start_teacher_gate(gate_subject(trainer, prepared))
    stored = json.loads((tmp_path / "run" / STATE_GATE_FILE).read_text())
    assert gate["states"]["on_path_agreement"] == stored["on_path_agreement"]
    assert stored["thresholds"] == {"on_path_agreement": 0.0, "recovery_rate": 1.0}
    assert stored["privileged_rule"] == "teacher_departs"  # the recipe's rule reaches the gate
    assert gate["passed"] is (not stored["failures"]) is stored["passed"]
    eval_ids = {t.task_id for t in trainer.splits["eval"]}
    assert not eval_ids & set(report["fit_task_ids"])
