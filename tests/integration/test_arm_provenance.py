"""The new arms train on what they claim, end to end with the toy backend (provenance, not labels).

Every sample that reaches the optimizer is captured; its token ids are then regenerated
independently: seqkd's by re-sampling the frozen teacher with the recorded seeds (the
student, sampled with the same seeds, says something else), kd_oracle's from the
environment's oracle, gkd_mix's by the fingerprint of the weights that sampled them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import capture_trained_samples, tiny_config
from miniverl.agent.loop import RolloutRunner
from miniverl.models.fingerprint import backend_fingerprint
from miniverl.training.recipe import OPDTrainer
from miniverl.utils.seeding import derive_seed


def _train_capturing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, *extra: str
) -> tuple[OPDTrainer, list[tuple[Any, str | None]]]:
    """Train a tiny ``mode`` run; every trained sample of the arm phase, with the student's
    fingerprint at the moment it was optimized."""
    seen = capture_trained_samples(monkeypatch)
    trainer = OPDTrainer(
        tiny_config(f"run.mode={mode}", "train.cycles=2", "rollout.temperature=1.0", *extra),
        output_dir=tmp_path / mode,
        quiet=True,
    )
    trainer.train()
    assert seen, f"{mode} trained on nothing"
    return trainer, seen


def test_seqkd_trains_on_ids_the_teacher_sampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, seen = _train_capturing(tmp_path, monkeypatch, "seqkd")
    assert trainer.teacher is not None
    teacher = RolloutRunner(trainer.teacher, trainer.environment, trainer.config.rollout)
    student = RolloutRunner(trainer.student, trainer.environment, trainer.config.rollout)
    student_differs = False
    for sample, _ in seen:
        traj = sample.trajectory
        task_id, kind, cycle, index = traj.trajectory_id.split(":")
        assert kind == "seqkd"
        seed = derive_seed(trainer.config.run.seed, "seqkd", int(cycle[1:]), int(index))
        task = trainer.tasks_by_id[task_id]
        again = teacher.rollout(task, seed, policy_version=traj.policy_version)
        assert again.token_ids == traj.token_ids
        assert traj.metadata["policy_fingerprint"] == backend_fingerprint(trainer.teacher)
        assert sample.provider is None, "hard labels: no teacher targets"
        student_differs |= student.rollout(task, seed).token_ids != traj.token_ids
    assert student_differs, "the student, sampled with the same seeds, would have said otherwise"
    cycles = [json.loads(x) for x in trainer.paths.metrics.read_text().splitlines()]
    arm = [c for c in cycles if c.get("kind") == "cycle"]
    assert all(c["sampling_temperature"] == 1.0 and c["loss_temperature"] is None for c in arm)


def test_kd_oracle_trains_on_oracle_ids_with_teacher_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, seen = _train_capturing(tmp_path, monkeypatch, "kd_oracle")
    for sample, _ in seen:
        traj = sample.trajectory
        oracle = trainer.runner.oracle_rollout(trainer.tasks_by_id[traj.task_id])
        assert traj.token_ids == oracle.token_ids and ":kd-oracle:" in traj.trajectory_id
        assert sample.provider is not None, "teacher targets at the oracle's states"


def test_gkd_mix_trains_on_student_and_teacher_prefixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, seen = _train_capturing(tmp_path, monkeypatch, "gkd_mix", "train.rollouts_per_cycle=4")
    assert trainer.teacher is not None
    teacher_fp = backend_fingerprint(trainer.teacher)
    student_rows = [(s, fp) for s, fp in seen if ":gkd-teacher:" not in s.trajectory_id]
    teacher_rows = [s for s, _ in seen if ":gkd-teacher:" in s.trajectory_id]
    assert len(student_rows) == len(teacher_rows) == 4, "λ = 0.5 of 4 tasks, 2 cycles"
    for sample, current in student_rows:
        assert sample.rollout_fingerprint == current != teacher_fp, "on-policy half"
    for sample in teacher_rows:
        assert sample.trajectory.metadata["policy_fingerprint"] == teacher_fp
    assert all(s.provider is not None for s, _ in seen)
