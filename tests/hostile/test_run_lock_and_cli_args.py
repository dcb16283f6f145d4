"""One writer per run directory, and hostile CLI arguments refused with typed errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import TOY_CALCULATOR, subprocess_env
from miniverl.cli.main import app
from miniverl.errors import RunDirectoryError
from miniverl.utils.runlock import LOCK_NAME, run_lock

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def live_holder(tmp_path: Path):
    """Another process holding the run lock of ``tmp_path / 'run'``."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run / LOCK_NAME)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield run, proc
    proc.kill()
    proc.wait()


def test_second_writer_fails_at_once_naming_the_holder_pid(live_holder) -> None:
    run, proc = live_holder
    started = time.monotonic()
    with pytest.raises(RunDirectoryError) as info, run_lock(run):
        pass
    assert time.monotonic() - started < 1.0
    assert f"PID {proc.pid}" in info.value.message
    assert str(run) in info.value.message


def test_train_beside_a_live_writer_exits_naming_its_pid(live_holder, tiny_recipe: Path) -> None:
    run, proc = live_holder
    result = CliRunner().invoke(
        app, ["train", str(tiny_recipe), "--output", str(run), "--resume", "-q", "--no-report"]
    )
    assert result.exit_code == 1
    assert f"in use by another miniverl process (PID {proc.pid}" in result.output
    assert not (run / "manifest.json").exists()


def test_benchmark_beside_a_live_writer_is_refused(live_holder, tiny_recipe: Path) -> None:
    run, proc = live_holder
    result = CliRunner().invoke(
        app, ["benchmark", str(tiny_recipe), "--output", str(run), "--arms", "opd", "-q"]
    )
    assert result.exit_code == 1 and f"PID {proc.pid}" in result.output


def test_cache_prune_beside_a_live_writer_is_refused_and_changes_nothing(
    live_holder, finished_run: Path
) -> None:
    """``cache prune`` writes into ``<run>/teacher-cache``: it takes the run's lock first."""
    import json
    import shutil

    run, proc = live_holder
    cache = run / "teacher-cache"
    shutil.copytree(finished_run / "teacher-cache", cache)
    versions = json.loads(CliRunner().invoke(app, ["cache", "stats", str(cache), "--json"]).output)[
        "versions"
    ]
    before = {p.name: p.read_bytes() for p in sorted(cache.iterdir())}
    keep = sorted(int(v) for v in versions)[-1]
    result = CliRunner().invoke(app, ["cache", "prune", str(cache), "--keep-version", str(keep)])
    assert result.exit_code == 1, result.output
    assert f"in use by another miniverl process (PID {proc.pid}" in result.output
    assert {p.name: p.read_bytes() for p in sorted(cache.iterdir())} == before


def test_validate_refuses_more_tasks_than_the_pool_holds_before_any_work() -> None:
    """The calculator's easy pool has 243 prompts; 100,000 is inside the config bound."""
    recipe = TOY_CALCULATOR
    started = time.monotonic()
    result = CliRunner().invoke(app, ["validate", str(recipe), "environment.train_tasks=100000"])
    assert time.monotonic() - started < 10.0
    assert result.exit_code == 1, result.output
    assert "can generate only 243 easy distinct tasks; 100024 were requested" in result.output


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run / LOCK_NAME)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()  # kill -9 while holding: the file still names it
    holder.wait()
    assert (run / LOCK_NAME).read_text().strip() == str(holder.pid)
    probe = (
        "import sys\nfrom miniverl.utils.runlock import run_lock\n"
        "try:\n    with run_lock(sys.argv[1]):\n        print('acquired')\n"
        "except Exception as exc:\n    print(exc)\n"
    )
    with run_lock(run) as path:
        assert path.read_text().strip() == str(os.getpid())
        with run_lock(run):  # re-entrant within one process (CLI around the trainer)
            pass
        other = subprocess.run(
            [sys.executable, "-c", probe, str(run)],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            check=True,
        )
        assert f"in use by another miniverl process (PID {os.getpid()}" in other.stdout
    after = subprocess.run(
        [sys.executable, "-c", probe, str(run)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        check=True,
    )
    assert after.stdout.strip() == "acquired"  # released on exit


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["eval", "--run", "{run}", "--tag", "../../evil"], "invalid eval tag '../../evil'"),
        (["eval", "--run", "{run}", "--tag", "a\x00b"], "invalid eval tag"),
        (["eval", "--run", "{run}", "--checkpoint", "../../etc"], "invalid checkpoint name"),
        (["eval", "--run", "{run}", "--checkpoint", "/etc/passwd"], "invalid checkpoint name"),
        (["eval", "--run", "{run}", "--checkpoint", "nope"], "nope is missing"),
        (["eval", "--run", "{run}", "--split", "bogus"], "--split 'bogus' is not a held-out split"),
        (["eval", "--run", "{run}", "--split", "train"], "--split 'train' is not a held-out split"),
        (["eval", "--run", "{run}", "--split", "test"], "environment.test_tasks: 0"),
        (["eval", "--run", "{run}/absent"], "is not a run directory"),
        (["cache", "prune", "{run}/teacher-cache", "--keep-version", "-1"], "is negative"),
        (
            ["cache", "prune", "{run}/teacher-cache", "--keep-version", "999"],
            "is not a policy version",
        ),
        (["cache", "stats", "{run}"], "index.json is missing"),
        (["train", "{recipe}", "run.name=../escaped"], "run.name: must be a single path component"),
        (["train", "{recipe}", "run.name=a\x00b"], "not valid YAML"),
        (["train", "{recipe}", "train.lr=.inf"], "train.lr: Input should be a finite number"),
        (["train", "{recipe}", "environment.train_tasks=1000000000"], "raise the constant"),
        (["train", "{recipe}", "--output", "{run}"], "already holds a run"),
        (["validate", "/dev/zero"], "not a regular file"),
        (["validate", "{run}"], "not a regular file"),
        (["inspect", "{run}/absent.jsonl"], "trajectory file not found"),
        (["inspect", "{run}"], "not a regular file"),
        (["report", "{run}/absent"], "is not a directory"),
        (["export", "{run}/absent"], "is not a directory"),
        (
            ["benchmark", "{recipe}", "--arms", "bogus", "--output", "{tmp}/b"],
            "unknown benchmark arm",
        ),
    ],
)
def test_hostile_cli_argument_is_a_clean_error(
    tmp_path: Path, finished_run: Path, tiny_recipe: Path, args: list[str], fragment: str
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    argv = [a.format(run=run, recipe=tiny_recipe, tmp=tmp_path) if "{" in a else a for a in args]
    result = CliRunner().invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code != 0
    assert fragment in result.output, result.output
