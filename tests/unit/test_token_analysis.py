"""``token_analysis.jsonl``: one j − 1 aligned record per selected token, rewritten per cycle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import oracle_trajectories
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend, ToyModelConfig
from miniverl.training.live import token_analysis_records, write_token_analysis
from miniverl.training.sources import hard_label_sample
from miniverl.utils.logging import EventLog

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ToyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)


def test_each_record_is_the_students_log_prob_of_token_j_from_row_j_minus_1() -> None:
    tokenizer = ToyTokenizer()
    student = ToyBackend(SMALL, tokenizer, model_id="toy-student", seed=3)
    [sample] = [hard_label_sample(t) for t in oracle_trajectories(1)]
    records = token_analysis_records(student, tokenizer, [sample], cycle=4)

    ids = sample.trajectory.token_ids
    targets = [j for j in range(1, len(ids)) if sample.trajectory.model_generated_mask[j]]
    assert [r["target_position"] for r in records] == targets
    assert all(r["prediction_position"] == r["target_position"] - 1 for r in records)
    assert [r["token_id"] for r in records] == [ids[j] for j in targets]
    with torch.no_grad():
        hidden = student.hidden_states_at(ids, list(range(len(ids))))
        full = torch.log_softmax(student.project(hidden).float(), dim=-1)
    expected = [float(full[j - 1, ids[j]]) for j in targets]
    assert [r["student_log_prob"] for r in records] == pytest.approx(expected, abs=1e-5)
    assert {r["cycle"] for r in records} == {4}
    assert {r["divergence"] for r in records} == {None}  # no teacher targets


def test_the_file_holds_only_the_latest_cycle(tmp_path: Path) -> None:
    tokenizer = ToyTokenizer()
    student = ToyBackend(SMALL, tokenizer, model_id="toy-student", seed=3)
    samples = [hard_label_sample(t) for t in oracle_trajectories(2)]
    path, events = tmp_path / "token_analysis.jsonl", EventLog(None)
    write_token_analysis(path, student, tokenizer, samples, cycle=0, events=events)
    write_token_analysis(path, student, tokenizer, samples, cycle=1, events=events)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["cycle"] for r in rows} == {1}
    assert len(rows) == sum(s.num_positions for s in samples)
    assert [(e["event"], e["positions"]) for e in events.events] == [
        ("token_analysis_written", len(rows))
    ] * 2
