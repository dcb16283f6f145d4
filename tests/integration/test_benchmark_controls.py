"""The positive control's extra arms through ``miniverl benchmark`` on checked calc_chain.

- ``opd_self`` (the negative control): its teacher is the seed's cold-start student, loaded
  from the cold start and frozen; checked by the SHA-256 of the weights the arm's teacher was
  loaded from and by the teacher's top-1 at the student's own states.
- ``sft_corrective`` (DART-style): SFT whose traces include corrective ones; the corrupted
  call is never trained on, and the environment flagged it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.trajectory.io import read_trajectories
from miniverl.utils.hashing import sha256_file
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SMALL = (
    "environment.train_tasks=8",
    "environment.eval_tasks=2",
    "environment.test_tasks=2",
    "environment.params.test_k=[1,2]",
    "train.cycles=2",
    "train.rollouts_per_cycle=4",
    "models.student.model_id=toy-student",
    "models.teacher.checkpoint=null",
    "train.sft_warmup_until=null",
    "train.sft_warmup_cycles=2",
    "models.toy_fit.max_steps=20",
    "models.toy_fit.check_every=10",
    "models.toy_fit.extra_tasks=8",
    "eval.teacher_gate_required=false",
    "eval.teacher_gate_tasks=2",
)


def _run(out: Path) -> dict[str, Any]:
    """The controls' benchmark into ``out`` (a rerun resumes it); its ``cells`` record."""
    result = CliRunner().invoke(
        app,
        [
            "benchmark",
            str(ROOT / "recipes" / "toy_calc_chain_checked.yaml"),
            *SMALL,
            "--arms",
            "opd,opd_self,sft_corrective",
            "--seeds",
            "2",
            "--output",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(RunPaths(out).benchmark_json.read_text())["cells"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("controls") / "out"
    _run(out)
    return out


def _arm_dir(out: Path, arm: str) -> Path:
    return next((out / "seed-2").glob(f"*{arm}*"))


def test_the_negative_control_is_taught_by_the_frozen_cold_start(bench: Path) -> None:
    cold = RunPaths(bench / "seed-2").cold_start
    manifest = json.loads(RunPaths(_arm_dir(bench, "opd_self")).manifest.read_text())
    record = manifest["teacher_checkpoint"]
    assert record["sha256"] == sha256_file(cold / "student.safetensors")
    assert Path(record["weights"]) == cold / "student.safetensors"
    assert manifest["teacher"] is None
    opd = json.loads(RunPaths(_arm_dir(bench, "opd")).manifest.read_text())
    assert "teacher_checkpoint" not in opd
    data = json.loads(RunPaths(bench).benchmark_json.read_text())
    assert data["arms"]["opd_self"]["overrides"][-2:] == [
        "models.teacher.checkpoint=cold_start",
        "lab.teacher_fit.enabled=false",
    ]


def test_the_dart_arm_trains_on_corrective_traces_but_never_on_the_corrupted_call(
    bench: Path,
) -> None:
    run = _arm_dir(bench, "sft_corrective")
    trajectories = read_trajectories(RunPaths(run).trajectories)
    corrective = [t for t in trajectories if t.metadata.get("source") == "noisy_oracle"]
    assert corrective, "half of the SFT traces are corrective"
    for traj in corrective:
        bad = traj.metadata["corrupted_turn"]
        result = traj.turns[bad].tool_result
        assert result is None or not result.ok
        if traj.metadata["corruption"] == "extra_call":  # a call after the last step
            assert (
                result is not None and result.error == "every step is done: give the final answer"
            )
        else:
            assert "the next step is" in (result.error if result else "") or result is None


def test_a_negative_control_cell_is_reused_on_a_rerun_and_after_a_copy(
    bench: Path, tmp_path: Path
) -> None:
    """``opd_self``'s run points its teacher at this directory's cold start; the cell is
    checked against the arm as planned (and the cold start by its SHA-256), so neither a rerun
    nor a copy of the cells and cold start into another directory trains it again."""
    cell = bench / "cells" / "s2-a0-opd_self.json"
    before = cell.read_bytes()
    payload = json.loads(before)["payload"]
    assert payload["arm_config_digest"] != payload["config_digest"]
    again = _run(bench)
    assert again["discarded"] == [] and "s2-a0-opd_self" in again["reused"]
    assert cell.read_bytes() == before
    copy = tmp_path / "copy"
    shutil.copytree(bench / "cells", copy / "cells")
    shutil.copy(bench / "plan.json", copy / "plan.json")
    shutil.copytree(bench / "seed-2" / "cold-start", copy / "seed-2" / "cold-start")
    moved = _run(copy)
    assert moved["discarded"] == [] and len(moved["reused"]) == 4
    assert (copy / "cells" / "s2-a0-opd_self.json").read_bytes() == before
