"""The learning-rate grid trains for real: each (arm, rate) cell's optimizer ran at that rate,
and the benchmark that follows runs each arm at the rate the grid selected for it.

Provenance is read from the runs' own step records (the optimizer's learning rate at every
step), not from labels, so a grid that forgot to apply ``train.lr`` fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import tiny_config
from miniverl.lab.benchmark.harness import run_benchmark
from miniverl.lab.benchmark.lr_grid import benchmark_arms_from_grid, grid_arm_name, run_lr_grid

GATE = ("eval.teacher_gate_tasks=2", "eval.teacher_gate_threshold=0")


def _step_lrs(run_dir: Path) -> set[float]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return {r["lr"] for r in records if r.get("kind") == "step"}


def test_grid_cells_train_at_their_rate_and_the_benchmark_at_the_selected_one(
    tmp_path: Path,
) -> None:
    base = tiny_config("train.cycles=2", "train.schedule=constant", *GATE)
    grid = [0.002, 0.02]
    record = run_lr_grid(
        base, arms=["opd", "sft_oracle"], grid=grid, seeds=[1], output_dir=tmp_path / "grid"
    )
    bench = json.loads((tmp_path / "grid" / "benchmark.json").read_text())
    for row in bench["rows"]:
        lr = float(row["arm"].split("@lr=")[1])
        assert _step_lrs(tmp_path / "grid" / row["run_dir"]) == {lr}, row["arm"]
    assert {r["arm"] for r in bench["rows"]} == {
        grid_arm_name(a, lr) for a in ("opd", "sft_oracle") for lr in grid
    }
    assert bench["base_config"]["eval"]["split"] == "eval"
    for arm in ("opd", "sft_oracle"):
        means = {e["lr"]: e["mean"] for e in record["table"][arm]}
        best = max(means.values())
        assert record["selected"][arm] == min(lr for lr, m in means.items() if m == best)

    definitions, learning_rates = benchmark_arms_from_grid(
        ["opd", "sft_oracle"], tmp_path / "grid", base
    )
    result = run_benchmark(
        base,
        arms=list(definitions),
        seeds=[2],
        output_dir=tmp_path / "bench",
        arm_definitions=definitions,
        learning_rates=learning_rates,
    )
    for row in result["rows"]:
        assert _step_lrs(tmp_path / "bench" / row["run_dir"]) == {record["selected"][row["arm"]]}
    assert result["learning_rates"]["selected"] == record["selected"]
    saved = json.loads((tmp_path / "bench" / "benchmark.json").read_text())
    assert saved["learning_rates"]["lr_grid_sha256"] == learning_rates["lr_grid_sha256"]


def test_cli_grid_then_benchmark_lr_from(tmp_path: Path) -> None:
    import yaml
    from typer.testing import CliRunner

    from miniverl.cli.main import app

    recipe = tmp_path / "tiny.yaml"
    config = tiny_config("train.cycles=1", "train.schedule=constant", *GATE).to_dict()
    recipe.write_text(yaml.safe_dump(config))
    runner = CliRunner()
    grid = runner.invoke(
        app,
        [
            "lr-grid",
            str(recipe),
            "--grid",
            "0.002,0.02",
            "--arms",
            "opd",
            "-o",
            str(tmp_path / "g"),
            "-q",
        ],
    )
    assert grid.exit_code == 0, grid.output
    assert "selected" in grid.output and "--lr-from" in grid.output
    selected = json.loads((tmp_path / "g" / "lr_grid.json").read_text())["selected"]["opd"]
    bench = runner.invoke(
        app,
        [
            "benchmark",
            str(recipe),
            "--arms",
            "opd",
            "--lr-from",
            str(tmp_path / "g"),
            "--seeds",
            "3",
            "-o",
            str(tmp_path / "b"),
            "-q",
        ],
    )
    assert bench.exit_code == 0, bench.output
    saved = json.loads((tmp_path / "b" / "benchmark.json").read_text())
    [row] = saved["rows"]
    assert _step_lrs(tmp_path / "b" / row["run_dir"]) == {selected}
    assert saved["learning_rates"]["selected"] == {"opd": selected}
    assert saved["arms"]["opd"]["overrides"][-1] == f"train.lr={selected}"
    note = f"Learning rates: opd {selected:g}, selected from the shared grid [0.002, 0.02] on the eval split"
    assert note in " ".join(bench.output.split())
    assert note in " ".join((tmp_path / "b" / "summary.md").read_text().split())
