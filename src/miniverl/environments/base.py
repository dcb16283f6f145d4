"""The tool-environment contract and deterministic task splits.

An environment supplies tool specs for the system prompt, executes tool calls
(returning a result or a *model-readable* error, never raising for a bad call), and
verifies a final answer exactly. There is no LLM judge anywhere.
"""

from __future__ import annotations

import abc
import json
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from miniverl.errors import ConfigError, ToolEnvironmentError
from miniverl.schemas.trajectory import VerificationRecord

Difficulty = Literal["easy", "medium", "hard"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")
SPLITS = ("train", "eval", "test")


@dataclass(frozen=True)
class ToolSpec:
    """One tool as described to the model in the system prompt."""

    name: str
    description: str
    parameters: dict[str, str]

    def signature(self) -> str:
        return f"{self.name}({', '.join(self.parameters)})"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def signature(self) -> str:
        """Canonical identity used by the repeated-call limit."""
        return json.dumps(
            {"name": self.name, "arguments": self.arguments}, sort_keys=True, default=str
        )


@dataclass(frozen=True)
class ToolResult:
    """What the environment returns for a call; ``ok=False`` carries a readable error."""

    ok: bool
    result: str = ""
    error: str | None = None
    env_state_id: str | None = None

    def observation_text(self) -> str:
        """The JSON the model reads inside ``<tool_result>``."""
        payload: dict[str, Any] = {"ok": self.ok}
        if self.ok:
            payload["result"] = self.result
        else:
            payload["error"] = self.error or "error"
        return json.dumps(payload)


@dataclass(frozen=True)
class OracleSolution:
    """A reference solution: the tool calls to make, then the final answer."""

    tool_calls: tuple[ToolCall, ...]
    final_answer: str


@dataclass(frozen=True)
class Task:
    """One task of a split. ``answer`` is what ``verify`` compares against."""

    task_id: str
    prompt: str
    answer: str
    difficulty: Difficulty
    split: str = "train"
    data: Mapping[str, Any] = field(default_factory=dict)


class ToolEnvironment(abc.ABC):
    """Base class of every environment. One episode at a time: ``reset`` then ``step``."""

    name: str = ""
    task_prefix: str = ""
    """Task ids are ``<task_prefix or name>-<split>-<i>``."""
    supports_task_files: bool = False
    """True when ``verify`` needs only ``task.answer`` and ``oracle_solution`` honours
    :func:`oracle_from_task`, so tasks may come from an ``environment.tasks`` JSONL file."""
    owns_splits: bool = False
    """True when :meth:`draw_tasks` generates every split (and extra pool) itself instead of
    :func:`make_splits` drawing from :meth:`sample_task` and dealing the draws in order."""

    @abc.abstractmethod
    def tool_specs(self) -> list[ToolSpec]: ...

    @abc.abstractmethod
    def system_prompt(self) -> str:
        """Instructions and tool specs, without chat markers."""

    @abc.abstractmethod
    def sample_task(
        self, rng: random.Random, difficulty: Difficulty
    ) -> tuple[str, str, dict[str, Any]]:
        """(prompt, answer, data) of one random task; used by :func:`make_splits`."""

    @abc.abstractmethod
    def reset(self, task: Task) -> None:
        """Start an episode on ``task``."""

    @abc.abstractmethod
    def step(self, call: ToolCall) -> ToolResult:
        """Execute one call. Bad calls return ``ok=False`` with a readable error."""

    def parse_error(self, message: str) -> ToolResult:
        """The observation for an assistant block the protocol could not parse (``message`` is
        the parser's sentence). An environment may add what the policy should do next."""
        return ToolResult(ok=False, error=message)

    @abc.abstractmethod
    def verify(self, task: Task, answer: str) -> VerificationRecord:
        """Exact verification of a final answer, with a failure category."""

    @abc.abstractmethod
    def oracle_solution(self, task: Task) -> OracleSolution: ...

    def draw_tasks(
        self,
        split: str,
        count: int,
        seed: int,
        difficulty: Difficulty | Literal["mixed"],
        exclude: Collection[str] = (),
    ) -> list[Task]:
        """``count`` tasks of ``split`` whose prompts are not in ``exclude`` (``owns_splits`` only)."""
        raise ToolEnvironmentError(f"environment {self.name!r} does not generate its own splits")

    def distinct_tasks(self, difficulty: Difficulty) -> int | None:
        """How many distinct prompts :meth:`sample_task` can produce at ``difficulty``.

        ``None`` (the default) means unknown or practically unbounded. A known count lets
        :func:`make_splits` refuse a request the pool cannot meet before drawing anything.
        """
        return None

    def turn_budget(self, task: Task) -> int | None:
        """Most assistant turns an episode of ``task`` may take; None leaves it to ``rollout.max_turns``."""
        return None

    def max_turn_budget(self) -> int | None:
        """The largest :meth:`turn_budget` of any task; ``rollout.max_turns`` must reach it."""
        return None

    def privileged_context(self, task: Task) -> str:
        """Oracle hint shown only to a privileged-context teacher."""
        oracle = self.oracle_solution(task)
        calls = "; ".join(f"{c.name} {c.arguments}" for c in oracle.tool_calls)
        return f"Reference solution: {calls}. The answer is {oracle.final_answer}."

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "tools": [s.signature() for s in self.tool_specs()]}


def oracle_from_task(task: Task) -> OracleSolution | None:
    """The oracle a task file gave this task (``task.data["oracle"]``), or None.

    Task files are validated by :mod:`miniverl.environments.tasks_file`, so the shape is
    known here: ``{"tool_calls": [{"name": str, "arguments": {...}}, ...], "final_answer": str}``.
    """
    oracle = task.data.get("oracle")
    if not oracle:
        return None
    calls = tuple(
        ToolCall(str(c["name"]), dict(c.get("arguments") or {})) for c in oracle["tool_calls"]
    )
    return OracleSolution(tool_calls=calls, final_answer=str(oracle["final_answer"]))


def check_turn_budget(env: ToolEnvironment, max_turns: int) -> None:
    """Refuse a ``rollout.max_turns`` that would cut the environment's longest turn budget short."""
    needed = env.max_turn_budget()
    if needed is not None and max_turns < needed:
        raise ConfigError(
            f"rollout.max_turns={max_turns} is below the {needed} turns "
            f"environment {env.name!r} allows its longest tasks",
            hint=f"set rollout.max_turns: {needed}",
        )


def _draw_distinct(
    env: ToolEnvironment,
    total: int,
    rng: random.Random,
    difficulty: Difficulty | Literal["mixed"],
    exclude: set[str],
) -> list[tuple[str, str, dict[str, Any], Difficulty]]:
    """``total`` tasks with distinct prompts, none of them in ``exclude``.

    A request larger than the environment's known pool (:meth:`ToolEnvironment.distinct_tasks`)
    is refused before any draw. Otherwise drawing stops once ``20 * distinct-so-far + 1000``
    draws in a row repeat a prompt: if even one unseen prompt were left, that run of misses
    would have probability below e**-20, so the pool is exhausted and waiting longer only
    burns CPU (a retry budget proportional to ``total`` took minutes at 100,000 tasks).
    """
    _check_pool(env, total, difficulty, len(exclude))
    seen = set(exclude)
    drawn: list[tuple[str, str, dict[str, Any], Difficulty]] = []
    misses = 0
    while len(drawn) < total:
        if misses > 20 * len(seen) + 1000:
            raise ToolEnvironmentError(
                f"could only draw {len(drawn)} distinct {difficulty} tasks of {total} requested",
                hint="request fewer tasks or a harder difficulty (more distinct tasks)",
            )
        level: Difficulty = DIFFICULTIES[len(drawn) % 3] if difficulty == "mixed" else difficulty
        prompt, answer, data = env.sample_task(rng, level)
        if prompt in seen:
            misses += 1
            continue
        misses = 0
        seen.add(prompt)
        drawn.append((prompt, answer, data, level))
    return drawn


def _check_pool(
    env: ToolEnvironment,
    total: int,
    difficulty: Difficulty | Literal["mixed"],
    excluded: int,
) -> None:
    """Refuse ``total`` distinct tasks when the environment's pool is known to hold fewer.

    ``excluded`` prompts (other splits, held out) are assumed to come from the same pool.
    "mixed" deals easy, medium, hard in turn, so each level must cover its share.
    """
    levels = DIFFICULTIES if difficulty == "mixed" else (difficulty,)
    sizes = {level: env.distinct_tasks(level) for level in levels}
    if any(size is None for size in sizes.values()):
        return
    need = {level: len(range(i, total, len(levels))) for i, level in enumerate(levels)}
    available = sum(int(size or 0) for size in sizes.values()) - excluded
    short = [lvl for lvl in levels if need[lvl] > int(sizes[lvl] or 0)]
    if short or total > available:
        pool = " + ".join(f"{sizes[lvl]} {lvl}" for lvl in levels)
        raise ToolEnvironmentError(
            f"environment {env.name!r} can generate only {pool} distinct tasks"
            + (f" ({excluded} already used by other splits)" if excluded else "")
            + f"; {total} were requested",
            hint="lower environment.train_tasks / eval_tasks / test_tasks, or choose "
            "environment.difficulty: medium or hard (more distinct tasks)",
        )


def sample_extra_tasks(
    env: ToolEnvironment,
    count: int,
    seed: int,
    difficulty: Difficulty | Literal["mixed"],
    exclude: list[Task],
    split: str = "teacher_pool",
) -> list[Task]:
    """``count`` further tasks whose prompts appear in none of ``exclude``.

    Used for the toy teacher's fitting pool, so held-out tasks stay held out from the
    teacher too.
    """
    if env.owns_splits:
        return env.draw_tasks(split, count, seed, difficulty, {t.prompt for t in exclude})
    drawn = _draw_distinct(
        env, count, random.Random(seed), difficulty, exclude={t.prompt for t in exclude}
    )
    prefix = env.task_prefix or env.name
    return [
        Task(
            task_id=f"{prefix}-{split}-{i}", prompt=p, answer=a, difficulty=lvl, split=split, data=d
        )
        for i, (p, a, d, lvl) in enumerate(drawn)
    ]


def make_splits(
    env: ToolEnvironment,
    counts: Mapping[str, int],
    seed: int,
    difficulty: Difficulty | Literal["mixed"] = "easy",
) -> dict[str, list[Task]]:
    """Deterministic, disjoint ``train`` / ``eval`` / ``test`` splits.

    Tasks are drawn from ``random.Random(seed)`` and deduplicated by prompt before being
    dealt to the splits in order, so the same arguments give the same splits everywhere
    and no prompt appears in two splits. An environment with ``owns_splits`` generates
    each split itself with :meth:`ToolEnvironment.draw_tasks` (calc_chain: by chain length).
    """
    unknown = set(counts) - set(SPLITS)
    if unknown:
        raise ToolEnvironmentError(
            f"unknown split name(s) {sorted(unknown)}; expected {list(SPLITS)}"
        )
    if difficulty != "mixed" and difficulty not in DIFFICULTIES:
        raise ToolEnvironmentError(
            f"unknown difficulty {difficulty!r}; expected one of {[*DIFFICULTIES, 'mixed']}"
        )
    if any(int(n) < 0 for n in counts.values()):
        raise ToolEnvironmentError("split counts must be non-negative")
    if env.owns_splits:
        return {s: env.draw_tasks(s, int(counts.get(s, 0)), seed, difficulty) for s in SPLITS}
    total = sum(int(counts.get(s, 0)) for s in SPLITS)
    drawn = _draw_distinct(env, total, random.Random(seed), difficulty, exclude=set())
    splits: dict[str, list[Task]] = {}
    prefix = env.task_prefix or env.name
    cursor = 0
    for split in SPLITS:
        n = int(counts.get(split, 0))
        splits[split] = [
            Task(
                task_id=f"{prefix}-{split}-{i}",
                prompt=p,
                answer=a,
                difficulty=lvl,
                split=split,
                data=d,
            )
            for i, (p, a, d, lvl) in enumerate(drawn[cursor : cursor + n])
        ]
        cursor += n
    return splits
