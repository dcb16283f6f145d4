"""Kill -9 at failpoints, recover, and require the uninterrupted result (crash_driver.py).

By default a representative subset of failpoints runs (``crash_driver.SUBSET``: before the
manifest, during the teacher fit, a torn line before the first checkpoint, every checkpoint
stage, the cache, the last cycle, after the final checkpoint, before ``eval.json``) plus three
injected full disks; ``MINIVERL_CRASH_MATRIX=full`` kills at every failpoint the run passes,
at its first and at its last hit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import subprocess_env

DRIVER = Path(__file__).with_name("crash_driver.py")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("crash")
    env = subprocess_env()
    if os.environ.get("MINIVERL_CRASH_MATRIX"):
        env["MINIVERL_CRASH_MATRIX"] = os.environ["MINIVERL_CRASH_MATRIX"]
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert "error" not in result, result["error"]
    return result


@pytest.mark.slow
def test_every_failpoint_kill_recovers_bit_identically(matrix: dict) -> None:
    assert matrix["targets"], "no failpoint was reached"
    failures = {
        target: entry
        for target, entry in matrix["results"].items()
        if entry.get("kill_rc") != 86 or entry.get("resume_rc", 0) != 0 or entry.get("problems")
    }
    assert not failures, json.dumps(failures, indent=1)[:4000]
    recoveries = {entry["recovery"] for entry in matrix["results"].values()}
    assert "--resume" in recoveries


@pytest.mark.slow
def test_the_run_passes_a_failpoint_around_every_kind_of_write(matrix: dict) -> None:
    names = set(matrix["failpoints"])
    for required in (
        "checkpoint:warmup:staged",
        "checkpoint:final:renamed",
        "write:eval.json:before_rename",
        "write:index.json:after_rename",
        "write:toy-teacher.safetensors:before_rename",
        "write:manifest.json:after_rename",
        "append:metrics.jsonl:partial",
        "append:events.jsonl:partial",
        "append:trajectories.jsonl:after",
    ):
        assert required in names, sorted(names)
    assert any(n.startswith("write:shard-") for n in names), sorted(names)


@pytest.mark.slow
def test_a_full_disk_is_a_clean_resumable_error(matrix: dict) -> None:
    assert matrix["enospc"]
    for target, entry in matrix["enospc"].items():
        assert entry["rc"] == 1, (target, entry)
        assert "no space left on device while writing" in entry["message"], entry
        assert "MiB free" in entry["message"] and "Traceback" not in entry["message"]
        assert entry["leftover_tmp"] == [] and entry["torn_logs"] == [], entry
        assert entry["resume_rc"] == 0 and entry["problems"] == [], (target, entry)
