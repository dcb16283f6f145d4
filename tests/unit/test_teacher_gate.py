"""The teacher gate: the correct next action at student states, the score,
the refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
from miniverl.agent.protocol import format_tool_call
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.oracle_state import next_oracle_action
from miniverl.environments.registry import make_environment
from miniverl.errors import TeacherGateError
from miniverl.lab.teachers.gate import (
    TEACHER_GATE_FILE,
    TeacherGateResult,
    evaluate_teacher_gate,
    gate_states,
    load_teacher_gate,
    record_teacher_gate,
    require_teacher_gate,
    score_teacher_gate,
)
from miniverl.schemas.trajectory import Trajectory

CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)
BAD_JSON = '<tool_call>\n{"arguments": {"expression": "1 + 1"}, "name": "calculator"\n</tool_call>'


@pytest.fixture(scope="module")
def task() -> Task:
    """A k = 3 chain whose later steps are not multiplications."""
    tasks = generate_tasks("train", 40, 3, (3,))
    return next(t for t in tasks if all(op != "multiply" for op, _ in t.data["steps"][1:]))


def _student(task: Task, script: list[str]) -> Trajectory:
    runner = make_runner(script, environment=make_environment("calc_chain"), config=CONFIG)
    return runner.rollout(task, seed=0)


def _states(task: Task, script: list[str]) -> list[tuple[int, str, int, bool]]:
    traj = _student(task, script)
    env = make_environment("calc_chain")
    return [
        (s.turn, s.action_text, s.steps_done, s.off_path)
        for s in gate_states(env, {task.task_id: task}, [traj])
    ]


def test_after_a_miscopied_operand_the_correct_action_is_the_corrective_recall(task: Task) -> None:
    script = [
        chain_call(task, 0),
        tool_call_text(miscopied_step(task, 1)),
        chain_call(task, 1),
        chain_call(task, 2),
    ]
    script.append(final_text(task.answer))
    assert _states(task, script) == [
        (0, chain_call(task, 0), 0, False),
        (1, chain_call(task, 1), 1, False),
        (2, chain_call(task, 1), 1, True),  # the re-call of step 1 from the last correct value
        (3, chain_call(task, 2), 2, True),
        (4, final_text(task.answer), 3, True),
    ]


def test_a_miscopy_that_the_student_propagates_still_asks_for_the_recall(task: Task) -> None:
    wrong = miscopied_step(task, 1)
    left, symbol, y = wrong.split(" ")
    value = int(left) + int(y) if symbol == "+" else int(left) - int(y)
    op2, y2 = task.data["steps"][2]
    propagated = f"{value} {'+' if op2 == 'add' else '-'} {y2}"
    script = [
        chain_call(task, 0),
        tool_call_text(wrong),
        tool_call_text(propagated),
        final_text("0"),
    ]
    assert _states(task, script) == [
        (0, chain_call(task, 0), 0, False),
        (1, chain_call(task, 1), 1, False),
        (2, chain_call(task, 1), 1, True),
        (3, chain_call(task, 1), 1, True),  # an answer would be wrong: step 1 was never done
    ]


def test_after_a_malformed_call_the_correct_action_is_the_recall(task: Task) -> None:
    refused = tool_call_text(task.data["expressions"][0].split(" ")[0] + " +")
    script = [BAD_JSON, chain_call(task, 0), refused, chain_call(task, 1), chain_call(task, 2)]
    script.append(final_text(task.answer))
    assert _states(task, script) == [
        (0, chain_call(task, 0), 0, False),
        (1, chain_call(task, 0), 0, True),  # re-call after the parse error
        (2, chain_call(task, 1), 1, True),
        (3, chain_call(task, 1), 1, True),  # re-call after the tool refused "a +"
        (4, chain_call(task, 2), 2, True),
        (5, final_text(task.answer), 3, True),
    ]


def test_a_duplicate_call_does_not_advance_and_an_early_answer_is_scored(task: Task) -> None:
    script = [chain_call(task, 0), chain_call(task, 0), final_text("7")]
    assert _states(task, script) == [
        (0, chain_call(task, 0), 0, False),
        (1, chain_call(task, 1), 1, False),
        (2, chain_call(task, 1), 1, True),
    ]
    env = make_environment("calc_chain")
    assert (
        next_oracle_action(env, task, []).call.arguments["expression"]
        == (task.data["expressions"][0])
    )


# ------------------------------------------------------------------ scoring with a stub teacher


class _LookupTeacher:
    """Greedy next token = the next token of the first reference sequence the prefix starts.

    ``references`` play the teacher's "beliefs": the student's own transcripts make a teacher
    that copies the student, the correct actions appended to each state make a perfect one.
    """

    def __init__(self, references: list[list[int]], wrong_at: set[tuple[int, ...]] = frozenset()):
        self.tokenizer = toy_tokenizer()
        self.device = "cpu"
        self.references = references
        self.wrong_at = wrong_at
        self.vocab = self.tokenizer.vocab_size

    def hidden_states_at_batch(self, batch: Any, *, with_grad: bool = False) -> torch.Tensor:
        out = torch.zeros(len(batch.row_index), self.vocab)
        ids = batch.input_ids.tolist()
        for i, (r, p) in enumerate(
            zip(batch.row_index.tolist(), batch.position_index.tolist(), strict=True)
        ):
            prefix = ids[r][: p + 1]
            nxt = next(
                (
                    ref[p + 1]
                    for ref in self.references
                    if len(ref) > p + 1 and ref[: p + 1] == prefix
                ),
                self.tokenizer.pad_token_id,
            )
            if tuple(prefix) in self.wrong_at:
                nxt = (nxt + 1) % self.vocab
            out[i, nxt] = 1.0
        return out

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


def test_the_score_is_all_action_tokens_argmax_at_student_states(task: Task) -> None:
    env = make_environment("calc_chain")
    script = [
        chain_call(task, 0),
        tool_call_text(miscopied_step(task, 1)),
        chain_call(task, 1),
        chain_call(task, 2),
    ]
    script.append(final_text(task.answer))
    student = _student(task, script)
    tok = toy_tokenizer()
    states = gate_states(env, {task.task_id: task}, [student])
    perfect = [s.prefix + tok.encode(s.action_text) for s in states]

    result = score_teacher_gate(_LookupTeacher(perfect), env, [task], [student])
    assert (result.value, result.actions, result.correct, result.token_accuracy) == (1.0, 5, 5, 1.0)
    assert (result.off_path_actions, result.off_path_correct) == (3, 3)

    # a teacher that copies the student is wrong exactly where the student erred (turn 1)
    copycat = score_teacher_gate(_LookupTeacher([student.token_ids]), env, [task], [student])
    assert copycat.correct == 4 and copycat.value == pytest.approx(0.8)
    assert [a["reproduced"] for a in copycat.per_action] == [True, False, True, True, True]

    # one wrong token anywhere in an action fails the whole action, not just that token
    state = states[2]
    action = tok.encode(state.action_text)
    wrong = {tuple(state.prefix + action[:3])}
    one_off = score_teacher_gate(_LookupTeacher(perfect, wrong), env, [task], [student])
    assert one_off.correct == 4 and one_off.per_action[2]["reproduced"] is False
    assert one_off.per_action[2]["tokens_correct"] == len(action) - 1
    total = sum(len(tok.encode(s.action_text)) for s in states)
    assert one_off.token_accuracy == pytest.approx((total - 1) / total)


def test_evaluate_rolls_out_the_student_and_scores_oracle_states_too(task: Task) -> None:
    env = make_environment("calc_chain")
    script = [
        chain_call(task, 0),
        tool_call_text(miscopied_step(task, 1)),
        chain_call(task, 1),
        chain_call(task, 2),
    ]
    script.append(final_text(task.answer))
    student = make_runner(script, environment=env, config=CONFIG).backend
    oracle = make_runner([], environment=env, config=CONFIG).oracle_rollout(task)
    teacher = _LookupTeacher([oracle.token_ids])  # knows only the oracle's path
    result = evaluate_teacher_gate(teacher, student, env, [task], CONFIG, seed=1, temperature=1.0)
    assert result.episodes == 1 and result.student_solved == 1 and result.actions == 5
    # right on the oracle path (turns 0 and 1), lost after the student's miscopy
    assert result.correct == 2 and result.off_path_correct == 0 and result.off_path_actions == 3
    assert result.oracle_state_accuracy == 1.0 and result.temperature == 1.0


# ------------------------------------------------------------------ the refusal


def _result(correct: int, actions: int) -> TeacherGateResult:
    return TeacherGateResult(
        value=correct / actions if actions else 0.0,
        actions=actions,
        correct=correct,
        token_accuracy=1.0,
        off_path_actions=0,
        off_path_correct=0,
        oracle_state_actions=0,
        oracle_state_correct=0,
        episodes=1,
        student_solved=0,
        temperature=1.0,
    )


def test_the_benchmark_refuses_a_teacher_under_the_threshold() -> None:
    with pytest.raises(TeacherGateError) as info:
        require_teacher_gate(_result(47, 50), 0.95)
    assert str(info.value) == (
        "teacher gate failed: the teacher reproduces the correct next action at 47 of 50 "
        "student-visited states (0.940), under the threshold 0.950"
    )
    assert "lab.toy_fit.max_steps" in info.value.hint
    assert "lab.toy_fit.noise_fraction" in info.value.hint
    require_teacher_gate(_result(19, 20), 0.95)  # exactly at the threshold passes
    require_teacher_gate(_result(50, 50))  # default threshold 0.95
    with pytest.raises(TeacherGateError, match="at 0 of 0 student-visited states"):
        require_teacher_gate(_result(0, 0), 0.0)  # nothing scored proves nothing


def test_the_gate_is_recorded_in_the_run(tmp_path: Path) -> None:
    emitted: list[tuple[str, dict]] = []

    class Events:
        def emit(self, name: str, **fields: Any) -> None:
            emitted.append((name, fields))

    path = record_teacher_gate(_result(47, 50), 0.95, tmp_path, Events())
    assert path == tmp_path / TEACHER_GATE_FILE
    stored = json.loads(path.read_text())
    assert stored["value"] == 0.94 and stored["threshold"] == 0.95 and stored["passed"] is False
    assert load_teacher_gate(tmp_path)["correct"] == 47
    assert emitted[0][0] == "teacher_gate" and emitted[0][1]["value"] == 0.94
    assert emitted[0][1]["passed"] is False
    record_teacher_gate(_result(50, 50), 0.95, tmp_path)
    assert load_teacher_gate(tmp_path)["passed"] is True


def test_format_of_correct_actions_is_the_oracle_render(task: Task) -> None:
    env = make_environment("calc_chain")
    oracle = make_runner([], environment=env, config=CONFIG).oracle_rollout(task)
    states = gate_states(env, {task.task_id: task}, [oracle])
    calls = env.oracle_solution(task).tool_calls
    assert [s.action_text for s in states] == [
        *(format_tool_call(c) for c in calls),
        final_text(task.answer),
    ]
    assert not any(s.off_path for s in states)
    tok = toy_tokenizer()
    for s in states:  # the state + action is exactly the oracle's transcript
        ids = s.prefix + tok.encode(s.action_text)
        assert oracle.token_ids[: len(ids)] == ids


# ------------------------------------------------------------------ saved weights


def test_the_gate_of_weight_files_is_the_gate_of_those_backends(tmp_path: Path) -> None:
    """Student and teacher files go to their own roles: the states are the student's rollouts
    and the scores the teacher's argmax, exactly as ``evaluate_teacher_gate`` computes them."""
    from safetensors.torch import save_file

    from miniverl.config.models import RunConfig
    from miniverl.environments.tasks_file import build_splits
    from miniverl.errors import CheckpointError
    from miniverl.lab.teachers.gate import gate_of_weight_files
    from miniverl.models.factory import build_student, build_teacher, build_tokenizer

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "toy_calc_chain.yaml"
    config = RunConfig.from_yaml(
        recipe,
        [
            "environment.train_tasks=4",
            "environment.eval_tasks=3",
            "environment.test_tasks=6",
            "rollout.max_new_tokens_per_turn=12",
            "rollout.max_turns=9",
        ],
    )
    tok = build_tokenizer(config)
    student, teacher = build_student(config, tok, "cpu"), build_teacher(config, tok, "cpu")
    with torch.no_grad():
        for i, p in enumerate(student.module.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.5)
    save_file(student.full_state_dict(), str(tmp_path / "student.safetensors"))
    save_file(teacher.full_state_dict(), str(tmp_path / "teacher.safetensors"))
    env = make_environment("calc_chain", **config.environment.params)
    tasks = build_splits(env, config.environment)["eval"][:2]
    direct = evaluate_teacher_gate(
        teacher, student, env, tasks, config.rollout, seed=config.run.seed
    )
    got = gate_of_weight_files(
        config, tmp_path / "student.safetensors", tmp_path / "teacher.safetensors", tasks=2
    )
    assert got.per_action == direct.per_action and got.value == direct.value
    assert got.actions > 0 and got.episodes == 2
    with pytest.raises(CheckpointError, match="cannot read the teacher weights"):
        gate_of_weight_files(config, tmp_path / "student.safetensors", tmp_path / "nope", tasks=1)


def test_the_gate_of_a_student_file_against_the_oracle_teacher(tmp_path: Path) -> None:
    """``lab.oracle_teacher`` has no weights file: the gate takes None and is exactly 1."""
    from safetensors.torch import save_file

    from miniverl.config.models import RunConfig
    from miniverl.errors import CheckpointError
    from miniverl.lab.teachers.gate import gate_of_weight_files
    from miniverl.models.factory import build_student, build_tokenizer

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    small = ["environment.train_tasks=4", "environment.eval_tasks=3", "environment.test_tasks=6"]
    config = RunConfig.from_yaml(recipes / "toy_calc_chain_oracle.yaml", small)
    student = build_student(config, build_tokenizer(config), "cpu")
    save_file(student.full_state_dict(), str(tmp_path / "student.safetensors"))
    got = gate_of_weight_files(config, tmp_path / "student.safetensors", None, tasks=3)
    assert got.value == 1.0 and got.off_path_actions > 0 and got.episodes == 3
    with pytest.raises(CheckpointError, match=r"lab\.oracle_teacher has no weights"):
        gate_of_weight_files(config, tmp_path / "student.safetensors", tmp_path / "t", tasks=1)
    learned = RunConfig.from_yaml(recipes / "toy_calc_chain.yaml", small)
    with pytest.raises(CheckpointError, match="a teacher weights file is needed"):
        gate_of_weight_files(learned, tmp_path / "student.safetensors", None, tasks=1)
