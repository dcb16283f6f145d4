"""calc_chain endpoints on hand-built episodes whose answers are known (lab/benchmark/endpoints.py)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import final_text, load_benchmark_script, make_runner, tool_call_text
from miniverl.config.models import RolloutConfig
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.lab.benchmark.endpoints import (
    AnswerEvent,
    CallEvent,
    ChainTask,
    analyze_episode,
    analyze_trajectory,
    area_under_curve,
    curve_is_dense_enough,
    exposure_gap,
    mean_token_nll,
    score_exposure,
    summarize_episodes,
)

# x0 = 10; +5 -> 15; *3 -> 45; -7 -> 38
TASK = ChainTask(10, (("add", 5), ("multiply", 3), ("subtract", 7)))
ORACLE = [CallEvent("10 + 5", True), CallEvent("15 * 3", True), CallEvent("45 - 7", True)]


def test_task_algebra() -> None:
    assert TASK.results() == [15, 45, 38]
    assert TASK.expected(1) == (10, "+", 5) and TASK.expected(3) == (45, "-", 7)


def test_oracle_episode_has_no_error_and_perfect_skills() -> None:
    a = analyze_episode(TASK, [*ORACLE, AnswerEvent("38")], solved=True)
    assert a.first_error_step is None and not a.had_error and a.steps_done == 3
    assert a.operand_copy == [True, True, True]
    assert a.result_copy == [True, True, True]  # steps 2, 3 and the answer


def test_result_miscopy_then_retry_recovers() -> None:
    events = [
        ORACLE[0],
        CallEvent("16 * 3", True),  # miscopied 15
        CallEvent("15 * 3", True),  # retry
        ORACLE[2],
        AnswerEvent("38"),
    ]
    a = analyze_episode(TASK, events, solved=True)
    assert (a.first_error_step, a.first_error_kind) == (2, "result_copy")
    assert a.errors == [(2, "result_copy")]
    assert a.recovered and a.steps_done == 3
    # clean states: step 1, the miscopy at step 2 (clean: right after a correct call), then step 3, the answer.
    # The retry follows an error, so it is no skill opportunity.
    assert a.operand_copy == [True, True, True]
    assert a.result_copy == [False, True, True]


def test_operand_miscopy_propagates_without_recovery() -> None:
    events = [ORACLE[0], CallEvent("15 * 4", True), CallEvent("60 - 7", True), AnswerEvent("53")]
    a = analyze_episode(TASK, events, solved=False)
    assert (a.first_error_step, a.first_error_kind) == (2, "operand_copy")
    assert a.had_error and not a.recovered and a.steps_done == 1
    assert a.operand_copy == [True, False]  # the call after the error is not at a clean state
    assert a.result_copy == [True]


def test_step_one_left_operand_is_an_operand_copy() -> None:
    a = analyze_episode(TASK, [CallEvent("11 + 5", True)], solved=False)
    assert a.errors == [(1, "operand_copy")] and a.result_copy == []


def test_malformed_call_early_answer_answer_copy_no_answer_and_repeats() -> None:
    a = analyze_episode(TASK, [CallEvent(None, False), *ORACLE, AnswerEvent("38")], solved=True)
    assert (a.first_error_step, a.first_error_kind) == (1, "malformed") and a.recovered
    assert a.operand_copy == [True, True]  # the first correct call follows an error
    b = analyze_episode(TASK, [ORACLE[0], AnswerEvent("15")], solved=False)
    assert (b.first_error_step, b.first_error_kind) == (2, "early_answer")
    c = analyze_episode(TASK, [*ORACLE, AnswerEvent("39")], solved=False)
    assert (c.first_error_step, c.first_error_kind) == (4, "answer_copy")
    assert c.result_copy == [True, True, False]
    d = analyze_episode(TASK, ORACLE[:2], solved=False)
    assert (d.first_error_step, d.first_error_kind) == (3, "no_answer")
    e = analyze_episode(TASK, [ORACLE[0], ORACLE[0], *ORACLE[1:], AnswerEvent("38")], solved=True)
    assert e.repeats == 1 and not e.had_error


def test_summary_rates() -> None:
    clean = analyze_episode(TASK, [*ORACLE, AnswerEvent("38")], solved=True)
    recovered = analyze_episode(
        TASK, [CallEvent(None, False), *ORACLE, AnswerEvent("38")], solved=True
    )
    lost = analyze_episode(TASK, [ORACLE[0], AnswerEvent("15")], solved=False)
    k1 = analyze_episode(
        ChainTask(3, (("add", 4),)), [CallEvent("3 + 4", True), AnswerEvent("7")], True
    )
    s = summarize_episodes([clean, recovered, lost, k1])
    assert s["success_by_k"] == {"1": 1.0, "3": pytest.approx(2 / 3)}
    assert s["error_rate"] == 0.5 and s["recovery_rate"] == 0.5 and s["recovery_episodes"] == 2
    assert s["first_error_step_mean"] == 1.5
    assert s["first_error_kinds"]["malformed"] == 1 and s["first_error_kinds"]["early_answer"] == 1
    refused_lost = analyze_episode(TASK, [ORACLE[0], CallEvent("15 * 4", False)], solved=False)
    s = summarize_episodes([clean, recovered, lost, k1, refused_lost])
    assert [a.flagged for a in (clean, recovered, lost, k1, refused_lost)] == [
        False, True, False, False, True
    ]  # fmt: skip
    assert s["flagged_episodes"] == 2 and s["flagged_recovery_rate"] == 0.5
    assert summarize_episodes([clean])["flagged_recovery_rate"] is None


def test_area_under_curve() -> None:
    assert area_under_curve([(0, 0.0), (10, 1.0)]) == 0.5
    assert area_under_curve([(0, 0.2), (5, 0.2), (20, 0.2)]) == pytest.approx(0.2)
    # unequal spacing: trapezoids weighted by step length; unsorted input
    assert area_under_curve([(30, 1.0), (0, 0.0), (10, 0.0)]) == pytest.approx(
        (10 * 0.0 + 20 * 0.5) / 30
    )
    assert area_under_curve([(5, 1.0)]) is None
    assert curve_is_dense_enough([(i, 0.0) for i in range(8)])
    assert not curve_is_dense_enough([(i % 7, 0.0) for i in range(8)])


def test_exposure_gap_sign() -> None:
    assert exposure_gap(2.0, 0.5) == 1.5 and exposure_gap(None, 1.0) is None


# ---------------------------------------------------------------------- from real trajectories

CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)


def _chain_task():
    tasks = generate_tasks("train", 12, 3, (2,))
    return next(t for t in tasks if t.data["steps"][1][0] != "multiply")


def test_scripted_trajectory_with_miscopy_and_retry() -> None:
    task = _chain_task()
    first, second = task.data["expressions"]
    op, y = task.data["steps"][1]
    wrong = f"{task.data['results'][0] + 1} {'+' if op == 'add' else '-'} {y}"
    script = [
        tool_call_text(first),
        '<tool_call>\n{"arguments": {"expression": "1 + 1"}, "name": "calculator"\n</tool_call>',
        tool_call_text(wrong),
        tool_call_text(second),
        final_text(task.answer),
    ]
    runner = make_runner(script, environment=make_environment("calc_chain"), config=CONFIG)
    traj = runner.rollout(task, seed=0)
    a = analyze_trajectory(traj, task.data)
    assert traj.solved and a.solved
    assert a.errors == [(2, "malformed"), (2, "result_copy")]
    assert a.first_error_kind == "malformed" and a.recovered
    oracle = runner.oracle_rollout(task)
    assert not analyze_trajectory(oracle, task.data).had_error


# ---------------------------------------------------------------------- model-scored endpoints


class BigramBackend:
    """hidden(j) = one-hot(token j); project = fixed matrix W: p(next | cur) = softmax(W[cur])."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.W = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))

    def set_train(self, mode: bool) -> None:
        pass

    def hidden_states_at(self, token_ids, positions, *, with_grad=False):
        return torch.nn.functional.one_hot(
            torch.tensor([token_ids[p] for p in positions]), self.W.shape[0]
        ).float()

    def project(self, hidden):
        return hidden @ self.W


def _brute_nll(W: torch.Tensor, traj) -> tuple[float, int]:
    total, n = 0.0, 0
    for j, is_model in enumerate(traj.model_generated_mask):
        if is_model and j > 0:
            row = W[traj.token_ids[j - 1]].double()
            total -= float(row[traj.token_ids[j]] - torch.logsumexp(row, 0))
            n += 1
    return total, n


def test_token_nll_against_brute_force() -> None:
    task = _chain_task()
    runner = make_runner(environment=make_environment("calc_chain"), config=CONFIG)
    oracle = runner.oracle_rollout(task)
    vocab = max(oracle.token_ids) + 1
    student, teacher = BigramBackend(vocab, 1), BigramBackend(vocab, 2)
    total, n = _brute_nll(student.W, oracle)
    assert n == sum(1 for j, m in enumerate(oracle.model_generated_mask) if m and j > 0) > 0
    assert mean_token_nll(student, [oracle]) == pytest.approx(total / n, rel=1e-9)
    scored = score_exposure(student, teacher, [oracle], [oracle])
    t_total, _ = _brute_nll(teacher.W, oracle)
    assert scored["teacher_logprob_on_student"] == pytest.approx(-t_total / n, rel=1e-9)
    assert scored["exposure_gap"] == pytest.approx((t_total - total) / n, rel=1e-9)
    assert math.isfinite(scored["student_nll_on_oracle"])


def test_a_compact_episode_gives_back_the_trajectorys_endpoints() -> None:
    """``benchmarks/run_endpoints.py`` stores episodes as calls and answers; summarizing the
    stored form must give what the trajectories give (recovery, first errors, copies)."""
    module = load_benchmark_script("run_endpoints")

    task = _chain_task()
    first, second = task.data["expressions"]
    op, y = task.data["steps"][1]
    wrong = f"{task.data['results'][0] + 1} {'+' if op == 'add' else '-'} {y}"
    scripts = [
        [
            tool_call_text(first),
            tool_call_text(wrong),
            tool_call_text(second),
            final_text(task.answer),
        ],
        [tool_call_text(first), final_text("7")],
        [
            '<tool_call>\n{"arguments": {"expression": "1 + 1"}, "name": "calculator"\n</tool_call>',
            tool_call_text(first),
            tool_call_text(second),
            final_text(task.answer),
        ],
    ]
    environment = make_environment("calc_chain", checked=True)
    trajectories = [
        make_runner(s, environment=environment, config=CONFIG).rollout(task, seed=0)
        for s in scripts
    ]
    compact = [module.compact_episode(t, task.data) for t in trajectories]
    expected = summarize_episodes([analyze_trajectory(t, task.data) for t in trajectories])
    assert module.summarize_compact(compact) == expected
    assert expected["flagged_episodes"] == 2 and expected["flagged_recovery_rate"] == 1.0
    assert [e["solved"] for e in compact] == [True, False, True]
