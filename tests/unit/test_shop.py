"""The ``shop`` environment: two tools, oracle solutions that solve, exact verification."""

from __future__ import annotations

import random

import pytest

from miniverl.environments.base import ToolCall, make_splits
from miniverl.environments.registry import available_environments, make_environment
from miniverl.environments.shop import DEFAULT_PRICES, ShopEnvironment
from miniverl.errors import ToolEnvironmentError


def _replay(env: ShopEnvironment, task) -> tuple[list[str], str]:
    """Run the oracle's calls through ``step`` and return the results and the final answer."""
    env.reset(task)
    oracle = env.oracle_solution(task)
    results = []
    for call in oracle.tool_calls:
        result = env.step(call)
        assert result.ok, result.error
        results.append(result.result)
    return results, oracle.final_answer


def test_registered_beside_calculator() -> None:
    assert {"calculator", "shop"} <= set(available_environments())
    assert isinstance(make_environment("shop"), ShopEnvironment)


@pytest.mark.parametrize(("difficulty", "items"), [("easy", 1), ("medium", 2), ("hard", 3)])
def test_oracle_is_multi_step_and_solves(difficulty: str, items: int) -> None:
    env = ShopEnvironment()
    tasks = make_splits(env, {"train": 20}, seed=3, difficulty=difficulty)["train"]
    for task in tasks:
        oracle = env.oracle_solution(task)
        names = [c.name for c in oracle.tool_calls]
        assert names == ["price"] * items + ["calculator"]
        results, final = _replay(env, task)
        prices = [DEFAULT_PRICES[c.arguments["item"]] for c in oracle.tool_calls[:-1]]
        assert results[:-1] == [str(p) for p in prices]
        expected = sum(qty * DEFAULT_PRICES[item] for item, qty in task.data["basket"])
        assert results[-1] == final == task.answer == str(expected)
        assert env.verify(task, final).solved
        assert not env.verify(task, str(expected + 1)).solved


def test_prices_are_only_reachable_through_the_tool() -> None:
    env = ShopEnvironment()
    (task,) = make_splits(env, {"train": 1}, seed=0, difficulty="medium")["train"]
    for item, _ in task.data["basket"]:
        assert str(DEFAULT_PRICES[item]) not in task.prompt.replace(item, "")
    assert "price(item)" in env.system_prompt() and "calculator(expression)" in env.system_prompt()


def test_bad_calls_are_readable_errors() -> None:
    env = ShopEnvironment(prices={"tea": 2, "jam": 3})
    assert (
        env.step(ToolCall("price", {"item": "gold"})).error
        == "unknown item 'gold'; items: jam, tea"
    )
    assert env.step(ToolCall("price", {"item": " Tea "})).result == "2"
    assert env.step(ToolCall("buy", {})).error == "unknown tool 'buy'; available: price, calculator"
    assert env.step(ToolCall("price", {"thing": "tea"})).error == (
        "unexpected argument(s) ['thing']; price takes 'item'"
    )
    assert env.step(ToolCall("calculator", {"expression": "1/0"})).error == "division by zero"
    assert env.step(ToolCall("calculator", {})).error == "missing string argument 'expression'"


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ({}, "shop: the price catalogue is empty"),
        ({"Tea": 1}, "shop: item name 'Tea' must be a lowercase word"),
        ({"tea": -1}, "shop: price of 'tea' must be a non-negative integer, got -1"),
        ({"tea": 1.5}, "shop: price of 'tea' must be a non-negative integer, got 1.5"),
    ],
)
def test_bad_catalogues(prices: dict, message: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        ShopEnvironment(prices=prices)
    assert str(info.value) == message


def test_custom_prices_change_answers() -> None:
    env = ShopEnvironment(prices={"tea": 10})
    prompt, answer, data = env.sample_task(random.Random(1), "easy")
    ((item, qty),) = data["basket"]
    assert item == "tea" and answer == str(10 * qty) and f"{qty} tea" in prompt


@pytest.mark.slow
def test_shop_trains_end_to_end_on_the_toy_backend(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from helpers import tiny_config
    from miniverl.training.recipe import OPDTrainer

    config = tiny_config(
        "environment.name=shop",
        "train.cycles=1",
        "rollout.max_turns=4",
        "eval.baseline=false",
        "eval.after_warmup=false",
    )
    trainer = OPDTrainer(config, output_dir=tmp_path / "run", quiet=True, progress=False)
    summary = trainer.train()
    assert summary["final"]["tasks"] == 2
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["environment"]["tools"] == ["price(item)", "calculator(expression)"]
    oracle = [
        json.loads(line)
        for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
        if '"source": "oracle"' in line
    ]
    assert oracle and all(t["verification"]["solved"] for t in oracle)
    calls = [turn["tool_call"]["name"] for turn in oracle[0]["turns"] if turn["tool_call"]]
    assert calls == ["price", "calculator"]
