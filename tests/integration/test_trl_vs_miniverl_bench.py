"""``benchmarks/trl_vs_miniverl_update.py`` end to end on a tiny random llama checkpoint,
without TRL: it must say that TRL is missing, run both miniverl arms on one batch of student
rollouts, and find the bucketed per-position forward KL never above the exact one (merging
the tail into one bucket can only lower a KL). The TRL arm itself needs TRL in a venv of its
own (docs/performance.md); nothing here is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from miniverl.models.tiny_hf import build_tiny_hf_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "trl_vs_miniverl_update.py"


@pytest.mark.slow
def test_miniverl_arms_run_and_a_missing_trl_is_reported(tmp_path: Path) -> None:
    model = build_tiny_hf_checkpoint(tmp_path / "tiny", arch="llama", seed=2)
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    args = [
        *("--model-dir", str(model), "--trl-python", str(tmp_path / "no-such-python")),
        *("--episodes", "2", "--repeats", "1", "--json", str(out)),
        *("models.student.lora.r=2", "rollout.max_new_tokens_per_turn=4"),
    ]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "TRL is not importable" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"bucketed", "exact"}
    assert result["batch"]["episodes"] == 2 and result["batch"]["positions"] > 0
    bucketed, exact = result["arms"]["bucketed"], result["arms"]["exact"]
    assert 0 < bucketed["loss_trajectory_mean"] <= exact["loss_trajectory_mean"]
    assert bucketed["top_k"] == 32 and exact["top_k"] == result["batch"]["vocab_size"]
    assert result["checks"]["bucketed_vs_exact"]["min_position_gap"] >= -1e-6
    assert "exact_vs_trl" not in result["checks"]
