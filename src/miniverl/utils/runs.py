"""Every run-directory path, defined once (docs/design.md §5).

Nothing else in miniverl spells a run-directory file name; it asks :class:`RunPaths`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from miniverl.errors import RunDirectoryError

_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class InvalidNameError(RunDirectoryError, ValueError):
    """A checkpoint name or eval tag that is not one safe path component.

    Also a ``ValueError`` for callers that predate the typed error.
    """

    default_hint = "use 1-64 letters, digits, '_', '.', '-', starting with a letter or digit"


@dataclass(frozen=True)
class RunPaths:
    """Paths inside one run directory. ``root`` may not exist yet."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config_submitted(self) -> Path:
        return self.root / "config.submitted.yaml"

    @property
    def config_validated(self) -> Path:
        return self.root / "config.validated.yaml"

    @property
    def config_original(self) -> Path:
        return self.root / "config.original.yaml"

    @property
    def config_resolved(self) -> Path:
        return self.root / "config.resolved.yaml"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def environment(self) -> Path:
        return self.root / "environment.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories.jsonl"

    @property
    def eval_trajectories(self) -> Path:
        return self.root / "eval_trajectories.jsonl"

    @property
    def token_analysis(self) -> Path:
        return self.root / "token_analysis.jsonl"

    @property
    def teacher_cache(self) -> Path:
        return self.root / "teacher-cache"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, name: str) -> Path:
        if not _TAG_RE.match(name):
            raise InvalidNameError(f"invalid checkpoint name {name!r}")
        return self.checkpoints / name

    @property
    def final_checkpoint(self) -> Path:
        return self.checkpoint("final")

    @property
    def eval_json(self) -> Path:
        return self.root / "eval.json"

    def eval_tag_json(self, tag: str) -> Path:
        if not _TAG_RE.match(tag):
            raise InvalidNameError(f"invalid eval tag {tag!r}: use letters, digits, '_', '.', '-'")
        return self.root / f"eval.{tag}.json"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def summary_md(self) -> Path:
        return self.root / "summary.md"

    @property
    def benchmark_json(self) -> Path:
        return self.root / "benchmark.json"

    @property
    def comparison_json(self) -> Path:
        """``miniverl demo``'s side-by-side record of its arms, in its ``opd`` run."""
        return self.root / "comparison.json"

    @property
    def cold_start(self) -> Path:
        """Benchmark only: the shared SFT cold-start weights of one seed."""
        return self.root / "cold-start"
