"""An arm cell stopped part-way continues from its last checkpoint, and counts its cost once.

A toy benchmark (one seed, ``offline_kd`` and ``opd``, 4 cycles, a checkpoint every 2) is
killed while the first arm saves its cycle-3 checkpoint (cycles 2 and 3 done, not committed).
Run again, the arm resumes from cycle 1 and ends with the same held-out outcomes and the same
final weights as a benchmark that was never stopped; its cost adds what the ledger committed
before the stop. A ledger written for another arm config makes the cell start over instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import TOY_CALCULATOR, subprocess_env
from miniverl.lab.benchmark.budgets import CELL_COST_FILE
from miniverl.utils.failpoints import FAILPOINT_EXIT_CODE
from miniverl.utils.hashing import sha256_file
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.slow

SMALL = (
    "environment.train_tasks=8",
    "environment.eval_tasks=2",
    "train.cycles=4",
    "train.checkpoint_every=2",
    "train.rollouts_per_cycle=2",
    "train.sft_warmup_cycles=1",
    "models.toy_fit.max_steps=20",
    "models.toy_fit.check_every=10",
    "rollout.max_turns=2",
    "rollout.max_new_tokens_per_turn=16",
    "rollout.max_total_tokens=256",
    "eval.teacher_gate_threshold=0",
)
FIRST_ARM = "offline_kd"
KILL = "checkpoint:cycle-0003:staged"


def _benchmark(recipe: Path, out: Path, failpoint: str | None = None) -> int:
    env = subprocess_env()
    if failpoint is not None:
        env["MINIVERL_FAILPOINT"] = failpoint
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "miniverl.cli.main",
            "benchmark",
            str(recipe),
            *SMALL,
            "--arms",
            f"{FIRST_ARM},opd",
            "--seeds",
            "3",
            "--output",
            str(out),
            "--quiet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, FAILPOINT_EXIT_CODE), done.stderr[-3000:]
    return done.returncode


def _cell(out: Path, arm: str) -> dict[str, Any]:
    return json.loads((out / "cells" / f"s3-a0-{arm}.json").read_text())["payload"]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in RunPaths(run_dir).events.read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arm-resume")
    recipe = root / "toy_calculator.yaml"
    recipe.write_bytes(TOY_CALCULATOR.read_bytes())
    whole, stopped = root / "whole", root / "stopped"
    assert _benchmark(recipe, whole) == 0
    assert _benchmark(recipe, stopped, failpoint=KILL) == FAILPOINT_EXIT_CODE
    foreign = root / "foreign"
    shutil.copytree(stopped, foreign)
    return {"recipe": recipe, "whole": whole, "stopped": stopped, "foreign": foreign}


def test_a_stopped_arm_resumes_from_its_checkpoint_to_the_uninterrupted_result(
    runs: dict[str, Path],
) -> None:
    stopped, arm_dir = runs["stopped"], runs["stopped"] / "seed-3" / FIRST_ARM
    assert sorted(p.name for p in (stopped / "cells").iterdir()) == ["s3-a0-cold-start.json"]
    ledger_path = arm_dir / CELL_COST_FILE
    ledger = json.loads(ledger_path.read_text())
    assert sorted(ledger["checkpoints"]) == ["cycle-0001"]
    committed = ledger["checkpoints"]["cycle-0001"]
    assert committed["pieces"] == 1 and committed["cpu_seconds"] > 0
    # A committed spend no piece could reach shows that the resumed cell adds it.
    committed["cpu_seconds"] = committed["wall_seconds"] = 10_000.0
    ledger_path.write_text(json.dumps(ledger))

    assert _benchmark(runs["recipe"], stopped) == 0
    resumed = [e for e in _events(arm_dir) if e["event"] == "resumed"]
    assert [e["start_cycle"] for e in resumed] == [2]
    cell, whole = _cell(stopped, FIRST_ARM), _cell(runs["whole"], FIRST_ARM)
    assert cell["pieces"] == 2 and whole["pieces"] == 1
    assert cell["budget"]["cpu_seconds"] > 10_000 and cell["budget"]["wall_seconds"] > 10_000
    assert cell["wall_seconds"] > 10_000
    assert whole["budget"]["cpu_seconds"] < 10_000
    for key in ("tasks", "final_success", "endpoints", "optimizer_steps", "curve"):
        assert cell[key] == whole[key], key
    final = RunPaths(arm_dir).checkpoint("final")
    reference = RunPaths(runs["whole"] / "seed-3" / FIRST_ARM).checkpoint("final")
    assert sha256_file(final / "adapter.safetensors") == sha256_file(
        reference / "adapter.safetensors"
    )
    assert _cell(stopped, "opd")["pieces"] == 1
    assert _cell(stopped, "opd")["tasks"] == _cell(runs["whole"], "opd")["tasks"]


def test_a_ledger_of_another_arm_config_starts_the_cell_over(runs: dict[str, Path]) -> None:
    foreign, arm_dir = runs["foreign"], runs["foreign"] / "seed-3" / FIRST_ARM
    ledger_path = arm_dir / CELL_COST_FILE
    ledger = json.loads(ledger_path.read_text())
    ledger["config_digest"] = "0" * 64
    ledger_path.write_text(json.dumps(ledger))

    assert _benchmark(runs["recipe"], foreign) == 0
    assert not [e for e in _events(arm_dir) if e["event"] == "resumed"]
    cell = _cell(foreign, FIRST_ARM)
    assert cell["pieces"] == 1
    assert cell["tasks"] == _cell(runs["whole"], FIRST_ARM)["tasks"]
