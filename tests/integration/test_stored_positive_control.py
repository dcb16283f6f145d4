"""Every figure results/positive_control/LOG.md quotes, recomputed from the stored artifacts.

``context-pilot/cells/`` are benchmark cell records (their payload SHA-256 is checked, so an
edited cell fails); ``turn-only-pilot/seed-N/`` holds a training run's ``eval.json`` and greedy
evaluation trajectories, from which the calc_chain endpoints are recomputed here with the
run's own config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.evaluation.cell_runner import _eval_trajectories, chain_endpoints
from miniverl.evaluation.cells import _digest

ROOT = Path(__file__).resolve().parents[2] / "results" / "positive_control"
LOG = (ROOT / "LOG.md").read_text(encoding="utf-8")

# (solved, success at k = 1, 2, 3, result-copy accuracy), as the LOG's table prints them
QUOTED: dict[tuple[int, str], tuple[int, tuple[str, str, str], str]] = {
    (1, "cold start"): (27, ("0.80", "0.55", "0.00"), "0.844"),
    (1, "offline_kd"): (23, ("0.60", "0.50", "0.05"), "0.766"),
    (1, "context"): (0, ("0", "0", "0"), "0.000"),
    (1, "turn_only"): (17, ("0.85", "0.00", "0.00"), "0.364"),
    (2, "cold start"): (17, ("0.80", "0.05", "0.00"), "0.818"),
    (2, "offline_kd"): (17, ("0.75", "0.10", "0.00"), "0.815"),
    (2, "context"): (0, ("0", "0", "0"), "0.000"),
    (2, "turn_only"): (17, ("0.85", "0.00", "0.00"), "0.680"),
}


def _cell(seed: int, name: str) -> dict[str, Any]:
    record = json.loads((ROOT / "context-pilot" / "cells" / f"s{seed}-a0-{name}.json").read_text())
    assert _digest(record["payload"]) == record["payload_sha256"], (
        "cell edited after it was written"
    )
    return record["payload"]


def _turn_only(seed: int) -> dict[str, Any]:
    run = ROOT / "turn-only-pilot" / f"seed-{seed}"
    config = RunConfig.from_yaml(run / "config.original.yaml")
    assert config.models.oracle_teacher.off_path == "turn_only"
    env = make_environment(config.environment.name, **config.environment.params)
    splits = build_splits(env, config.environment)
    tasks = {t.task_id: t for split in splits.values() for t in split}
    final = chain_endpoints(_eval_trajectories(run)["final"], tasks)
    assert final is not None
    stored = json.loads((run / "eval.json").read_text())["final"]
    assert round(final["success"] * final["episodes"]) == stored["solved"]
    return {**final, "solved": stored["solved"], "tasks": stored["tasks"]}


def _figures(endpoints: dict[str, Any], solved: int, digits: int) -> tuple[Any, ...]:
    by_k = tuple(
        "0" if digits == 0 else f"{endpoints['success_by_k'][k]:.{digits}f}"
        for k in ("1", "2", "3")
    )
    return solved, by_k, f"{endpoints['result_copy_accuracy']:.3f}"


@pytest.mark.parametrize("seed", [1, 2])
def test_every_quoted_cell_recomputes(seed: int) -> None:
    cold = _cell(seed, "cold-start")
    start = cold["start_endpoints"]
    assert (
        _figures(start, round(start["success"] * start["episodes"]), 2)
        == QUOTED[(seed, "cold start")]
    )
    offline = _cell(seed, "offline_kd")
    assert (
        _figures(offline["endpoints"], offline["final_solved"], 2) == QUOTED[(seed, "offline_kd")]
    )
    opd = _cell(seed, "opd")
    assert opd["arm_overrides"] == ["run.mode=opd", "loss.divergence=forward_kl"]
    assert all(v == 0 for v in opd["endpoints"]["success_by_k"].values())
    assert _figures(opd["endpoints"], opd["final_solved"], 0) == QUOTED[(seed, "context")]
    turn = _turn_only(seed)
    assert turn["tasks"] == 60
    assert _figures(turn, turn["solved"], 2) == QUOTED[(seed, "turn_only")]
    for cell in (offline["endpoints"], opd["endpoints"], turn):
        assert cell["recovery_rate"] == 0.0


def test_the_turn_only_runs_differ_from_the_opd_cell_only_in_off_path() -> None:
    """Each turn_only run took the opd cell's config (``config.submitted.yaml``, the cell's
    ``context`` teacher) and changed one field on the command line."""
    for seed in (1, 2):
        run = ROOT / "turn-only-pilot" / f"seed-{seed}"
        submitted = RunConfig.from_yaml(run / "config.submitted.yaml")
        ran = RunConfig.from_yaml(run / "config.original.yaml")
        assert submitted.models.oracle_teacher.off_path == "context"
        assert ran.models.oracle_teacher.off_path == "turn_only"
        assert ran.with_overrides(["models.oracle_teacher.off_path=context"]) == submitted
        command = json.loads((run / "command.json").read_text())
        assert command["overrides"] == ["models.oracle_teacher.off_path=turn_only"]
        assert submitted.run.mode == "opd" and submitted.loss.divergence == "forward_kl"
        assert submitted.train.cycles == 400 and submitted.train.lr == 0.001


def test_the_log_quotes_exactly_these_figures() -> None:
    for (seed, column), (solved, by_k, copy) in QUOTED.items():
        text = f"{solved}/60 ({' / '.join(by_k)}; {copy})"
        assert text in LOG, (seed, column, text)


def test_rerunning_the_pilot_on_a_copy_reuses_every_cell(tmp_path: Path) -> None:
    copy = tmp_path / "context-pilot"
    shutil.copytree(ROOT / "context-pilot", copy)
    recipe = ROOT.parents[1] / "recipes" / "toy_calc_chain_oracle.yaml"
    result = CliRunner().invoke(
        app,
        [
            "benchmark",
            str(recipe),
            "--arms",
            "offline_kd,opd",
            "--seeds",
            "1,2",
            "--output",
            str(copy),
            "--quiet",
            "models.oracle_teacher.off_path=context",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "6 of 6 cells were stored and reused" in result.output
