"""Every figure results/positive_control/LOG.md quotes, recomputed from the stored artifacts.

``context-pilot/cells/`` are benchmark cell records (their payload SHA-256 is checked, so an
edited cell fails); ``turn-only-pilot/seed-N/`` holds a training run's ``eval.json`` and greedy
evaluation trajectories, from which the calc_chain endpoints are recomputed here with the
run's own config. The LOG's table rows and contrast lines are rebuilt here and must appear in
it verbatim.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.evaluation.cell_runner import _eval_trajectories, chain_endpoints
from miniverl.evaluation.cells import _digest
from miniverl.evaluation.stats import t_interval, t_test_p

ROOT = Path(__file__).resolve().parents[2] / "results" / "positive_control"
LOG = (ROOT / "LOG.md").read_text(encoding="utf-8")
SEEDS = sorted(int(p.name.split("-")[1]) for p in (ROOT / "context-pilot").glob("seed-*"))
TASKS = 60


def _cell(seed: int, name: str) -> dict[str, Any]:
    path = ROOT / "context-pilot" / "cells" / f"s{seed}-a0-{name}.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert _digest(record["payload"]) == record["payload_sha256"], f"{path} edited"
    return record["payload"]


def _turn_only(seed: int) -> tuple[int, dict[str, Any]]:
    run = ROOT / "turn-only-pilot" / f"seed-{seed}"
    config = RunConfig.from_yaml(run / "config.original.yaml")
    assert config.models.oracle_teacher.off_path == "turn_only"
    env = make_environment(config.environment.name, **config.environment.params)
    splits = build_splits(env, config.environment)
    tasks = {t.task_id: t for split in splits.values() for t in split}
    final = chain_endpoints(_eval_trajectories(run)["final"], tasks)
    assert final is not None
    stored = json.loads((run / "eval.json").read_text(encoding="utf-8"))["final"]
    assert stored["tasks"] == TASKS == final["episodes"]
    assert round(final["success"] * final["episodes"]) == stored["solved"]
    return stored["solved"], final


def _text(solved: int, endpoints: dict[str, Any]) -> str:
    by_k = " / ".join(f"{endpoints['success_by_k'][k]:.2f}" for k in ("1", "2", "3"))
    return f"{solved}/{TASKS} ({by_k}; {endpoints['result_copy_accuracy']:.3f})"


@functools.cache
def _row(seed: int) -> tuple[str, dict[str, int]]:
    """The LOG's table row for ``seed`` and the solved counts of its four columns."""
    start = _cell(seed, "cold-start")["start_endpoints"]
    cold = round(start["success"] * start["episodes"])
    offline, opd = _cell(seed, "offline_kd"), _cell(seed, "opd")
    assert opd["arm_overrides"] == ["run.mode=opd", "loss.divergence=forward_kl"]
    turn_solved, turn = _turn_only(seed)
    for endpoints in (offline["endpoints"], opd["endpoints"], turn):
        assert endpoints["recovery_rate"] == 0.0  # the LOG: "0.0 in every cell"
    cells = [
        _text(cold, start),
        _text(offline["final_solved"], offline["endpoints"]),
        _text(opd["final_solved"], opd["endpoints"]),
        _text(turn_solved, turn),
    ]
    solved = {
        "cold start": cold,
        "offline_kd": offline["final_solved"],
        "context": opd["final_solved"],
        "turn_only": turn_solved,
    }
    return f"| {seed} | " + " | ".join(cells) + " |", solved


def _contrast(name: str, diffs: list[float]) -> str:
    low, high = t_interval(diffs)
    mean = sum(diffs) / len(diffs)
    return (
        f"`opd` with `{name}` − `offline_kd`: {mean:+.1f} pp, 95% t-interval [{low:+.1f}, {high:+.1f}] "
        f"over {len(diffs)} seeds, p = {t_test_p(diffs):.3f}"
    )


def test_every_table_row_recomputes() -> None:
    assert SEEDS == [1, 2, 3, 4, 5]
    for seed in SEEDS:
        row, _ = _row(seed)
        assert row in LOG, row


def test_the_contrasts_recompute() -> None:
    solved = [_row(seed)[1] for seed in SEEDS]
    for arm in ("turn_only", "context"):
        diffs = [100.0 * (s[arm] - s["offline_kd"]) / TASKS for s in solved]
        line = _contrast(arm, diffs)
        assert line in LOG, line


def test_the_turn_only_runs_differ_from_the_opd_cell_only_in_off_path() -> None:
    """Each turn_only run took the opd cell's config (``config.submitted.yaml``, the cell's
    ``context`` teacher) and changed one field on the command line."""
    for seed in SEEDS:
        run = ROOT / "turn-only-pilot" / f"seed-{seed}"
        submitted = RunConfig.from_yaml(run / "config.submitted.yaml")
        ran = RunConfig.from_yaml(run / "config.original.yaml")
        assert submitted.models.oracle_teacher.off_path == "context"
        assert ran.models.oracle_teacher.off_path == "turn_only"
        assert ran.with_overrides(["models.oracle_teacher.off_path=context"]) == submitted
        command = json.loads((run / "command.json").read_text(encoding="utf-8"))
        assert command["overrides"] == ["models.oracle_teacher.off_path=turn_only"]
        assert submitted.run.mode == "opd" and submitted.loss.divergence == "forward_kl"
        assert submitted.train.cycles == 400 and submitted.train.lr == 0.001
        assert submitted.run.seed == _cell(seed, "opd")["run_seed"] == seed


def test_rerunning_the_pilot_on_a_copy_reuses_every_cell(tmp_path: Path) -> None:
    copy = tmp_path / "context-pilot"
    shutil.copytree(ROOT / "context-pilot", copy)
    recipe = ROOT.parents[1] / "recipes" / "toy_calc_chain_oracle.yaml"
    seeds = ",".join(str(s) for s in SEEDS)
    args = ["benchmark", str(recipe), "--arms", "offline_kd,opd", "--seeds", seeds]
    args += ["--output", str(copy), "--quiet", "models.oracle_teacher.off_path=context"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    n = 3 * len(SEEDS)
    assert f"{n} of {n} cells were stored and reused" in result.output


def test_the_log_names_every_seed() -> None:
    assert f"seeds {SEEDS[0]}–{SEEDS[-1]}" in LOG


TEST_RUN = ROOT / "test-turn-only"


def test_the_pre_registered_test_split_run_is_frozen_and_its_finished_cells_intact() -> None:
    """The test-split run of the positive control is stored in pieces as its cells finish: its
    protocol frozen before any cell ran (bytes and SHA-256), every stored cell under the same
    plan and unedited, every stored cold start the weights its cell names."""
    from miniverl.utils.hashing import sha256_bytes, sha256_file

    frozen = json.loads((TEST_RUN / "protocol.json").read_text(encoding="utf-8"))
    assert sha256_bytes((TEST_RUN / frozen["stored_as"]).read_bytes()) == frozen["sha256"]
    content = frozen["content"]
    assert content["seeds"] == list(range(1, 9)) and content["arms"] == ["offline_kd", "opd"]
    assert content["endpoints"] == ["all", "k=2"]
    assert content["primary_contrasts"] == [["opd", "offline_kd"]]
    plan = json.loads((TEST_RUN / "plan.json").read_text(encoding="utf-8"))["plan_digest"]
    cells = sorted((TEST_RUN / "cells").glob("*.json"))
    for path in cells:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["plan_digest"] == plan, path.name
        assert _digest(record["payload"]) == record["payload_sha256"], path.name
        payload = record["payload"]
        assert payload["seed"] in content["seeds"]
        if path.name.endswith("-cold-start.json"):
            weights = TEST_RUN / f"seed-{payload['seed']}" / "cold-start" / "student.safetensors"
            assert sha256_file(weights) == payload["student_sha256"]
    assert f"{len(cells)} of the run's 24 cells" in LOG
