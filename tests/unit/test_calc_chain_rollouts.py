"""calc_chain episodes with a scripted policy: every recoverable error path, and its bounds."""

from __future__ import annotations

import json

import pytest

from helpers import final_text, make_runner, tool_call_text
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.schemas.trajectory import TerminationReason, Trajectory

CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)
BAD_JSON = '<tool_call>\n{"arguments": {"expression": "1 + 1"}, "name": "calculator"\n</tool_call>'
BAD_JSON_ERROR = "tool call is not valid JSON: Expecting ',' delimiter at character 59"


@pytest.fixture(scope="module")
def task() -> Task:
    """A k = 2 chain whose second step is not a multiplication (so a miscopy changes the answer)."""
    tasks = generate_tasks("train", 12, 3, (2,))
    return next(t for t in tasks if t.data["steps"][1][0] != "multiply")


def _run(task: Task, script: list[str], config: RolloutConfig = CONFIG) -> tuple[Trajectory, int]:
    runner = make_runner(script, environment=make_environment("calc_chain"), config=config)
    traj = runner.rollout(task, seed=0)
    return traj, len(runner.backend.calls)


def _observations(traj: Trajectory) -> list[dict]:
    return [
        json.loads(s.text.split("<tool_result>\n")[1].split("\n</tool_result>")[0])
        for s in traj.spans_of("tool_result")
    ]


def _miscopied(task: Task) -> tuple[str, int]:
    """The second call with the first result off by one, and where that chain ends."""
    op, y = task.data["steps"][1]
    wrong = task.data["results"][0] + 1
    symbol = {"add": "+", "subtract": "-", "multiply": "*"}[op]
    value = {"add": wrong + y, "subtract": wrong - y, "multiply": wrong * y}[op]
    return f"{wrong} {symbol} {y}", value


def test_oracle_path(task: Task) -> None:
    first, second = task.data["expressions"]
    traj, calls = _run(
        task, [tool_call_text(first), tool_call_text(second), final_text(task.answer)]
    )
    assert traj.solved and calls == 3 and traj.invalid_tool_calls == 0
    assert [o["result"] for o in _observations(traj)] == [
        f"{first} = {task.data['results'][0]}",
        f"{second} = {task.answer}",
    ]


def test_a_miscopied_operand_propagates_to_the_answer(task: Task) -> None:
    first = task.data["expressions"][0]
    wrong_call, wrong_value = _miscopied(task)
    traj, _ = _run(
        task, [tool_call_text(first), tool_call_text(wrong_call), final_text(str(wrong_value))]
    )
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER
    assert not traj.solved and traj.verification.failure_category == "wrong_answer"
    assert traj.verification.predicted == str(wrong_value) != task.answer
    assert traj.invalid_tool_calls == 0  # a miscopy is a valid call: only the echo reveals it
    assert _observations(traj)[1] == {"ok": True, "result": f"{wrong_call} = {wrong_value}"}


def test_a_miscopied_operand_is_visible_and_a_retry_recovers(task: Task) -> None:
    first, second = task.data["expressions"]
    wrong_call, _ = _miscopied(task)
    script = [
        tool_call_text(first),
        tool_call_text(wrong_call),
        tool_call_text(second),
        final_text(task.answer),
    ]
    traj, calls = _run(task, script)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER and traj.solved
    assert calls == 4
    observations = _observations(traj)
    # The echo shows the miscopied operand next to the previous result it should have been.
    assert observations[0]["result"].endswith(f"= {task.data['results'][0]}")
    assert observations[1]["result"].startswith(f"{task.data['results'][0] + 1} ")
    assert observations[2] == {"ok": True, "result": f"{second} = {task.answer}"}


def test_a_malformed_block_gets_a_readable_error_and_the_episode_continues(task: Task) -> None:
    first, second = task.data["expressions"]
    script = [BAD_JSON, tool_call_text(first), tool_call_text(second), final_text(task.answer)]
    traj, calls = _run(task, script)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER and traj.solved
    assert calls == 4 and traj.invalid_tool_calls == 1
    assert traj.turns[0].tool_call.parse_error == BAD_JSON_ERROR
    assert _observations(traj)[0] == {"ok": False, "error": BAD_JSON_ERROR}


def test_a_call_the_tool_cannot_do_gets_a_readable_error_and_a_retry_recovers(task: Task) -> None:
    first, second = task.data["expressions"]
    fused = f"({first}) {second.split(' ', 1)[1]}"
    script = [
        tool_call_text(fused),
        tool_call_text(first),
        tool_call_text(second),
        final_text(task.answer),
    ]
    traj, calls = _run(task, script)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER and traj.solved
    assert calls == 4 and traj.invalid_tool_calls == 1
    assert _observations(traj)[0] == {
        "ok": False,
        "error": "one step per call: 'a + b', 'a - b' or 'a * b' with integers (e.g. '80 * 4'), "
        f"got {fused!r}",
    }


def test_two_errors_fit_the_spare_turns_a_third_does_not(task: Task) -> None:
    first, second = task.data["expressions"]
    wrong_call, _ = _miscopied(task)
    recovered = [
        BAD_JSON,
        tool_call_text(first),
        tool_call_text(wrong_call),
        tool_call_text(second),
    ]
    traj, calls = _run(task, [*recovered, final_text(task.answer)])
    assert traj.solved and calls == 5 == 2 + 1 + 2  # k calls, the answer, two spare turns
    traj, calls = _run(task, [BAD_JSON, *recovered, final_text(task.answer)])
    assert traj.termination_reason is TerminationReason.MAX_TURNS
    assert calls == 5 and traj.verification is None


def test_the_turn_budget_is_per_task_not_rollout_max_turns() -> None:
    env = make_environment("calc_chain")
    for k in (1, 4):
        (task,) = generate_tasks("test", 1, 5, (k,))
        script = [tool_call_text(f"{i} + 1") for i in range(20)]
        runner = make_runner(script, environment=env, config=CONFIG)
        traj = runner.rollout(task, seed=0)
        assert traj.termination_reason is TerminationReason.MAX_TURNS
        assert len(runner.backend.calls) == len(traj.turns) == k + 3 < CONFIG.max_turns


def test_the_parse_error_budget_ends_the_episode(task: Task) -> None:
    traj, calls = _run(task, [BAD_JSON, "no block", BAD_JSON, final_text(task.answer)])
    assert traj.termination_reason is TerminationReason.PARSE_ERROR_LIMIT
    assert calls == 3 == CONFIG.max_parse_errors and traj.invalid_tool_calls == 3
    relaxed = CONFIG.model_copy(update={"max_parse_errors": 4})
    traj, calls = _run(task, [BAD_JSON, "no block", BAD_JSON, final_text(task.answer)], relaxed)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER and calls == 4
