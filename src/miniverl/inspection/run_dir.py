"""THE run-directory reader: every consumer of a finished (or interrupted) run reads here.

``miniverl report``, ``miniverl export``, the benchmark's per-arm measurements and the
re-evaluation of a run all read ``manifest.json``, ``config.resolved.yaml``,
``metrics.jsonl``, ``events.jsonl``, ``eval.json`` / ``eval.<tag>.json`` and
``benchmark.json`` through these functions, so there is one answer to "what does a run
directory contain" and one set of tolerance rules:

- a missing optional file is empty (``[]``) or ``None``, never an error;
- an append-only log's final line without its newline is an interrupted append (see
  ``utils.io.append_jsonl``) and is ignored; a malformed *complete* line is corruption and
  raises :class:`~miniverl.errors.RunDirectoryError` naming the file and line, because a
  report must not quietly drop data (limits: ``utils.safe_load``);
- metrics and events lines are typed by :mod:`miniverl.schemas.records` (unknown keys
  kept, wrong-typed known fields refused with the field named).

Torch-free: only JSON/JSONL/YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniverl.errors import RunDirectoryError
from miniverl.schemas.records import (
    CycleRecord,
    EvalRecord,
    EventRecord,
    RunRecord,
    StepRecord,
    parse_event,
    parse_metric,
)
from miniverl.utils.io import read_json
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import iter_jsonl, load_yaml_file


def _present(path: Path) -> bool:
    """Exists in any form: a FIFO or dangling link is then refused by the loader, not skipped."""
    return path.exists() or path.is_symlink()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL artifact as plain objects; a missing file is empty.

    A final line without its newline is an interrupted append and is ignored; a malformed
    complete line raises :class:`RunDirectoryError`.
    """
    if not _present(path):
        return []
    return [record for _, record in iter_jsonl(path, allow_partial_tail=True)]


def read_metrics(path: Path) -> list[RunRecord]:
    """``metrics.jsonl`` as typed records (:class:`StepRecord`, :class:`CycleRecord`,
    :class:`EvalRecord`, or ``OtherMetricRecord`` for a kind this version does not know)."""
    if not _present(path):
        return []
    return [
        parse_metric(raw, f"{path}:{lineno}")
        for lineno, raw in iter_jsonl(path, allow_partial_tail=True)
    ]


def read_events(path: Path) -> list[EventRecord]:
    """``events.jsonl`` as :class:`EventRecord` s (any event name is kept)."""
    if not _present(path):
        return []
    return [
        parse_event(raw, f"{path}:{lineno}")
        for lineno, raw in iter_jsonl(path, allow_partial_tail=True)
    ]


def read_json_or_none(path: Path) -> Any:
    """A JSON object artifact, or ``None`` when the file is absent."""
    if not _present(path):
        return None
    return read_json(path)


def read_eval_summary(paths: RunPaths) -> dict[str, Any]:
    """``eval.json`` of a finished run; a missing file is a :class:`RunDirectoryError`."""
    return read_json(paths.eval_json)


def read_config(paths: RunPaths) -> tuple[dict[str, Any] | None, str | None]:
    """``config.resolved.yaml`` as (mapping, verbatim text); ``(None, None)`` when absent."""
    if not _present(paths.config_resolved):
        return None, None
    config = load_yaml_file(paths.config_resolved)
    if not isinstance(config, dict):
        raise RunDirectoryError(f"{paths.config_resolved} is not a mapping of config sections")
    return config, paths.config_resolved.read_text(encoding="utf-8")


def eval_tag_files(paths: RunPaths) -> dict[str, dict[str, Any]]:
    """``eval.<tag>.json`` files written by ``miniverl eval --run``, by tag (sorted by file name).

    A file whose tag is not a valid eval tag (``RunPaths.eval_tag_json``) is not one of ours
    and is skipped.
    """
    head, _, tail = paths.eval_tag_json("TAG").name.partition("TAG")
    found: dict[str, dict[str, Any]] = {}
    if not paths.root.is_dir():
        return found
    for candidate in sorted(paths.root.glob(f"{head}*{tail}")):
        tag = candidate.name[len(head) : len(candidate.name) - len(tail)]
        if not tag:
            continue
        try:
            expected = paths.eval_tag_json(tag)
        except ValueError:
            continue
        payload = read_json_or_none(expected)
        if isinstance(payload, dict):
            found[tag] = payload
    return found


@dataclass
class RunData:
    """Everything one directory holds; absent artifacts are empty/None."""

    paths: RunPaths
    manifest: dict[str, Any] | None
    eval_summary: dict[str, Any] | None
    eval_tags: dict[str, dict[str, Any]]
    steps: list[StepRecord]
    cycles: list[CycleRecord]
    evals: list[EvalRecord]
    events: list[EventRecord]
    token_rows: list[dict[str, Any]]
    benchmark: dict[str, Any] | None
    config_text: str | None
    config: dict[str, Any] | None
    comparison: dict[str, Any] | None = None
    """``comparison.json``: the demo's arms side by side (``cli/main.py`` ``demo``)."""

    @property
    def is_training_run(self) -> bool:
        return self.manifest is not None or bool(self.steps) or self.eval_summary is not None

    @property
    def run_id(self) -> str:
        if self.manifest and self.manifest.get("run_id"):
            return str(self.manifest["run_id"])
        return self.paths.root.resolve().name

    def config_value(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def require_directory(run_dir: str | Path) -> RunPaths:
    """:class:`RunPaths` of an existing directory, else :class:`RunDirectoryError`."""
    paths = RunPaths(run_dir)
    if not paths.root.is_dir():
        raise RunDirectoryError(
            f"{paths.root} is not a directory",
            hint="pass a run directory written by 'miniverl train' or 'miniverl benchmark'",
        )
    return paths


def load_run(run_dir: str | Path) -> RunData:
    """Read every artifact of ``run_dir``; a directory with neither a run nor a benchmark raises."""
    paths = require_directory(run_dir)
    metrics = read_metrics(paths.metrics)
    config, config_text = read_config(paths)
    data = RunData(
        paths=paths,
        manifest=read_json_or_none(paths.manifest),
        eval_summary=read_json_or_none(paths.eval_json),
        eval_tags=eval_tag_files(paths),
        steps=[r for r in metrics if isinstance(r, StepRecord)],
        cycles=[r for r in metrics if isinstance(r, CycleRecord)],
        evals=[r for r in metrics if isinstance(r, EvalRecord)],
        events=read_events(paths.events),
        token_rows=read_jsonl(paths.token_analysis),
        benchmark=read_json_or_none(paths.benchmark_json),
        config_text=config_text,
        config=config,
        comparison=read_json_or_none(paths.comparison_json),
    )
    if not data.is_training_run and data.benchmark is None:
        raise RunDirectoryError(
            f"{paths.root} holds neither a run ({paths.manifest.name}, {paths.metrics.name}) nor a {paths.benchmark_json.name}",
            hint="point 'miniverl report' at a directory written by 'miniverl train', 'miniverl demo' or 'miniverl benchmark'",
        )
    return data


__all__ = [
    "RunData",
    "eval_tag_files",
    "load_run",
    "read_config",
    "read_eval_summary",
    "read_events",
    "read_json_or_none",
    "read_jsonl",
    "read_metrics",
    "require_directory",
]
