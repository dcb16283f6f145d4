"""The ``calculator`` environment: arithmetic tasks, a safe calculator tool, exact checks.

The tool parses expressions with :mod:`ast` and walks an allow-list of node types; it
never calls ``eval``. Size and time are bounded *before* any arithmetic runs: a
``9**9**9`` or a 10,000-digit literal is an error result returned to the model, not a
hang or a crash.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
import time
from decimal import Decimal, InvalidOperation
from typing import Any

from miniverl.environments.base import (
    Difficulty,
    OracleSolution,
    Task,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    ToolSpec,
    oracle_from_task,
)
from miniverl.errors import ToolEnvironmentError
from miniverl.schemas.text import (
    FINAL_CLOSE,
    FINAL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_PROTOCOL_HINT,
    TOOL_RESULT_OPEN,
)
from miniverl.schemas.trajectory import VerificationRecord

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 64
MAX_DEPTH = 16
MAX_LITERAL_DIGITS = 18
MAX_ABS_RESULT = 10**30
MAX_EXPONENT = 64
TIME_BUDGET_S = 0.05


class CalculatorError(ValueError):
    """A model-readable reason an expression was refused."""


_BINOPS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Any] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _check_magnitude(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if abs(value) > MAX_ABS_RESULT:
        raise CalculatorError(f"result exceeds {MAX_ABS_RESULT:.0e} in magnitude")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if isinstance(exponent, float) and not exponent.is_integer():
        raise CalculatorError("only integer exponents are supported")
    exponent = int(exponent)
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent} is too large (limit {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    if base != 0 and exponent * math.log10(abs(base)) > math.log10(MAX_ABS_RESULT):
        raise CalculatorError(f"result exceeds {MAX_ABS_RESULT:.0e} in magnitude")
    return base**exponent


def safe_evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression, or raise :class:`CalculatorError`.

    Allowed: integer and decimal literals, ``+ - * / // % **``, unary ``+``/``-`` and
    parentheses. Everything else (names, calls, attributes, strings, comparisons) is
    refused by the node allow-list.
    """
    if not isinstance(expression, str):
        raise CalculatorError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression is too long ({len(expression)} characters, limit {MAX_EXPRESSION_CHARS})"
        )
    if not expression.strip():
        raise CalculatorError("expression is empty")
    if expression.count("(") > MAX_DEPTH:
        raise CalculatorError(f"expression is nested too deeply (limit {MAX_DEPTH})")
    for literal in re.findall(r"\d+", expression):
        if len(literal) > MAX_LITERAL_DIGITS:
            raise CalculatorError(
                f"number with {len(literal)} digits is too long (limit {MAX_LITERAL_DIGITS})"
            )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"could not parse expression: {type(exc).__name__}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CalculatorError(f"expression has too many parts ({nodes}, limit {MAX_NODES})")
    deadline = time.monotonic() + TIME_BUDGET_S

    def walk(node: ast.AST, depth: int) -> int | float:
        if depth > MAX_DEPTH:
            raise CalculatorError(f"expression is nested too deeply (limit {MAX_DEPTH})")
        if time.monotonic() > deadline:
            raise CalculatorError("expression took too long to evaluate")
        if isinstance(node, ast.Expression):
            return walk(node.body, depth + 1)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return _check_magnitude(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand, depth + 1))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left = walk(node.left, depth + 1)
            right = walk(node.right, depth + 1)
            if isinstance(node.op, ast.Pow):
                return _check_magnitude(_power(left, right))
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
                raise CalculatorError("division by zero")
            return _check_magnitude(_BINOPS[type(node.op)](left, right))
        raise CalculatorError(
            f"unsupported syntax: {type(node).__name__}; use numbers and + - * / // % ** ( )"
        )

    try:
        return walk(tree, 0)
    except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError(f"arithmetic error: {type(exc).__name__}") from None


def format_number(value: int | float) -> str:
    """Integers print exactly; floats that are integral print as integers; others to 10 sig. digits."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


def normalize_answer(text: str) -> Decimal | None:
    """Parse a numeric answer; commas and surrounding whitespace are ignored."""
    cleaned = text.strip().replace(",", "").replace(" ", "")
    if not cleaned or len(cleaned) > 64:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def verify_number(expected: str, answer: str) -> VerificationRecord:
    """Exact numeric verification: ``answer`` parses (commas ignored) and equals ``expected``."""
    if not answer.strip():
        return VerificationRecord(
            solved=False,
            reward=0.0,
            predicted=answer,
            expected=expected,
            failure_category="empty_answer",
        )
    value = normalize_answer(answer)
    if value is None:
        return VerificationRecord(
            solved=False,
            reward=0.0,
            predicted=answer,
            expected=expected,
            failure_category="unparseable_answer",
            detail="the final answer is not a number",
        )
    solved = value == Decimal(expected)
    return VerificationRecord(
        solved=solved,
        reward=1.0 if solved else 0.0,
        predicted=answer.strip(),
        expected=expected,
        failure_category="solved" if solved else "wrong_answer",
    )


_OPS = ("+", "-", "*")

_SYSTEM_PROMPTS = {
    "compact": (
        "Use tools to solve the task.\n"
        "- calculator(expression): evaluate arithmetic.\n"
        f"{TOOL_PROTOCOL_HINT}"
    ),
    "verbose": (
        "You are a careful assistant that solves arithmetic tasks with tools.\n"
        "Available tools:\n"
        "- calculator(expression): evaluates an arithmetic expression with + - * / // % ** and parentheses.\n"
        f'To call a tool, write {TOOL_CALL_OPEN}{{"arguments": {{"expression": "..."}}, "name": "calculator"}}'
        f"{TOOL_CALL_CLOSE} and wait for the {TOOL_RESULT_OPEN}.\n"
        f"When you know the answer, write it as a number inside {FINAL_OPEN}...{FINAL_CLOSE}."
    ),
}


def calculator_expression(call: ToolCall, state: str) -> str | ToolResult:
    """The ``expression`` of a well-formed ``calculator`` call, or the tool error to return.

    Shared by every environment whose only tool is ``calculator`` (``calculator``,
    ``calc_chain``), so a malformed call reads the same everywhere.
    """
    if call.name != "calculator":
        return ToolResult(
            ok=False,
            error=f"unknown tool {call.name!r}; available: calculator",
            env_state_id=state,
        )
    extra = set(call.arguments) - {"expression"}
    if extra:
        return ToolResult(
            ok=False,
            error=f"unexpected argument(s) {sorted(extra)}; calculator takes 'expression'",
            env_state_id=state,
        )
    expression = call.arguments.get("expression")
    if not isinstance(expression, str):
        return ToolResult(
            ok=False, error="missing string argument 'expression'", env_state_id=state
        )
    return expression


class CalculatorEnvironment(ToolEnvironment):
    """Arithmetic tasks of three difficulties, solved with a safe calculator tool.

    - easy: ``Compute a op b`` with one-digit operands (one tool call);
    - medium: ``Compute (a op b) op c`` with two-digit operands (one tool call);
    - hard: a two-step task needing two tool calls.
    """

    name = "calculator"
    task_prefix = "calc"
    supports_task_files = True

    def __init__(self, prompt_style: str = "compact") -> None:
        if prompt_style not in _SYSTEM_PROMPTS:
            raise ToolEnvironmentError(
                f"calculator: unknown prompt_style {prompt_style!r}; expected one of {sorted(_SYSTEM_PROMPTS)}"
            )
        self.prompt_style = prompt_style
        self._steps = 0
        self._task: Task | None = None

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name="calculator",
                description="evaluate an arithmetic expression",
                parameters={"expression": "string, e.g. '(3 + 4) * 2'"},
            )
        ]

    def system_prompt(self) -> str:
        return _SYSTEM_PROMPTS[self.prompt_style]

    def sample_task(
        self, rng: random.Random, difficulty: Difficulty
    ) -> tuple[str, str, dict[str, Any]]:
        if difficulty == "easy":
            a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice(_OPS)
            expression = f"{a} {op} {b}"
            return (
                f"Compute {expression} and report the value.",
                format_number(safe_evaluate(expression)),
                {"expressions": [expression]},
            )
        if difficulty == "medium":
            a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 20)
            op1, op2 = rng.choice(_OPS), rng.choice(_OPS)
            expression = f"({a} {op1} {b}) {op2} {c}"
            return (
                f"Compute {expression} and report the value.",
                format_number(safe_evaluate(expression)),
                {"expressions": [expression]},
            )
        if difficulty == "hard":
            a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
            op = rng.choice(_OPS)
            first = f"{a} {op} {b}"
            intermediate = format_number(safe_evaluate(first))
            second = f"{intermediate} * {c}"
            answer = format_number(safe_evaluate(second))
            prompt = f"Compute {first}, then multiply the result by {c}. Report the final value."
            return prompt, answer, {"expressions": [first, second]}
        raise ToolEnvironmentError(f"calculator: unknown difficulty {difficulty!r}")

    def distinct_tasks(self, difficulty: Difficulty) -> int | None:
        """easy: 9 * 9 operand pairs * 3 operators = 243 prompts; medium and hard run to
        millions, treated as unbounded."""
        return 9 * 9 * len(_OPS) if difficulty == "easy" else None

    def reset(self, task: Task) -> None:
        self._task = task
        self._steps = 0

    def step(self, call: ToolCall) -> ToolResult:
        self._steps += 1
        state = f"calc:{self._steps}"
        expression = calculator_expression(call, state)
        if isinstance(expression, ToolResult):
            return expression
        try:
            value = safe_evaluate(expression)
        except CalculatorError as exc:
            return ToolResult(ok=False, error=str(exc), env_state_id=state)
        return ToolResult(ok=True, result=format_number(value), env_state_id=state)

    def verify(self, task: Task, answer: str) -> VerificationRecord:
        return verify_number(task.answer, answer)

    def oracle_solution(self, task: Task) -> OracleSolution:
        from_file = oracle_from_task(task)
        if from_file is not None:
            return from_file
        expressions = task.data.get("expressions")
        if not expressions:
            raise ToolEnvironmentError(
                f"task {task.task_id} has no oracle expressions (and no 'oracle' in its task file)"
            )
        calls = tuple(ToolCall("calculator", {"expression": e}) for e in expressions)
        return OracleSolution(tool_calls=calls, final_answer=task.answer)

    def privileged_context(self, task: Task) -> str:
        expressions = task.data.get("expressions") or []
        if not expressions:
            return super().privileged_context(task)
        steps = " then ".join(f"calculator({e!r})" for e in expressions)
        return f"Reference solution (hidden from the student): call {steps}; the answer is {task.answer}."
