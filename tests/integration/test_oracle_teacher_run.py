"""A run with ``lab.oracle_teacher``: nothing is fitted, and the OPD targets at the student's
own states are the oracle's next action, checked against the environment's turn records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import capture_trained_samples, tiny_config
from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.environments.oracle_state import next_oracle_action
from miniverl.lab.benchmark.cell_runner import gate_subject
from miniverl.lab.run import start_run
from miniverl.lab.teachers.gate import run_teacher_gate
from miniverl.lab.teachers.prepare import PreparedTeacher
from miniverl.lab.teachers.toy_fit import TOY_TEACHER_FILE

EPS = 0.001
CHAIN = (
    "environment.name=calc_chain",
    "environment.difficulty=mixed",
    "environment.params.train_k=[1,2,3]",
    "environment.params.eval_k=[1,2,3]",
    "environment.params.test_k=[1]",
    "rollout.max_turns=6",
    "rollout.max_new_tokens_per_turn=40",
    "rollout.max_total_tokens=700",
    "rollout.max_parse_errors=3",
    f"models.oracle_teacher.smoothing={EPS}",
)


def test_opd_with_the_oracle_teacher_is_supervised_by_the_oracle_at_student_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = capture_trained_samples(monkeypatch)
    config = tiny_config(
        "run.mode=opd", "rollout.temperature=1.0", "train.rollouts_per_cycle=4", *CHAIN
    )
    trainer = start_run(config, output_dir=tmp_path / "run")
    trainer.train()

    root = tmp_path / "run"
    assert not (root / TOY_TEACHER_FILE).exists(), "no toy teacher is fitted or saved"
    assert trainer.teacher is not None and trainer.teacher.capabilities.backend == "oracle"
    manifest = json.loads((root / "manifest.json").read_text())
    assert '"backend": "oracle"' in json.dumps(manifest)

    tokenizer = trainer.teacher.tokenizer
    high = math.log(1 - EPS + EPS / tokenizer.vocab_size)
    turn_starts = off_path = 0
    assert len(seen) == 8
    for sample, fingerprint in seen:
        assert sample.rollout_fingerprint == fingerprint, "the student's own rollouts"
        traj, provider = sample.trajectory, sample.provider
        assert provider.topk_log_probs[:, 0].sub(high).abs().max() < 1e-5
        task = trainer.tasks_by_id[traj.task_id]
        starts: dict[int, int] = {}
        for span in traj.spans:
            if span.is_model_generated:
                starts.setdefault(span.turn_id, span.start)
        first_token = {start: turn for turn, start in starts.items()}
        targets = sample.alignment.target_token_ids
        for i, position in enumerate(sample.alignment.teacher_prediction_positions):
            if position + 1 not in first_token:
                continue
            turn = first_token[position + 1]
            before = [t for t in traj.turns if t.turn_id < turn]
            action = next_oracle_action(trainer.environment, task, before)
            text = format_final(action.answer) if action.is_final else format_tool_call(action.call)
            assert int(provider.topk_indices[i, 0]) == tokenizer.encode(text)[0]
            assert targets[i] == traj.token_ids[position + 1]
            turn_starts += 1
            off_path += action.steps_done < len(before)
    assert turn_starts >= 8 and off_path >= 2, (turn_starts, off_path)

    gate = run_teacher_gate(gate_subject(trainer, PreparedTeacher()))
    assert gate.value == 1.0 and gate.actions >= 2
