"""The shared learning-rate grid: same grid and rule for every arm, selection on validation only.

A fake cell runner stands in for the trainer (as in test_benchmark_cells.py); its
validation success is a known function of (arm, rate, seed), so the selection is checked
against values computed here. tests/integration/test_lr_grid_run.py trains for real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from helpers import tiny_config
from miniverl.cli.main import app
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.lab.benchmark.cells import Cell
from miniverl.lab.benchmark.lr_grid import (
    GRID_FILE,
    arms_with_learning_rates,
    benchmark_arms_from_grid,
    grid_arm_definitions,
    grid_arm_name,
    parse_grid,
    read_lr_grid,
    run_lr_grid,
    select_learning_rates,
    training_digest,
    validation_overrides,
)

# Validation success per (arm, rate) and seed. opd peaks at 0.001, offline_kd at 0.003; at
# 0.0003 offline_kd has the better seed-2 value (0.1 vs 0.1 tie) but a lower mean.
SUCCESS = {
    ("opd", 0.0003): {1: 0.2, 2: 0.4},
    ("opd", 0.001): {1: 0.6, 2: 0.4},
    ("opd", 0.003): {1: 0.0, 2: 0.1},
    ("offline_kd", 0.0003): {1: 0.5, 2: 0.1},
    ("offline_kd", 0.001): {1: 0.3, 2: 0.3},
    ("offline_kd", 0.003): {1: 0.9, 2: 0.1},
}
GRID = [0.003, 0.0003, 0.001]


def fake_cell(cell: Cell, done: Any) -> dict[str, Any]:
    if cell.is_cold_start:
        return {
            "seed": cell.seed,
            "student_sha256": f"cold-{cell.seed}",
            "teacher_gate": {"value": 1.0, "threshold": 0.95, "passed": True},
        }
    arm, lr = cell.arm.split("@lr=")
    success = SUCCESS[(arm, float(lr))][cell.seed]
    return {
        "arm": cell.arm,
        "seed": cell.seed,
        "arm_seed": cell.arm_seed,
        "cold_start_student_sha256": f"cold-{cell.seed}",
        "final_success": success,
        "optimizer_steps": 4,
        "tasks": [{"task_id": "t0", "k": 1, "solved": success}],
    }


def _grid(tmp_path: Path, *overrides: str, **kwargs: Any) -> dict[str, Any]:
    return run_lr_grid(
        tiny_config(),
        arms=kwargs.pop("arms", ["offline_kd", "opd"]),
        grid=kwargs.pop("grid", GRID),
        seeds=[1, 2],
        output_dir=tmp_path / "grid",
        overrides=list(overrides),
        run_cell=kwargs.pop("run_cell", fake_cell),
        resamples=20,
        **kwargs,
    )


def test_every_arm_runs_every_rate_and_gets_its_validation_best(tmp_path: Path) -> None:
    record = _grid(tmp_path)
    assert record["grid"] == [0.0003, 0.001, 0.003]
    assert record["selected"] == {"offline_kd": 0.003, "opd": 0.001}
    opd = {e["lr"]: e for e in record["table"]["opd"]}
    assert opd[0.001]["mean"] == pytest.approx(0.5) and opd[0.001]["n"] == 2
    assert opd[0.003]["values"] == [0.0, 0.1]
    bench = json.loads((tmp_path / "grid" / "benchmark.json").read_text())
    assert sorted(bench["arm_order"]) == sorted(
        grid_arm_name(a, lr) for a in ("offline_kd", "opd") for lr in GRID
    )
    assert bench["base_config"]["eval"]["split"] == "eval", "selection sees validation only"
    assert bench["arms"]["opd@lr=0.001"]["overrides"] == [
        "run.mode=opd",
        "loss.divergence=forward_kl",
        "train.lr=0.001",
    ]
    assert json.loads((tmp_path / "grid" / GRID_FILE).read_text())["selected"] == record["selected"]


def test_an_exact_tie_goes_to_the_smaller_rate() -> None:
    rows = [{"arm": grid_arm_name("opd", lr), "final_success": 0.5} for lr in (0.01, 0.001, 0.1)]
    table, selected = select_learning_rates(rows, ["opd"], [0.001, 0.01, 0.1])
    assert selected == {"opd": 0.001}
    assert [e["mean"] for e in table["opd"]] == [0.5, 0.5, 0.5]


def test_a_rate_without_a_finished_cell_is_refused() -> None:
    rows = [{"arm": grid_arm_name("opd", 0.001), "final_success": 0.5}]
    with pytest.raises(ConfigError, match=r"no final validation success for opd@lr=0.01"):
        select_learning_rates(rows, ["opd"], [0.001, 0.01])


def test_the_grid_refuses_another_split_and_an_arm_that_sets_its_own_rate(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"selects on the validation split, but the overrides set eval.split=test",
    ):
        validation_overrides(["eval.split=test"])
    assert validation_overrides(["train.cycles=2"]) == ["train.cycles=2", "eval.split=eval"]
    with pytest.raises(ConfigError, match=r"'tuned' sets train.lr itself"):
        grid_arm_definitions({"tuned": ("run.mode=opd", "train.lr=0.1")}, [0.001])
    with pytest.raises(ConfigError, match=r"must be positive"):
        parse_grid([0.001, 0.0])
    with pytest.raises(ConfigError, match=r"grid is empty"):
        parse_grid([])
    with pytest.raises(ConfigError, match=r"would share the arm name @lr=0.001"):
        parse_grid([0.001, 0.0010000001])
    assert not (tmp_path / "grid").exists()


def test_the_benchmark_runs_each_arm_at_its_selected_rate(tmp_path: Path) -> None:
    _grid(tmp_path)
    test_base = tiny_config("eval.every=1", "eval.max_tasks=3")
    definitions, record = benchmark_arms_from_grid(
        ["opd", "offline_kd"], tmp_path / "grid", test_base
    )
    assert definitions == {
        "opd": ("run.mode=opd", "loss.divergence=forward_kl", "train.lr=0.001"),
        "offline_kd": ("run.mode=offline_kd", "loss.divergence=forward_kl", "train.lr=0.003"),
    }
    assert record["selected"] == {"opd": 0.001, "offline_kd": 0.003}
    assert record["split"] == "eval" and record["seeds"] == [1, 2]
    configs = {a: test_base.with_overrides(list(o)) for a, o in definitions.items()}
    assert configs["offline_kd"].train.lr == 0.003 and configs["opd"].train.lr == 0.001


def test_a_grid_for_other_training_settings_or_arms_is_refused(tmp_path: Path) -> None:
    _grid(tmp_path, arms=["opd"])
    grid = read_lr_grid(tmp_path / "grid")
    with pytest.raises(ConfigError, match=r"selected for other training settings"):
        arms_with_learning_rates(
            {"opd": ("run.mode=opd", "loss.divergence=forward_kl")},
            grid,
            tiny_config("train.cycles=7"),
            "g",
        )
    with pytest.raises(ConfigError, match=r"benchmark arm 'offline_kd' has no learning rate in g"):
        arms_with_learning_rates(
            {"offline_kd": ("run.mode=offline_kd", "loss.divergence=forward_kl")},
            grid,
            tiny_config(),
            "g",
        )
    with pytest.raises(ConfigError, match=r"'opd' is defined differently"):
        arms_with_learning_rates(
            {"opd": ("run.mode=opd", "loss.divergence=reverse_kl")}, grid, tiny_config(), "g"
        )


def test_training_digest_ignores_evaluation_and_the_rate_only() -> None:
    config = tiny_config().to_dict()
    before = json.dumps(config, sort_keys=True)
    base = training_digest(config)
    assert json.dumps(config, sort_keys=True) == before, "the digest leaves its argument alone"
    assert (
        training_digest(tiny_config("eval.max_tasks=2", "eval.every=3", "train.lr=0.5").to_dict())
        == base
    )
    assert training_digest(tiny_config("train.sft_lr=0.5").to_dict()) != base
    assert training_digest(tiny_config("rollout.temperature=0.7").to_dict()) != base


def test_a_missing_or_foreign_grid_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match=r"no learning-rate grid at"):
        read_lr_grid(tmp_path)
    (tmp_path / GRID_FILE).write_text(json.dumps({"schema": "miniverl.benchmark/2"}))
    with pytest.raises(RunDirectoryError, match=r"is not a learning-rate grid"):
        read_lr_grid(tmp_path / GRID_FILE)


def test_cli_usage_errors_exit_2_and_create_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    recipe = Path(__file__).parents[2] / "recipes" / "toy_calc_chain_oracle.yaml"
    for args, code, message in (
        (["--grid", "0.001,fast"], 2, "--grid must be comma-separated numbers"),
        (["--grid", ""], 2, "--grid needs a comma-separated list"),
        (["--grid", "0.001", "--arms", "nope"], 1, "unknown benchmark arm(s) nope"),
        (["--grid", "0.001", "eval.split=test"], 1, "selects on the validation split"),
    ):
        result = runner.invoke(app, ["lr-grid", str(recipe), *args, "-o", str(tmp_path / "g")])
        assert result.exit_code == code and message in result.output, result.output
    assert not (tmp_path / "g").exists()
    result = runner.invoke(
        app, ["benchmark", str(recipe), "--lr-from", str(tmp_path), "-o", str(tmp_path / "b")]
    )
    assert result.exit_code != 0 and "no learning-rate grid" in result.output
    assert not (tmp_path / "b").exists()


def test_a_rerun_of_the_grid_reuses_every_cell_and_selects_the_same(tmp_path: Path) -> None:
    calls: list[str] = []

    def counting(cell: Cell, done: Any) -> dict[str, Any]:
        calls.append(cell.name)
        return fake_cell(cell, done)

    first = _grid(tmp_path, run_cell=counting)
    assert len(calls) == 2 + 2 * 2 * 3  # a cold start per seed, then arms x rates per seed
    calls.clear()
    again = _grid(tmp_path, run_cell=counting)
    assert calls == [] and again["selected"] == first["selected"]
    assert again["table"] == first["table"]
