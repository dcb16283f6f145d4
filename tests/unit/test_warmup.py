"""The SFT warm-up: a fixed count, or until the lab's criterion (lab/benchmark/warmup.py), with
a cap. The run's own loop (``OPDTrainer.train``) runs the warm-up's cycles; the criterion
only measures, and its measurement is scripted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import tiny_config
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task
from miniverl.errors import ConfigError
from miniverl.lab.benchmark import warmup
from miniverl.lab.benchmark.warmup import WarmupCriterion, criterion_tasks
from miniverl.lab.config import LabRunConfig, WarmupUntilConfig
from miniverl.training.recipe import OPDTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _Outcome:
    def __init__(self, end: dict[str, Any] | None, cycles: list[int]) -> None:
        self.cycles_run = len(cycles)
        self.stopped_by = end["stopped_by"] if end else "cycles"
        self.value = end["value"] if end else None


def _warm_up(
    tmp_path: Path,
    values: list[float],
    *,
    cycles: int,
    until: WarmupUntilConfig | None,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Any, list[int], list[dict[str, Any]]]:
    measured = iter(values)
    monkeypatch.setattr(warmup, "greedy_validation_success", lambda *a, **k: next(measured))
    monkeypatch.setattr(warmup, "criterion_tasks", lambda config, splits, u: splits["eval"])
    config = tiny_config(
        "train.cycles=0", f"train.sft_warmup_cycles={cycles if until is None else 0}"
    )
    trainer = OPDTrainer(
        config,
        output_dir=tmp_path / "run",
        quiet=True,
        warmup_until=None if until is None else WarmupCriterion(config, until),
    )
    trainer.train()
    events = [json.loads(line) for line in trainer.paths.events.read_text().splitlines()]
    warm = [e for e in events if e["event"].startswith("sft_warmup")]
    run = [e["cycle"] for e in warm if e["event"] == "sft_warmup_cycle"]
    end = next((e for e in warm if e["event"] == "sft_warmup_end"), None)
    return _Outcome(end, run), run, warm


def test_the_warm_up_stops_after_the_first_cycle_that_reaches_the_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    until = WarmupUntilConfig(threshold=0.8, max_cycles=6)
    outcome, source, events = _warm_up(
        tmp_path, [0.1, 0.79, 0.8, 0.95, 1.0], cycles=6, until=until, monkeypatch=monkeypatch
    )
    assert (outcome.cycles_run, outcome.stopped_by, outcome.value) == (3, "criterion", 0.8)
    assert source == [-6, -5, -4]
    per_cycle = [e["validation_success"] for e in events if e["event"] == "sft_warmup_cycle"]
    assert per_cycle == [0.1, 0.79, 0.8]
    [end] = [e for e in events if e["event"] == "sft_warmup_end"]
    assert (end["stopped_by"], end["value"], end["cycles"], end["threshold"]) == (
        "criterion",
        0.8,
        3,
        0.8,
    )


def test_the_cap_stops_a_warm_up_that_never_reaches_the_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    until = WarmupUntilConfig(metric="success_at_k", k=1, threshold=0.9, max_cycles=3)
    outcome, source, events = _warm_up(
        tmp_path, [0.2, 0.5, 0.89], cycles=3, until=until, monkeypatch=monkeypatch
    )
    assert (outcome.cycles_run, outcome.stopped_by, outcome.value) == (3, "cap", 0.89)
    assert source == [-3, -2, -1]
    [end] = [e for e in events if e["event"] == "sft_warmup_end"]
    assert (end["stopped_by"], end["value"], end["k"], end["metric"]) == (
        "cap",
        0.89,
        1,
        "success_at_k",
    )


def test_check_every_measures_every_nth_cycle_and_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only measured cycles can stop the warm-up; the cap's cycle is always measured."""
    until = WarmupUntilConfig(threshold=0.8, max_cycles=7, check_every=3)
    outcome, source, events = _warm_up(
        tmp_path, [0.5, 0.9], cycles=7, until=until, monkeypatch=monkeypatch
    )
    assert (outcome.cycles_run, outcome.stopped_by, outcome.value) == (6, "criterion", 0.9)
    assert source == [-7, -6, -5, -4, -3, -2]
    measured = [
        (e["cycle"], e.get("validation_success"))
        for e in events
        if e["event"] == "sft_warmup_cycle"
    ]
    assert measured == [(-7, None), (-6, None), (-5, 0.5), (-4, None), (-3, None), (-2, 0.9)]
    until = WarmupUntilConfig(threshold=0.8, max_cycles=4, check_every=3)
    (tmp_path / "cap").mkdir()
    outcome, _, events = _warm_up(
        tmp_path / "cap", [0.1, 0.2], cycles=4, until=until, monkeypatch=monkeypatch
    )
    assert (outcome.cycles_run, outcome.stopped_by, outcome.value) == (4, "cap", 0.2)
    assert [e["cycle"] for e in events if "validation_success" in e] == [-2, -1]


def test_a_fixed_count_runs_every_cycle_and_measures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome, source, events = _warm_up(tmp_path, [], cycles=2, until=None, monkeypatch=monkeypatch)
    assert (outcome.cycles_run, outcome.stopped_by) == (2, "cycles")
    assert source == [-2, -1]
    assert [e["event"] for e in events] == ["sft_warmup_start"] + ["sft_warmup_cycle"] * 2
    assert all("validation_success" not in e for e in events)


def test_the_cap_is_the_warm_up_length_the_run_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, fixed = _warm_up(tmp_path / "a", [], cycles=3, until=None, monkeypatch=monkeypatch)
    until = WarmupUntilConfig(threshold=1.0, max_cycles=2)
    _, _, by = _warm_up(tmp_path / "b", [0.0, 0.0], cycles=2, until=until, monkeypatch=monkeypatch)
    assert [e["cycles"] for e in fixed + by if e["event"] == "sft_warmup_start"] == [3, 2]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"metric": "success_at_k"}, "metric: success_at_k needs k"),
        ({"metric": "success", "k": 2}, "k only applies to metric: success_at_k"),
    ],
)
def test_the_metric_and_k_must_agree(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LabRunConfig.from_mapping({"train": {"sft_warmup_cycles": 0, "sft_warmup_until": fields}})


def _task(i: int, k: int) -> Task:
    return Task(task_id=f"t{i}", prompt=f"p{i}", answer="1", difficulty="easy", data={"k": k})


def test_the_criterion_measures_the_validation_tasks_of_its_k() -> None:
    config = RunConfig.from_mapping({"eval": {"max_tasks": 5}})
    splits = {"eval": [_task(i, 1 + i % 3) for i in range(9)], "test": [_task(99, 1)]}
    at_2 = WarmupUntilConfig(metric="success_at_k", k=2)
    assert [t.task_id for t in criterion_tasks(config, splits, at_2)] == ["t1", "t4"]
    assert len(criterion_tasks(config, splits, WarmupUntilConfig())) == 5
    with pytest.raises(ConfigError, match="no validation task to measure success_at_k at k=4"):
        criterion_tasks(config, splits, WarmupUntilConfig(metric="success_at_k", k=4))
