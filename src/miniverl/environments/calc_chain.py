"""The ``calc_chain`` environment: k chained operations, one tool call each, recoverable errors.

A task reads "Start with x0. Then op1 y1, then op2 y2, ..., then opk yk. Report the final
value." with x0 and every add/subtract operand in 2..99, every multiplier in 2..9 and k in
1..6. The tool does ONE operation per call, so after the first call every call has to
start from the previous tool result: copying that number wrongly is an error that
propagates to the answer unless the policy notices and re-calls.

Errors are recoverable by construction, which is what makes on-policy training matter:

- the tool result echoes the evaluated expression (``"81 * 4 = 324"``), so a miscopied
  operand is visible in the context;
- an episode may take ``k + 1`` turns (k calls and the answer) plus ``spare_turns``
  (default 2) for retries; :meth:`CalcChainEnvironment.turn_budget` exposes the number and
  the rollout runner enforces it per task;
- a call the tool cannot do returns a readable error and the episode continues; a block
  the protocol cannot parse does too, up to ``rollout.max_parse_errors``.

**Checked** (``checked: true``): the tool knows the task and answers only the next step of
the chain. A malformed call, an unparseable block, a wrong operand and any call that is not
the next step (a repeat, a skipped step, a call once every step is done) are *flagged*: an
``ok: false`` observation whose message names the next step (``"wrong step: the next step
is 75 + 12"``) or says the answer is due, so the correct next action is always derivable
from the transcript. Oracle traces never see a flag; a student's own error is flagged at
once, which is the state a teacher's traces never show and on-policy distillation does.

Splits are owned by the environment (``owns_splits``): task ``i`` of a split is generated
from ``(seed, split, i)`` alone (plus rejection of prompts already drawn), with the chain
length ``k = ks[i % len(ks)]`` for the split's ``ks``. Disjointness does not depend on
the seed or on bookkeeping: every prompt belongs to exactly one *partition*
(:func:`partition_of`, a SHA-256 bucket of the prompt text: 80% train, 10% eval, 10%
test), and a split only accepts prompts of its own partition. The toy teacher's extra
pool (any other split name) draws from the train partition.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Collection, Sequence
from typing import Any, Literal

from miniverl.environments.base import (
    Difficulty,
    OracleSolution,
    Task,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    ToolSpec,
)
from miniverl.environments.calculator import calculator_expression, verify_number
from miniverl.errors import ToolEnvironmentError
from miniverl.schemas.text import TOOL_PROTOCOL_HINT
from miniverl.schemas.trajectory import VerificationRecord

OPERAND_RANGE = (2, 99)
"""Inclusive range of the start value and of every add/subtract operand."""
MULTIPLIER_RANGE = (2, 9)
"""Inclusive range of every multiplier."""
K_RANGE = (1, 6)
"""Inclusive range of chain lengths an environment may be configured with."""
OPS: dict[str, str] = {"add": "+", "subtract": "-", "multiply": "*"}
"""Operation word in the prompt -> operator in the tool call."""
SPARE_TURNS = 2
PARTITIONS: dict[str, tuple[int, int]] = {"train": (0, 80), "eval": (80, 90), "test": (90, 100)}
"""Split -> half-open range of :func:`partition_bucket` values (percent of the prompt space)."""
PARTITION_SALT = "miniverl/calc_chain/partition/v1"
MAX_ATTEMPTS_PER_TASK = 2000
MAX_OPERAND_DIGITS = 12

Step = tuple[str, int]
"""One operation: (``"add"`` | ``"subtract"`` | ``"multiply"``, operand)."""

_SYSTEM_PROMPT = (
    "Use tools to solve the task.\n"
    "- calculator(expression): one step a + b, a - b or a * b; the result repeats it.\n"
    "Start each step from the previous result.\n"
    f"{TOOL_PROTOCOL_HINT}"
)
_COMPACT_PROMPT = f"Solve it with calculator calls, one step each.\n{TOOL_PROTOCOL_HINT}"
_CHECKED_HINT = "A wrong step is refused, and the error names the next step.\n"
PROMPT_STYLES = ("full", "compact")
"""``full``: the tool described and the chaining rule stated; ``compact``: one line before the
block syntax (about half the tokens, for budgets where sequence length is the cost)."""
_CALL_PATTERN = re.compile(
    rf"^\s*([+-]?\d{{1,{MAX_OPERAND_DIGITS}}})\s*([-+*])\s*([+-]?\d{{1,{MAX_OPERAND_DIGITS}}})\s*$"
)
_PROMPT_PATTERN = re.compile(r"^Start with (\d+)\. Then (.+)\. Report the final value\.$")
_STEP_PATTERN = re.compile(r"^(add|subtract) (\d+)$|^multiply by (\d+)$")


# ---------------------------------------------------------------------- pure task algebra


def step_phrase(step: Step) -> str:
    """``("add", 23)`` -> ``"add 23"``; ``("multiply", 7)`` -> ``"multiply by 7"``."""
    op, operand = step
    return f"multiply by {operand}" if op == "multiply" else f"{op} {operand}"


def render_prompt(start: int, steps: Sequence[Step]) -> str:
    """The task text; injective in ``(start, steps)`` (see :func:`parse_prompt`)."""
    return f"Start with {start}. Then {', then '.join(step_phrase(s) for s in steps)}. Report the final value."


def parse_prompt(prompt: str) -> tuple[int, tuple[Step, ...]]:
    """Inverse of :func:`render_prompt`; raises ``ValueError`` for any other text."""
    match = _PROMPT_PATTERN.match(prompt)
    if match is None:
        raise ValueError(f"not a calc_chain prompt: {prompt!r}")
    steps: list[Step] = []
    for phrase in match.group(2).split(", then "):
        step = _STEP_PATTERN.match(phrase)
        if step is None:
            raise ValueError(f"not a calc_chain step: {phrase!r}")
        steps.append(
            (step.group(1), int(step.group(2)))
            if step.group(1)
            else ("multiply", int(step.group(3)))
        )
    return int(match.group(1)), tuple(steps)


def all_steps() -> list[Step]:
    """Every operation a chain can contain (98 adds, 98 subtracts, 8 multiplies)."""
    lo, hi = OPERAND_RANGE
    mlo, mhi = MULTIPLIER_RANGE
    return [
        *(("add", y) for y in range(lo, hi + 1)),
        *(("subtract", y) for y in range(lo, hi + 1)),
        *(("multiply", m) for m in range(mlo, mhi + 1)),
    ]


def prompt_space_size(k: int) -> int:
    """Distinct prompts of chain length ``k``: 98 start values x 204 operations per step."""
    return (OPERAND_RANGE[1] - OPERAND_RANGE[0] + 1) * len(all_steps()) ** k


def apply_step(value: int, step: Step) -> int:
    op, operand = step
    return {"add": value + operand, "subtract": value - operand, "multiply": value * operand}[op]


def expression_of(left: int, step: Step) -> str:
    """The canonical tool expression for applying ``step`` to ``left``."""
    return f"{left} {OPS[step[0]]} {step[1]}"


def solve_chain(start: int, steps: Sequence[Step]) -> tuple[list[str], list[int]]:
    """The oracle's tool expressions and the value after each step."""
    expressions: list[str] = []
    results: list[int] = []
    value = start
    for step in steps:
        expressions.append(expression_of(value, step))
        value = apply_step(value, step)
        results.append(value)
    return expressions, results


def draw_chain(rng: random.Random, k: int) -> tuple[int, tuple[Step, ...]]:
    """A uniformly random start value, then ``k`` steps with a uniformly random operation."""
    start = rng.randint(*OPERAND_RANGE)
    steps: list[Step] = []
    for _ in range(k):
        op = rng.choice(tuple(OPS))
        operand = rng.randint(*(MULTIPLIER_RANGE if op == "multiply" else OPERAND_RANGE))
        steps.append((op, operand))
    return start, tuple(steps)


def partition_bucket(prompt: str) -> int:
    """0..99 from the SHA-256 of the prompt: a fixed function of the text, independent of any seed."""
    digest = hashlib.sha256(f"{PARTITION_SALT}\n{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


def partition_of(prompt: str) -> str:
    """The one split (``train``, ``eval`` or ``test``) that may ever hold ``prompt``."""
    bucket = partition_bucket(prompt)
    return next(name for name, (lo, hi) in PARTITIONS.items() if lo <= bucket < hi)


def difficulty_of(k: int) -> Difficulty:
    """A report label only: k = 1 easy, 2..3 medium, 4..6 (beyond the training lengths) hard."""
    return "easy" if k == 1 else "medium" if k <= 3 else "hard"


def make_task(task_id: str, split: str, start: int, steps: Sequence[Step]) -> Task:
    expressions, results = solve_chain(start, steps)
    return Task(
        task_id=task_id,
        prompt=render_prompt(start, steps),
        answer=str(results[-1]),
        difficulty=difficulty_of(len(steps)),
        split=split,
        data={
            "k": len(steps),
            "start": start,
            "steps": [[op, operand] for op, operand in steps],
            "expressions": expressions,
            "results": results,
        },
    )


def generate_tasks(
    split: str,
    count: int,
    seed: int,
    ks: Sequence[int],
    *,
    exclude: Collection[str] = (),
    prefix: str = "chain",
) -> list[Task]:
    """Tasks ``0..count-1`` of ``split``: task ``i`` has ``k = ks[i % len(ks)]``.

    Task ``i`` draws chains from ``random.Random("calc_chain/<seed>/<split>/<i>")`` (string
    seeds hash with SHA-512, so ``PYTHONHASHSEED`` does not matter) until one lies in the
    split's partition and is new (not earlier in the split, not in ``exclude``). Task ``i``
    therefore never changes when more tasks are requested.
    """
    if count < 0:
        raise ToolEnvironmentError("split counts must be non-negative")
    partition = split if split in PARTITIONS else "train"
    seen = set(exclude)
    tasks: list[Task] = []
    for index in range(count):
        k = ks[index % len(ks)]
        rng = random.Random(f"calc_chain/{seed}/{split}/{index}")
        for _ in range(MAX_ATTEMPTS_PER_TASK):
            start, steps = draw_chain(rng, k)
            prompt = render_prompt(start, steps)
            if prompt not in seen and partition_of(prompt) == partition:
                break
        else:
            raise ToolEnvironmentError(
                f"calc_chain: no new {split} task of length k={k} in {MAX_ATTEMPTS_PER_TASK} draws "
                f"(task {index} of {count})",
                hint=f"request fewer tasks; k = 1 has only {prompt_space_size(1)} distinct prompts, "
                "about 10% of them in each held-out split",
            )
        seen.add(prompt)
        tasks.append(make_task(f"{prefix}-{split}-{index}", split, start, steps))
    return tasks


def _check_ks(name: str, ks: Any) -> tuple[int, ...]:
    values = tuple(ks) if isinstance(ks, list | tuple) else (ks,)
    lo, hi = K_RANGE
    if not values or any(type(k) is not int or not lo <= k <= hi for k in values):
        raise ToolEnvironmentError(
            f"calc_chain: {name} must be a non-empty list of chain lengths in {lo}..{hi}, got {ks!r}"
        )
    return values


# ---------------------------------------------------------------------- the environment


class CalcChainEnvironment(ToolEnvironment):
    """Chained arithmetic with a one-operation calculator; see the module docstring."""

    name = "calc_chain"
    task_prefix = "chain"
    owns_splits = True

    def __init__(
        self,
        train_k: Sequence[int] = (1, 2, 3),
        eval_k: Sequence[int] = (1, 2, 3),
        test_k: Sequence[int] = (1, 2, 3, 4, 5, 6),
        spare_turns: int = SPARE_TURNS,
        checked: bool = False,
        prompt_style: str = "full",
    ) -> None:
        self.split_ks: dict[str, tuple[int, ...]] = {
            "train": _check_ks("train_k", train_k),
            "eval": _check_ks("eval_k", eval_k),
            "test": _check_ks("test_k", test_k),
        }
        if type(spare_turns) is not int or spare_turns < 0:
            raise ToolEnvironmentError(
                f"calc_chain: spare_turns must be a non-negative integer, got {spare_turns!r}"
            )
        if not isinstance(checked, bool):
            raise ToolEnvironmentError(
                f"calc_chain: checked must be true or false, got {checked!r}"
            )
        if prompt_style not in PROMPT_STYLES:
            raise ToolEnvironmentError(
                f"calc_chain: prompt_style must be one of {', '.join(PROMPT_STYLES)}, "
                f"got {prompt_style!r}"
            )
        self.prompt_style = prompt_style
        self.spare_turns = spare_turns
        self.checked = checked
        self._steps = 0
        self._expected: list[str] = []
        self._done = 0

    def ks_of(self, split: str) -> tuple[int, ...]:
        """Chain lengths of ``split``; any split other than eval/test (the toy teacher's pool) uses train's."""
        return self.split_ks.get(split, self.split_ks["train"])

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name="calculator",
                description="one operation a + b, a - b or a * b on integers; echoes it with the value",
                parameters={"expression": "string, e.g. '80 * 4'"},
            )
        ]

    def system_prompt(self) -> str:
        prompt = _SYSTEM_PROMPT if self.prompt_style == "full" else _COMPACT_PROMPT
        if not self.checked:
            return prompt
        head, _, hint = prompt.partition(TOOL_PROTOCOL_HINT)
        return head + _CHECKED_HINT + TOOL_PROTOCOL_HINT + hint

    def sample_task(
        self, rng: random.Random, difficulty: Difficulty
    ) -> tuple[str, str, dict[str, Any]]:
        """One chain whose length matches :func:`difficulty_of`, ignoring partitions.

        Splits never use this (``owns_splits``); it exists for the ToolEnvironment contract.
        """
        lengths = [k for k in range(K_RANGE[0], K_RANGE[1] + 1) if difficulty_of(k) == difficulty]
        if not lengths:
            raise ToolEnvironmentError(f"calc_chain: unknown difficulty {difficulty!r}")
        start, steps = draw_chain(rng, rng.choice(lengths))
        task = make_task("sample", "train", start, steps)
        return task.prompt, task.answer, dict(task.data)

    def draw_tasks(
        self,
        split: str,
        count: int,
        seed: int,
        difficulty: Difficulty | Literal["mixed"],
        exclude: Collection[str] = (),
    ) -> list[Task]:
        if difficulty != "mixed":
            raise ToolEnvironmentError(
                f"calc_chain sets chain lengths per split, not a difficulty (got {difficulty!r})",
                hint="set environment.difficulty: mixed and choose lengths with environment.params "
                "train_k / eval_k / test_k",
            )
        return generate_tasks(
            split, count, seed, self.ks_of(split), exclude=exclude, prefix=self.task_prefix
        )

    def turn_budget(self, task: Task) -> int:
        """k tool calls, the answer, and ``spare_turns`` for retries."""
        return int(task.data["k"]) + 1 + self.spare_turns

    def max_turn_budget(self) -> int:
        return max(max(ks) for ks in self.split_ks.values()) + 1 + self.spare_turns

    def reset(self, task: Task) -> None:
        self._steps = 0
        self._expected = list(task.data.get("expressions") or []) if self.checked else []
        self._done = 0

    def next_step_message(self) -> str:
        """What a flagged error tells the policy: the next step of the chain, or that the
        answer is due (checked mode)."""
        if self._done < len(self._expected):
            return f"the next step is {self._expected[self._done]}"
        return "every step is done: give the final answer"

    def _flag(self, error: str, state: str | None) -> ToolResult:
        return ToolResult(
            ok=False, error=f"{error}; {self.next_step_message()}", env_state_id=state
        )

    def parse_error(self, message: str) -> ToolResult:
        """An unparseable block; checked mode names the next step too."""
        if not self.checked:
            return super().parse_error(message)
        return self._flag(message, None)

    def step(self, call: ToolCall) -> ToolResult:
        self._steps += 1
        state = f"chain:{self._steps}"
        expression = calculator_expression(call, state)
        if isinstance(expression, ToolResult):
            return self._flag(expression.error or "error", state) if self.checked else expression
        match = _CALL_PATTERN.match(expression)
        if match is None:
            shown = expression if len(expression) <= 40 else expression[:40] + "..."
            error = (
                f"one step per call: 'a + b', 'a - b' or 'a * b' with integers "
                f"(e.g. '80 * 4'), got {shown!r}"
            )
            if self.checked:
                return self._flag(error, state)
            return ToolResult(ok=False, error=error, env_state_id=state)
        left, symbol, right = int(match.group(1)), match.group(2), int(match.group(3))
        if self.checked:
            if self._done >= len(self._expected):
                return ToolResult(ok=False, error=self.next_step_message(), env_state_id=state)
            if f"{left} {symbol} {right}" != self._expected[self._done]:
                return self._flag("wrong step", state)
            self._done += 1
        value = {"+": left + right, "-": left - right, "*": left * right}[symbol]
        return ToolResult(ok=True, result=f"{left} {symbol} {right} = {value}", env_state_id=state)

    def verify(self, task: Task, answer: str) -> VerificationRecord:
        return verify_number(task.answer, answer)

    def oracle_solution(self, task: Task) -> OracleSolution:
        expressions = task.data.get("expressions")
        if not expressions:
            raise ToolEnvironmentError(f"task {task.task_id} has no oracle expressions")
        calls = tuple(ToolCall("calculator", {"expression": e}) for e in expressions)
        return OracleSolution(tool_calls=calls, final_answer=task.answer)

    def privileged_context(self, task: Task) -> str:
        expressions = task.data.get("expressions") or []
        steps = " then ".join(f"calculator({e!r})" for e in expressions)
        return f"Reference solution (hidden from the student): call {steps}; the answer is {task.answer}."

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "chain_lengths": {split: list(ks) for split, ks in self.split_ks.items()},
            "spare_turns": self.spare_turns,
            "max_turn_budget": self.max_turn_budget(),
            **({"checked": True} if self.checked else {}),
            **({"prompt_style": self.prompt_style} if self.prompt_style != "full" else {}),
        }
