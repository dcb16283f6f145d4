"""fsync calls and seconds of a short toy OPD run: per-append fsyncs vs durability points.

A run's append-only logs (``events.jsonl``, ``metrics.jsonl``, the trajectory logs) are
appended without an fsync and made durable together at the end of every cycle, before every
checkpoint and at run end (``utils.io.DurableLogs``). This script runs the same toy recipe
(``recipes/toy_calculator.yaml``, ``train.cycles`` cut to ``--cycles`` and a shorter toy-teacher fit; its
300 SFT warm-up cycles log like any other cycle) twice, each in a fresh directory with
its own empty teacher cache:

  per_append   every ``append_jsonl`` fsyncs (``sync`` forced on) and the durability
               points do nothing: how the logs were written before the points existed;
  points       the shipped behaviour.

It counts ``append_jsonl`` calls, every ``os.fsync`` (all files, and the run's logs with
their directory), and the seconds spent inside those fsyncs, and prints both arms. The
fsync seconds depend on the file system (a tmpfs barely pays for one): pass ``--root`` on
the disk the runs live on.

    PYTHONPATH=src python benchmarks/log_fsyncs.py                # 20 OPD cycles
    PYTHONPATH=src python benchmarks/log_fsyncs.py --cycles 5 --warmup-cycles 20 --root /var/tmp
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from miniverl.lab.config import load_recipe
from miniverl.lab.run import start_run
from miniverl.training.checkpoint import run_logs
from miniverl.utils import io
from miniverl.utils.runs import RunPaths

TOY_RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "toy_calculator.yaml"
"""The smallest toy recipe (one-step calculator tasks, a toy teacher fitted on oracle traces)."""

ARMS = ("per_append", "points")


@dataclass
class Counts:
    """One arm's totals: ``*_s`` are seconds; ``log_*`` only the run's logs and their directory."""

    appends: int = 0
    fsyncs: int = 0
    fsync_s: float = 0.0
    log_fsyncs: int = 0
    log_fsync_s: float = 0.0
    wall_s: float = 0.0

    def row(self, arm: str) -> str:
        return (
            f"{arm:<11} {self.appends:>8} {self.fsyncs:>7} {self.fsync_s:>9.3f}"
            f" {self.log_fsyncs:>11} {self.log_fsync_s:>9.3f} {self.wall_s:>7.1f}"
        )


def _fd_path(fd: int) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{fd}")
    return None


@contextlib.contextmanager
def instrumented(arm: str, paths: RunPaths, counts: Counts) -> Iterator[None]:
    """Count and time every ``os.fsync`` and ``append_jsonl``; ``per_append`` forces ``sync``."""
    real_fsync, real_append, real_sync = os.fsync, io.append_jsonl, io.DurableLogs.sync
    logs = {str(p.resolve()) for p in run_logs(paths).paths} | {str(paths.root.resolve())}

    def fsync(fd: int) -> None:
        started = time.perf_counter()
        real_fsync(fd)
        seconds = time.perf_counter() - started
        counts.fsyncs += 1
        counts.fsync_s += seconds
        if _fd_path(fd) in logs:
            counts.log_fsyncs += 1
            counts.log_fsync_s += seconds

    def append(path: Any, records: Any, *, sync: bool = True) -> None:
        counts.appends += 1
        real_append(path, records, sync=sync or arm == "per_append")

    holders = [
        m
        for m in list(sys.modules.values())
        if getattr(m, "__name__", "").startswith("miniverl")
        and getattr(m, "append_jsonl", None) is real_append
    ]
    os.fsync = fsync
    for module in holders:
        module.append_jsonl = append  # type: ignore[attr-defined]
    if arm == "per_append":
        io.DurableLogs.sync = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        os.fsync = real_fsync
        for module in holders:
            module.append_jsonl = real_append  # type: ignore[attr-defined]
        io.DurableLogs.sync = real_sync  # type: ignore[method-assign]


def run_arm(arm: str, root: Path, cycles: int, warmup_cycles: int) -> Counts:
    """One toy OPD run of ``cycles`` cycles under ``arm``'s log writing."""
    directory = root / arm
    os.environ["MINIVERL_CACHE_DIR"] = str(directory / "cache")
    config = load_recipe(
        TOY_RECIPE,
        [
            f"train.cycles={cycles}",
            f"train.sft_warmup_cycles={warmup_cycles}",
            "lab.toy_fit.max_steps=200",
            "lab.toy_fit.extra_tasks=0",
        ],
    )
    counts = Counts()
    with instrumented(arm, RunPaths(directory / "run"), counts):
        started = time.perf_counter()
        start_run(config, output_dir=directory / "run").train()
        counts.wall_s = time.perf_counter() - started
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="OPD cycles per run")
    parser.add_argument(
        "--warmup-cycles",
        type=int,
        default=300,
        help="SFT warm-up cycles (the toy calculator recipe's: 300)",
    )
    parser.add_argument("--root", type=Path, default=None, help="where the runs are written")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    previous = os.environ.get("MINIVERL_CACHE_DIR")
    with tempfile.TemporaryDirectory(dir=args.root, prefix="log-fsyncs-") as tmp:
        results = {arm: run_arm(arm, Path(tmp), args.cycles, args.warmup_cycles) for arm in ARMS}
    if previous is None:
        os.environ.pop("MINIVERL_CACHE_DIR", None)
    else:
        os.environ["MINIVERL_CACHE_DIR"] = previous
    print(
        f"toy demo recipe: {args.warmup_cycles} SFT warm-up cycles, {args.cycles} OPD cycles;"
        f" runs under {args.root or tempfile.gettempdir()}"
    )
    print(
        f"{'arm':<11} {'appends':>8} {'fsyncs':>7} {'fsync_s':>9} {'log_fsyncs':>11} {'log_s':>9} {'wall_s':>7}"
    )
    for arm, counts in results.items():
        print(counts.row(arm))
    before, after = results["per_append"], results["points"]
    print(
        f"log fsyncs {before.log_fsyncs} -> {after.log_fsyncs}, "
        f"log fsync seconds {before.log_fsync_s:.3f} -> {after.log_fsync_s:.3f}"
    )


if __name__ == "__main__":
    main()
