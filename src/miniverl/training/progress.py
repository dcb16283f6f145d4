"""Progress bars with ETA for the long phases, silent when quiet or not on a terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ProgressReporter:
    """One rich ``Progress`` shared by every phase; a no-op when disabled."""

    def __init__(self, console: Console | None, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = console is not None and console.is_terminal and not console.quiet
        self.enabled = bool(enabled and console is not None)
        self._progress: Progress | None = None
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[callable]:
        """Yield an ``advance()`` callable for a phase of ``total`` units."""
        if self._progress is None:
            yield lambda n=1: None
            return
        started = not self._progress.live.is_started
        if started:
            self._progress.start()
        task_id = self._progress.add_task(description, total=total)
        try:
            yield lambda n=1: self._progress.advance(task_id, n)
        finally:
            self._progress.remove_task(task_id)
            if started:
                self._progress.stop()
