"""``benchmarks/fixed_state_actions.py`` sorts a policy's first action after the cold start's
flagged error by the step the error message names, and its solved count is the fixed-state
endpoint's (the same replay)."""

from __future__ import annotations

import pytest

from helpers import (
    ScriptedBackend,
    chain_call,
    final_text,
    load_benchmark_script,
    miscopied_step,
    tool_call_text,
)
from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.lab.benchmark.fixed_states import policy_recovery

ROLLOUT = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)
ENV = make_environment("calc_chain", checked=True)
actions = load_benchmark_script("fixed_state_actions")


@pytest.fixture(scope="module")
def task() -> Task:
    return next(
        t
        for t in generate_tasks("eval", 60, 5, (3,))
        if all(op != "multiply" for op, _ in t.data["steps"][1:])
    )


def _policy(script: list[str]) -> ScriptedBackend:
    return ScriptedBackend(script, default=final_text("0"))


def test_each_first_action_is_sorted_by_the_step_the_error_names(task: Task) -> None:
    wrong = miscopied_step(task, 1)
    student = RolloutRunner(_policy([chain_call(task, 0), tool_call_text(wrong)]), ENV, ROLLOUT)
    states = [student.rollout(task, seed=0, temperature=1.0, trajectory_id="t:gate")]
    finish = [chain_call(task, 2), final_text(task.answer)]
    cases = {
        "named": [chain_call(task, 1), *finish],
        "repeat": [tool_call_text(wrong)],
        "other": [tool_call_text(miscopied_step(task, 2))],
        "malformed": ['<tool_call>\n{"arguments": {"expression": </tool_call>'],
        "answer": [final_text("0")],
    }
    for kind, script in cases.items():
        got = actions.tally(_policy(script), ENV, [task], states, ROLLOUT)
        assert got["states"] == got[kind] == 1, (kind, got)
        assert sum(got.get(k, 0) for k in actions.ACTIONS) == 1
        solved = policy_recovery(_policy(script), ENV, [task], ROLLOUT, states)["recovered"]
        assert got["solved"] == solved == int(kind == "named")
        assert got.get("solved_after_named", 0) == int(kind == "named")


def test_the_named_first_contrast_pairs_the_shares_by_seed() -> None:
    per_seed = {
        "1": {"opd": {"states": 10, "named": 5}, "offline_kd": {"states": 10}},
        "2": {"opd": {"states": 4, "named": 1}, "offline_kd": {"states": 4, "named": 1}},
        "3": {"opd": {"states": 5, "named": 4}, "offline_kd": {"states": 5, "named": 1}},
    }
    got = actions.named_first_contrast(per_seed, "opd", "offline_kd")
    assert got["diffs"] == pytest.approx([50.0, 0.0, 60.0])
    mean, sd = 110 / 3, (((50 - 110 / 3) ** 2 + (110 / 3) ** 2 + (60 - 110 / 3) ** 2) / 2) ** 0.5
    half = 4.302652729911275 * sd / 3**0.5  # t_{0.975, 2}
    assert (got["mean"], got["low"], got["high"]) == pytest.approx((mean, mean - half, mean + half))
    t = mean / (sd / 3**0.5)
    assert got["p"] == pytest.approx(1 - t / (2 + t * t) ** 0.5)  # two-sided p at df 2, closed form
    per_seed["2"]["offline_kd"]["states"] = 5
    with pytest.raises(ValueError, match="seed 2: opd and offline_kd answered different states"):
        actions.named_first_contrast(per_seed, "opd", "offline_kd")
