"""``train.sft_warmup_until`` end to end: the trainer measures, stops and records the warm-up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import tiny_config
from miniverl.lab.benchmark import warmup as warmup_module
from miniverl.lab.run import start_run

UNTIL = ("train.sft_warmup_cycles=0", "train.cycles=1", "eval.baseline=false")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_run_leaves_the_warm_up_at_the_first_cycle_that_reaches_the_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = iter([0.0, 0.5, 0.75, 1.0])
    measured_at: list[int] = []

    def measure(runner: Any, tasks: Any, *, policy_version: int, **_: Any) -> float:
        measured_at.append(policy_version)
        return next(scripted)

    monkeypatch.setattr(warmup_module, "greedy_validation_success", measure)
    config = tiny_config(
        *UNTIL, "train.sft_warmup_until.threshold=0.75", "train.sft_warmup_until.max_cycles=5"
    )
    trainer = start_run(config, output_dir=tmp_path / "run")
    trainer.train()
    events = _rows(trainer.paths.events)
    [end] = [e for e in events if e["event"] == "sft_warmup_end"]
    assert (end["stopped_by"], end["value"], end["cycles"]) == ("criterion", 0.75, 3)
    assert measured_at == [1, 2, 3]  # after every warm-up update, on the new weights
    steps = _rows(trainer.paths.metrics)
    assert [s["cycle"] for s in steps if s.get("kind") == "step"] == [-5, -4, -3, 0]
    assert trainer.state.main_start_step == 3
    assert (trainer.paths.checkpoints / "warmup").is_dir()


def test_the_cap_ends_a_warm_up_whose_criterion_is_never_met(tmp_path: Path) -> None:
    config = tiny_config(
        *UNTIL,
        "train.sft_warmup_until.metric=success",
        "train.sft_warmup_until.threshold=1.0",
        "train.sft_warmup_until.max_cycles=2",
        "environment.eval_tasks=2",
    )
    trainer = start_run(config, output_dir=tmp_path / "run")
    trainer.train()
    events = _rows(trainer.paths.events)
    per_cycle = [e for e in events if e["event"] == "sft_warmup_cycle"]
    [end] = [e for e in events if e["event"] == "sft_warmup_end"]
    assert [e["cycle"] for e in per_cycle] == [-2, -1]
    assert all(0.0 <= e["validation_success"] < 1.0 for e in per_cycle)
    assert (end["stopped_by"], end["cycles"], end["value"]) == (
        "cap",
        2,
        per_cycle[-1]["validation_success"],
    )
