"""The ``shop`` environment: look up prices, then compute a total (two tools, several steps).

A task names a basket (``Buy 2 apple and 1 milk. Report the total price.``). The prices are
not in the prompt: the model must call ``price(item)`` once per item, read the results,
then call ``calculator(expression)`` with an expression built from them and answer with
the total. This exercises what ``calculator`` alone does not: two tools, a dependency of
one call's arguments on earlier results, and unknown-item errors returned to the model.

Prices are whole units (no currency rounding), so verification is exact.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from miniverl.environments.base import (
    Difficulty,
    OracleSolution,
    Task,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    ToolSpec,
    oracle_from_task,
)
from miniverl.environments.calculator import (
    CalculatorError,
    format_number,
    safe_evaluate,
    verify_number,
)
from miniverl.errors import ToolEnvironmentError
from miniverl.schemas.text import TOOL_PROTOCOL_HINT
from miniverl.schemas.trajectory import VerificationRecord

DEFAULT_PRICES: dict[str, int] = {
    "apple": 3,
    "bread": 5,
    "butter": 12,
    "cheese": 15,
    "egg": 2,
    "jam": 8,
    "milk": 4,
    "pasta": 6,
    "pear": 6,
    "rice": 7,
    "soap": 9,
    "tea": 11,
}
"""Unit prices of the default catalogue (whole units)."""

ITEMS_PER_DIFFICULTY: dict[str, int] = {"easy": 1, "medium": 2, "hard": 3}

SYSTEM_PROMPT = (
    "Use tools to solve the task.\n"
    "- price(item): the unit price of an item.\n"
    "- calculator(expression): evaluate arithmetic.\n"
    f"{TOOL_PROTOCOL_HINT}"
)


class ShopEnvironment(ToolEnvironment):
    """Shopping baskets: ``price`` per item, then one ``calculator`` call for the total.

    - easy: one item (``n * p``): two tool calls;
    - medium: two distinct items: three tool calls;
    - hard: three distinct items: four tool calls.

    ``prices`` (recipe ``environment.params.prices``) replaces the catalogue; item names
    must be lowercase words and prices non-negative integers.
    """

    name = "shop"
    task_prefix = "shop"
    supports_task_files = True

    def __init__(self, prices: Mapping[str, int] | None = None) -> None:
        catalogue = dict(DEFAULT_PRICES if prices is None else prices)
        if not catalogue:
            raise ToolEnvironmentError("shop: the price catalogue is empty")
        for item, value in catalogue.items():
            if not (isinstance(item, str) and item.isalpha() and item.islower()):
                raise ToolEnvironmentError(f"shop: item name {item!r} must be a lowercase word")
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ToolEnvironmentError(
                    f"shop: price of {item!r} must be a non-negative integer, got {value!r}"
                )
        self.prices = catalogue
        self._steps = 0

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec("price", "the unit price of an item", {"item": "string, e.g. 'apple'"}),
            ToolSpec(
                "calculator",
                "evaluate an arithmetic expression",
                {"expression": "string, e.g. '2 * 3 + 4'"},
            ),
        ]

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def sample_task(
        self, rng: random.Random, difficulty: Difficulty
    ) -> tuple[str, str, dict[str, Any]]:
        if difficulty not in ITEMS_PER_DIFFICULTY:
            raise ToolEnvironmentError(f"shop: unknown difficulty {difficulty!r}")
        count = min(ITEMS_PER_DIFFICULTY[difficulty], len(self.prices))
        items = rng.sample(sorted(self.prices), count)
        basket = [(item, rng.randint(1, 9)) for item in items]
        listing = " and ".join(f"{qty} {item}" for item, qty in basket)
        prompt = f"Buy {listing}. Report the total price."
        expression = " + ".join(f"{qty} * {self.prices[item]}" for item, qty in basket)
        answer = format_number(safe_evaluate(expression))
        return prompt, answer, {"basket": [[item, qty] for item, qty in basket]}

    def reset(self, task: Task) -> None:
        self._steps = 0

    def step(self, call: ToolCall) -> ToolResult:
        self._steps += 1
        state = f"shop:{self._steps}"
        expected = {"price": "item", "calculator": "expression"}
        if call.name not in expected:
            return ToolResult(
                ok=False,
                error=f"unknown tool {call.name!r}; available: price, calculator",
                env_state_id=state,
            )
        key = expected[call.name]
        extra = set(call.arguments) - {key}
        if extra:
            return ToolResult(
                ok=False,
                error=f"unexpected argument(s) {sorted(extra)}; {call.name} takes {key!r}",
                env_state_id=state,
            )
        value = call.arguments.get(key)
        if not isinstance(value, str):
            return ToolResult(
                ok=False, error=f"missing string argument {key!r}", env_state_id=state
            )
        if call.name == "price":
            item = value.strip().lower()
            if item not in self.prices:
                return ToolResult(
                    ok=False,
                    error=f"unknown item {value!r}; items: {', '.join(sorted(self.prices))}",
                    env_state_id=state,
                )
            return ToolResult(ok=True, result=str(self.prices[item]), env_state_id=state)
        try:
            return ToolResult(
                ok=True, result=format_number(safe_evaluate(value)), env_state_id=state
            )
        except CalculatorError as exc:
            return ToolResult(ok=False, error=str(exc), env_state_id=state)

    def verify(self, task: Task, answer: str) -> VerificationRecord:
        return verify_number(task.answer, answer)

    def oracle_solution(self, task: Task) -> OracleSolution:
        from_file = oracle_from_task(task)
        if from_file is not None:
            return from_file
        basket = task.data.get("basket")
        if not basket:
            raise ToolEnvironmentError(
                f"task {task.task_id} has no oracle solution (no basket and no 'oracle' in its task file)"
            )
        calls = [ToolCall("price", {"item": item}) for item, _ in basket]
        expression = " + ".join(f"{qty} * {self.prices[item]}" for item, qty in basket)
        calls.append(ToolCall("calculator", {"expression": expression}))
        return OracleSolution(tool_calls=tuple(calls), final_answer=task.answer)
