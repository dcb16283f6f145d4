"""Task files (``environment.tasks: tasks.jsonl``) and the one place splits are built.

One JSON object per line (blank lines are skipped)::

    {"prompt": "Compute 3 + 4 and report the value.", "answer": "7",
     "oracle": {"tool_calls": [{"name": "calculator", "arguments": {"expression": "3 + 4"}}],
                "final_answer": "7"},
     "difficulty": "easy", "data": {}}

``prompt`` and ``answer`` are required strings; ``oracle`` (needed for the SFT warm-up,
``offline_kd`` and fitting a toy teacher), ``difficulty`` (default ``easy``; only a label
in reports) and ``data`` (passed to the environment in ``Task.data``) are optional; any
other key is an error. Every problem is reported as ``path:line: field: message``, all of
them at once, before anything is built. The tasks are shuffled with
``random.Random(environment.split_seed)`` and dealt in order to ``train``, ``eval`` and
``test`` with the configured counts, so splits are deterministic and disjoint.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miniverl.config.models import EnvironmentConfig
from miniverl.environments.base import SPLITS, Task, ToolEnvironment, check_turn_budget, make_splits
from miniverl.errors import ConfigError, ToolEnvironmentError
from miniverl.utils.hashing import sha256_bytes, sha256_file

MAX_TASK_FILE_BYTES = 64 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _OracleCall(_Strict):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class _Oracle(_Strict):
    tool_calls: list[_OracleCall]
    final_answer: str


class TaskLine(_Strict):
    """The schema of one task-file line."""

    prompt: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    oracle: _Oracle | None = None
    difficulty: Literal["easy", "medium", "hard"] = "easy"
    data: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class LoadedTaskFile:
    path: Path
    sha256: str
    lines: list[tuple[int, TaskLine]]
    """(1-based line number, validated record), in file order."""


def _error_lines(path: Path, lineno: int, exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "<line>"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        out.append(f"{path}:{lineno}: {loc}: {msg}")
    return out


def load_task_file(path: str | Path) -> LoadedTaskFile:
    """Read and validate every line; raise one :class:`ConfigError` listing every problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"environment.tasks: task file not found: {path}",
            hint="relative paths are read from the working directory; pass an absolute path or cd first",
        )
    raw = path.read_bytes()
    if len(raw) > MAX_TASK_FILE_BYTES:
        raise ConfigError(f"{path}: task file exceeds {MAX_TASK_FILE_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from None
    problems: list[str] = []
    lines: list[tuple[int, TaskLine]] = []
    first_seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{lineno}: not valid JSON: {exc.msg} (column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            continue
        try:
            record = TaskLine.model_validate(obj)
        except ValidationError as exc:
            problems.extend(_error_lines(path, lineno, exc))
            continue
        if record.prompt in first_seen:
            problems.append(
                f"{path}:{lineno}: prompt: duplicate of line {first_seen[record.prompt]} "
                "(a prompt may appear once, so splits stay disjoint)"
            )
            continue
        first_seen[record.prompt] = lineno
        lines.append((lineno, record))
    if problems:
        shown = problems[:50]
        more = len(problems) - len(shown)
        raise ConfigError(
            f"{path}: {len(problems)} task-file error(s)\n"
            + "\n".join(f"  - {p}" for p in shown)
            + (f"\n  ... and {more} more" if more else ""),
            hint="each line needs 'prompt' and 'answer' strings; 'oracle', 'difficulty' and 'data' are optional (docs/environments.md)",
        )
    if not lines:
        raise ConfigError(f"{path}: the task file holds no tasks")
    return LoadedTaskFile(path=path, sha256=sha256_bytes(raw), lines=lines)


def task_file_splits(
    env: ToolEnvironment, loaded: LoadedTaskFile, counts: dict[str, int], seed: int
) -> dict[str, list[Task]]:
    """Deal the file's tasks, shuffled by ``seed``, to the splits in ``SPLITS`` order."""
    needed = sum(counts.get(s, 0) for s in SPLITS)
    if needed > len(loaded.lines):
        raise ConfigError(
            f"{loaded.path}: {len(loaded.lines)} task(s), but the splits need {needed} "
            f"(environment.train_tasks {counts.get('train', 0)} + eval_tasks {counts.get('eval', 0)} "
            f"+ test_tasks {counts.get('test', 0)})",
            hint="lower the split sizes or add tasks to the file",
        )
    order = list(range(len(loaded.lines)))
    random.Random(seed).shuffle(order)
    prefix = env.task_prefix or env.name
    splits: dict[str, list[Task]] = {}
    cursor = 0
    for split in SPLITS:
        chosen = order[cursor : cursor + counts.get(split, 0)]
        cursor += len(chosen)
        tasks = []
        for i, index in enumerate(chosen):
            lineno, rec = loaded.lines[index]
            data: dict[str, Any] = {**rec.data, "source": f"{loaded.path.name}:{lineno}"}
            if rec.oracle is not None:
                data["oracle"] = rec.oracle.model_dump()
            tasks.append(
                Task(
                    task_id=f"{prefix}-{split}-{i}",
                    prompt=rec.prompt,
                    answer=rec.answer,
                    difficulty=rec.difficulty,
                    split=split,
                    data=data,
                )
            )
        splits[split] = tasks
    return splits


def build_splits(env: ToolEnvironment, cfg: EnvironmentConfig) -> dict[str, list[Task]]:
    """The run's splits: dealt from ``cfg.tasks`` when set, otherwise sampled by the environment."""
    counts = {"train": cfg.train_tasks, "eval": cfg.eval_tasks, "test": cfg.test_tasks}
    if cfg.tasks is None:
        return make_splits(env, counts, cfg.split_seed, cfg.difficulty)
    if not getattr(env, "supports_task_files", False):
        raise ToolEnvironmentError(
            f"environment {env.name!r} does not support environment.tasks",
            hint="set supports_task_files = True on an environment whose verify() uses only task.answer "
            "and whose oracle_solution() honours oracle_from_task() (docs/environments.md)",
        )
    return task_file_splits(env, load_task_file(cfg.tasks), counts, cfg.split_seed)


def task_file_digest(path: str | None) -> str | None:
    """SHA-256 of a task file (recorded in the manifest), or None without one."""
    if path is None:
        return None
    return sha256_file(path)


def check_environment(cfg: EnvironmentConfig, max_turns: int | None = None) -> str:
    """Resolve ``cfg.name``, build it and its splits (what ``miniverl validate`` checks).

    With ``max_turns`` (``rollout.max_turns``) it is also checked against the environment's
    turn budget. Returns a one-line description; raises the typed error ``train`` would
    raise later.
    """
    from miniverl.environments.registry import make_environment

    env = make_environment(cfg.name, **cfg.params)
    if max_turns is not None:
        check_turn_budget(env, max_turns)
    splits = build_splits(env, cfg)
    sizes = ", ".join(f"{k} {len(v)}" for k, v in splits.items())
    source = f"task file {cfg.tasks}" if cfg.tasks else f"sampled ({cfg.difficulty})"
    return (
        f"environment {cfg.name} -> {type(env).__module__}.{type(env).__qualname__}: "
        f"tools {[s.signature() for s in env.tool_specs()]}; tasks {source}: {sizes}"
    )
