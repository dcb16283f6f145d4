"""The example plugin environment (examples/letter_count) end to end from the CLI.

``train``, ``eval``, ``benchmark`` and ``report`` run on ``module:Class`` with a tiny
budget; the first three are fresh ``miniverl`` processes, as a user would type them, so
nothing registered in this test process can help them resolve the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SRC_DIR

REPO = SRC_DIR.parent
EXAMPLE = REPO / "examples" / "letter_count"
TINY = [
    "train.cycles=2",
    "train.sft_warmup_cycles=2",
    "train.rollouts_per_cycle=2",
    "train.checkpoint_every=1",
    "models.toy_fit.max_steps=20",
    "models.toy_fit.check_every=10",
    "environment.train_tasks=6",
    "environment.eval_tasks=2",
    "environment.test_tasks=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens_per_turn=16",
    "rollout.max_total_tokens=200",
    "loss.top_k=8",
    "eval.teacher_gate_threshold=0",
]

pytestmark = pytest.mark.slow


def _miniverl(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC_DIR), str(EXAMPLE)])}
    proc = subprocess.run(
        [sys.executable, "-m", "miniverl.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, f"miniverl {' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_train_eval_benchmark_report(tmp_path: Path) -> None:
    recipe = str(EXAMPLE / "recipe.yaml")
    run = tmp_path / "run"
    _miniverl("train", recipe, *TINY, "--output", str(run), "--quiet")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["environment"]["name"] == "letter_count"
    assert manifest["environment"]["tools"] == ["count(text, letter)"]
    trajectories = [
        json.loads(line)
        for line in (run / "trajectories.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert trajectories and {t["environment"] for t in trajectories} == {"letter_count"}
    assert all(t["task_id"].startswith("letters-") for t in trajectories)
    assert (run / "report.html").is_file()

    out = _miniverl("eval", "--run", str(run), "--split", "test", "--tag", "t", "--quiet")
    result = json.loads((run / "eval.t.json").read_text())
    assert result["tasks"] == 2 and f"t: {result['solved']}/2 solved" in out.stdout

    bench = tmp_path / "bench"
    _miniverl(
        "benchmark",
        recipe,
        *TINY,
        "--arms",
        "sft_only,opd",
        "--seeds",
        "1",
        "--output",
        str(bench),
        "--quiet",
    )
    summary = json.loads((bench / "benchmark.json").read_text())
    assert sorted(summary["arms"]) == ["opd", "sft_only"]

    (run / "report.html").unlink()
    _miniverl("report", str(run))
    html = (run / "report.html").read_text()
    assert "letter_count" in html and "count(text, letter)" in (run / "manifest.json").read_text()
