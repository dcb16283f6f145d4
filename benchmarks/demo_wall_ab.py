"""Wall time of ``miniverl demo --fast`` for two checkouts, measured in one interleaved run.

A refactor should keep ``demo --fast`` within 5% of the wall time it had before, measured
side by side. Timing one checkout now and the other later compares
two machine loads, not two programs, so this script alternates the two (A B B A A B ...)
in fresh subprocesses, each with its own empty cache directory (``MINIVERL_CACHE_DIR``), as a
first-time user starts. It also checks
that both print the same held-out figures: the ``eval`` records of ``metrics.jsonl`` must
agree on every tag's solved / tasks, and the step losses must be identical.
``--full`` runs the full demo instead (minutes per run).

    python benchmarks/demo_wall_ab.py --before ../base --after . --repeats 3

``--before`` / ``--after`` are repository roots (their ``src/`` goes first on PYTHONPATH);
the interpreter is this one (torch installed). Prints every run's seconds, the median per
checkout and the ratio after / before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEMO = "from miniverl.cli.main import main; main()"


def run_demo(repo: Path, scratch: Path, fast: bool) -> tuple[float, dict[str, object]]:
    """One demo of ``repo`` in a fresh subprocess: (wall seconds, held-out figures and losses)."""
    out = scratch / "run"
    env = {
        **os.environ,
        "PYTHONPATH": str(repo / "src"),
        "MINIVERL_CACHE_DIR": str(scratch / "cache"),
    }
    cmd = [
        sys.executable,
        "-c",
        DEMO,
        "demo",
        *(["--fast"] if fast else []),
        "--quiet",
        "--no-report",
    ]
    started = time.perf_counter()
    subprocess.run([*cmd, "--output", str(out)], env=env, check=True, cwd=scratch)
    seconds = time.perf_counter() - started
    figures: dict[str, object] = {}
    losses = []
    for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") == "eval":
            key = f"{record.get('tag')}/{record.get('split')}"
            figures[key] = (record["solved"], record["tasks"])
        elif record.get("kind") == "step":
            losses.append(record["loss"])
    figures["step losses (sha256 of their repr)"] = hashlib.sha256(
        repr(losses).encode()
    ).hexdigest()[:16]
    return seconds, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="the full demo instead of --fast")
    parser.add_argument(
        "--keep", type=Path, help="copy each run directory to KEEP/<before|after>-<i> to compare"
    )
    args = parser.parse_args()
    repos = {"before": args.before.resolve(), "after": args.after.resolve()}
    times: dict[str, list[float]] = {"before": [], "after": []}
    figures: dict[str, dict[str, object]] = {}
    order = ["before", "after"]
    for i in range(args.repeats):
        for name in order if i % 2 == 0 else order[::-1]:
            with tempfile.TemporaryDirectory(prefix=f"demo-ab-{name}-") as scratch:
                seconds, figs = run_demo(repos[name], Path(scratch), fast=not args.full)
                if args.keep is not None:
                    shutil.copytree(Path(scratch) / "run", args.keep / f"{name}-{i + 1}")
            times[name].append(seconds)
            if figures.setdefault(name, figs) != figs:
                print(f"{name}: held-out figures changed between repeats: {figs}")
            print(f"{name:6s} run {i + 1}: {seconds:7.2f} s  {figs}")
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"median before {medians['before']:.2f} s, after {medians['after']:.2f} s")
    print(f"ratio after / before: {medians['after'] / medians['before']:.3f}")
    print(
        "held-out figures identical:",
        "yes" if figures["before"] == figures["after"] else f"NO {figures}",
    )


if __name__ == "__main__":
    main()
