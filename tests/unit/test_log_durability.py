"""When a run's append-only logs reach the disk (``utils.io`` durability contract).

Inside a training run every append reaches the operating system only; the logs are fsynced
together at the durability points (``utils.io.DurableLogs``): before a checkpoint records
their lengths, at the end of every cycle and when the run ends. The checkpoint's fsync is
what keeps ``--resume`` valid after a power loss: a committed checkpoint must never vouch
for log bytes that were still only in the page cache. ``os.fsync`` is recorded here by
file (its path from ``/proc/self/fd`` with device and inode: an inode number alone is
reused once a file is deleted) and size, so each test names exactly which flush it needs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import tiny_config
from miniverl.config.models import RunConfig
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend, ToyModelConfig
from miniverl.training.checkpoint import (
    STATE_FILE,
    ResumeCounters,
    run_logs,
    write_training_checkpoint,
)
from miniverl.training.optim import Schedule, build_optimizer
from miniverl.training.recipe import OPDTrainer
from miniverl.utils.io import DurableLogs, append_jsonl
from miniverl.utils.logging import EventLog, MetricsLog
from miniverl.utils.runs import RunPaths

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not Path("/proc/self/fd").is_dir(), reason="names fsynced files via /proc/self/fd"
    ),
]

Identity = tuple[str, int, int]


class FsyncRecorder:
    """``os.fsync`` that notes ``(device, inode) -> largest size flushed`` and every call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.durable: dict[Identity, int] = {}
        self.calls: list[tuple[Identity, int, bool]] = []
        self.in_sync_point = False
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self._fsync)
        real_sync = DurableLogs.sync

        def sync(logs: DurableLogs) -> None:
            self.in_sync_point = True
            try:
                real_sync(logs)
            finally:
                self.in_sync_point = False

        monkeypatch.setattr(DurableLogs, "sync", sync)

    def _fsync(self, fd: int) -> None:
        self._real(fd)
        stat = os.fstat(fd)
        key = (os.readlink(f"/proc/self/fd/{fd}"), stat.st_dev, stat.st_ino)
        self.calls.append((key, stat.st_size, self.in_sync_point))
        self.durable[key] = max(self.durable.get(key, 0), stat.st_size)

    def fsyncs_of(self, path: Path) -> int:
        key = _identity(path)
        return sum(1 for k, _, _ in self.calls if k == key)

    def durable_size(self, path: Path) -> int:
        """Bytes of ``path`` an fsync has covered (0 when none has)."""
        return self.durable.get(_identity(path), 0)


def _identity(path: Path) -> Identity:
    stat = os.stat(path)
    return (str(path.resolve()), stat.st_dev, stat.st_ino)


def _logs(paths: RunPaths) -> list[Path]:
    return [p for p in run_logs(paths).paths if p.exists()]


# ------------------------------------------------------------------ utils.io


def test_append_without_sync_reaches_the_file_but_is_not_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = FsyncRecorder(monkeypatch)
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, [{"a": 1}], sync=False)
    assert path.read_bytes() == b'{"a": 1}\n'
    assert fsyncs.calls == []
    append_jsonl(path, [{"b": 2}])
    assert fsyncs.calls == [(_identity(path), path.stat().st_size, False)]


def test_event_and_metrics_logs_follow_their_sync_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = FsyncRecorder(monkeypatch)
    events, metrics = EventLog(tmp_path / "e.jsonl", sync=False), MetricsLog(tmp_path / "m.jsonl")
    metrics.sync = False
    events.emit("x")
    metrics.write({"kind": "cycle"})
    assert fsyncs.calls == []
    events.sync = metrics.sync = True
    events.emit("y")
    metrics.write({"kind": "cycle"})
    assert len(fsyncs.calls) == 2


def test_durable_logs_flush_changed_logs_and_new_logs_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = FsyncRecorder(monkeypatch)
    a, b, missing = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "never.jsonl"
    logs = DurableLogs([a, b, missing])
    append_jsonl(a, [{"n": 1}], sync=False)
    append_jsonl(b, [{"n": 1}], sync=False)
    logs.sync()
    assert fsyncs.durable_size(a) == a.stat().st_size
    assert fsyncs.durable_size(b) == b.stat().st_size
    directory = _identity(tmp_path)
    flushed = [k for k, _, _ in fsyncs.calls]
    assert flushed.count(directory) == 1, "the new logs' directory entries, once, after them"
    assert flushed.index(directory) == len(flushed) - 1

    append_jsonl(a, [{"n": 2}], sync=False)
    logs.sync()
    assert fsyncs.durable_size(a) == a.stat().st_size
    assert (fsyncs.fsyncs_of(a), fsyncs.fsyncs_of(b)) == (2, 1), "b is unchanged: not again"

    logs.sync()
    assert len(fsyncs.calls) == 5, "nothing changed: nothing flushed"

    b.unlink()
    append_jsonl(b, [{"replaced": True}], sync=False)
    logs.sync()
    assert fsyncs.durable_size(b) == b.stat().st_size
    assert [k for k, _, _ in fsyncs.calls[5:]] == [_identity(b), directory], (
        "a replaced log is a new directory entry (even when its inode number is reused)"
    )


# ------------------------------------------------------------------ checkpoint


def _write_checkpoint(paths: RunPaths) -> Path:
    small = ToyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    student = ToyBackend(small, ToyTokenizer(), model_id="toy-student", seed=1)
    optimizer = build_optimizer(student.trainable_parameters(), RunConfig.from_mapping({}).train)
    for p in student.trainable_parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    counters = ResumeCounters(
        cycle=0,
        global_step=1,
        parameter_version=1,
        rollout_policy_version=0,
        task_cursor=2,
        chunk_size=32,
        main_start_step=0,
        eval_results={},
    )

    class Source:
        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

    return write_training_checkpoint(
        paths.checkpoint("cycle-0000"),
        counters=counters,
        student=student,
        optimizer=optimizer,
        schedule=Schedule(peak_lr=1e-3),
        source=Source(),
        teacher=None,
        paths=paths,
        config_digest="d" * 64,
    )


def _check_commits(
    monkeypatch: pytest.MonkeyPatch, fsyncs: FsyncRecorder, paths: RunPaths
) -> list[str]:
    """Patch ``os.replace``: when a staged checkpoint is renamed into place, every log length
    its ``state.json`` records must already be covered by an fsync. Returns the commits seen."""
    real_replace = os.replace
    committed: list[str] = []

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        src, dst = Path(src), Path(dst)
        if dst.parent == paths.checkpoints and not dst.name.startswith("."):
            state = json.loads((src / STATE_FILE).read_text())
            for name, size in state["jsonl_sizes"].items():
                log = getattr(paths, name)
                if size:
                    assert fsyncs.durable_size(log) >= size, (
                        f"checkpoint {dst.name} records {size} bytes of {log.name}, but only "
                        f"{fsyncs.durable_size(log)} were fsynced before its commit"
                    )
            committed.append(dst.name)
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return committed


def test_a_checkpoint_is_committed_only_after_the_logs_it_measures_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = RunPaths(tmp_path)
    append_jsonl(paths.events, [{"event": "run_start"}], sync=False)
    append_jsonl(paths.metrics, [{"kind": "step", "loss": 1.0}], sync=False)
    append_jsonl(paths.trajectories, [{"trajectory_id": "t"}], sync=False)
    fsyncs = FsyncRecorder(monkeypatch)
    committed = _check_commits(monkeypatch, fsyncs, paths)
    _write_checkpoint(paths)
    assert committed == ["cycle-0000"]
    for log in (paths.events, paths.metrics, paths.trajectories):
        assert fsyncs.durable_size(log) == log.stat().st_size, log.name


# ------------------------------------------------------------------ a training run


def test_a_run_fsyncs_its_logs_only_at_cycle_ends_checkpoints_and_run_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cycles checkpoint every other cycle and evaluate in between, so a commit follows
    appends that no cycle end has flushed (the checkpoint's own fsync is what covers them)."""
    paths = RunPaths(tmp_path / "run")
    fsyncs = FsyncRecorder(monkeypatch)
    committed = _check_commits(monkeypatch, fsyncs, paths)
    cycle_ends: list[int] = []
    original: Callable[..., None] = OPDTrainer._end_cycle

    def end_cycle(self: OPDTrainer, cycle: int, *args: Any) -> None:
        original(self, cycle, *args)
        if cycle < 0:  # a warm-up cycle; the warm-up's end is its durability point
            return
        for log in _logs(paths):
            assert fsyncs.durable_size(log) == log.stat().st_size, (
                f"cycle {cycle} ended with {log.name} not fsynced"
            )
        cycle_ends.append(cycle)

    monkeypatch.setattr(OPDTrainer, "_end_cycle", end_cycle)
    config = tiny_config("train.cycles=3", "train.checkpoint_every=2", "eval.every=1")
    trainer = OPDTrainer(config, output_dir=paths.root, quiet=True)
    trainer.train()

    assert cycle_ends == [0, 1, 2]
    assert committed == ["warmup", "cycle-0001", "cycle-0002", "final"]
    logs = _logs(paths)
    assert {p.name for p in logs} >= {"events.jsonl", "metrics.jsonl", "trajectories.jsonl"}
    identities = {_identity(p) for p in logs}
    stray = [c for c in fsyncs.calls if c[0] in identities and not c[2]]
    assert not stray, f"{len(stray)} log fsyncs outside a durability point (per-append fsyncs)"
    for log in logs:
        assert fsyncs.durable_size(log) == log.stat().st_size, f"run ended with {log.name} unsynced"
    appends = sum(len(p.read_bytes().splitlines()) for p in logs)
    log_fsyncs = sum(1 for c in fsyncs.calls if c[0] in identities)
    assert log_fsyncs < appends / 2, (log_fsyncs, appends)
    assert trainer.events.sync and trainer.metrics.sync, "appends after the run fsync again"


def test_an_interrupted_run_leaves_its_logs_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``run_end`` event of an interrupted run, written after the last cycle end, is flushed."""
    paths = RunPaths(tmp_path / "run")
    fsyncs = FsyncRecorder(monkeypatch)
    original: Callable[..., None] = OPDTrainer._end_cycle

    def end_cycle(self: OPDTrainer, cycle: int, *args: Any) -> None:
        original(self, cycle, *args)
        if cycle == 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(OPDTrainer, "_end_cycle", end_cycle)
    trainer = OPDTrainer(tiny_config("train.cycles=2"), output_dir=paths.root, quiet=True)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    last = json.loads(paths.events.read_bytes().splitlines()[-1])
    assert (last["event"], last["status"]) == ("run_end", "interrupted")
    for log in _logs(paths):
        assert fsyncs.durable_size(log) == log.stat().st_size, f"{log.name} left unsynced"
    assert trainer.events.sync and trainer.metrics.sync
