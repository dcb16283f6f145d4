"""``benchmarks/recovery_overfit.py`` runs end to end on a stored toy cold start, finds the
student's refused calls, and its fit moves the student towards the teacher at exactly the
positions it scores (a fit that kept no position would leave the agreement where it was)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "recovery_overfit.py"
COLD_START = ROOT / "results" / "positive_control" / "test-context" / "seed-1" / "cold-start"
LINE = re.compile(
    r"(before|after \d+ passes): top-1 agreement (\d+)/(\d+) \(([\d.]+)\); "
    r"corrective turns reproduced (\d+)/(\d+)"
)


@pytest.mark.slow
def test_the_overfit_check_finds_refusals_and_its_fit_moves_the_student(tmp_path: Path) -> None:
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    args = [str(COLD_START), "environment.params.checked=true", "run.seed=1", "--as-checked"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--cycles", "1", "--passes", "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    head = re.search(r"(\d+) of (\d+) student episodes have a refused call", proc.stdout)
    assert head is not None, proc.stdout
    assert 0 < int(head.group(1)) <= int(head.group(2)) == 8
    (before, after) = LINE.findall(proc.stdout)
    assert before[0] == "before" and after[0] == "after 4 passes"
    assert before[2] == after[2] and int(before[2]) > 0  # the same positions, scored twice
    assert before[5] == after[5] and int(before[5]) > 0
    assert int(after[1]) > int(before[1]), proc.stdout
    assert re.search(r"loss ([\d.]+) -> ([\d.]+) nats/token over \d+ steps", proc.stdout)


def test_the_log_quotes_the_stored_overfit_check() -> None:
    """``results/toy_positive_control/recovery-overfit-seed1.txt`` is the script's output; the
    LOG's figures are read from it."""
    text = (ROOT / "results" / "toy_positive_control" / "recovery-overfit-seed1.txt").read_text()
    log = " ".join(
        (ROOT / "results" / "toy_positive_control" / "LOG.md").read_text(encoding="utf-8").split()
    )
    (before, after) = LINE.findall(text)
    assert after[0] == "after 100 passes" and before[2] == after[2] == "1207"
    assert f"at {int(before[1]):,} of {int(before[2]):,} positions ({before[3]})" in log
    assert (
        f"After: {int(after[1]):,} of {int(after[2]):,} ({after[3]}) and {after[4]} of {after[5]}"
        in log
    )
    assert f"whole in {before[4]} of {before[5]}" in log
    assert "31 of the 32 episodes have a refused call" in log
    assert text.startswith("31 of 32 student episodes have a refused call")
