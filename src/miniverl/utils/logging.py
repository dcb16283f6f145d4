"""Console output and the append-only ``events.jsonl`` lifecycle log.

There is no telemetry: events go to the console and to the run directory, nowhere else.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from miniverl.utils.io import append_jsonl


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


PER_CYCLE_EVENTS = frozenset({"rollouts_collected", "cycle_end", "offline_kd_reuse"})
"""Events written once per cycle: echoed only by a verbose run (``--verbose``); otherwise the
progress bar carries their loss, KL and rollouts solved, so a 400-cycle demo prints a bar, not
800 lines (``offline_kd_reuse``: every ``offline_kd`` cycle after the first, which builds the
teacher's pool and says so). They are written to ``events.jsonl`` either way."""

NOTICE_EVENTS = frozenset({"temperature_mismatch"})
"""Notices that ask for no action: the recipe is valid as it stands and the event only records
a choice (``temperature_mismatch``: sampling and loss temperatures differ on purpose). Echoed
only by a verbose run, so the first line of a default run is not a warning with nothing to
fix; written to ``events.jsonl`` either way."""

VERBOSE_ONLY_EVENTS = PER_CYCLE_EVENTS | NOTICE_EVENTS


class EventLog:
    """Appends one JSON object per lifecycle event (docs/design.md §5.3) and echoes it.

    ``console`` may be ``None`` for quiet runs; events are written either way. ``sync``
    (see ``utils.io.append_jsonl``): fsync each event; a training run clears it while it
    runs, because its ``DurableLogs`` fsyncs the log at every cycle end, checkpoint and run end.
    """

    def __init__(
        self,
        path: str | Path | None,
        console: Console | None = None,
        *,
        verbose: bool = True,
        sync: bool = True,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.console = console
        self.verbose = verbose
        self.sync = sync
        self.events: list[dict[str, Any]] = []

    def emit(self, event: str, *, echo: str | None = None, **fields: Any) -> dict[str, Any]:
        record = {
            "event": event,
            "time": utc_now(),
            "monotonic_s": round(time.monotonic(), 3),
            **fields,
        }
        self.events.append(record)
        if self.path is not None:
            append_jsonl(self.path, [record], sync=self.sync)
        if self.console is not None and echo and (self.verbose or event not in VERBOSE_ONLY_EVENTS):
            self.console.print(f"[bold cyan]{event}[/] {echo}")
        return record


class MetricsLog:
    """Append-only ``metrics.jsonl``: one object per optimizer step, cycle and eval.

    ``sync`` as for :class:`EventLog`: a training run defers the fsync to its durability points.
    """

    def __init__(self, path: str | Path | None, *, sync: bool = True) -> None:
        self.path = Path(path) if path is not None else None
        self.records: list[dict[str, Any]] = []
        self.sync = sync

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self.path is not None:
            append_jsonl(self.path, [record], sync=self.sync)


def make_console(quiet: bool = False) -> Console:
    """A rich console; quiet mode prints nothing (errors still go to stderr)."""
    return Console(quiet=quiet, highlight=False)
