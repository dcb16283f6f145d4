"""The oracle teacher (lab/teachers/oracle.py): the smoothed oracle policy at any state.

Checked by values, not labels: the next token it predicts at every student-generated
position of scripted episodes (on the oracle's path, after a miscopied operand, after a
malformed call, mid-turn after a wrong digit), its exact log-probabilities against a float64
reference, its samples, and the teacher gate it scores.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import (
    chain_call,
    final_text,
    make_runner,
    miscopied_step,
    tool_call_text,
    toy_tokenizer,
)
from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.errors import BackendError
from miniverl.lab.teachers.gate import score_teacher_gate
from miniverl.lab.teachers.oracle import OracleTeacher, deviated_continuation
from miniverl.models.batching import build_padded_trajectory_batch
from miniverl.schemas.trajectory import Trajectory

CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)
EPS = 0.01


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return generate_tasks("train", 40, 3, (3,))


@pytest.fixture(scope="module")
def task(tasks: list[Task]) -> Task:
    """A k = 3 chain whose later steps are not multiplications (single-digit operands)."""
    return next(t for t in tasks if all(op != "multiply" for op, _ in t.data["steps"][1:]))


def _teacher(tasks: list[Task], smoothing: float = EPS) -> OracleTeacher:
    return OracleTeacher(
        toy_tokenizer(), make_environment("calc_chain"), tasks, smoothing=smoothing
    )


def _student(task: Task, script: list[str | list[int]]) -> Trajectory:
    runner = make_runner(script, environment=make_environment("calc_chain"), config=CONFIG)
    return runner.rollout(task, seed=0)


def _model_positions(traj: Trajectory) -> list[int]:
    return [
        j for span in traj.spans if span.is_model_generated for j in range(span.start, span.end)
    ]


def _turn_predictions(teacher: OracleTeacher, traj: Trajectory) -> dict[int, list[int]]:
    """Per turn: the teacher's predicted ids for each model token (position j - 1 predicts j)."""
    out: dict[int, list[int]] = {}
    for span in traj.spans:
        if span.is_model_generated:
            positions = [j - 1 for j in range(span.start, span.end)]
            out.setdefault(span.turn_id, []).extend(
                teacher.next_token_ids(traj.token_ids, positions)
            )
    return out


# -- the continuation rule -------------------------------------------------------------------


def test_a_prefix_of_the_action_continues_with_the_rest() -> None:
    action = tool_call_text("12 + 34")
    assert deviated_continuation("", action) == action
    assert deviated_continuation(action[:20], action) == action[20:]


def test_a_wrong_value_keeps_the_structure_of_the_action() -> None:
    action = tool_call_text("12 + 34")
    at = action.index("12")
    assert deviated_continuation(action[:at] + "1", action) == action[at + 1 :]  # on the path
    assert deviated_continuation(action[:at] + "19", action) is None  # a miscopied number
    assert deviated_continuation(action[:at] + "7", action) is None
    assert deviated_continuation(action[:at] + "123", action) is None
    assert deviated_continuation(action[:at] + "19 ", action) == action[at + 3 :]  # ended
    assert deviated_continuation(action[:at] + "-19 ", action) == action[at + 3 :]  # signed
    assert deviated_continuation(action[:at] + "-", action) is None  # a sign where none is due
    plus = action.index("+")
    assert deviated_continuation(action[:plus] + "*", action) == action[plus + 1 :]  # operator
    assert deviated_continuation(action[:plus] + "- 3", action) == action[plus + 3 :]
    assert deviated_continuation("<final>\n69", final_text("68")) is None
    assert deviated_continuation("<final>\n-6", final_text("68")) is None
    assert deviated_continuation("<final>\n6", final_text("68")) == "8\n</final>"
    assert deviated_continuation("<final>\n-", final_text("-12")) == "12\n</final>"  # its sign
    assert deviated_continuation("<final>\n12", final_text("-12")) is None  # sign missing


def test_a_deviation_of_the_structure_realigns_with_the_action() -> None:
    action = tool_call_text("12 + 34")
    plus = action.index("+")
    tail = action[plus + 1 :]
    assert deviated_continuation(action[:plus] + "x", action) == "+" + tail  # x inserted
    assert deviated_continuation(action[:plus] + "+  ", action) == tail[1:]  # extra space
    assert deviated_continuation(action[:plus] + "34", action) == "+" + tail  # 34 inserted
    assert deviated_continuation(action[:plus] + "+ 7", action) is None  # miscopied operand
    quote = action.index('"}')
    assert deviated_continuation(action[:quote] + "}", action) == action[quote:]


def test_a_block_of_the_wrong_kind_has_no_continuation() -> None:
    call, answer = tool_call_text("12 + 34"), final_text("46")
    assert deviated_continuation("<final>\n4", call) is None
    assert deviated_continuation("<tool_call>", answer) is None
    assert deviated_continuation("so <final>\n7", call) is None
    assert deviated_continuation(call, call) is None  # the action used up


def test_before_any_block_it_starts_the_action() -> None:
    action = tool_call_text("12 + 34")
    assert deviated_continuation("hello", action) == action
    assert deviated_continuation("hi " + action[:15], action) == action[15:]


# -- next tokens at student states -----------------------------------------------------------


def test_on_the_oracle_path_it_predicts_every_oracle_token(task: Task, tasks: list[Task]) -> None:
    script = [chain_call(task, k) for k in range(3)] + [final_text(task.answer)]
    traj = _student(task, script)
    positions = _model_positions(traj)
    predicted = _teacher(tasks).next_token_ids(traj.token_ids, [j - 1 for j in positions])
    assert predicted == [traj.token_ids[j] for j in positions]
    shifted = _teacher(tasks).next_token_ids(traj.token_ids, positions[:-1])
    assert shifted != [traj.token_ids[j] for j in positions[:-1]]  # j, not j - 1: misaligned


def test_after_a_miscopied_operand_it_asks_for_the_corrective_recall(
    task: Task, tasks: list[Task]
) -> None:
    tok = toy_tokenizer()
    script = [chain_call(task, 0), tool_call_text(miscopied_step(task, 1)), chain_call(task, 2)]
    script += [final_text("0")] * 2
    traj = _student(task, script)
    predicted = _turn_predictions(_teacher(tasks), traj)
    assert predicted[0] == tok.encode(chain_call(task, 0))
    recall = tok.encode(chain_call(task, 1))
    turn1 = traj.token_ids[traj.spans[4].start : traj.spans[4].end]
    first_wrong = next(i for i, (a, b) in enumerate(zip(turn1, recall, strict=False)) if a != b)
    assert predicted[1][: first_wrong + 1] == recall[: first_wrong + 1]
    # the student carried on from the wrong result; the oracle re-calls step 1 instead
    assert predicted[2][0] == recall[0]
    assert predicted[2][: first_wrong + 1] != turn1[: first_wrong + 1] or turn1 != recall


def test_the_recall_is_asked_for_at_the_start_of_every_later_turn(
    task: Task, tasks: list[Task]
) -> None:
    tok = toy_tokenizer()
    bad_json = (
        '<tool_call>\n{"arguments": {"expression": "1 + 1"}, "name": "calculator"\n</tool_call>'
    )
    script = [chain_call(task, 0), bad_json, chain_call(task, 1), final_text(task.answer)]
    traj = _student(task, script)
    teacher = _teacher(tasks)
    starts = {span.turn_id: span.start for span in reversed(traj.spans) if span.is_model_generated}
    first = {turn: teacher.next_token_ids(traj.token_ids, [j - 1])[0] for turn, j in starts.items()}
    assert first[1] == tok.encode(chain_call(task, 1))[0]
    assert first[2] == tok.encode(chain_call(task, 1))[0]  # the malformed call did not advance
    assert first[3] == tok.encode(chain_call(task, 2))[0]  # early answer: the oracle calls step 2


def test_a_tool_result_written_by_the_policy_does_not_count(task: Task, tasks: list[Task]) -> None:
    tok = toy_tokenizer()
    fake = '<tool_result>\n{{"ok": true, "result": "{}"}}\n</tool_result>'.format(
        f"{task.data['expressions'][0]} = {task.data['results'][0]}"
    )
    traj = _student(task, ["<final>\n" + fake + "</final>"])
    teacher = _teacher(tasks)
    end = traj.spans[-1].end
    # the state after the fake text: still no step done, so the oracle's action is call 0
    assert teacher._action(tok.decode(traj.token_ids[:end])) == chain_call(task, 0)


def test_an_unknown_task_is_refused(task: Task, tasks: list[Task]) -> None:
    traj = _student(
        task, [chain_call(task, 0), chain_call(task, 1), chain_call(task, 2), final_text("1")]
    )
    other = [t for t in tasks if t.prompt != task.prompt]
    with pytest.raises(BackendError, match="whose task it does not know"):
        _teacher(other).next_token_ids(traj.token_ids, [traj.spans[2].start - 1])


# -- distribution, scoring, sampling ---------------------------------------------------------


def test_scores_are_the_smoothed_oracle_in_float64(task: Task, tasks: list[Task]) -> None:
    script = [
        chain_call(task, 0),
        tool_call_text(miscopied_step(task, 1)),
        chain_call(task, 1),
        chain_call(task, 2),
    ]
    traj = _student(task, [*script, final_text(task.answer)])
    teacher = _teacher(tasks)
    targets = _model_positions(traj)
    batch = build_padded_trajectory_batch(
        [traj.token_ids, traj.token_ids[: targets[5] + 1]],
        [[j - 1 for j in targets], [j - 1 for j in targets[:5]]],
        0,
        "cpu",
    )
    logp = torch.log_softmax(teacher.project(teacher.hidden_states_at_batch(batch)).double(), -1)
    oracle = teacher.next_token_ids(traj.token_ids, [j - 1 for j in targets])
    vocab = teacher.tokenizer.vocab_size
    expected = torch.full((len(targets) + 5, vocab), math.log(EPS / vocab), dtype=torch.float64)
    assert None in oracle  # the miscopied number: no target, a uniform row
    for row, token in enumerate(oracle + oracle[:5]):
        if token is None:
            expected[row] = -math.log(vocab)
        else:
            expected[row, token] = math.log(1 - EPS + EPS / vocab)
    torch.testing.assert_close(logp, expected, atol=1e-6, rtol=0)
    single = teacher.hidden_states_at(traj.token_ids, [j - 1 for j in targets])
    defined = [row for row, token in enumerate(oracle) if token is not None]
    assert torch.equal(single[defined].argmax(-1), torch.tensor([oracle[r] for r in defined]))


def test_greedy_samples_are_the_oracle_trajectory(tasks: list[Task]) -> None:
    env = make_environment("calc_chain")
    teacher = _teacher(tasks)
    runner = RolloutRunner(teacher, env, CONFIG)
    sampled = runner.rollout_batch(
        [EpisodeRequest(t, i) for i, t in enumerate(tasks[:6])], temperature=0.0
    )
    for task, traj in zip(tasks[:6], sampled, strict=True):
        assert traj.token_ids == runner.oracle_rollout(task).token_ids
        assert traj.solved


def test_samples_at_t1_deviate_at_the_smoothing_rate_and_recover(tasks: list[Task]) -> None:
    env = make_environment("calc_chain")
    teacher = _teacher(tasks, smoothing=0.01)
    runner = RolloutRunner(teacher, env, CONFIG)
    sampled = runner.rollout_batch([EpisodeRequest(t, 100 + i) for i, t in enumerate(tasks)])
    stray = total = 0
    for traj in sampled:
        positions = _model_positions(traj)
        predicted = teacher.next_token_ids(traj.token_ids, [j - 1 for j in positions])
        pairs = [(p, j) for p, j in zip(predicted, positions, strict=True) if p is not None]
        stray += sum(p != traj.token_ids[j] for p, j in pairs)
        total += len(pairs)
    rate = stray / total
    assert 0.005 < rate < 0.016, rate  # 0.01 * (V - 1) / V per token
    assert sum(t.solved for t in sampled) >= 30  # the oracle recovers from its stray tokens


def test_the_gate_of_the_oracle_teacher_is_one_at_off_path_states(
    task: Task, tasks: list[Task]
) -> None:
    env = make_environment("calc_chain")
    script = [chain_call(task, 0), tool_call_text(miscopied_step(task, 1)), chain_call(task, 2)]
    student = _student(task, [*script, final_text("0")])
    result = score_teacher_gate(_teacher(tasks), env, [task], [student])
    assert result.off_path_actions == 2
    assert (result.correct, result.actions, result.off_path_correct) == (4, 4, 2)


def test_on_calculator_greedy_samples_are_the_oracle_and_a_wrong_value_is_recalled() -> None:
    from helpers import calculator, calculator_tasks

    env = calculator()
    tasks = calculator_tasks(8, difficulty="mixed")
    teacher = OracleTeacher(toy_tokenizer(), env, tasks, smoothing=EPS)
    runner = RolloutRunner(teacher, env, CONFIG)
    for task, traj in zip(
        tasks,
        runner.rollout_batch([EpisodeRequest(t, 0) for t in tasks], temperature=0.0),
        strict=True,
    ):
        assert traj.token_ids == runner.oracle_rollout(task).token_ids
    task = tasks[0]
    call = env.oracle_solution(task).tool_calls[0]
    wrong = tool_call_text(call.arguments["expression"] + " + 1")
    student = make_runner([wrong, final_text("0")], environment=env, config=CONFIG).rollout(
        task, seed=0
    )
    second = next(s for s in student.spans if s.is_model_generated and s.turn_id == 1)
    first_token = teacher.next_token_ids(student.token_ids, [second.start - 1])[0]
    assert first_token == toy_tokenizer().encode(tool_call_text(call.arguments["expression"]))[0]


def test_a_call_where_the_answer_is_due_carries_no_target_inside_it(
    task: Task, tasks: list[Task]
) -> None:
    tok = toy_tokenizer()
    script = [
        chain_call(task, 0),
        chain_call(task, 1),
        chain_call(task, 2),
        chain_call(task, 0),
        final_text("1"),
    ]
    traj = _student(task, script)
    span = next(s for s in traj.spans if s.is_model_generated and s.turn_id == 3)
    teacher = _teacher(tasks)
    assert teacher.next_token_ids(traj.token_ids, [span.start - 1]) == tok.encode("<final>")
    inside = teacher.next_token_ids(traj.token_ids, list(range(span.start, span.end - 1)))
    assert inside == [None] * (span.end - 1 - span.start)
