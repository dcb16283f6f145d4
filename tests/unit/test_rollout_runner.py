"""``RolloutRunner`` driven by a scripted backend: every exit path, no re-tokenization."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import (
    ScriptedBackend,
    calculator,
    calculator_tasks,
    char_ids,
    final_text,
    make_runner,
    run_python,
    tool_call_text,
    toy_tokenizer,
)
from miniverl.agent.loop import RolloutRunner
from miniverl.agent.protocol import stop_sequences
from miniverl.config.models import RolloutConfig, SelectionConfig
from miniverl.environments.base import Task, make_splits
from miniverl.environments.registry import make_environment
from miniverl.schemas.text import ASSISTANT_HEADER, IM_END
from miniverl.schemas.trajectory import TerminationReason, Trajectory
from miniverl.selection.selectors import select_positions
from miniverl.trajectory.alignment import build_alignment_map
from miniverl.trajectory.masks import model_target_positions


@pytest.fixture(scope="module")
def task() -> Task:
    task = calculator_tasks(1, difficulty="easy")[0]
    assert task.data["expressions"] == ["6 - 3"] and task.answer == "3"
    return task


def _types(traj: Trajectory) -> list[str]:
    return [s.span_type.value for s in traj.spans]


def _ids(traj: Trajectory, span_type: str, index: int = 0) -> list[int]:
    span = traj.spans_of(span_type)[index]
    return traj.token_ids[span.start : span.end]


# -- final_answer --------------------------------------------------------------------------------


def test_final_answer_episode(task: Task) -> None:
    tok = toy_tokenizer()
    runner = make_runner([tool_call_text("6 - 3"), final_text("3")])
    traj = runner.rollout(task, seed=5)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER
    assert _types(traj) == [
        "system",
        "user",
        "assistant_tool_call",
        "tool_result",
        "assistant_final",
    ]
    assert _ids(traj, "assistant_tool_call") == tok.encode(tool_call_text("6 - 3"))
    assert _ids(traj, "assistant_final") == tok.encode(final_text("3"))
    assert traj.generated_token_count == sum(traj.model_generated_mask)
    assert traj.invalid_tool_calls == 0
    assert traj.verification is not None and traj.verification.solved
    assert traj.verification.failure_category == "solved"
    assert traj.trajectory_id == f"{task.task_id}:v0:s5"
    assert traj.metadata == {
        "source": "policy",
        "seed": 5,
        "temperature": 1.0,
        "policy_fingerprint": None,  # the scripted backend has no trainable parameters
        "difficulty": "easy",
        "split": "train",
    }
    call_span = traj.spans_of("assistant_tool_call")[0]
    assert (call_span.tool_name, call_span.tool_call_id, call_span.turn_id) == (
        "calculator",
        "c0",
        0,
    )
    obs = traj.spans_of("tool_result")[0]
    assert (obs.tool_call_id, obs.env_state_id) == ("c0", "calc:1")
    assert obs.text.startswith(IM_END + "\n") and obs.text.endswith(ASSISTANT_HEADER)
    assert '{"ok": true, "result": "3"}' in obs.text
    assert [t.turn_id for t in traj.turns] == [0, 1]
    assert traj.turns[0].tool_call.arguments == {"expression": "6 - 3"}
    assert traj.turns[0].tool_result.ok and traj.turns[0].tool_result.result == "3"
    assert traj.turns[1].is_final and traj.turns[1].tool_call is None
    assert traj.model_id == "toy-student" and traj.tokenizer_fingerprint == tok.fingerprint


def test_generate_receives_the_exact_prefix_and_limits(task: Task) -> None:
    config = RolloutConfig(max_new_tokens_per_turn=48, temperature=0.7)
    runner = make_runner([tool_call_text("6 - 3"), final_text("3")], config=config)
    traj = runner.rollout(task, seed=11)
    calls = runner.backend.calls
    assert len(calls) == 2
    call_span, final_span = (
        traj.spans_of("assistant_tool_call")[0],
        traj.spans_of("assistant_final")[0],
    )
    # Generation begins exactly at the first token of each model span.
    assert calls[0].prompt_ids == traj.token_ids[: call_span.start]
    assert calls[1].prompt_ids == traj.token_ids[: final_span.start]
    assert all(c.stop_sequences == stop_sequences() == ("</tool_call>", "</final>") for c in calls)
    assert [c.max_new_tokens for c in calls] == [48, 48]
    assert [(c.temperature, c.top_p) for c in calls] == [(0.7, 1.0), (0.7, 1.0)]
    assert calls[0].seed != calls[1].seed
    again = make_runner([tool_call_text("6 - 3"), final_text("3")], config=config)
    assert again.rollout(task, seed=11) == traj
    assert [c.seed for c in again.backend.calls] == [c.seed for c in calls]
    other = make_runner([tool_call_text("6 - 3"), final_text("3")], config=config)
    other.rollout(task, seed=12)
    assert other.backend.calls[0].seed != calls[0].seed


def test_ids_after_a_stop_sequence_are_never_sampled(task: Task) -> None:
    tok = toy_tokenizer()
    runner = make_runner([tool_call_text("6 - 3") + " trailing text", final_text("3") + "\nmore"])
    traj = runner.rollout(task, seed=0)
    assert _ids(traj, "assistant_tool_call") == tok.encode(tool_call_text("6 - 3"))
    assert _ids(traj, "assistant_final") == tok.encode(final_text("3"))


def test_wrong_final_answer_is_graded(task: Task) -> None:
    traj = make_runner([final_text("4")]).rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER
    assert traj.verification.failure_category == "wrong_answer" and not traj.solved
    assert _types(traj) == ["system", "user", "assistant_final"]


def test_rollout_options(task: Task) -> None:
    runner = make_runner([final_text("3")])
    traj = runner.rollout(
        task,
        seed=3,
        policy_version=7,
        temperature=0.0,
        trajectory_id="custom",
        extra_metadata={"cycle": 2},
    )
    assert (traj.trajectory_id, traj.policy_version) == ("custom", 7)
    assert traj.metadata["temperature"] == 0.0 and traj.metadata["cycle"] == 2
    assert runner.backend.calls[0].temperature == 0.0


# -- the other five termination reasons ------------------------------------------------------------


def test_max_turns(task: Task) -> None:
    runner = make_runner(
        [tool_call_text("6 - 3"), tool_call_text("3 + 0")], config=RolloutConfig(max_turns=2)
    )
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.MAX_TURNS
    assert traj.verification is None
    assert _types(traj) == [
        "system",
        "user",
        "assistant_tool_call",
        "tool_result",
        "assistant_tool_call",
        "tool_result",
    ]
    assert [t.tool_result.result for t in traj.turns] == ["3", "3"]
    assert len(runner.backend.calls) == 2


def test_max_tokens(task: Task) -> None:
    prompt_len = make_runner().oracle_rollout(task).spans_of("user")[0].end
    config = RolloutConfig(max_new_tokens_per_turn=64, max_total_tokens=prompt_len + 30)
    runner = make_runner([tool_call_text("6 - 3"), final_text("3")], config=config)
    traj = runner.rollout(task, seed=0)
    assert runner.backend.calls[0].max_new_tokens == 30  # min(per-turn, remaining total)
    assert len(runner.backend.calls) == 1  # no budget left for a second turn
    assert traj.termination_reason is TerminationReason.MAX_TOKENS
    assert traj.verification is None
    assert _types(traj) == ["system", "user", "assistant_tool_call", "tool_result"]


def test_budget_truncates_a_turn(task: Task) -> None:
    prompt_len = make_runner().oracle_rollout(task).spans_of("user")[0].end
    config = RolloutConfig(max_new_tokens_per_turn=64, max_total_tokens=prompt_len + 10)
    runner = make_runner([tool_call_text("6 - 3")], config=config)
    traj = runner.rollout(task, seed=0)
    assert traj.length == config.max_total_tokens
    assert _ids(traj, "assistant_text") == toy_tokenizer().encode(tool_call_text("6 - 3"))[:10]
    assert traj.termination_reason is TerminationReason.PARSE_ERROR_LIMIT
    assert (
        traj.turns[0].tool_call.parse_error
        == "unterminated <tool_call> block; close it with </tool_call>"
    )


NO_BLOCK = "no <tool_call> or <final> block found; call a tool or give the final answer"


@pytest.mark.parametrize("max_parse_errors", [0, 1])
def test_parse_error_limit_stops_on_first_error(task: Task, max_parse_errors: int) -> None:
    runner = make_runner(
        ["I am not sure what to do."], config=RolloutConfig(max_parse_errors=max_parse_errors)
    )
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.PARSE_ERROR_LIMIT
    assert _types(traj) == ["system", "user", "assistant_text"]
    assert traj.spans[-1].text == "I am not sure what to do."
    (turn,) = traj.turns
    assert turn.tool_call.name == "<unparsed>" and turn.tool_call.valid is False
    assert turn.tool_call.parse_error == NO_BLOCK and turn.tool_result is None
    assert traj.invalid_tool_calls == 1
    assert traj.critical_mask == [False] * traj.length
    assert sum(traj.model_generated_mask) == traj.spans[-1].length


def test_parse_error_limit_two_stops_on_second(task: Task) -> None:
    runner = make_runner(
        ["hmm", '<tool_call>{"name": 3}</tool_call>'], config=RolloutConfig(max_parse_errors=2)
    )
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.PARSE_ERROR_LIMIT
    assert _types(traj) == ["system", "user", "assistant_text", "tool_result", "assistant_text"]
    obs = traj.spans_of("tool_result")[0]
    assert json.dumps({"ok": False, "error": NO_BLOCK}) in obs.text
    assert [t.tool_call.parse_error for t in traj.turns] == [
        NO_BLOCK,
        'tool call needs a string "name"',
    ]
    assert traj.invalid_tool_calls == 2


@pytest.mark.parametrize(("max_repeated", "turns_taken"), [(0, 2), (1, 3), (2, 4)])
def test_repeated_call_limit(task: Task, max_repeated: int, turns_taken: int) -> None:
    config = RolloutConfig(max_turns=6, max_repeated_calls=max_repeated)
    runner = make_runner([], config=config, default=tool_call_text("6 - 3"))
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.REPEATED_CALL_LIMIT
    assert len(runner.backend.calls) == turns_taken
    assert len(traj.turns) == turns_taken
    assert traj.turns[-1].tool_result is None and traj.turns[-1].tool_call.name == "calculator"
    assert all(t.tool_result is not None for t in traj.turns[:-1])
    # The refused call is still recorded as a model span, but never executed.
    assert len(traj.spans_of("assistant_tool_call")) == turns_taken
    assert len(traj.spans_of("tool_result")) == turns_taken - 1


def test_eos_without_final(task: Task) -> None:
    tok = toy_tokenizer()
    ids = [*tok.encode("Let me think"), tok.eos_token_id, *tok.encode(" never sampled")]
    runner = make_runner([ids], config=RolloutConfig(max_parse_errors=3))
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.EOS_WITHOUT_FINAL
    sampled = [*tok.encode("Let me think"), tok.eos_token_id]
    assert _ids(traj, "assistant_text") == sampled  # the EOS id is kept verbatim
    assert traj.generated_token_count == len(sampled)
    assert traj.turns[0].tool_call.raw_text == "Let me think"  # ... but not in the text
    assert traj.invalid_tool_calls == 1


def test_zero_tokens_is_eos_without_final(task: Task) -> None:
    runner = make_runner([[]])
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.EOS_WITHOUT_FINAL
    assert _types(traj) == ["system", "user"]
    assert traj.generated_token_count == 0 and sum(traj.model_generated_mask) == 0
    assert [t.turn_id for t in traj.turns] == [0]


def test_invalid_tool_call_is_an_error_result(task: Task) -> None:
    call = '<tool_call>\n{"arguments": {"expression": "__import__(\'os\')"}, "name": "calculator"}\n</tool_call>'
    runner = make_runner(
        [call, '<tool_call>{"name": "search", "arguments": {}}</tool_call>', final_text("3")]
    )
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER
    assert traj.invalid_tool_calls == 2
    results = [t.tool_result for t in traj.turns[:2]]
    assert [r.ok for r in results] == [False, False]
    assert results[0].error == "unsupported syntax: Call; use numbers and + - * / // % ** ( )"
    assert results[1].error == "unknown tool 'search'; available: calculator"


# -- provenance of sampled ids --------------------------------------------------------------------


def test_non_canonical_ids_are_kept_verbatim(task: Task) -> None:
    tok = toy_tokenizer()
    call_ids = char_ids(
        tool_call_text("6 - 3")
    )  # '<', 't', 'o', ... instead of the <tool_call> piece
    final_ids = char_ids("<final>") + tok.encode("\n3\n</final>")
    assert call_ids != tok.encode(tool_call_text("6 - 3"))
    assert len(call_ids) > RolloutConfig().max_new_tokens_per_turn  # one id per character is long
    runner = make_runner([call_ids, final_ids], config=RolloutConfig(max_new_tokens_per_turn=128))
    traj = runner.rollout(task, seed=0)
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER and traj.solved
    assert _ids(traj, "assistant_tool_call") == call_ids
    assert _ids(traj, "assistant_final") == final_ids
    assert traj.spans_of("assistant_tool_call")[0].text == tool_call_text("6 - 3")
    assert traj.generated_token_count == len(call_ids) + len(final_ids)


def test_prose_before_a_block_is_assistant_text(task: Task) -> None:
    tok = toy_tokenizer()
    prose = "I will call the tool first.\n"
    runner = make_runner([prose + tool_call_text("6 - 3"), final_text("3")])
    traj = runner.rollout(task, seed=0)
    assert _types(traj) == [
        "system",
        "user",
        "assistant_text",
        "assistant_tool_call",
        "tool_result",
        "assistant_final",
    ]
    text_span, call_span = traj.spans[2], traj.spans[3]
    assert text_span.text == prose and call_span.text == tool_call_text("6 - 3")
    assert text_span.end == call_span.start
    assert traj.token_ids[call_span.start] == tok.token_to_id("<tool_call>")
    assert _ids(traj, "assistant_text") == tok.encode(prose)
    assert (text_span.turn_id, call_span.turn_id) == (0, 0)
    assert (text_span.segment_key, call_span.segment_key) == ("gen:0:prose", "gen:0:block")
    assert traj.model_generated_mask[text_span.start : call_span.end] == [True] * (
        call_span.end - text_span.start
    )
    assert traj.critical_mask[text_span.start : text_span.end] == [False] * text_span.length
    assert traj.critical_mask[call_span.start : call_span.end] == [True] * call_span.length


def test_prose_split_with_non_canonical_block_opener(task: Task) -> None:
    tok = toy_tokenizer()
    prose_ids = tok.encode("ok ")
    ids = prose_ids + char_ids("<final>") + tok.encode("3</final>")
    traj = make_runner([ids]).rollout(task, seed=0)
    assert _ids(traj, "assistant_text") == prose_ids
    assert _ids(traj, "assistant_final") == char_ids("<final>") + tok.encode("3</final>")
    assert traj.solved


# -- oracle rollouts ---------------------------------------------------------------------------


@pytest.mark.parametrize(("difficulty", "calls"), [("easy", 1), ("medium", 1), ("hard", 2)])
def test_oracle_rollout(difficulty: str, calls: int) -> None:
    tok = toy_tokenizer()
    env = calculator()
    for task in calculator_tasks(3, difficulty=difficulty):
        runner = make_runner(environment=env)
        traj = runner.oracle_rollout(task, policy_version=2)
        assert runner.backend.calls == []  # the oracle never samples
        assert traj.trajectory_id == f"{task.task_id}:oracle"
        assert traj.policy_version == 2
        assert traj.metadata == {"source": "oracle", "difficulty": difficulty, "split": "train"}
        assert _types(traj) == [
            "system",
            "user",
            *["assistant_tool_call", "tool_result"] * calls,
            "assistant_final",
        ]
        assert traj.solved and traj.termination_reason is TerminationReason.FINAL_ANSWER
        assert (
            traj.generated_token_count == sum(traj.model_generated_mask) == sum(traj.critical_mask)
        )
        for i, expression in enumerate(task.data["expressions"]):
            assert _ids(traj, "assistant_tool_call", i) == tok.encode(tool_call_text(expression))
        assert traj.turns[-1].is_final


def test_oracle_rollout_is_rendered_once_per_task_and_returned_as_a_private_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = calculator()
    tasks = calculator_tasks(3, difficulty="hard")
    fresh = [make_runner(environment=env).oracle_rollout(t) for t in tasks]
    runner = make_runner(environment=env)
    rendered: list[str] = []
    render = runner._render_oracle
    monkeypatch.setattr(
        runner, "_render_oracle", lambda task: rendered.append(task.task_id) or render(task)
    )
    for cycle in range(3):
        for task, expected in zip(tasks, fresh, strict=True):
            traj = runner.oracle_rollout(
                task, trajectory_id=f"{task.task_id}:oracle:c{cycle}", policy_version=cycle
            )
            assert traj.trajectory_id == f"{task.task_id}:oracle:c{cycle}"
            assert traj.policy_version == cycle
            assert traj.model_dump(exclude={"trajectory_id", "policy_version"}) == (
                expected.model_dump(exclude={"trajectory_id", "policy_version"})
            )
            traj.token_ids.append(0)
            traj.spans[0].metadata["edited"] = True
            traj.metadata["edited"] = True
            traj.turns.clear()
    assert rendered == [t.task_id for t in tasks]
    again = runner.oracle_rollout(tasks[0])
    assert again.trajectory_id == f"{tasks[0].task_id}:oracle" and again.policy_version == 0
    assert again == fresh[0]
    runner.environment = calculator()
    runner.oracle_rollout(tasks[0])
    assert rendered == [t.task_id for t in tasks] + [tasks[0].task_id]
    other = Task(**{**tasks[0].__dict__, "prompt": tasks[0].prompt + " "})
    assert runner.oracle_rollout(other).spans[1].text != again.spans[1].text


def test_the_system_prompt_is_tokenized_once_per_runner() -> None:
    env = calculator()
    tok = toy_tokenizer()
    encoded: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> object:
            return getattr(tok, name)

        def encode(self, text: str) -> list[int]:
            encoded.append(text)
            return tok.encode(text)

    counting = Counting()
    runner = RolloutRunner(make_runner().backend, env, RolloutConfig(), tokenizer=counting)  # type: ignore[arg-type]
    tasks = calculator_tasks(3, difficulty="hard")
    expected = [make_runner(environment=env).corrective_rollout(t, "malformed") for t in tasks]
    for _ in range(2):
        got = [runner.corrective_rollout(t, "malformed") for t in tasks]
        assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    system = [t for t in encoded if env.system_prompt() in t]
    assert len(system) == 1
    assert sum(1 for t in encoded if tasks[0].prompt in t) == 1


# -- docs/design.md §9: the runnable example -----------------------------------------------------------

DESIGN_EXAMPLE = """
from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RolloutConfig, RunConfig, SelectionConfig
from miniverl.environments.base import make_splits
from miniverl.environments.registry import make_environment
from miniverl.models.factory import build_student, build_tokenizer
from miniverl.selection.selectors import select_positions
from miniverl.trajectory.alignment import build_alignment_map

config = RunConfig.from_mapping(
    {
        "models": {
            "backend": "toy",
            "device": "cpu",
            "student": {"model_id": "toy-student", "lora": {"enabled": False}},
            "teacher": {"model_id": "toy-teacher"},
        },
        "environment": {"name": "calculator", "params": {"prompt_style": "compact"}},
    }
)

env = make_environment("calculator", prompt_style="compact")
splits = make_splits(env, counts={"train": 2, "eval": 1, "test": 0}, seed=7, difficulty="easy")
tokenizer = build_tokenizer(config)
student = build_student(config, tokenizer, device="cpu")
runner = RolloutRunner(backend=student, environment=env, config=RolloutConfig())

traj = runner.oracle_rollout(splits["train"][0])
print(traj.token_counts_by_span_type())

selection = select_positions(traj, SelectionConfig(), run_seed=1234)
alignment = build_alignment_map(traj, selection.positions, selection.weights)
print(alignment.num_positions, alignment.is_identity())
print(alignment.student_prediction_positions[0], alignment.target_token_ids[0])
"""


def _example_output() -> list[str]:
    """What §9 prints, computed with the scripted backend (the oracle never samples)."""
    env = make_environment("calculator", prompt_style="compact")
    splits = make_splits(env, counts={"train": 2, "eval": 1, "test": 0}, seed=7, difficulty="easy")
    runner = RolloutRunner(backend=ScriptedBackend([]), environment=env, config=RolloutConfig())
    traj = runner.oracle_rollout(splits["train"][0])
    selection = select_positions(traj, SelectionConfig(), run_seed=1234)
    alignment = build_alignment_map(traj, selection.positions, selection.weights)
    return [
        str(traj.token_counts_by_span_type()),
        f"{alignment.num_positions} {alignment.is_identity()}",
        f"{alignment.student_prediction_positions[0]} {alignment.target_token_ids[0]}",
    ]


def _check_example(traj: Trajectory, alignment, printed: list[str] | None = None) -> None:  # type: ignore[no-untyped-def]
    tok = toy_tokenizer()
    counts = traj.token_counts_by_span_type()
    assert list(counts) == [
        "system",
        "user",
        "assistant_tool_call",
        "tool_result",
        "assistant_final",
    ]
    first_model = traj.model_token_positions()[0]
    user = traj.spans_of("user")[0]
    assert first_model == user.end and user.text.endswith(ASSISTANT_HEADER)
    assert traj.token_ids[first_model] == tok.token_to_id("<tool_call>")
    n_model = sum(traj.model_generated_mask)
    assert n_model == counts["assistant_tool_call"] + counts["assistant_final"]
    assert alignment.num_positions == n_model
    assert alignment.is_identity()
    assert alignment.student_prediction_positions[0] == first_model - 1
    assert alignment.target_token_ids[0] == tok.token_to_id("<tool_call>")
    if printed is not None:
        assert printed == [
            str(counts),
            f"{n_model} True",
            f"{first_model - 1} {tok.token_to_id('<tool_call>')}",
        ]


def test_design_example_with_scripted_backend() -> None:
    """§9 with the one line that needs a real model replaced by the scripted backend."""
    env = make_environment("calculator", prompt_style="compact")
    splits = make_splits(env, counts={"train": 2, "eval": 1, "test": 0}, seed=7, difficulty="easy")
    runner = RolloutRunner(backend=ScriptedBackend([]), environment=env, config=RolloutConfig())
    traj = runner.oracle_rollout(splits["train"][0])
    selection = select_positions(traj, SelectionConfig(), run_seed=1234)
    alignment = build_alignment_map(traj, selection.positions, selection.weights)
    _check_example(traj, alignment, _example_output())
    assert model_target_positions(traj.model_generated_mask) == selection.positions


def test_design_example_verbatim() -> None:
    """§9 exactly as documented, in a fresh process; it must print what the adapted run computes."""
    if importlib.util.find_spec("miniverl.models.factory") is None:
        pytest.skip("miniverl.models.factory (build_student/build_tokenizer) does not exist yet")
    proc = run_python(DESIGN_EXAMPLE, timeout=300)
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.strip().splitlines()
    expected = _example_output()
    assert printed == expected


# -- the scripted backend itself is honest ----------------------------------------------------------


@pytest.mark.parametrize(
    ("planned", "max_new_tokens"),
    [
        (tool_call_text("6 - 3") + " trailing", 64),
        (final_text("3") + "<final>x</final>", 64),
        ("no block at all", 64),
        ("no block at all", 3),
        (tool_call_text("6 - 3"), 5),
        ("a</final>b</tool_call>", 64),
    ],
)
def test_scripted_backend_matches_run_generation(planned: str, max_new_tokens: int) -> None:
    """Replaying ids through ``run_generation`` (greedy on one-hot logits) gives the same result."""
    torch = pytest.importorskip("torch")
    from miniverl.models.sampling import run_generation

    tok = toy_tokenizer()
    for ids in (
        tok.encode(planned),
        [*tok.encode(planned[:4]), tok.eos_token_id, *tok.encode("zz")],
    ):
        plan = [*ids, tok.eos_token_id]
        queue = list(plan)

        def step(input_ids, cache, queue=queue):  # type: ignore[no-untyped-def]
            logits = torch.zeros(tok.vocab_size)
            logits[queue.pop(0)] = 1.0
            return logits, cache

        real = run_generation(
            step,
            [1, 2],
            tokenizer=tok,
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            stop_sequences=stop_sequences(),
            eos_token_id=tok.eos_token_id,
        )
        backend = ScriptedBackend([plan])
        scripted = backend.generate(
            [1, 2],
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            top_p=1.0,
            seed=0,
            stop_sequences=stop_sequences(),
        )
        assert scripted == real
