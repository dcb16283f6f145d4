"""The oracle's next action from any state of an episode, including states after errors.

The teacher gate (``lab/teachers/gate.py``) asks "what should the policy do next?" at
every state the *student* visited, and the noise-injected fitting traces
(``lab/teachers/toy_fit.py``) continue after a corrupted step with the same answer. Both use
:func:`next_oracle_action`, so the gate measures the teacher on exactly the behaviour the fit
taught it.

The state is the number ``n`` of oracle steps already done, read from the tool results in
the transcript: walking the turns in order, a turn advances ``n`` when its call was valid,
the tool answered ``ok`` and the result text equals the result of oracle call ``n``
(:func:`oracle_tool_results`). Everything else leaves ``n`` unchanged: a malformed block, a
call the tool refused, a miscopied operand (calc_chain echoes ``"a op b = v"``, so a wrong
``a`` gives a different text), a duplicate of an earlier step. The next action is oracle
call ``n``, or the final answer once every call is done. After an error that is the
corrective re-call of the step that went wrong, from the last correct value.

For calc_chain the result text is the whole expression and its value, so "same result" means
"the same step from the same value". For ``calculator`` (the result is the value alone) a
different expression with the same value counts as done, which is right for a task whose
answer is that value.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from miniverl.environments.base import Task, ToolCall, ToolEnvironment
from miniverl.errors import ToolEnvironmentError
from miniverl.schemas.trajectory import Turn


@dataclass(frozen=True)
class OracleAction:
    """The oracle's next action: ``call`` (a tool call) or ``answer`` (the final answer).

    ``steps_done`` is the state it was derived from: how many oracle calls the transcript
    had already completed.
    """

    steps_done: int
    call: ToolCall | None = None
    answer: str | None = None

    @property
    def is_final(self) -> bool:
        return self.call is None


def oracle_tool_results(environment: ToolEnvironment, task: Task) -> list[str]:
    """The result text of each oracle call, from a private copy of ``environment``.

    Raises :class:`ToolEnvironmentError` when an oracle call itself fails (the oracle of a
    task must solve it).
    """
    env = copy.deepcopy(environment)
    env.reset(task)
    out: list[str] = []
    for k, call in enumerate(env.oracle_solution(task).tool_calls):
        result = env.step(call)
        if not result.ok or result.result is None:
            raise ToolEnvironmentError(
                f"oracle call {k} of task {task.task_id} failed: {result.error}",
                hint="the environment's oracle_solution must only make calls its tool accepts",
            )
        out.append(result.result)
    return out


def steps_done_of_results(
    expected_results: Sequence[str], outcomes: Iterable[tuple[bool, str | None]]
) -> int:
    """How many oracle calls a sequence of tool outcomes ``(ok, result text)`` completed in order.

    The oracle teacher (``lab/teachers/oracle.py``) reads the outcomes from transcript text;
    :func:`oracle_steps_done` from recorded turns. A call that never reached the tool (a
    parse error) has ``ok`` false.
    """
    done = 0
    for ok, result in outcomes:
        if done < len(expected_results) and ok and result == expected_results[done]:
            done += 1
    return done


def oracle_steps_done(expected_results: Sequence[str], turns: Sequence[Turn]) -> int:
    """How many oracle calls ``turns`` completed in order (see the module docstring)."""
    return steps_done_of_results(
        expected_results,
        (
            (turn.tool_call.valid and turn.tool_result.ok, turn.tool_result.result)
            for turn in turns
            if turn.tool_call is not None and turn.tool_result is not None
        ),
    )


def next_oracle_action(
    environment: ToolEnvironment,
    task: Task,
    turns: Sequence[Turn],
    *,
    expected_results: Sequence[str] | None = None,
) -> OracleAction:
    """The oracle's action after ``turns`` (the episode's turns so far, in order).

    ``expected_results`` may be passed to avoid re-running the oracle
    (:func:`oracle_tool_results` of the same task).
    """
    oracle = environment.oracle_solution(task)
    expected = (
        list(expected_results)
        if expected_results is not None
        else oracle_tool_results(environment, task)
    )
    done = oracle_steps_done(expected, turns)
    if done < len(oracle.tool_calls):
        return OracleAction(steps_done=done, call=oracle.tool_calls[done])
    return OracleAction(steps_done=done, answer=oracle.final_answer)


__all__ = [
    "OracleAction",
    "next_oracle_action",
    "oracle_steps_done",
    "oracle_tool_results",
    "steps_done_of_results",
]
