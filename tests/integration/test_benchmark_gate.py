"""The benchmark refuses to start its arms when the teacher gate fails (end to end, tiny toy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import tiny_config
from miniverl.errors import TeacherGateError
from miniverl.lab.benchmark.harness import run_benchmark
from miniverl.utils.runs import RunPaths

GATE = ("eval.teacher_gate_tasks=2", "train.cycles=1")


def _cells(root: Path) -> list[str]:
    return (
        sorted(p.name for p in (root / "cells").glob("*.json")) if (root / "cells").exists() else []
    )


def test_a_failing_gate_refuses_the_arms_and_writes_no_benchmark(tmp_path: Path) -> None:
    base = tiny_config(*GATE, "eval.teacher_gate_threshold=1.0")
    out = tmp_path / "bench"
    with pytest.raises(TeacherGateError, match="teacher gate failed for seed 1") as info:
        run_benchmark(base, arms=["offline_kd", "opd"], seeds=[1], output_dir=out)
    assert "no benchmark arm was started" in str(info.value)
    assert "the teacher reproduces the correct next action at" in str(info.value)
    assert not RunPaths(out).benchmark_json.exists()
    assert not (out / "seed-1" / "opd").exists() and not (out / "seed-1" / "offline_kd").exists()
    gate = json.loads((out / "seed-1" / "cold-start-run" / "teacher-gate.json").read_text())
    assert gate["passed"] is False and gate["threshold"] == 1.0 and gate["value"] < 1.0
    assert (
        json.loads((RunPaths(out / "seed-1").cold_start / "teacher-gate.json").read_text())["value"]
        == gate["value"]
    )


def test_a_passing_gate_is_recorded_in_benchmark_json(tmp_path: Path) -> None:
    base = tiny_config(*GATE, "eval.teacher_gate_threshold=0")
    result = run_benchmark(base, arms=["opd"], seeds=[1], output_dir=tmp_path / "bench")
    gate = result["teacher_gate"]["1"]
    assert gate["passed"] is True and gate["threshold"] == 0.0 and gate["actions"] > 0
    assert result["cold_starts"][0]["teacher_gate"] == gate
    [check] = [c for c in result["stop_or_go"]["checks"] if c["check"] == "teacher_gate_passed"]
    assert check["status"] == "go" and check["value"] == [gate["value"]]
    assert result["arms"]["opd"]["sampling_temperature"] == 1.0
    assert result["arms"]["opd"]["loss_temperature"] == base.loss.temperature


def test_the_cli_exits_non_zero_with_the_gate_message(tmp_path: Path) -> None:
    from miniverl.cli.main import app

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(tiny_config(*GATE, "eval.teacher_gate_threshold=1.0").to_yaml())
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app, ["benchmark", str(recipe), "--arms", "opd", "--seeds", "2", "--output", str(out)]
    )
    assert result.exit_code == 1, result.output
    assert "teacher gate failed" in result.output
    assert not RunPaths(out).benchmark_json.exists() and not (out / "seed-2" / "opd").exists()
