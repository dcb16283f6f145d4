"""The example plugin environment (examples/letter_count) keeps the ToolEnvironment contract."""

from __future__ import annotations

import sys

import pytest

from helpers import SRC_DIR
from miniverl.environments.base import ToolCall, make_splits
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import load_task_file, task_file_splits

EXAMPLE = SRC_DIR.parent / "examples" / "letter_count"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield make_environment("miniverl_letter_count:LetterCountEnvironment")
    sys.modules.pop("miniverl_letter_count", None)


@pytest.mark.parametrize(("difficulty", "calls"), [("easy", 1), ("medium", 1), ("hard", 2)])
def test_oracles_solve_their_tasks(env, difficulty: str, calls: int) -> None:  # type: ignore[no-untyped-def]
    for task in make_splits(env, {"train": 10}, seed=1, difficulty=difficulty)["train"]:
        oracle = env.oracle_solution(task)
        assert len(oracle.tool_calls) == calls
        env.reset(task)
        counts = [int(env.step(call).result) for call in oracle.tool_calls]
        assert str(sum(counts)) == oracle.final_answer == task.answer
        assert env.verify(task, task.answer).solved
        assert env.verify(task, str(int(task.answer) + 1)).failure_category == "wrong_answer"
        assert env.verify(task, "three").failure_category == "unparseable_answer"


def test_bad_calls_are_readable_errors(env) -> None:  # type: ignore[no-untyped-def]
    assert env.name == "letter_count"
    assert env.step(ToolCall("count", {"text": "aa", "letter": "ab"})).error == (
        "letter must be exactly one character"
    )
    assert env.step(ToolCall("count", {"text": "aa"})).error == (
        "count takes string arguments 'text' and 'letter'"
    )
    assert env.step(ToolCall("len", {})).error == "unknown tool 'len'; available: count"


def test_the_example_task_file_is_valid_and_its_oracles_solve(env) -> None:  # type: ignore[no-untyped-def]
    loaded = load_task_file(EXAMPLE / "tasks.jsonl")
    splits = task_file_splits(env, loaded, {"train": 8, "eval": 4, "test": 0}, seed=7)
    for task in splits["train"] + splits["eval"]:
        oracle = env.oracle_solution(task)
        env.reset(task)
        assert [env.step(c).result for c in oracle.tool_calls] == [task.answer]
        assert env.verify(task, oracle.final_answer).solved
