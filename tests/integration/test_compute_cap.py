"""Compute-matched mode is enforced: the trainer charges its cap and stops cleanly when spent."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import tiny_config
from miniverl.lab.benchmark.budgets import BudgetCap, CapMeter, cap_outcome, measure_budget
from miniverl.lab.benchmark.harness import run_benchmark
from miniverl.training.recipe import OPDTrainer


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_trainer_stops_after_the_cycle_that_spends_the_cap(tmp_path: Path) -> None:
    cap = BudgetCap(resource="student_generated_tokens", limit=1.0)
    trainer = OPDTrainer(
        tiny_config("train.cycles=3"),
        output_dir=tmp_path / "run",
        quiet=True,
        stop_after_cycle=CapMeter(cap),
    )
    trainer.train()
    cycles = [r for r in _records(trainer.paths.metrics) if r.get("kind") == "cycle"]
    assert [c["cycle"] for c in cycles] == [0], "stopped after the first cycle"
    assert cap.enforced and cap.exhausted and cap.steps_charged == cycles[0]["steps"]
    assert cap.spent == cycles[0]["rollouts"]["generated_tokens"]
    assert cap.stopped_at == {
        "cycle": 0,
        "global_optimizer_step": trainer.state.global_step,
        "spent": cap.spent,
        "limit": 1.0,
    }
    [event] = [e for e in _records(trainer.paths.events) if e["event"] == "compute_cap_reached"]
    assert event["cycle"] == 0 and event["resource"] == "student_generated_tokens"
    assert trainer.paths.eval_json.exists(), "a stopped run still finishes cleanly"
    budget = measure_budget(trainer.paths.root, wall_seconds=1.0, cpu_seconds=1.0, device="cpu")
    assert budget["student_generated_tokens"] == cap.spent
    assert cap_outcome(cap, budget)["bound"] is True


def test_an_arms_budget_is_measured_from_a_trajectory_log_of_any_size(tmp_path: Path) -> None:
    """A long on-policy arm writes a trajectory log past the 64 MiB cap of a JSON file read whole
    (400 toy cycles of 16 rollouts wrote 93 MB); its budget is counted streaming, line by line."""
    from miniverl.utils.safe_load import MAX_JSON_BYTES

    trainer = OPDTrainer(tiny_config("train.cycles=1"), output_dir=tmp_path / "run", quiet=True)
    trainer.train()
    measured = measure_budget(trainer.paths.root, wall_seconds=1.0, cpu_seconds=1.0, device="cpu")
    assert measured["teacher_scored_tokens"] > 0
    with trainer.paths.trajectories.open("ab") as handle:
        handle.write(b" " * (MAX_JSON_BYTES + 1) + b"\n")
    assert trainer.paths.trajectories.stat().st_size > MAX_JSON_BYTES
    again = measure_budget(trainer.paths.root, wall_seconds=1.0, cpu_seconds=1.0, device="cpu")
    assert again == measured


def test_an_unspent_cap_changes_nothing(tmp_path: Path) -> None:
    cap = BudgetCap(resource="wall_seconds", limit=1e9)
    trainer = OPDTrainer(
        tiny_config("train.cycles=2"),
        output_dir=tmp_path / "run",
        quiet=True,
        stop_after_cycle=CapMeter(cap),
    )
    trainer.train()
    cycles = [r for r in _records(trainer.paths.metrics) if r.get("kind") == "cycle"]
    assert len(cycles) == 2 and cap.enforced and not cap.exhausted and cap.stopped_at is None
    assert cap.steps_charged == sum(c["steps"] for c in cycles) and cap.spent > 0


def test_compute_matched_benchmark_records_where_an_arm_stopped(tmp_path: Path) -> None:
    base = tiny_config(
        "train.cycles=3", "eval.teacher_gate_tasks=2", "eval.teacher_gate_threshold=0"
    )
    result = run_benchmark(
        base,
        arms=["offline_kd", "opd"],
        seeds=[1],
        output_dir=tmp_path / "bench",
        compute_matched="teacher_scored_tokens",
    )
    rows = {r["arm"]: r for r in result["rows"]}
    assert rows["opd"]["compute_cap"] is None
    cap = rows["offline_kd"]["compute_cap"]
    assert cap["enforced"] is True and cap["bound"] is True
    assert cap["stopped_at"]["cycle"] == 0, "the offline pool outspends opd's whole run in cycle 0"
    assert (
        rows["offline_kd"]["budget"]["optimizer_steps"] < rows["opd"]["budget"]["optimizer_steps"]
    )
