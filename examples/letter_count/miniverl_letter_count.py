"""A complete example plugin environment for miniverl: count letters with a tool.

Tasks ask how often a letter occurs in a word ("How many times does the letter r appear
in strawberry?"). The one tool, ``count(text, letter)``, returns the count; the model must
call it and answer with the number (hard tasks: two words, two calls, the sum). It is the
worked example of docs/environments.md: every method of the ``ToolEnvironment`` contract,
task-file support, and an entry point in ``pyproject.toml``.

Use it without installing (``module:Class``)::

    PYTHONPATH=examples/letter_count miniverl train examples/letter_count/recipe.yaml

or install it (``pip install ./examples/letter_count``) and name the entry point,
``environment.name: letter_count``.
"""

from __future__ import annotations

import random
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
from miniverl.schemas.trajectory import VerificationRecord

WORDS: dict[str, tuple[str, ...]] = {
    "easy": ("apple", "banana", "cherry", "lemon", "mango", "melon", "onion", "pepper", "tomato"),
    "medium": ("strawberry", "raspberry", "blueberry", "pineapple", "watermelon", "tangerine"),
}
SYSTEM_PROMPT = (
    "Use tools to solve the task.\n"
    "- count(text, letter): how many times letter occurs in text.\n"
    'Call a tool: <tool_call>{"arguments": {...}, "name": ...}</tool_call>\n'
    "Answer: <final>value</final>"
)


class LetterCountEnvironment(ToolEnvironment):
    """Letter counting with one ``count`` tool; exact integer verification."""

    name = "letter_count"
    task_prefix = "letters"
    supports_task_files = True

    def __init__(self, max_text_chars: int = 64) -> None:
        self.max_text_chars = max_text_chars
        self._steps = 0

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                "count",
                "how many times a letter occurs in a text",
                {"text": "string", "letter": "one character"},
            )
        ]

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def sample_task(
        self, rng: random.Random, difficulty: Difficulty
    ) -> tuple[str, str, dict[str, Any]]:
        if difficulty == "hard":
            words = rng.sample(WORDS["medium"], 2)
            letter = rng.choice(sorted(set(words[0]) & set(words[1])) or sorted(set(words[0])))
            total = sum(w.count(letter) for w in words)
            prompt = f"How many times does the letter {letter} appear in {words[0]} and {words[1]} together?"
            return prompt, str(total), {"words": words, "letter": letter}
        word = rng.choice(WORDS[difficulty])
        letter = rng.choice(sorted(set(word)))
        prompt = f"How many times does the letter {letter} appear in {word}?"
        return prompt, str(word.count(letter)), {"words": [word], "letter": letter}

    def reset(self, task: Task) -> None:
        self._steps = 0

    def step(self, call: ToolCall) -> ToolResult:
        self._steps += 1
        state = f"letters:{self._steps}"
        if call.name != "count":
            return ToolResult(
                False, error=f"unknown tool {call.name!r}; available: count", env_state_id=state
            )
        text, letter = call.arguments.get("text"), call.arguments.get("letter")
        if (
            set(call.arguments) != {"text", "letter"}
            or not isinstance(text, str)
            or not isinstance(letter, str)
        ):
            return ToolResult(
                False, error="count takes string arguments 'text' and 'letter'", env_state_id=state
            )
        if len(letter) != 1:
            return ToolResult(
                False, error="letter must be exactly one character", env_state_id=state
            )
        if len(text) > self.max_text_chars:
            return ToolResult(
                False,
                error=f"text longer than {self.max_text_chars} characters",
                env_state_id=state,
            )
        return ToolResult(True, result=str(text.count(letter)), env_state_id=state)

    def verify(self, task: Task, answer: str) -> VerificationRecord:
        predicted = answer.strip()
        if not predicted:
            category = "empty_answer"
        elif not predicted.isdigit():
            category = "unparseable_answer"
        else:
            category = "solved" if int(predicted) == int(task.answer) else "wrong_answer"
        solved = category == "solved"
        return VerificationRecord(
            solved=solved,
            reward=1.0 if solved else 0.0,
            predicted=predicted,
            expected=task.answer,
            failure_category=category,
        )

    def oracle_solution(self, task: Task) -> OracleSolution:
        from_file = oracle_from_task(task)
        if from_file is not None:
            return from_file
        letter = task.data["letter"]
        calls = tuple(ToolCall("count", {"text": w, "letter": letter}) for w in task.data["words"])
        return OracleSolution(tool_calls=calls, final_answer=task.answer)
