"""DAgger-style teacher data and the held-out state gate: labels, refusals, privilege, digests."""

from __future__ import annotations

import shutil
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
from miniverl.config.models import RolloutConfig, RunConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.errors import TeacherGateError
from miniverl.lab.config import lab_of
from miniverl.lab.teachers import adapter_fit, toy_fit
from miniverl.lab.teachers.dagger import label_student_states
from miniverl.lab.teachers.gate import (
    evaluate_state_gate,
    privileged_prediction,
    score_state_gate,
)
from miniverl.lab.teachers.oracle import build_oracle_teacher
from miniverl.schemas.trajectory import Trajectory

CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)


@pytest.fixture(scope="module")
def task() -> Task:
    tasks = generate_tasks("train", 40, 3, (3,))
    return next(t for t in tasks if all(op != "multiply" for op, _ in t.data["steps"][1:]))


def _student(task: Task, script: list[str]) -> Trajectory:
    runner = make_runner(script, environment=make_environment("calc_chain"), config=CONFIG)
    return runner.rollout(task, seed=0, trajectory_id=f"{task.task_id}:s")


def test_an_off_path_state_is_labelled_with_the_corrective_action(task: Task) -> None:
    script = [
        chain_call(task, 0),
        tool_call_text(miscopied_step(task, 1)),
        chain_call(task, 1),
        chain_call(task, 2),
    ]
    script.append(final_text(task.answer))
    traj = _student(task, script)
    tok = toy_tokenizer()
    states = label_student_states(make_environment("calc_chain"), {task.task_id: task}, [traj], tok)
    assert [(s.turn, s.off_path, s.deviated) for s in states] == [
        (0, False, False),
        (1, False, True),
        (2, True, False),
        (3, True, False),
        (4, True, False),
    ]
    # the miscopied turn: labelled up to and including its first wrong id, whose label is the
    # oracle's id there, never the student's
    wrong = states[1]
    assert wrong.action == tok.encode(chain_call(task, 1))
    assert wrong.labelled == wrong.agreed + 1 < len(wrong.action)
    ids, targets = wrong.gate_row()
    assert ids[targets[-1]] == wrong.action[wrong.agreed] != wrong.generated[wrong.agreed]
    # after the miscopy, the label is the re-call of step 1 from the last correct value
    after = states[2]
    assert tok.decode(after.action) == chain_call(task, 1)
    ids, targets = after.fit_row()
    assert ids[: len(after.prefix)] == list(traj.token_ids[: len(after.prefix)])
    assert tok.decode([ids[j] for j in targets]) == chain_call(task, 1)


class _StubTeacher:
    """Greedy next id = the next id of the first reference the prefix starts (else pad)."""

    def __init__(self, references: list[list[int]]) -> None:
        self.tokenizer = toy_tokenizer()
        self.device = "cpu"
        self.references = references

    def hidden_states_at_batch(self, batch: Any, *, with_grad: bool = False) -> torch.Tensor:
        out = torch.zeros(len(batch.row_index), self.tokenizer.vocab_size)
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
            out[i, nxt] = 1.0
        return out

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def generate(self, prompt_ids: list[int], *, max_new_tokens: int, **_: Any) -> Any:
        """Always answers 0, at once."""
        from miniverl.models.base import GenerationResult

        ids = self.tokenizer.encode(final_text("0"))
        return GenerationResult(ids, final_text("0"), "stop_sequence", len(prompt_ids))


def test_a_privileged_number_is_a_miss_off_path(task: Task) -> None:
    """A student that answers where a call is due: a teacher that completes the block with the
    true final value (no tool result shows it) is counted wrong; one that writes a number
    of the transcript is not."""
    early = final_text("1")
    traj = _student(task, [chain_call(task, 0), early])
    tok = toy_tokenizer()
    env = make_environment("calc_chain")
    turn = label_student_states(env, {task.task_id: task}, [traj], tok)[1]
    assert turn.deviated and not turn.off_path
    context = turn.prefix
    opened = tok.encode(early[: early.index("1")])
    leak = context + opened + tok.encode(f"{task.answer}\n")
    honest = context + opened + tok.encode(f"{task.data['results'][0]}\n")
    assert str(task.answer) not in tok.decode(context)

    for rule in ("any_new_number", "teacher_departs"):
        leaky = score_state_gate(
            _StubTeacher([leak]), env, [task], [traj], CONFIG, recovery=False, privileged_rule=rule
        )
        clean = score_state_gate(
            _StubTeacher([honest]),
            env,
            [task],
            [traj],
            CONFIG,
            recovery=False,
            privileged_rule=rule,
        )
        assert leaky.privileged_predictions >= 1 and clean.privileged_predictions == 0
        assert leaky.off_path_positions == clean.off_path_positions + leaky.privileged_predictions
        assert leaky.off_path_correct == clean.off_path_correct == 0
        assert leaky.privileged_rule == rule


def test_privileged_prediction_reads_only_the_transcript() -> None:
    context = "Start with 12. Then add 5. result: 12 + 5 = 17"
    assert not privileged_prediction(context, "<answer>\n1", "7")
    assert privileged_prediction(context, "<answer>\n1", "9")
    assert privileged_prediction(context, "<answer>\n", "4")
    assert not privileged_prediction(context, "<answer>\n", "<")
    assert privileged_prediction(context, "<answer>\n17", "0")


def test_teacher_departs_judges_a_number_only_until_the_student_has_left_the_transcript() -> None:
    context = "Start with 12. Then add 5. result: 12 + 5 = 17"
    for rule in ("any_new_number", "teacher_departs"):
        assert privileged_prediction(context, "<answer>\n", "4", rule)
        assert privileged_prediction(context, "<answer>\n1", "9", rule)
        assert privileged_prediction(context, "<answer>\n17", "0", rule)
        assert not privileged_prediction(context, "<answer>\n1", "7", rule)
        assert not privileged_prediction(context, "<answer>\n19", "<", rule)
    assert privileged_prediction(context, "<answer>\n19", "0")
    assert not privileged_prediction(context, "<answer>\n19", "0", "teacher_departs")
    assert privileged_prediction(context, "<answer>\n19 + ", "3", "teacher_departs")


def test_the_oracle_teacher_is_gated_on_the_same_footing(task: Task) -> None:
    """Inside an answer opened too early the oracle's continuation is undefined, so it targets
    nothing there (never the task's final value, which the transcript does not hold): the gate
    finds no privileged prediction, and the on-path positions agree with the label."""
    config = RunConfig.from_mapping(
        {
            "models": {"backend": "toy", "oracle_teacher": {"smoothing": 0.001}},
            "environment": {"name": "calc_chain"},
        }
    )
    tok = toy_tokenizer()
    oracle = build_oracle_teacher(config, tok, [task])
    env = make_environment("calc_chain")
    traj = _student(task, [chain_call(task, 0), final_text("1")])
    result = score_state_gate(oracle, env, [task], [traj], CONFIG, recovery=False)
    assert result.on_path_agreement == 1.0
    assert result.privileged_predictions == 0
    assert result.off_path_positions == 0 and result.unlabelled_positions == 4


def test_the_teacher_recovers_from_the_students_state(task: Task) -> None:
    script = [chain_call(task, 0), tool_call_text(miscopied_step(task, 1)), final_text("0")]
    traj = _student(task, script)
    env = make_environment("calc_chain")
    tok = toy_tokenizer()
    oracle_cfg = RunConfig.from_mapping(
        {
            "models": {"backend": "toy", "oracle_teacher": {"smoothing": 0.001}},
            "environment": {"name": "calc_chain"},
        }
    )
    oracle = build_oracle_teacher(oracle_cfg, tok, [task])
    good = score_state_gate(oracle, env, [task], [traj], CONFIG)
    assert (good.recovery_states, good.recovered) == (1, 1)
    lost = score_state_gate(_StubTeacher([]), env, [task], [traj], CONFIG)
    assert (lost.recovery_states, lost.recovered) == (1, 0)


def test_a_gate_task_the_teacher_was_fitted_on_is_refused(task: Task) -> None:
    env = make_environment("calc_chain")
    student = make_runner([chain_call(task, 0)], environment=env, config=CONFIG).backend
    with pytest.raises(TeacherGateError, match="not held out"):
        evaluate_state_gate(
            _StubTeacher([]), student, env, [task], CONFIG, seed=0, fit_task_ids=[task.task_id]
        )


def test_the_fit_digests_include_the_fitting_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Editing a hashed source changes code_sha256, and with it the toy teacher's and the HF
    adapter's cache keys."""
    package = Path(toy_fit.__file__).resolve().parents[2]
    assert "lab/teachers/fitting.py" in toy_fit.FIT_SOURCES
    assert "lab/teachers/fitting.py" in adapter_fit.HF_FIT_SOURCES
    assert "lab/teachers/toy_fit.py" in toy_fit.FIT_SOURCES
    assert "lab/teachers/adapter_fit.py" in adapter_fit.HF_FIT_SOURCES
    before = toy_fit.code_sha256()
    copy = tmp_path / "pkg"
    for rel in set(toy_fit.FIT_SOURCES) | set(adapter_fit.HF_FIT_SOURCES):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package / rel, copy / rel)
    monkeypatch.setattr(toy_fit, "_PACKAGE", copy)
    assert toy_fit.code_sha256() == before
    (copy / "lab/teachers/fitting.py").write_text(
        (copy / "lab/teachers/fitting.py").read_text() + "\n# edited\n"
    )
    assert toy_fit.code_sha256() != before
    monkeypatch.undo()

    cfg = RunConfig.from_mapping({})
    fit = lab_of(cfg).teacher_fit
    payload = adapter_fit.fit_payload(cfg, fit, "fp", [([1, 2, 3], [2])])
    monkeypatch.setattr(adapter_fit, "code_sha256", lambda files=(): "edited")
    edited = adapter_fit.fit_payload(cfg, fit, "fp", [([1, 2, 3], [2])])
    assert adapter_fit.fit_digest(edited) != adapter_fit.fit_digest(payload)
    other_rows = adapter_fit.fit_payload(cfg, fit, "fp", [([1, 2, 4], [2])])
    assert (
        other_rows["examples_sha256"]
        != adapter_fit.fit_payload(cfg, fit, "fp", [([1, 2, 3], [2])])["examples_sha256"]
    )


@pytest.mark.parametrize(
    ("value", "states", "says"),
    [
        (0.985, ["off_path_agreement 0.848 < 0.900"], ["state gate failed (off_path_agreement"]),
        (0.5, ["recovery_rate 0.571 < 0.800"], ["at 0.500 of 66", "state gate failed (recovery"]),
        (
            0.5,
            [],
            ["at 0.500 of 66 student-visited states, under lab.teacher_gate.threshold 0.950"],
        ),
        (None, [], ["at 0.000 of 66 student-visited states"]),
    ],
)
def test_the_refusal_names_the_gate_that_failed(
    value: float | None, states: list[str], says: list[str]
) -> None:
    from miniverl.errors import TeacherGateError
    from miniverl.lab.teachers.gate import refuse_failed_gates

    gate = {"passed": False, "value": value, "threshold": 0.95, "actions": 66}
    gate["states"] = {"failures": states}
    with pytest.raises(TeacherGateError) as info:
        refuse_failed_gates([{"seed": 1, "teacher_gate": gate}])
    message = str(info.value)
    assert all(part in message for part in says), message
    assert ("reproduces the correct next action" in message) == ((value or 0.0) < 0.95)


def test_the_configured_state_gate_scores_as_the_recipe_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The benchmark's cold start and a script that gates a teacher it fitted score through
    one function: the recipe's seed, batch size and privileged rule reach the gate."""
    from miniverl.lab.config import load_recipe
    from miniverl.lab.teachers import gate

    config = load_recipe(
        Path(__file__).resolve().parents[2] / "recipes" / "toy_calc_chain_checked.yaml",
        ["run.seed=17", "eval.batch_size=5"],
    )
    seen: dict[str, Any] = {}

    def fake(teacher: Any, student: Any, env: Any, tasks: Any, rollout: Any, **kw: Any) -> str:
        seen.update(kw, rollout=rollout, tasks=tasks)
        return "result"

    monkeypatch.setattr(gate, "evaluate_state_gate", fake)
    got = gate.configured_state_gate("t", "s", "env", ["a"], config, fit_task_ids=["x"])
    assert got == "result"
    assert seen == {
        "seed": 17,
        "batch_size": 5,
        "fit_task_ids": ["x"],
        "privileged_rule": "teacher_departs",
        "rollout": config.rollout,
        "tasks": ["a"],
    }
