"""The ``calculator`` environment: splits, oracle, a safe bounded tool, exact verification."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest

from helpers import calculator, oracle_trajectory
from miniverl.environments.base import SPLITS, Task, ToolCall, ToolResult, make_splits
from miniverl.environments.calculator import (
    MAX_ABS_RESULT,
    CalculatorEnvironment,
    CalculatorError,
    format_number,
    normalize_answer,
    safe_evaluate,
)
from miniverl.errors import ToolEnvironmentError

# -- splits -----------------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard", "mixed"])
def test_make_splits_deterministic_and_disjoint(difficulty: str) -> None:
    env = calculator()
    counts = {"train": 12, "eval": 5, "test": 3}
    a = make_splits(env, counts, seed=11, difficulty=difficulty)
    b = make_splits(calculator(), counts, seed=11, difficulty=difficulty)
    assert a == b
    assert {k: len(v) for k, v in a.items()} == counts
    prompts = [t.prompt for split in SPLITS for t in a[split]]
    assert len(prompts) == len(set(prompts)) == 20
    for split in SPLITS:
        assert [t.task_id for t in a[split]] == [f"calc-{split}-{i}" for i in range(counts[split])]
        assert all(t.split == split for t in a[split])
    if difficulty == "mixed":
        assert {t.difficulty for split in SPLITS for t in a[split]} == {"easy", "medium", "hard"}
    else:
        assert {t.difficulty for split in SPLITS for t in a[split]} == {difficulty}
    assert make_splits(env, counts, seed=12, difficulty=difficulty) != a


def test_make_splits_missing_counts_are_empty() -> None:
    splits = make_splits(calculator(), {"train": 2}, seed=0)
    assert [len(splits[s]) for s in SPLITS] == [2, 0, 0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"counts": {"validation": 1}},
            "unknown split name(s) ['validation']; expected ['train', 'eval', 'test']",
        ),
        (
            {"counts": {"train": 1}, "difficulty": "extreme"},
            "unknown difficulty 'extreme'; expected one of ['easy', 'medium', 'hard', 'mixed']",
        ),
        ({"counts": {"train": -1}}, "split counts must be non-negative"),
    ],
)
def test_make_splits_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        make_splits(calculator(), seed=0, **kwargs)
    assert str(info.value) == message


def test_make_splits_reports_exhaustion() -> None:
    class Tiny(CalculatorEnvironment):
        def sample_task(self, rng, difficulty):  # type: ignore[no-untyped-def]
            a = rng.randint(1, 2)
            return f"Compute {a} + 0 and report the value.", str(a), {"expressions": [f"{a} + 0"]}

    with pytest.raises(ToolEnvironmentError) as info:
        make_splits(Tiny(), {"train": 3}, seed=0)
    assert str(info.value) == "could only draw 2 distinct easy tasks of 3 requested"


# -- oracle ------------------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_oracle_solutions_verify_as_solved(difficulty: str) -> None:
    env = calculator()
    tasks = make_splits(env, {"train": 6, "eval": 2}, seed=3, difficulty=difficulty)
    for task in tasks["train"] + tasks["eval"]:
        oracle = env.oracle_solution(task)
        assert len(oracle.tool_calls) == (2 if difficulty == "hard" else 1)
        env.reset(task)
        results = [env.step(call) for call in oracle.tool_calls]
        assert all(r.ok for r in results)
        assert results[-1].result == task.answer == oracle.final_answer
        assert [r.env_state_id for r in results] == [f"calc:{i + 1}" for i in range(len(results))]
        record = env.verify(task, oracle.final_answer)
        assert (record.solved, record.reward, record.failure_category) == (True, 1.0, "solved")
        traj = oracle_trajectory(task, environment=env)
        assert traj.solved and traj.verification == record


def test_hard_task_chains_the_intermediate_result() -> None:
    env = calculator()
    (task,) = make_splits(env, {"train": 1}, seed=5, difficulty="hard")["train"]
    first, second = task.data["expressions"]
    intermediate = env.step(ToolCall("calculator", {"expression": first})).result
    assert second.startswith(f"{intermediate} * ")


def test_privileged_context_contains_the_solution() -> None:
    env = calculator()
    (task,) = make_splits(env, {"train": 1}, seed=5, difficulty="medium")["train"]
    hint = env.privileged_context(task)
    assert task.answer in hint and task.data["expressions"][0] in hint


def test_oracle_without_expressions() -> None:
    task = Task(task_id="x", prompt="p", answer="1", difficulty="easy")
    with pytest.raises(ToolEnvironmentError, match="task x has no oracle expressions"):
        calculator().oracle_solution(task)


# -- the tool ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("7 - 3", 4),
        ("(3 + 4) * 2", 14),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("2 ** 10", 1024),
        ("-3 * -3", 9),
        ("+5", 5),
        ("2 ** -1", 0.5),
        ("1.5 + 1.5", 3.0),
        ("  12  ", 12),
    ],
)
def test_safe_evaluate_arithmetic(expression: str, value: float) -> None:
    assert safe_evaluate(expression) == value


MALICIOUS = {
    "import": ("__import__('os')", "unsupported syntax: Call; use numbers and + - * / // % ** ( )"),
    "system call": (
        "__import__('os').system('true')",
        "unsupported syntax: Call; use numbers and + - * / // % ** ( )",
    ),
    "attribute": (
        "(1).__class__",
        "unsupported syntax: Attribute; use numbers and + - * / // % ** ( )",
    ),
    "dunder chain": (
        "().__class__.__bases__[0]",
        "unsupported syntax: Subscript; use numbers and + - * / // % ** ( )",
    ),
    "huge power": ("9**9**9", "exponent 387420489 is too large (limit 64)"),
    "power magnitude": ("10**40", "result exceeds 1e+30 in magnitude"),
    "10,000 digits": ("9" * 10_000, "expression is too long (10000 characters, limit 200)"),
    "19-digit literal": ("1" * 19 + " + 1", "number with 19 digits is too long (limit 18)"),
    "deep parentheses": (
        "(" * 100 + "1" + ")" * 100,
        "expression is too long (201 characters, limit 200)",
    ),
    "nested parentheses": ("(" * 40 + "1" + ")" * 40, "expression is nested too deeply (limit 16)"),
    "nested unary": ("-" * 30 + "1", "expression is nested too deeply (limit 16)"),
    "lambda": ("lambda: 1", "unsupported syntax: Lambda; use numbers and + - * / // % ** ( )"),
    "name": ("x + 1", "unsupported syntax: Name; use numbers and + - * / // % ** ( )"),
    "string": ("'a' * 10", "unsupported syntax: Constant; use numbers and + - * / // % ** ( )"),
    "bool": ("True + 1", "unsupported syntax: Constant; use numbers and + - * / // % ** ( )"),
    "complex": ("1j * 2", "unsupported syntax: Constant; use numbers and + - * / // % ** ( )"),
    "comparison": ("1 < 2", "unsupported syntax: Compare; use numbers and + - * / // % ** ( )"),
    "list": ("[1] * 9", "unsupported syntax: List; use numbers and + - * / // % ** ( )"),
    "conditional": (
        "1 if 1 else 2",
        "unsupported syntax: IfExp; use numbers and + - * / // % ** ( )",
    ),
    "bit ops": ("1 << 100", "unsupported syntax: BinOp; use numbers and + - * / // % ** ( )"),
    "multiplication chain": ("*".join(["999999999"] * 12), "result exceeds 1e+30 in magnitude"),
    "many parts": ("+".join(["1"] * 60), "expression has too many parts (179, limit 64)"),
    "float overflow": ("1e300 * 1e300", "result exceeds 1e+30 in magnitude"),
    "division by zero": ("1 / (2 - 2)", "division by zero"),
    "modulo by zero": ("5 % 0", "division by zero"),
    "zero negative power": ("0 ** -1", "division by zero"),
    "fractional power": ("4 ** 0.5", "only integer exponents are supported"),
    "syntax error": ("1 +", "could not parse expression: SyntaxError"),
    "empty": ("   ", "expression is empty"),
    "statement": ("import os", "could not parse expression: SyntaxError"),
    "walrus": ("(y := 3)", "unsupported syntax: NamedExpr; use numbers and + - * / // % ** ( )"),
}


@pytest.mark.parametrize("name", list(MALICIOUS))
def test_malicious_expressions_are_fast_error_results(name: str) -> None:
    expression, message = MALICIOUS[name]
    env = calculator()
    started = time.perf_counter()
    result = env.step(ToolCall("calculator", {"expression": expression}))
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0  # a bound, not a benchmark: nothing may hang
    assert result == ToolResult(ok=False, error=message, env_state_id="calc:1")
    with pytest.raises(CalculatorError) as info:
        safe_evaluate(expression)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (ToolCall("python", {"expression": "1"}), "unknown tool 'python'; available: calculator"),
        (ToolCall("calculator", {}), "missing string argument 'expression'"),
        (ToolCall("calculator", {"expression": 5}), "missing string argument 'expression'"),
        (
            ToolCall("calculator", {"expression": "1", "mode": "x"}),
            "unexpected argument(s) ['mode']; calculator takes 'expression'",
        ),
    ],
)
def test_bad_calls_are_error_results(call: ToolCall, error: str) -> None:
    result = calculator().step(call)
    assert (result.ok, result.error) == (False, error)
    assert json.loads(result.observation_text()) == {"ok": False, "error": error}


def test_steps_count_state_ids_and_reset() -> None:
    env = calculator()
    task = make_splits(env, {"train": 1}, seed=0)["train"][0]
    env.reset(task)
    assert env.step(ToolCall("calculator", {"expression": "1+1"})) == ToolResult(
        ok=True, result="2", env_state_id="calc:1"
    )
    assert env.step(ToolCall("nope")).env_state_id == "calc:2"
    env.reset(task)
    assert env.step(ToolCall("calculator", {"expression": "2*3"})).env_state_id == "calc:1"
    assert json.loads(ToolResult(ok=True, result="6").observation_text()) == {
        "ok": True,
        "result": "6",
    }


def test_safe_evaluate_refuses_non_strings() -> None:
    with pytest.raises(CalculatorError, match="expression must be a string"):
        safe_evaluate(42)  # type: ignore[arg-type]


def test_limits_are_not_off_by_one() -> None:
    assert safe_evaluate("1" * 18) == int("1" * 18)
    assert safe_evaluate("2 ** 64") == 2**64
    assert safe_evaluate("(" * 15 + "1" + ")" * 15) == 1
    assert abs(safe_evaluate("10 ** 30")) == MAX_ABS_RESULT


# -- verification --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "solved", "category", "predicted"),
    [
        ("12", True, "solved", "12"),
        (" 12 ", True, "solved", "12"),
        ("12.0", True, "solved", "12.0"),
        ("1,2", True, "solved", "1,2"),
        ("13", False, "wrong_answer", "13"),
        ("-12", False, "wrong_answer", "-12"),
        ("twelve", False, "unparseable_answer", "twelve"),
        ("12 apples", False, "unparseable_answer", "12 apples"),
        ("inf", False, "unparseable_answer", "inf"),
        ("NaN", False, "unparseable_answer", "NaN"),
        ("", False, "empty_answer", ""),
        ("   ", False, "empty_answer", "   "),
    ],
)
def test_verify_categories(answer: str, solved: bool, category: str, predicted: str) -> None:
    task = Task(task_id="t", prompt="Compute 3 * 4", answer="12", difficulty="easy")
    record = calculator().verify(task, answer)
    assert (record.solved, record.failure_category, record.predicted, record.expected) == (
        solved,
        category,
        predicted,
        "12",
    )
    assert record.reward == (1.0 if solved else 0.0)


def test_normalize_and_format() -> None:
    assert normalize_answer("1,000") == Decimal(1000)
    assert normalize_answer(" -3.50 ") == Decimal("-3.50")
    assert normalize_answer("1" * 65) is None
    assert normalize_answer("") is None
    assert format_number(7) == "7" and format_number(7.0) == "7" and format_number(3.5) == "3.5"
    assert format_number(1 / 3) == "0.3333333333"
    assert format_number(1e20) == "1e+20"


def test_environment_description() -> None:
    env = calculator()
    assert env.describe() == {"name": "calculator", "tools": ["calculator(expression)"]}
    assert "calculator(expression)" in env.system_prompt()
    verbose = calculator("verbose")
    assert verbose.system_prompt() != env.system_prompt()
    with pytest.raises(ToolEnvironmentError, match="unknown prompt_style 'chatty'"):
        CalculatorEnvironment(prompt_style="chatty")
