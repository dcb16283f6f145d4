"""Progress bars with ETA for the long phases, silent when quiet or not on a terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

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
                TextColumn("{task.fields[stats]}"),
                console=console,
                transient=True,
            )

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[..., None]]:
        """Yield ``advance(n=1, stats=None)`` for a phase of ``total`` units.

        ``stats`` replaces the text after the bar (e.g. loss, KL and success so far).
        """
        if self._progress is None:
            yield lambda n=1, stats=None: None
            return
        started = not self._progress.live.is_started
        if started:
            self._progress.start()
        progress = self._progress
        task_id = progress.add_task(description, total=total, stats="")

        def advance(n: int = 1, stats: str | None = None) -> None:
            if stats is not None:
                progress.update(task_id, stats=stats)
            progress.advance(task_id, n)

        try:
            yield advance
        finally:
            self._progress.remove_task(task_id)
            if started:
                self._progress.stop()
