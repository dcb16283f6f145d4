"""Noise-injected oracle traces: teach the toy teacher to recover from a mistake it never makes.

A teacher fitted only on oracle traces has only seen states on the oracle's path. A student's
rollouts leave that path (a miscopied number, a broken call), and on-policy distillation asks
the teacher what to do *there*. So a fraction ``noise_fraction`` of the fitting traces get one
tool-call step corrupted:

- ``operand_digit``: one digit of one number in the call's arguments changed (for calc_chain
  the copied previous result or the copied operand), a valid call the tool evaluates;
- ``malformed_json``: the call's JSON cut short (its closing brace dropped), a parse error;
- ``bad_expression``: the last number of the expression dropped (``"81 *"``), a call the tool
  refuses with its readable error.

The episode is then *played through the real rollout loop* (:class:`RolloutRunner` with a
replaying policy), so the corrupted step gets the environment's real response (calc_chain
echoes the wrong expression and its value; a parse error or tool error is the text a student
would see), and the oracle continues with its corrective re-call of the same step and the rest
of the chain (:func:`~miniverl.environments.oracle_state.next_oracle_action` derives the same
actions; a test checks it). The corrupted step's tokens are excluded from the fit targets; the
corrective actions are supervised. Every noisy trace is checked to solve its task.

Corrupted steps are tool calls only: a wrong final answer ends the episode, so nothing could
follow it. Any environment whose oracle makes at least one tool call works (``calc_chain`` and
``calculator``); ``operand_digit`` and ``bad_expression`` need a digit in a string argument and
fall back to ``malformed_json`` otherwise.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from miniverl.agent.loop import RolloutRunner
from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.environments.base import Task, ToolCall
from miniverl.environments.oracle_state import oracle_steps_done, oracle_tool_results
from miniverl.errors import ConfigError, TrajectoryError
from miniverl.models.base import GenerationResult
from miniverl.schemas.trajectory import Trajectory
from miniverl.trajectory.masks import model_target_positions

CORRUPTION_KINDS: dict[str, float] = {
    "operand_digit": 0.5,
    "malformed_json": 0.25,
    "bad_expression": 0.25,
}
"""Corruption kind -> probability of being drawn for a noisy trace."""
_NUMBER = re.compile(r"\d+")

FitExample = tuple[list[int], list[int]]
"""``(token_ids, target_positions)``: what ``fit_toy_model`` trains on."""


@dataclass(frozen=True)
class FitTrace:
    """One fitting trace and its provenance.

    ``corrupted_turn`` is the turn whose tokens are excluded from the targets (``None`` for a
    clean oracle trace); ``corrupted_text`` is what that turn "generated".
    """

    trajectory: Trajectory
    example: FitExample
    corrupted_turn: int | None = None
    kind: str | None = None
    corrupted_text: str | None = None


# ------------------------------------------------------------------ pure corruptions


def _change_digit(number: str, rng: random.Random) -> str:
    """``number`` with one digit replaced by a different one (never a new leading zero)."""
    pos = rng.randrange(len(number))
    choices = [d for d in "0123456789" if d != number[pos] and not (pos == 0 and d == "0")]
    return number[:pos] + rng.choice(choices) + number[pos + 1 :]


def _numeric_arguments(call: ToolCall) -> list[str]:
    return [
        k for k, v in sorted(call.arguments.items()) if isinstance(v, str) and _NUMBER.search(v)
    ]


def corrupt_call_text(call: ToolCall, kind: str, rng: random.Random) -> tuple[str, str]:
    """``(text, kind)``: the corrupted rendering of ``call`` and the kind actually applied.

    The text is what a policy turn would contain (a whole ``<tool_call>`` block). A kind that
    needs a number falls back to ``malformed_json`` for a call without one.
    """
    numeric = _numeric_arguments(call)
    if kind in ("operand_digit", "bad_expression") and not numeric:
        kind = "malformed_json"
    if kind == "malformed_json":
        good = format_tool_call(call)
        cut = good.rindex("}")
        return good[:cut] + good[cut + 1 :], kind
    key = rng.choice(numeric)
    value = call.arguments[key]
    numbers = list(_NUMBER.finditer(value))
    if kind == "operand_digit":
        match = rng.choice(numbers)
        changed = value[: match.start()] + _change_digit(match.group(), rng) + value[match.end() :]
    elif kind == "bad_expression":
        changed = value[: numbers[-1].start()].rstrip()
    else:
        raise ConfigError(
            f"unknown corruption kind {kind!r}; expected one of {sorted(CORRUPTION_KINDS)}"
        )
    return format_tool_call(ToolCall(call.name, {**call.arguments, key: changed})), kind


def draw_kind(rng: random.Random) -> str:
    kinds = list(CORRUPTION_KINDS)
    return rng.choices(kinds, weights=[CORRUPTION_KINDS[k] for k in kinds])[0]


def noisy_indices(count: int, fraction: float, seed: int) -> set[int]:
    """Exactly ``round(fraction * count)`` of ``range(count)``, a seeded sample."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"noise_fraction must be in [0, 1], got {fraction}")
    return set(random.Random(f"noisy-traces/{seed}").sample(range(count), round(fraction * count)))


def fit_example(trajectory: Trajectory, excluded_turns: Sequence[int] = ()) -> FitExample:
    """Token ids and every model-generated target position outside ``excluded_turns``."""
    excluded = {
        j
        for span in trajectory.spans
        if span.is_model_generated and span.turn_id in set(excluded_turns)
        for j in range(span.start, span.end)
    }
    targets = [
        j for j in model_target_positions(trajectory.model_generated_mask) if j not in excluded
    ]
    return list(trajectory.token_ids), targets


# ------------------------------------------------------------------ playing a trace


class _ReplayPolicy:
    """A policy that "generates" scripted texts, one per turn, for :class:`RolloutRunner`."""

    def __init__(self, texts: Sequence[str], tokenizer: Any) -> None:
        self.texts, self.tokenizer = list(texts), tokenizer
        self.capabilities = SimpleNamespace(model_id="oracle", revision=None)

    def generate(self, prompt_ids: list[int], *, max_new_tokens: int, **_: Any) -> GenerationResult:
        ids = self.tokenizer.encode(self.texts.pop(0)) if self.texts else []
        cut = ids[:max_new_tokens]
        return GenerationResult(
            token_ids=cut,
            text=self.tokenizer.decode(cut),
            finish_reason="stop_sequence" if len(cut) == len(ids) else "max_new_tokens",
            num_prompt_tokens=len(prompt_ids),
        )


def noisy_oracle_trace(
    runner: RolloutRunner,
    task: Task,
    rng: random.Random,
    *,
    kind: str | None = None,
    step: int | None = None,
) -> FitTrace:
    """The oracle's episode with tool call ``step`` corrupted (``kind``), then its correction.

    ``kind`` and ``step`` default to draws from ``rng`` (:data:`CORRUPTION_KINDS`, a uniform
    tool-call step). Raises :class:`ConfigError` when the rollout limits leave no room for the
    extra turn, :class:`TrajectoryError` if the corrupted step did not fail or the trace does
    not solve the task.
    """
    environment = runner.environment
    oracle = environment.oracle_solution(task)
    calls = list(oracle.tool_calls)
    if not calls:
        raise TrajectoryError(f"task {task.task_id}: the oracle makes no tool call to corrupt")
    step = rng.randrange(len(calls)) if step is None else step
    text, applied = corrupt_call_text(calls[step], kind or draw_kind(rng), rng)
    script = [
        *(format_tool_call(c) for c in calls[:step]),
        text,
        *(format_tool_call(c) for c in calls[step:]),
        format_final(oracle.final_answer),
    ]
    player = RolloutRunner(
        _ReplayPolicy(script, runner.tokenizer),  # type: ignore[arg-type]
        environment,
        runner.config,
        tokenizer=runner.tokenizer,
        model_id="oracle",
    )
    trajectory = player.rollout(
        task,
        seed=0,
        temperature=0.0,
        trajectory_id=f"{task.task_id}:noisy-{applied}-{step}",
        extra_metadata={"source": "noisy_oracle", "corruption": applied, "corrupted_turn": step},
    )
    if not trajectory.solved or len(trajectory.turns) != len(script):
        raise ConfigError(
            f"the noise-injected trace of task {task.task_id} did not finish "
            f"({trajectory.termination_reason}, {len(trajectory.turns)} of {len(script)} turns)",
            hint="a corrupted step needs one spare turn, its tokens and (for a malformed call) a "
            "parse error the episode survives: raise rollout.max_turns, rollout.max_new_tokens_per_turn, "
            "rollout.max_total_tokens or rollout.max_parse_errors (>= 2), or set "
            "models.toy_fit.noise_fraction: 0",
        )
    expected = oracle_tool_results(environment, task)
    if oracle_steps_done(expected, trajectory.turns[: step + 1]) != step:
        raise TrajectoryError(
            f"task {task.task_id}: the corrupted call {text!r} did the oracle's step {step}"
        )
    return FitTrace(trajectory, fit_example(trajectory, [step]), step, applied, text)


def toy_fit_traces(
    runner: RolloutRunner, tasks: Sequence[Task], *, noise_fraction: float, seed: int
) -> list[FitTrace]:
    """One fitting trace per task: the oracle's, or for ``round(noise_fraction * n)`` seeded
    tasks a noise-injected one. With ``noise_fraction == 0`` these are exactly the oracle
    traces the toy teacher was always fitted on.
    """
    noisy = noisy_indices(len(tasks), noise_fraction, seed)
    out: list[FitTrace] = []
    for i, task in enumerate(tasks):
        if i in noisy:
            out.append(noisy_oracle_trace(runner, task, random.Random(f"noisy-traces/{seed}/{i}")))
        else:
            trajectory = runner.oracle_rollout(task)
            out.append(FitTrace(trajectory, fit_example(trajectory)))
    return out


__all__ = [
    "CORRUPTION_KINDS",
    "FitTrace",
    "corrupt_call_text",
    "draw_kind",
    "fit_example",
    "noisy_indices",
    "noisy_oracle_trace",
    "toy_fit_traces",
]
