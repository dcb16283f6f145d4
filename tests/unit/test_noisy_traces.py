"""Noise-injected toy-teacher fitting traces: provenance, masks, recovery."""

from __future__ import annotations

import json
import random

import pytest

from helpers import make_runner, toy_tokenizer
from miniverl.agent.corrective import (
    CORRUPTION_KINDS,
    WRONG_KEYS,
    CorrectiveTrace,
    corrupt_call_text,
    noisy_oracle_trace,
)
from miniverl.agent.loop import RolloutRunner
from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.oracle_state import next_oracle_action
from miniverl.environments.registry import make_environment
from miniverl.errors import ConfigError
from miniverl.lab.config import ToyFitConfig
from miniverl.lab.teachers import toy_fit as teacher_fit
from miniverl.lab.teachers.toy_fit import fit_traces, toy_fit_traces
from miniverl.schemas.trajectory import SpanType, Trajectory
from miniverl.utils.seeding import derive_seed

CONFIG = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)


class _NoPolicy:
    """The runner's own backend is never asked to generate by these functions."""

    def generate(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("noisy traces must not sample from the runner's policy")


def _runner(
    env_name: str = "calc_chain", config: RolloutConfig = CONFIG, **env_params: int
) -> RolloutRunner:
    return RolloutRunner(
        _NoPolicy(),  # type: ignore[arg-type]
        make_environment(env_name, **env_params),
        config,
        tokenizer=toy_tokenizer(),
        model_id="toy-teacher",
    )


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return generate_tasks("train", 30, 5, (1, 2, 3))


def _model_spans(traj: Trajectory, turn: int) -> list[range]:
    return [range(s.start, s.end) for s in traj.spans if s.is_model_generated and s.turn_id == turn]


def _assistant_texts(traj: Trajectory) -> list[str]:
    """What the policy 'generated' in each turn, read back from the transcript's tokens."""
    tok = toy_tokenizer()
    turns = sorted({s.turn_id for s in traj.spans if s.is_model_generated})
    return [
        "".join(tok.decode(traj.token_ids[r.start : r.stop]) for r in _model_spans(traj, t))
        for t in turns
    ]


def _observations(traj: Trajectory) -> list[dict]:
    return [
        json.loads(s.text.split("<tool_result>\n")[1].split("\n</tool_result>")[0])
        for s in traj.spans_of("tool_result")
    ]


CALL_KINDS = [k for k in CORRUPTION_KINDS if k != "extra_call"]
"""The kinds that corrupt one of the oracle's calls (``extra_call`` adds one after them)."""


def _all_noisy(tasks: list[Task]) -> list[tuple[Task, CorrectiveTrace]]:
    runner = _runner()
    out = []
    for i, task in enumerate(tasks):
        for kind in CALL_KINDS:
            for step in range(task.data["k"]):
                trace = noisy_oracle_trace(runner, task, random.Random(i), kind=kind, step=step)
                out.append((task, trace))
    return out


def test_the_corrupted_step_never_enters_the_loss_and_the_correction_does(
    tasks: list[Task],
) -> None:
    tok = toy_tokenizer()
    for task, trace in _all_noisy(tasks[:9]):
        traj, (ids, targets) = trace.trajectory, trace.example
        bad = trace.corrupted_turn
        assert bad is not None and ids == traj.token_ids
        mask = [0] * len(ids)
        for j in targets:
            mask[j] = 1
        corrupted = [j for r in _model_spans(traj, bad) for j in r]
        corrective = [j for r in _model_spans(traj, bad + 1) for j in r]
        # provenance: the excluded tokens ARE the corrupted text, the re-call IS the oracle's call
        assert tok.decode([ids[j] for j in corrupted]) == trace.corrupted_text
        oracle_call = task.data["expressions"][bad]
        assert tok.decode([ids[j] for j in corrective]) == format_tool_call(
            make_environment("calc_chain").oracle_solution(task).tool_calls[bad]
        )
        assert oracle_call in tok.decode([ids[j] for j in corrective])
        assert corrupted and all(mask[j] == 0 for j in corrupted)
        assert corrective and all(mask[j] == 1 for j in corrective)
        # every other model-generated token (oracle steps before, continuation, answer) is a target
        model = {j for j, m in enumerate(traj.model_generated_mask) if m and j > 0}
        assert set(targets) == model - set(corrupted)


def test_the_noisy_prefix_is_the_oracle_render_token_for_token(tasks: list[Task]) -> None:
    runner = _runner()
    for task, trace in _all_noisy(tasks[:6]):
        oracle = runner.oracle_rollout(task)
        cut = min(r.start for r in _model_spans(trace.trajectory, trace.corrupted_turn))
        assert trace.trajectory.token_ids[:cut] == oracle.token_ids[:cut]
        # and the end (final answer) renders as the oracle's
        final = trace.trajectory.spans_of(SpanType.ASSISTANT_FINAL)[-1]
        assert trace.trajectory.token_ids[final.start : final.end] == toy_tokenizer().encode(
            format_final(task.answer)
        )


def test_the_corrective_continuation_solves_the_task_in_the_environment(
    tasks: list[Task],
) -> None:
    env = make_environment("calc_chain")
    for task, trace in _all_noisy(tasks[:9]):
        texts = _assistant_texts(trace.trajectory)
        # replay the trace's actions through a fresh environment and a scripted policy
        replay = make_runner(texts, environment=make_environment("calc_chain"), config=CONFIG)
        traj = replay.rollout(task, seed=0)
        assert traj.solved and traj.token_ids == trace.trajectory.token_ids
        bad = trace.corrupted_turn
        observed = _observations(traj)[bad]
        if trace.kind in ("operand_digit", "random_operands"):  # valid: the echo shows it
            wrong = json.loads(texts[bad].split("\n")[1])["arguments"]["expression"]
            assert observed["ok"] and observed["result"].startswith(f"{wrong} = ")
            assert wrong != task.data["expressions"][bad]
        else:
            assert observed["ok"] is False and observed["error"]
        # every action after the corruption is the oracle's action from that state
        for t in range(bad + 1, len(texts)):
            action = next_oracle_action(env, task, traj.turns[:t])
            expected = (
                format_final(action.answer) if action.is_final else format_tool_call(action.call)
            )
            assert texts[t] == expected


def test_the_noise_fraction_is_honoured_and_zero_means_the_oracle_traces(
    tasks: list[Task],
) -> None:
    runner = _runner()
    for fraction, expected in ((0.0, 0), (0.2, 6), (0.5, 15), (1.0, 30)):
        traces = toy_fit_traces(runner, tasks, noise_fraction=fraction, seed=3)
        # count by provenance: a trace with a failed or off-oracle call, not by its label
        noisy = [
            t
            for t, task in zip(traces, tasks, strict=True)
            if len(t.trajectory.turns) != task.data["k"] + 1
        ]
        assert len(noisy) == expected, fraction
        assert all(t.corrupted_turn is not None for t in noisy)
        assert all(t.trajectory.solved for t in traces)
    clean = toy_fit_traces(runner, tasks, noise_fraction=0.0, seed=3)
    for trace, task in zip(clean, tasks, strict=True):
        oracle = runner.oracle_rollout(task)
        assert trace.example == (
            oracle.token_ids,
            [j for j, m in enumerate(oracle.model_generated_mask) if m and j > 0],
        )
    with pytest.raises(ConfigError, match=r"noise_fraction must be in \[0, 1\], got 1.5"):
        toy_fit_traces(runner, tasks, noise_fraction=1.5, seed=3)


def test_corruption_kinds_change_what_they_say() -> None:
    env = make_environment("calc_chain")
    task = generate_tasks("train", 1, 1, (2,))[0]
    call = env.oracle_solution(task).tool_calls[1]
    for seed in range(40):
        text, kind = corrupt_call_text(call, "operand_digit", random.Random(seed))
        expr = json.loads(text.split("\n")[1])["arguments"]["expression"]
        left, op, right = expr.split(" ")
        good_left, good_op, good_right = call.arguments["expression"].split(" ")
        assert kind == "operand_digit" and op == good_op
        assert (left != good_left) ^ (right != good_right)
        assert not left.startswith("0") and not right.startswith("0")
    text, kind = corrupt_call_text(call, "malformed_json", random.Random(0))
    assert text == format_tool_call(call).replace('"}\n</tool_call>', '"\n</tool_call>')
    text, kind = corrupt_call_text(call, "bad_expression", random.Random(0))
    assert json.loads(text.split("\n")[1])["arguments"]["expression"] == " ".join(
        call.arguments["expression"].split(" ")[:2]
    )


def test_calculator_traces_work_too() -> None:
    runner = _runner("calculator", RolloutConfig(max_turns=6, max_parse_errors=2))
    env = runner.environment
    calc_tasks = [
        Task(task_id=f"c{i}", prompt=p, answer=a, difficulty="easy", split="train", data=d)
        for i, (p, a, d) in enumerate(env.sample_task(random.Random(i), "hard") for i in range(6))
    ]
    for task in calc_tasks:
        for kind in CORRUPTION_KINDS:
            trace = noisy_oracle_trace(runner, task, random.Random(0), kind=kind)
            assert trace.trajectory.solved
            corrupted = [j for r in _model_spans(trace.trajectory, trace.corrupted_turn) for j in r]
            assert corrupted and not set(corrupted) & set(trace.example[1])


def test_a_turn_budget_without_room_for_the_correction_is_a_clear_error(
    tasks: list[Task],
) -> None:
    task = next(t for t in tasks if t.data["k"] == 3)
    runner = _runner(spare_turns=0)
    with pytest.raises(ConfigError, match="did not finish") as info:
        noisy_oracle_trace(runner, task, random.Random(0), kind="operand_digit")
    assert "noise_fraction: 0" in info.value.hint


def test_the_teacher_digest_covers_the_noise_settings(tasks: list[Task]) -> None:
    """A teacher fitted without noise must not be reused for a noisy fit (and vice versa)."""
    runner = _runner()

    def digest(fraction: float, fit: dict) -> str:
        examples = [
            t.example for t in toy_fit_traces(runner, tasks, noise_fraction=fraction, seed=1)
        ]
        teacher = _DigestTeacher()
        inputs = teacher_fit.toy_teacher_digest_inputs(
            teacher,  # type: ignore[arg-type]
            examples=examples,
            probe=tasks[:2],
            train=tasks,
            eval_tasks=tasks[:2],
            fit=fit,
            rollout={},
            chunk_size=8,
            seed=1,
            device="cpu",
        )
        return teacher_fit.teacher_digest(inputs)

    base = digest(0.0, {"noise_fraction": 0.0})
    # the examples alone (same fit dict) already differ: targets and ids change with the noise
    assert digest(0.2, {"noise_fraction": 0.0}) != base
    # and the setting itself is in the fit dict the trainer passes
    assert digest(0.0, {"noise_fraction": 0.2}) != base
    assert "lab/teachers/toy_fit.py" in teacher_fit.FIT_SOURCES
    assert "environments/oracle_state.py" in teacher_fit.FIT_SOURCES


class _DigestTeacher:
    def __init__(self) -> None:
        import torch

        self._state = {"w": torch.zeros(2)}
        self.tokenizer = toy_tokenizer()

    def full_state_dict(self) -> dict:
        return self._state


def _expression(text: str) -> str:
    return json.loads(text.split("\n")[1])["arguments"]["expression"]


def test_random_operands_replaces_every_number_and_keeps_the_operator() -> None:
    env = make_environment("calc_chain")
    task = generate_tasks("train", 1, 1, (3,))[0]
    for call in env.oracle_solution(task).tool_calls:
        left, op, right = call.arguments["expression"].split(" ")
        for seed in range(30):
            text, kind = corrupt_call_text(call, "random_operands", random.Random(seed))
            new_left, new_op, new_right = _expression(text).split(" ")
            assert kind == "random_operands" and new_op == op
            assert new_left != left and new_right != right
            assert 2 <= int(new_left) <= 999 and 2 <= int(new_right) <= 999


def test_follow_on_calls_carry_the_wrong_result_and_stay_out_of_the_loss(
    tasks: list[Task],
) -> None:
    """After a valid wrong call the trace carries on from the tool's wrong result, then goes
    back to the first step not done; neither the mistake nor the carried-on call is a target."""
    runner, tok, env = _runner(), toy_tokenizer(), make_environment("calc_chain")
    seen = 0
    for i, task in enumerate(t for t in tasks if t.data["k"] >= 2):
        for kind in ("operand_digit", "random_operands"):
            for step in range(task.data["k"] - 1):
                trace = noisy_oracle_trace(
                    runner, task, random.Random(i), kind=kind, step=step, follow=1
                )
                traj, (ids, targets) = trace.trajectory, trace.example
                assert trace.followed == 1 and trace.excluded_turns == [step, step + 1]
                texts = _assistant_texts(traj)
                wrong_value = _observations(traj)[step]["result"].split(" = ")[1]
                carried = _expression(texts[step + 1])
                oracle_next = task.data["expressions"][step + 1]
                # the carried-on call is the oracle's next step, started from the WRONG result
                assert carried.split(" ")[0] == wrong_value
                assert carried.split(" ")[1:] == oracle_next.split(" ")[1:]
                # then the correction: the oracle's call of the step still undone
                assert _expression(texts[step + 2]) == task.data["expressions"][step]
                assert traj.solved and len(texts) == task.data["k"] + 3
                excluded = {j for t in (step, step + 1) for r in _model_spans(traj, t) for j in r}
                assert excluded and not excluded & set(targets)
                model = {j for j, m in enumerate(traj.model_generated_mask) if m and j > 0}
                assert set(targets) == model - excluded
                assert (
                    tok.decode([ids[j] for r in _model_spans(traj, step + 2) for j in r])
                    == (texts[step + 2])
                )
                for t in range(step + 2, len(texts)):
                    action = next_oracle_action(env, task, traj.turns[:t])
                    expected = (
                        format_final(action.answer)
                        if action.is_final
                        else format_tool_call(action.call)
                    )
                    assert texts[t] == expected
                seen += 1
    assert seen >= 10


def test_follow_on_calls_never_exceed_the_turn_budget_or_follow_a_refused_call(
    tasks: list[Task],
) -> None:
    task = next(t for t in tasks if t.data["k"] == 3)
    tight = _runner(spare_turns=1)
    trace = noisy_oracle_trace(
        tight, task, random.Random(0), kind="operand_digit", step=0, follow=2
    )
    assert trace.followed == 0 and trace.trajectory.solved
    for kind in ("malformed_json", "bad_expression"):
        trace = noisy_oracle_trace(_runner(), task, random.Random(0), kind=kind, step=0, follow=1)
        assert trace.followed == 0 and trace.trajectory.solved
    # the last step has nothing to carry on to
    trace = noisy_oracle_trace(
        _runner(), task, random.Random(0), kind="operand_digit", step=2, follow=1
    )
    assert trace.followed == 0


def test_the_fit_config_reaches_the_traces(tasks: list[Task]) -> None:
    """models.toy_fit.noise_kinds / noise_max_follow change the traces, checked by their text."""
    runner, env = _runner(), make_environment("calc_chain")
    fit = ToyFitConfig(
        noise_fraction=1.0,
        noise_kinds={"random_operands": 1.0, "operand_digit": 0.0},
        noise_max_follow=1,
    )
    traces = fit_traces(runner, tasks, fit, seed=7)
    assert len(traces) == len(tasks)
    for trace, task in zip(traces, tasks, strict=True):
        good = env.oracle_solution(task).tool_calls[trace.corrupted_turn].arguments["expression"]
        bad = _expression(trace.corrupted_text)
        assert all(a != b for a, b in zip(bad.split(" ")[::2], good.split(" ")[::2], strict=True))
    assert any(t.followed == 1 for t in traces)
    assert all(
        t.followed == 0
        for t in fit_traces(runner, tasks, fit.model_copy(update={"noise_max_follow": 0}), seed=7)
    )
    # the defaults draw exactly the traces the three original kinds drew
    default = fit_traces(runner, tasks, ToyFitConfig(noise_fraction=0.5), seed=7)
    old = toy_fit_traces(
        runner,
        tasks,
        noise_fraction=0.5,
        seed=derive_seed(7, "toy-teacher-noise"),
        kinds={"operand_digit": 0.5, "malformed_json": 0.25, "bad_expression": 0.25},
    )
    assert [t.example for t in default] == [t.example for t in old]


def test_an_extra_call_is_made_after_the_chain_flagged_and_corrected_by_the_answer(
    tasks: list[Task],
) -> None:
    """``extra_call``: the last call again once every step is done (what a student that does
    not stop does); the checked tool flags it, the correction is the final answer."""
    runner, tok = _runner(checked=True, spare_turns=1), toy_tokenizer()
    for i, task in enumerate(tasks[:12]):
        k = task.data["k"]
        trace = noisy_oracle_trace(runner, task, random.Random(i), kind="extra_call", step=0)
        traj, (ids, targets) = trace.trajectory, trace.example
        texts = _assistant_texts(traj)
        last = make_environment("calc_chain").oracle_solution(task).tool_calls[-1]
        assert trace.kind == "extra_call" and trace.corrupted_turn == k
        assert texts[:k] == [
            format_tool_call(c)
            for c in make_environment("calc_chain").oracle_solution(task).tool_calls
        ]
        assert texts[k] == trace.corrupted_text == format_tool_call(last)
        assert _observations(traj)[k] == {
            "ok": False,
            "error": "every step is done: give the final answer",
        }
        assert texts[k + 1] == format_final(task.answer) and traj.solved
        extra = [j for r in _model_spans(traj, k) for j in r]
        answer = [j for r in _model_spans(traj, k + 1) for j in r]
        assert extra and not set(extra) & set(targets)
        assert answer and set(answer) <= set(targets)
        assert tok.decode([ids[j] for j in answer]) == format_final(task.answer)


def test_wrong_key_misnames_the_name_key_or_the_argument_key(tasks: list[Task]) -> None:
    env = make_environment("calc_chain")
    call = env.oracle_solution(tasks[0]).tool_calls[0]
    seen = set()
    for seed in range(40):
        text, kind = corrupt_call_text(call, "wrong_key", random.Random(seed))
        payload = json.loads(text.split("\n")[1])
        assert kind == "wrong_key" and text != format_tool_call(call)
        if "name" not in payload:
            (key,) = set(payload) - {"arguments"}
            assert key in WRONG_KEYS["name"] and payload[key] == "calculator"
            assert payload["arguments"] == call.arguments
            seen.add("name")
        else:
            (key,) = payload["arguments"]
            assert key in WRONG_KEYS["argument"] and payload["name"] == "calculator"
            assert payload["arguments"][key] == call.arguments["expression"]
            seen.add("argument")
    assert seen == {"name", "argument"}


@pytest.mark.parametrize("kind", sorted(k for k, w in CORRUPTION_KINDS.items() if w > 0))
def test_the_checked_tool_flags_every_default_kind_and_names_the_correction(
    tasks: list[Task], kind: str
) -> None:
    """Every kind a corrective trace draws by default is an error the checked calc_chain
    flags, and the flag's message says exactly what the corrective turn then does."""
    runner = _runner(checked=True, spare_turns=1)
    for i, task in enumerate(tasks[:12]):
        trace = noisy_oracle_trace(runner, task, random.Random(i), kind=kind)
        traj, bad = trace.trajectory, trace.corrupted_turn
        texts, observed = _assistant_texts(traj), _observations(traj)[bad]
        assert trace.kind == kind and observed["ok"] is False, (kind, observed)
        if bad < task.data["k"]:
            step = task.data["expressions"][bad]
            assert observed["error"].endswith(f"; the next step is {step}")
            assert _expression(texts[bad + 1]) == step
        else:
            assert observed["error"] == "every step is done: give the final answer"
            assert texts[bad + 1] == format_final(task.answer)


def test_the_default_kinds_draw_every_flagged_kind(tasks: list[Task]) -> None:
    """``train.sft_noise_fraction`` draws from :data:`CORRUPTION_KINDS`: a recovery from
    each of the checked tool's flags (a wrong step, an unparseable call, a malformed
    expression, a misnamed key, a call after the last step) turns up, and a kind with weight 0
    never does."""
    flagged = {"operand_digit", "malformed_json", "bad_expression", "wrong_key", "extra_call"}
    assert {k for k, w in CORRUPTION_KINDS.items() if w > 0} == flagged
    runner = _runner(checked=True, spare_turns=1)
    drawn = {
        noisy_oracle_trace(runner, tasks[i % len(tasks)], random.Random(i)).kind for i in range(120)
    }
    assert drawn == flagged
