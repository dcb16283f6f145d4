"""Resident memory of a ``miniverl`` command phase by phase: where a run's peak comes from.

Runs the CLI in this process (``miniverl.cli.main``) with a sampler thread reading
``VmRSS`` from ``/proc/self/status`` every ``--interval`` seconds, and hooks two places every
run passes through: each event the run emits (``EventLog.emit``) and each progress phase
(``ProgressReporter.task``: warm-up, teacher-adapter fit, rollouts, evaluation). Printed
after the command, one line per boundary: seconds since start, the event or phase, RSS at
the boundary and the highest sampled RSS since the previous boundary (MB, 10^6 bytes), so
the phase that set the process peak is the line whose "peak since" is largest. Beside them,
from glibc's ``mallinfo2``: bytes ``malloc`` has handed out and not had back (``in use``:
arena plus mmapped chunks, i.e. live tensors and Python objects) and bytes freed but still
held in the arena (``held free``): RSS that no live object needs, kept by the allocator.
``--tensors`` adds the bytes of every live torch tensor's storage (a ``gc`` walk per
boundary, slow) to tell tensors from other live memory.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/phase_memory.py -- \\
        train recipes/smollm2_smoke.yaml --output /tmp/smoke --quiet

``--json PATH`` also writes the rows. Sampling misses a spike shorter than the interval;
``/usr/bin/time -v``'s "Maximum resident set size" is the exact process peak.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MB = 1_000_000


def rss_bytes() -> int:
    """This process's resident set size now (``VmRSS``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_stats() -> tuple[int, int] | None:
    """``(in use, held free)`` bytes of glibc's allocator, or None off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        info = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    info.restype = _MallInfo2
    m = info()
    return m.uordblks + m.hblkhd, m.fordblks


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every torch tensor the garbage collector can reach."""
    import torch

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                storage = obj.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, ReferenceError):
            continue
    return sum(seen.values())


class Sampler:
    """Highest RSS seen since the last :meth:`boundary`, sampled every ``interval`` seconds."""

    def __init__(self, interval: float, tensors: bool = False) -> None:
        self.interval = interval
        self.tensors = tensors
        self.started = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self._peak = rss_bytes()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = rss_bytes()
            with self._lock:
                self._peak = max(self._peak, now)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def boundary(self, label: str) -> None:
        now = rss_bytes()
        with self._lock:
            peak, self._peak = max(self._peak, now), now
        row: dict[str, Any] = {
            "seconds": round(time.perf_counter() - self.started, 2),
            "boundary": label,
            "rss_mb": round(now / MB, 1),
            "peak_since_previous_mb": round(peak / MB, 1),
        }
        stats = malloc_stats()
        if stats is not None:
            row["malloc_in_use_mb"] = round(stats[0] / MB, 1)
            row["malloc_held_free_mb"] = round(stats[1] / MB, 1)
        if self.tensors:
            row["live_tensors_mb"] = round(live_tensor_bytes() / MB, 1)
        self.rows.append(row)


def install_hooks(sampler: Sampler) -> None:
    """Record a boundary at every emitted event and at the start and end of every progress phase."""
    from miniverl.training import live
    from miniverl.utils import logging as run_logging

    emit = run_logging.EventLog.emit

    def emit_and_mark(self: Any, event: str, **kwargs: Any) -> dict[str, Any]:
        sampler.boundary(f"event {event}")
        return emit(self, event, **kwargs)

    run_logging.EventLog.emit = emit_and_mark  # type: ignore[method-assign]
    task = live.ProgressReporter.task

    @contextlib.contextmanager
    def marked_task(self: Any, description: str, total: int) -> Iterator[Any]:
        sampler.boundary(f"start {description}")
        with task(self, description, total) as advance:
            yield advance
        sampler.boundary(f"end {description}")

    live.ProgressReporter.task = marked_task  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--tensors", action="store_true", help="also sum live torch tensors (slow gc walk)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then miniverl arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sampler = Sampler(args.interval, tensors=args.tensors)
    sampler.start()
    sampler.boundary("start")
    from miniverl.cli.main import app

    sampler.boundary("imports")
    install_hooks(sampler)
    code = 0
    try:
        app(command, standalone_mode=False)
    except SystemExit as exc:  # typer exits with the command's code
        code = int(exc.code or 0)
    finally:
        sampler.boundary("end")
        sampler.stop()
    extra = [
        (key, title)
        for key, title in (
            ("malloc_in_use_mb", "in use MB"),
            ("malloc_held_free_mb", "held free MB"),
            ("live_tensors_mb", "tensors MB"),
        )
        if key in sampler.rows[0]
    ]
    head = "".join(f" {title:>12}" for _, title in extra)
    print(f"{'s':>8} {'RSS MB':>8} {'peak since MB':>14}{head}  boundary")
    for row in sampler.rows:
        cells = "".join(f" {row[key]:>12.1f}" for key, _ in extra)
        print(
            f"{row['seconds']:>8.1f} {row['rss_mb']:>8.1f} {row['peak_since_previous_mb']:>14.1f}"
            f"{cells}  {row['boundary']}"
        )
    top = max(sampler.rows, key=lambda r: r["peak_since_previous_mb"])
    print(f"sampled peak {top['peak_since_previous_mb']:.1f} MB, ending at: {top['boundary']}")
    if args.json is not None:
        args.json.write_text(json.dumps(sampler.rows, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
