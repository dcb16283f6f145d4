"""``benchmarks/teacher_dagger_refit.py`` end to end on a few tasks: it fits the teacher on the
cold start's labelled training states only, writes the refitted weights with their SHA-256, and
scores the gate before and after on held-out tasks (the weights change, the students' states
do not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT, subprocess_env
from miniverl.utils.hashing import sha256_file

pytestmark = pytest.mark.slow


def test_the_refit_trains_on_training_states_and_gates_on_held_out_ones(tmp_path: Path) -> None:
    start = REPO_ROOT / "src" / "miniverl" / "recipes" / "toy_demo_cold_start"
    teacher = REPO_ROOT / "src" / "miniverl" / "recipes" / "toy_demo_teacher.safetensors"
    out = tmp_path / "refit"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "teacher_dagger_refit.py"), str(start),
         "--out", str(out), "--steps", "3", "--tasks", "4", "--train-tasks", "3",
         "--rollouts-per-task", "1"],
        cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "gate.json").read_text())
    assert record["teacher_sha256"] == sha256_file(out / "teacher.safetensors")
    assert record["teacher_sha256"] != sha256_file(teacher)  # the fit changed the weights
    assert record["fit"]["dagger_tasks"] == 3 and record["fit"]["trace_rows"] == 3
    assert record["fit"]["steps"] == 3
    before, after = record["before"]["figures"], record["after"]["figures"]
    assert before["tasks"] == after["tasks"] == 4
    # the same student episodes are scored before and after: only the teacher changed
    assert (
        before["turns"] == after["turns"] and before["recovery_states"] == after["recovery_states"]
    )
    assert "before: on the path" in done.stdout and "after: on the path" in done.stdout
