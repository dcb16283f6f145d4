"""The ``calc_chain`` environment: task space, deterministic disjoint splits, oracle, tool, budgets."""

from __future__ import annotations

import json
import random

import pytest

from helpers import REPO_ROOT, ScriptedBackend, run_python, toy_tokenizer
from miniverl.agent.loop import RolloutRunner
from miniverl.agent.protocol import format_final, format_observation, format_tool_call
from miniverl.config.models import RolloutConfig, RunConfig
from miniverl.environments import calc_chain
from miniverl.environments.base import (
    SPLITS,
    Task,
    ToolCall,
    ToolResult,
    make_splits,
    sample_extra_tasks,
)
from miniverl.environments.calc_chain import (
    PARTITIONS,
    CalcChainEnvironment,
    all_steps,
    generate_tasks,
    parse_prompt,
    partition_of,
    prompt_space_size,
    render_prompt,
    solve_chain,
    step_phrase,
)
from miniverl.environments.registry import available_environments, make_environment
from miniverl.errors import ConfigError, ToolEnvironmentError

COUNTS = {"train": 60, "eval": 30, "test": 3600}


def chain_env(**params: object) -> CalcChainEnvironment:
    env = make_environment("calc_chain", **params)
    assert isinstance(env, CalcChainEnvironment)
    return env


@pytest.fixture(scope="module")
def splits() -> dict[str, list[Task]]:
    return make_splits(chain_env(), COUNTS, seed=7, difficulty="mixed")


def _k(task: Task) -> int:
    return int(task.data["k"])


# -- the task space ------------------------------------------------------------------------------


def test_registered_beside_calculator() -> None:
    assert {"calculator", "calc_chain"} <= set(available_environments())
    env = chain_env()
    assert env.describe() == {
        "name": "calc_chain",
        "tools": ["calculator(expression)"],
        "chain_lengths": {"train": [1, 2, 3], "eval": [1, 2, 3], "test": [1, 2, 3, 4, 5, 6]},
        "spare_turns": 2,
        "max_turn_budget": 9,
    }


def test_step_phrases_are_distinct_and_cannot_contain_the_separator() -> None:
    steps = all_steps()
    phrases = [step_phrase(s) for s in steps]
    assert len(steps) == 98 + 98 + 8 == len(set(phrases))
    assert {op for op, _ in steps} == {"add", "subtract", "multiply"}
    assert {y for op, y in steps if op != "multiply"} == set(range(2, 100))
    assert {m for op, m in steps if op == "multiply"} == set(range(2, 10))
    assert not any(", then " in p or ". " in p for p in phrases)


def test_every_k1_prompt_counted_by_enumeration() -> None:
    prompts = {render_prompt(x0, (s,)) for x0 in range(2, 100) for s in all_steps()}
    assert len(prompts) == prompt_space_size(1) == 19_992


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_more_than_a_million_prompts_for_k_at_least_2(k: int) -> None:
    # Distinct by unique decoding: 98 start values x 204 distinct step phrases per step, joined
    # by a separator no phrase contains (previous test); parse_prompt inverts render_prompt.
    assert prompt_space_size(k) == 98 * 204**k > 10**6
    rng = random.Random(k)
    for _ in range(200):
        start = rng.randint(2, 99)
        steps = tuple(rng.choice(all_steps()) for _ in range(k))
        assert parse_prompt(render_prompt(start, steps)) == (start, steps)


def test_parse_prompt_refuses_other_text() -> None:
    with pytest.raises(ValueError, match="not a calc_chain prompt"):
        parse_prompt("Compute 3 + 4 and report the value.")
    with pytest.raises(ValueError, match="not a calc_chain step: 'divide by 3'"):
        parse_prompt("Start with 5. Then divide by 3. Report the final value.")


# -- splits ----------------------------------------------------------------------------------------


def test_split_sizes_lengths_and_ids(splits: dict[str, list[Task]]) -> None:
    assert {s: len(v) for s, v in splits.items()} == COUNTS
    for split in SPLITS:
        assert [t.task_id for t in splits[split]] == [
            f"chain-{split}-{i}" for i in range(COUNTS[split])
        ]
        assert all(t.split == split for t in splits[split])
    assert {_k(t) for t in splits["train"]} == {_k(t) for t in splits["eval"]} == {1, 2, 3}
    per_k = {k: sum(_k(t) == k for t in splits["test"]) for k in range(1, 7)}
    assert per_k == {k: 600 for k in range(1, 7)}
    assert [t.difficulty for t in splits["test"][:6]] == [
        "easy", "medium", "medium", "hard", "hard", "hard"
    ]  # fmt: skip


def test_splits_are_disjoint_by_partition_for_every_seed(splits: dict[str, list[Task]]) -> None:
    other = make_splits(
        chain_env(), {"train": 60, "eval": 30, "test": 600}, seed=8, difficulty="mixed"
    )
    for tasks in (splits, other):
        for split in SPLITS:
            prompts = [t.prompt for t in tasks[split]]
            assert len(prompts) == len(set(prompts))
            # The proof: a prompt's split is a function of its text alone, whatever the seed.
            assert {partition_of(p) for p in prompts} == {split}
    for a in SPLITS:
        for b in SPLITS:
            if a != b:
                assert not {t.prompt for t in splits[a]} & {t.prompt for t in other[b]}
    assert {t.prompt for t in splits["test"]} != {t.prompt for t in other["test"]}


def test_partition_sizes_match_their_share_of_the_k1_space() -> None:
    prompts = [render_prompt(x0, (s,)) for x0 in range(2, 100) for s in all_steps()]
    shares = {name: 0 for name in PARTITIONS}
    for p in prompts:
        shares[partition_of(p)] += 1
    for name, (lo, hi) in PARTITIONS.items():
        assert abs(shares[name] / len(prompts) - (hi - lo) / 100) < 0.01


def test_tasks_depend_only_on_seed_split_and_index(splits: dict[str, list[Task]]) -> None:
    env = chain_env()
    again = make_splits(env, {"train": 60, "eval": 30, "test": 120}, seed=7, difficulty="mixed")
    assert again["train"] == splits["train"] and again["eval"] == splits["eval"]
    assert (
        again["test"] == splits["test"][:120] == generate_tasks("test", 120, 7, env.ks_of("test"))
    )
    alone = make_splits(env, {"eval": 30}, seed=7, difficulty="mixed")
    assert alone["eval"] == splits["eval"] and alone["train"] == alone["test"] == []
    assert make_splits(env, {"eval": 30}, seed=6, difficulty="mixed")["eval"] != splits["eval"]


def test_generation_ignores_the_hash_seed() -> None:
    code = (
        "from miniverl.environments.calc_chain import generate_tasks\n"
        "print([t.prompt for t in generate_tasks('test', 12, 7, (1, 2, 3, 4, 5, 6))])"
    )
    outputs = {run_python(code, hash_seed=h).stdout for h in ("0", "4242")}
    assert len(outputs) == 1
    expected = [t.prompt for t in generate_tasks("test", 12, 7, (1, 2, 3, 4, 5, 6))]
    assert outputs.pop().strip() == repr(expected)


def test_teacher_pool_comes_from_the_train_partition(splits: dict[str, list[Task]]) -> None:
    env = chain_env()
    everything = [t for split in SPLITS for t in splits[split]]
    pool = sample_extra_tasks(env, 200, seed=99, difficulty="mixed", exclude=everything)
    assert [t.task_id for t in pool[:2]] == ["chain-teacher_pool-0", "chain-teacher_pool-1"]
    assert {partition_of(t.prompt) for t in pool} == {"train"}
    assert {_k(t) for t in pool} == {1, 2, 3}
    assert not {t.prompt for t in pool} & {t.prompt for t in everything}
    assert len({t.prompt for t in pool}) == 200
    first = generate_tasks("teacher_pool", 3, 99, (1, 2, 3))
    assert first == pool[:3]
    shifted = generate_tasks("teacher_pool", 3, 99, (1, 2, 3), exclude={first[0].prompt})
    assert shifted[0].prompt != first[0].prompt and shifted[1:] == first[1:]


def test_split_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        make_splits(chain_env(), {"train": 1}, seed=0, difficulty="easy")
    assert (
        str(info.value) == "calc_chain sets chain lengths per split, not a difficulty (got 'easy')"
    )
    assert "environment.difficulty: mixed" in (info.value.hint or "")
    monkeypatch.setattr(calc_chain, "MAX_ATTEMPTS_PER_TASK", 3)
    with pytest.raises(ToolEnvironmentError) as info:
        make_splits(chain_env(test_k=[1]), {"test": 50}, seed=0, difficulty="mixed")
    assert str(info.value).startswith(
        "calc_chain: no new test task of length k=1 in 3 draws (task "
    )
    assert "k = 1 has only 19992 distinct prompts" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"train_k": [0, 1]}, "calc_chain: train_k must be a non-empty list of chain lengths in 1..6, got [0, 1]"),
        ({"test_k": [7]}, "calc_chain: test_k must be a non-empty list of chain lengths in 1..6, got [7]"),
        ({"eval_k": []}, "calc_chain: eval_k must be a non-empty list of chain lengths in 1..6, got []"),
        ({"eval_k": ["2"]}, "calc_chain: eval_k must be a non-empty list of chain lengths in 1..6, got ['2']"),
        ({"spare_turns": -1}, "calc_chain: spare_turns must be a non-negative integer, got -1"),
        ({"checked": "yes"}, "calc_chain: checked must be true or false, got 'yes'"),
        ({"prompt_style": "tiny"}, "calc_chain: prompt_style must be one of full, compact, got 'tiny'"),
    ],
)  # fmt: skip
def test_bad_params(params: dict, message: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        make_environment("calc_chain", **params)
    assert str(info.value) == message


# -- oracle ------------------------------------------------------------------------------------------


def test_oracle_solves_every_task(splits: dict[str, list[Task]]) -> None:
    env = chain_env()
    for task in [t for split in SPLITS for t in splits[split]]:
        oracle = env.oracle_solution(task)
        assert len(oracle.tool_calls) == _k(task)
        env.reset(task)
        results = [env.step(call) for call in oracle.tool_calls]
        assert all(r.ok for r in results)
        values = [r.result.rsplit(" = ", 1)[1] for r in results]
        assert values == [str(v) for v in task.data["results"]]
        # Every call after the first starts from the previous tool result.
        for call, previous in zip(oracle.tool_calls[1:], values, strict=False):
            assert call.arguments["expression"].startswith(f"{previous} ")
        assert values[-1] == task.answer == oracle.final_answer
        assert env.verify(task, oracle.final_answer).solved


def test_oracle_matches_independent_arithmetic(splits: dict[str, list[Task]]) -> None:
    for task in splits["test"][:300]:
        start, steps = parse_prompt(task.prompt)
        value = start
        for op, y in steps:
            value = value + y if op == "add" else value - y if op == "subtract" else value * y
        assert str(value) == task.answer
        assert solve_chain(start, steps)[1][-1] == value


def test_oracle_rollouts_solve_and_fit_the_recipe_budget(splits: dict[str, list[Task]]) -> None:
    """The recipe's token bounds hold a k-step oracle episode plus two worst-case spare turns."""
    recipe = RunConfig.from_yaml(REPO_ROOT / "recipes" / "toy_calc_chain.yaml").rollout
    tok = toy_tokenizer()
    # No reachable value exceeds 99 * 9**6 in magnitude (the multiplier grows fastest).
    worst = ToolCall("calculator", {"expression": f"-{99 * 9**6} * 99"})
    worst_call = len(tok.encode(format_tool_call(worst)))
    worst_result = ToolResult(ok=True, result=f"-{99 * 9**6} * 99 = -{99 * 9**6 * 99}")
    worst_body = len(tok.encode(format_observation(worst_result.observation_text())))
    assert worst_call <= recipe.max_new_tokens_per_turn
    runner = RolloutRunner(ScriptedBackend([]), chain_env(), recipe)
    k6 = [t for t in splits["test"] if _k(t) == 6][:100]
    for task in k6 + splits["train"][:12]:
        traj = runner.oracle_rollout(task)
        assert traj.solved and len(traj.turns) == _k(task) + 1
        # An observation span is its body plus the chat markers around it.
        span, result = traj.spans_of("tool_result")[0], traj.turns[0].tool_result
        markers = span.length - len(
            tok.encode(
                format_observation(ToolResult(ok=True, result=result.result).observation_text())
            )
        )
        spare = 2 * (worst_call + worst_body + markers)
        assert len(traj.token_ids) + spare <= recipe.max_total_tokens


def test_toy_tokenizer_encodes_every_calc_chain_text(splits: dict[str, list[Task]]) -> None:
    tok = toy_tokenizer()
    # Every character any calc_chain text can contain (templates, digits, signs, JSON) is a piece.
    alphabet = set(render_prompt(99, tuple(all_steps()))) | set("0123456789-+*= ")
    alphabet |= set(chain_env().system_prompt()) | set(
        format_tool_call(ToolCall("calculator", {"expression": "-1 * 2"}))
    )
    alphabet |= set(ToolResult(ok=True, result="-1 * 2 = -2").observation_text())
    assert all(c.isascii() and (c.isprintable() or c == "\n") for c in alphabet)
    for c in alphabet:
        assert tok.decode([tok.token_to_id(c)]) == c
    for task in splits["test"][:600] + splits["train"]:
        for text in (task.prompt, format_final(task.answer), *task.data["expressions"]):
            ids = tok.encode(text)
            assert tok.decode(ids) == text
            assert not any(tok.id_to_token(i).startswith("<0x") for i in ids)  # no byte fallback


# -- the tool ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("57 + 23", "57 + 23 = 80"),
        ("80*4", "80 * 4 = 320"),
        (" -94 * 3 ", "-94 * 3 = -282"),
        ("5 - 99", "5 - 99 = -94"),
        ("57 - -3", "57 - -3 = 60"),
    ],
)
def test_the_tool_echoes_the_evaluated_expression(expression: str, result: str) -> None:
    env = chain_env()
    assert env.step(ToolCall("calculator", {"expression": expression})) == ToolResult(
        ok=True, result=result, env_state_id="chain:1"
    )


ONE_STEP = "one step per call: 'a + b', 'a - b' or 'a * b' with integers (e.g. '80 * 4'), got "


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (ToolCall("calculator", {"expression": "(57 + 23) * 4"}), ONE_STEP + "'(57 + 23) * 4'"),
        (ToolCall("calculator", {"expression": "57 + 23 + 4"}), ONE_STEP + "'57 + 23 + 4'"),
        (ToolCall("calculator", {"expression": "80 / 4"}), ONE_STEP + "'80 / 4'"),
        (ToolCall("calculator", {"expression": "add 23"}), ONE_STEP + "'add 23'"),
        (ToolCall("calculator", {"expression": "1.5 * 2"}), ONE_STEP + "'1.5 * 2'"),
        (ToolCall("calculator", {"expression": "1" * 13 + " + 1"}), ONE_STEP + "'1111111111111 + 1'"),
        (ToolCall("calculator", {"expression": "9" * 50}), ONE_STEP + repr("9" * 40 + "...")),
        (ToolCall("python", {"expression": "1 + 1"}), "unknown tool 'python'; available: calculator"),
        (ToolCall("calculator", {}), "missing string argument 'expression'"),
        (ToolCall("calculator", {"expression": 3}), "missing string argument 'expression'"),
        (ToolCall("calculator", {"expression": "1 + 1", "x": 1}), "unexpected argument(s) ['x']; calculator takes 'expression'"),
    ],
)  # fmt: skip
def test_calls_the_tool_cannot_do_are_readable_errors(call: ToolCall, error: str) -> None:
    result = chain_env().step(call)
    assert (result.ok, result.error) == (False, error)
    assert json.loads(result.observation_text()) == {"ok": False, "error": error}


def test_state_ids_count_steps_and_reset() -> None:
    env = chain_env()
    task = generate_tasks("train", 1, 0, (2,))[0]
    env.reset(task)
    assert env.step(ToolCall("calculator", {"expression": "1 + 1"})).env_state_id == "chain:1"
    assert env.step(ToolCall("nope")).env_state_id == "chain:2"
    env.reset(task)
    assert env.step(ToolCall("calculator", {"expression": "2 * 3"})).env_state_id == "chain:1"


@pytest.mark.parametrize(
    ("answer", "solved", "category"),
    [("320", True, "solved"), (" 320 ", True, "solved"), ("324", False, "wrong_answer"),
     ("80 * 4 = 320", False, "unparseable_answer"), ("", False, "empty_answer")],
)  # fmt: skip
def test_verify(answer: str, solved: bool, category: str) -> None:
    task = Task(task_id="t", prompt="p", answer="320", difficulty="easy")
    record = chain_env().verify(task, answer)
    assert (record.solved, record.failure_category) == (solved, category)


def test_privileged_context_and_sample_task() -> None:
    env = chain_env()
    task = generate_tasks("train", 3, 0, (3,))[2]
    hint = env.privileged_context(task)
    assert all(e in hint for e in task.data["expressions"]) and task.answer in hint
    for difficulty, ks in (("easy", {1}), ("medium", {2, 3}), ("hard", {4, 5, 6})):
        prompt, answer, data = env.sample_task(random.Random(1), difficulty)
        assert data["k"] in ks and parse_prompt(prompt)[1] and answer == str(data["results"][-1])
    with pytest.raises(ToolEnvironmentError, match="unknown difficulty 'extreme'"):
        env.sample_task(random.Random(1), "extreme")  # type: ignore[arg-type]


# -- turn budget -------------------------------------------------------------------------------------


def test_turn_budget_is_k_plus_one_plus_spare(splits: dict[str, list[Task]]) -> None:
    env = chain_env()
    assert {env.turn_budget(t) - _k(t) for t in splits["test"]} == {3}
    assert chain_env(spare_turns=0).turn_budget(splits["test"][5]) == 6 + 1
    assert env.max_turn_budget() == 9
    assert chain_env(test_k=[1, 2], spare_turns=1).max_turn_budget() == 3 + 1 + 1


def test_runner_refuses_a_max_turns_below_the_budget() -> None:
    with pytest.raises(ConfigError) as info:
        RolloutRunner(ScriptedBackend([]), chain_env(), RolloutConfig(max_turns=8))
    assert str(info.value) == (
        "rollout.max_turns=8 is below the 9 turns environment 'calc_chain' allows its longest tasks"
    )
    assert info.value.hint == "set rollout.max_turns: 9"
    RolloutRunner(ScriptedBackend([]), chain_env(test_k=[1, 2, 3]), RolloutConfig(max_turns=6))


def test_validate_refuses_a_max_turns_below_the_budget() -> None:
    from typer.testing import CliRunner

    from miniverl.cli.main import app

    recipe = str(REPO_ROOT / "recipes" / "toy_calc_chain.yaml")
    bad = CliRunner().invoke(app, ["validate", recipe, "rollout.max_turns=8", "-q"])
    assert bad.exit_code == 1
    assert "rollout.max_turns=8 is below the 9 turns environment 'calc_chain'" in bad.stderr
    assert "hint: set rollout.max_turns: 9" in bad.stderr
    good = CliRunner().invoke(app, ["validate", recipe, "-q"])
    assert good.exit_code == 0, good.stderr


# -- checked: every error is flagged with the next step ------------------------------------------


def _call(expression: str) -> ToolCall:
    return ToolCall("calculator", {"expression": expression})


def test_checked_answers_only_the_next_step_and_names_it_otherwise(
    splits: dict[str, list[Task]],
) -> None:
    task = next(t for t in splits["train"] if _k(t) == 3)
    e, r = task.data["expressions"], task.data["results"]
    env = chain_env(checked=True)
    env.reset(task)
    wrong = env.step(_call(e[1]))  # a skipped step
    assert (wrong.ok, wrong.error) == (False, f"wrong step; the next step is {e[0]}")
    assert env.step(_call(e[0])).result == f"{e[0]} = {r[0]}"
    assert env.step(_call(e[0])).error == f"wrong step; the next step is {e[1]}"  # a repeat
    miscopy = e[1].replace(str(r[0]), str(r[0] + 1), 1)
    assert env.step(_call(miscopy)).error == f"wrong step; the next step is {e[1]}"
    malformed = env.step(_call("12 +"))
    assert malformed.error.endswith(f"got '12 +'; the next step is {e[1]}")
    assert env.step(ToolCall("calc", {"expression": e[1]})).error.endswith(
        f"; the next step is {e[1]}"
    )
    assert env.parse_error("tool call is not valid JSON").error == (
        f"tool call is not valid JSON; the next step is {e[1]}"
    )
    assert env.step(_call(e[1])).ok and env.step(_call(e[2])).ok
    done = env.step(_call(e[2]))
    assert (done.ok, done.error) == (False, "every step is done: give the final answer")
    env.reset(task)
    assert env.step(_call(e[0])).ok  # reset starts the chain again


def test_unchecked_answers_any_step_and_parse_errors_stay_the_parsers(
    splits: dict[str, list[Task]],
) -> None:
    task = next(t for t in splits["train"] if _k(t) == 3)
    env = chain_env()
    env.reset(task)
    assert env.step(_call(task.data["expressions"][1])).ok
    assert env.parse_error("no block").error == "no block"
    assert "refused" not in env.system_prompt()
    assert (
        "A wrong step is refused, and the error names the next step."
        in chain_env(checked=True).system_prompt()
    )


def test_checked_oracle_traces_carry_no_flag_and_a_student_error_is_flagged_in_the_transcript(
    splits: dict[str, list[Task]],
) -> None:
    recipe = RunConfig.from_yaml(REPO_ROOT / "recipes" / "toy_calc_chain.yaml").rollout
    env = chain_env(checked=True)
    runner = RolloutRunner(ScriptedBackend([]), env, recipe)
    for task in splits["train"][:30]:
        traj = runner.oracle_rollout(task)
        assert traj.solved and all(t.tool_result.ok for t in traj.turns if t.tool_result)
    task = next(t for t in splits["train"] if _k(t) == 2)
    e = task.data["expressions"]
    script = [format_tool_call(_call("5 + 5")), "<tool_call>{oops", format_tool_call(_call(e[0]))]
    script += [format_tool_call(_call(e[1])), format_final(task.answer)]
    student = RolloutRunner(ScriptedBackend(script), env, recipe).rollout(task, seed=0)
    text = toy_tokenizer().decode(student.token_ids)
    assert text.count(f"the next step is {e[0]}") == 2  # the wrong call and the broken block
    assert student.solved
