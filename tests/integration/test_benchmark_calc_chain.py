"""``miniverl benchmark --arm-seeds 2`` on calc_chain with the real trainer: cells, endpoints, budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.trajectory.io import read_trajectories
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "toy_calc_chain.yaml"
SHRINK = [
    "models.toy_fit.max_steps=10",
    "models.toy_fit.check_every=10",
    "models.toy_fit.extra_tasks=4",
    "models.toy_fit.probe_tasks=2",
    "models.toy_fit.batch_size=4",
    "environment.train_tasks=6",
    "environment.eval_tasks=3",
    "environment.test_tasks=6",
    "eval.split=test",
    "eval.every=1",
    "train.sft_warmup_until.max_cycles=1",
    "train.cycles=2",
    "train.rollouts_per_cycle=2",
    "rollout.max_new_tokens_per_turn=24",
    "eval.teacher_gate_threshold=0",
    "eval.teacher_gate_tasks=3",
]


PROTOCOL = """\
endpoints: [k=3]
primary_contrasts: [[opd, offline_kd]]
seeds: [5]
arms: [offline_kd, opd]
thresholds: {alpha: 0.05, power: 0.8, teacher_gate: 0.0}
lr_grid: {grid: [0.001], split: eval}
"""


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A test-split benchmark run through the CLI with a pre-registered protocol file."""
    root = tmp_path_factory.mktemp("chain")
    out = root / "bench"
    protocol = root / "protocol.yaml"
    protocol.write_text(PROTOCOL)
    args = [
        "benchmark",
        str(RECIPE),
        *SHRINK,
        "--arms",
        "offline_kd,opd",
        "--seeds",
        "5",
        "--arm-seeds",
        "2",
        "--output",
        str(out),
        "--protocol",
        str(protocol),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, result.output


def test_cells_endpoints_and_budgets(bench: tuple[Path, str]) -> None:
    out, output = bench
    data = json.loads(RunPaths(out).benchmark_json.read_text())
    assert data["arm_seeds"] == 2 and len(data["rows"]) == 4
    assert sorted(p.name for p in (out / "cells").iterdir()) == sorted(
        ["s5-a0-cold-start.json"]
        + [f"s5-a{a}-{arm}.json" for a in (0, 1) for arm in ("offline_kd", "opd")]
    )
    seeds = {(r["arm"], r["arm_seed"]): r["run_seed"] for r in data["rows"]}
    assert (
        seeds[("opd", 0)] == 5
        and seeds[("opd", 1)] != 5
        and seeds[("opd", 1)] == seeds[("offline_kd", 1)]
    )
    for row in data["rows"]:
        run_dir = out / row["run_dir"]
        final = [
            t
            for t in read_trajectories(RunPaths(run_dir).eval_trajectories)
            if t.metadata.get("eval_tag") == "final"
        ]
        assert [t["task_id"] for t in row["tasks"]] == sorted(t.task_id for t in final)
        assert sum(t["solved"] for t in row["tasks"]) == sum(t.solved for t in final)
        # baseline, cycle-0000 (eval.every=1; the last cycle is evaluated as final), final
        assert [p["tag"] for p in row["curve"]["points"]] == ["baseline", "cycle-0000", "final"]
        assert row["endpoints"]["episodes"] == 6 and set(row["endpoints"]["success_by_k"]) == {
            "1",
            "2",
            "3",
            "4",
            "5",
            "6",
        }
        budget = row["budget"]
        assert budget["optimizer_steps"] == row["optimizer_steps"] == 2
        assert budget["trained_tokens"] == row["selected_training_tokens"] > 0
        assert budget["cpu_seconds"] > 0 and budget["gpu_seconds"] is None
        assert budget["teacher_scored_tokens"] > 0
        assert row["exposure"]["student_nll_on_oracle"] > 0
        assert row["exposure"]["teacher_logprob_on_student"] < 0
    opd = next(r for r in data["rows"] if r["arm"] == "opd")
    assert opd["budget"]["student_generated_tokens"] == opd["generated_tokens"] > 0
    cold = data["cold_starts"][0]
    assert cold["start_endpoints"]["episodes"] == 6
    gate = cold["teacher_gate"]
    assert gate["passed"] is True and gate["threshold"] == 0.0 and gate["tasks"] == 3
    assert gate["actions"] > 0 and data["teacher_gate"] == {"5": gate}
    assert {c["check"] for c in data["stop_or_go"]["checks"]} == {
        "teacher_gate_passed",
        "oracle_sft_not_at_ceiling",
        "student_errors_at_start",
    }
    assert "pre-registered primary contrasts" in output and "opd vs offline_kd (k=3)" in output
    assert "no interval is quoted: only 1 seed" in output
    assert "budget opd (mean per cell): optimizer_steps 2" in output
    assert "4 arm cell(s) have learning curves with fewer than 8 evaluation points" in output
    assert data["budgets"]["opd"]["cpu_seconds"]["n"] == 2
    frozen = json.loads((out / "protocol.json").read_text())
    assert (out / frozen["stored_as"]).read_text() == PROTOCOL
    assert data["protocol"]["required"] is True and data["protocol"]["frozen"] == frozen
    assert "protocol protocol.yaml frozen at" in output


def test_rerun_reuses_every_cell(bench: tuple[Path, str]) -> None:
    out, _ = bench
    before = json.loads(RunPaths(out).benchmark_json.read_text())
    args = [
        "benchmark",
        str(RECIPE),
        *SHRINK,
        "--arms",
        "offline_kd,opd",
        "--seeds",
        "5",
        "--arm-seeds",
        "2",
        "--output",
        str(out),
        "--quiet",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    after = json.loads(RunPaths(out).benchmark_json.read_text())
    assert len(after["cells"]["reused"]) == 5
    assert after["rows"] == before["rows"] and after["contrasts"] == before["contrasts"]
