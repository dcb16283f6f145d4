"""Noise-injected oracle traces: teach the toy teacher to recover from a mistake it never makes.

A teacher fitted only on oracle traces has only seen states on the oracle's path. A student's
rollouts leave that path (a miscopied number, a broken call), and on-policy distillation asks
the teacher what to do *there*. So a fraction ``noise_fraction`` of the fitting traces get one
tool-call step corrupted:

- ``operand_digit``: one digit of one number in the call's arguments changed (for calc_chain
  the copied previous result or the copied operand), a valid call the tool evaluates;
- ``random_operands``: every number of one argument replaced by an unrelated one (2..999), the
  kind of call an undertrained student makes that has not learnt to copy at all, also valid;
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

A student that miscopied a number rarely notices at once: it carries on from the wrong result.
With ``max_follow > 0`` a trace whose corrupted call was valid (a digit or random operands)
continues the wrong chain for ``0..max_follow`` further calls, each the oracle's next call with
the expected previous result replaced by the wrong one the tool returned, before the corrective
re-call of the first step not yet done. Those follow-on calls are excluded from the targets too,
so the teacher learns where to go back to, never to make the mistake. The turn budget
(``rollout.max_turns`` and the environment's ``turn_budget``) caps how many follow.

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
from miniverl.config.sections import DEFAULT_NOISE_KINDS
from miniverl.environments.base import Task, ToolCall
from miniverl.environments.oracle_state import oracle_steps_done, oracle_tool_results
from miniverl.errors import ConfigError, TrajectoryError
from miniverl.models.base import GenerationResult
from miniverl.schemas.trajectory import Trajectory
from miniverl.trajectory.masks import model_target_positions

CORRUPTION_KINDS: dict[str, float] = dict(DEFAULT_NOISE_KINDS)
"""Every corruption kind -> its default relative weight (``models.toy_fit.noise_kinds``)."""
_NUMBER = re.compile(r"\d+")
_SIGNED = re.compile(r"-?\d+")

FitExample = tuple[list[int], list[int]]
"""``(token_ids, target_positions)``: what ``fit_toy_model`` trains on."""


@dataclass(frozen=True)
class FitTrace:
    """One fitting trace and its provenance.

    ``corrupted_turn`` is the first turn whose tokens are excluded from the targets (``None``
    for a clean oracle trace); ``corrupted_text`` is what that turn "generated"; ``followed``
    more turns after it carried on the wrong chain and are excluded too.
    """

    trajectory: Trajectory
    example: FitExample
    corrupted_turn: int | None = None
    kind: str | None = None
    corrupted_text: str | None = None
    followed: int = 0

    @property
    def excluded_turns(self) -> list[int]:
        if self.corrupted_turn is None:
            return []
        return list(range(self.corrupted_turn, self.corrupted_turn + 1 + self.followed))


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


def _unrelated_number(number: str, rng: random.Random) -> str:
    """A number in 2..999 other than ``number``."""
    return str(rng.choice([n for n in range(2, 1000) if n != int(number)]))


def corrupt_call(call: ToolCall, kind: str, rng: random.Random) -> tuple[str, str, ToolCall | None]:
    """``(text, kind, corrupted call)``: the corrupted rendering of ``call``, the kind actually
    applied and, for a kind that leaves a parseable call, that call (``None`` for
    ``malformed_json``).

    The text is what a policy turn would contain (a whole ``<tool_call>`` block). A kind that
    needs a number falls back to ``malformed_json`` for a call without one.
    """
    if kind not in CORRUPTION_KINDS:
        raise ConfigError(
            f"unknown corruption kind {kind!r}; expected one of {sorted(CORRUPTION_KINDS)}"
        )
    numeric = _numeric_arguments(call)
    if kind != "malformed_json" and not numeric:
        kind = "malformed_json"
    if kind == "malformed_json":
        good = format_tool_call(call)
        cut = good.rindex("}")
        return good[:cut] + good[cut + 1 :], kind, None
    key = rng.choice(numeric)
    value = call.arguments[key]
    numbers = list(_NUMBER.finditer(value))
    if kind == "operand_digit":
        match = rng.choice(numbers)
        changed = value[: match.start()] + _change_digit(match.group(), rng) + value[match.end() :]
    elif kind == "random_operands":
        changed = _NUMBER.sub(lambda m: _unrelated_number(m.group(), rng), value)
    else:
        changed = value[: numbers[-1].start()].rstrip()
    bad = ToolCall(call.name, {**call.arguments, key: changed})
    return format_tool_call(bad), kind, bad


def corrupt_call_text(call: ToolCall, kind: str, rng: random.Random) -> tuple[str, str]:
    """``(text, kind)`` of :func:`corrupt_call`."""
    text, applied, _ = corrupt_call(call, kind, rng)
    return text, applied


def draw_kind(rng: random.Random, weights: dict[str, float] | None = None) -> str:
    """A kind drawn with ``weights`` (default :data:`CORRUPTION_KINDS`)."""
    weights = CORRUPTION_KINDS if weights is None else weights
    kinds = list(weights)
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]


def _last_number(text: str) -> str | None:
    found = _SIGNED.findall(text)
    return found[-1] if found else None


def _with_wrong_input(call: ToolCall, right: str, wrong: str) -> ToolCall | None:
    """``call`` with the whole number ``right`` in one string argument replaced by ``wrong``."""
    pattern = re.compile(rf"(?<![\d-]){re.escape(right)}(?!\d)")
    for key, value in sorted(call.arguments.items()):
        if isinstance(value, str) and pattern.search(value):
            return ToolCall(call.name, {**call.arguments, key: pattern.sub(wrong, value, count=1)})
    return None


def follow_calls(
    environment: Any,
    task: Task,
    calls: Sequence[ToolCall],
    step: int,
    bad: ToolCall,
    count: int,
    expected: Sequence[str],
) -> list[ToolCall]:
    """Up to ``count`` calls that carry on the wrong chain after ``bad`` replaced call ``step``.

    Call ``step + j`` of the oracle, with the oracle's result of step ``step + j - 1`` (the last
    number of ``expected[step + j - 1]``) replaced by the last number of what the tool returned
    for the previous wrong call. Stops early when the tool refused a call, the chain ends or
    the next call does not use the previous result. Uses ``environment`` (reset to ``task``).
    """
    environment.reset(task)
    result = environment.step(bad)
    out: list[ToolCall] = []
    for j in range(1, count + 1):
        if step + j >= len(calls) or not result.ok:
            break
        wrong, right = _last_number(result.result), _last_number(expected[step + j - 1])
        nxt = (
            None
            if wrong is None or right is None
            else _with_wrong_input(calls[step + j], right, wrong)
        )
        if nxt is None:
            break
        out.append(nxt)
        result = environment.step(nxt)
    return out


def _room_for_follow(runner: RolloutRunner, task: Task, calls: int) -> int:
    """Turns left for follow-on calls after the oracle's calls, its answer and one corruption."""
    budget = runner.environment.turn_budget(task)
    turns = runner.config.max_turns if budget is None else min(budget, runner.config.max_turns)
    return max(0, turns - calls - 2)


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
    kinds: dict[str, float] | None = None,
    max_follow: int = 0,
    follow: int | None = None,
) -> FitTrace:
    """The oracle's episode with tool call ``step`` corrupted (``kind``), then its correction.

    ``kind`` and ``step`` default to draws from ``rng`` (``kinds`` weights, default
    :data:`CORRUPTION_KINDS`; a uniform tool-call step). ``follow`` follow-on calls (default:
    a uniform draw from ``0..max_follow``, capped by the turn budget) carry on the wrong chain
    before the correction (:func:`follow_calls`). Raises :class:`ConfigError` when the rollout
    limits leave no room for the extra turn, :class:`TrajectoryError` if a corrupted or
    follow-on call did the oracle's step or the trace does not solve the task.
    """
    environment = runner.environment
    oracle = environment.oracle_solution(task)
    calls = list(oracle.tool_calls)
    if not calls:
        raise TrajectoryError(f"task {task.task_id}: the oracle makes no tool call to corrupt")
    step = rng.randrange(len(calls)) if step is None else step
    text, applied, bad = corrupt_call(calls[step], kind or draw_kind(rng, kinds), rng)
    if follow is None:
        follow = rng.randint(0, max_follow) if max_follow > 0 else 0
    follow = min(follow, _room_for_follow(runner, task, len(calls)))
    expected = oracle_tool_results(environment, task)
    carried = (
        follow_calls(environment, task, calls, step, bad, follow, expected)
        if bad is not None and follow > 0
        else []
    )
    script = [
        *(format_tool_call(c) for c in calls[:step]),
        text,
        *(format_tool_call(c) for c in carried),
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
        trajectory_id=f"{task.task_id}:noisy-{applied}-{step}-{len(carried)}",
        extra_metadata={
            "source": "noisy_oracle",
            "corruption": applied,
            "corrupted_turn": step,
            "followed": len(carried),
        },
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
    if oracle_steps_done(expected, trajectory.turns[: step + 1 + len(carried)]) != step:
        raise TrajectoryError(
            f"task {task.task_id}: the corrupted call {text!r} (or a follow-on call) did the "
            f"oracle's step {step}"
        )
    excluded = list(range(step, step + 1 + len(carried)))
    return FitTrace(
        trajectory, fit_example(trajectory, excluded), step, applied, text, followed=len(carried)
    )


def toy_fit_traces(
    runner: RolloutRunner,
    tasks: Sequence[Task],
    *,
    noise_fraction: float,
    seed: int,
    kinds: dict[str, float] | None = None,
    max_follow: int = 0,
) -> list[FitTrace]:
    """One fitting trace per task: the oracle's, or for ``round(noise_fraction * n)`` seeded
    tasks a noise-injected one (``kinds`` weights, up to ``max_follow`` follow-on calls). With
    ``noise_fraction == 0`` these are exactly the oracle traces the toy teacher was always
    fitted on.
    """
    noisy = noisy_indices(len(tasks), noise_fraction, seed)
    out: list[FitTrace] = []
    for i, task in enumerate(tasks):
        if i in noisy:
            rng = random.Random(f"noisy-traces/{seed}/{i}")
            out.append(noisy_oracle_trace(runner, task, rng, kinds=kinds, max_follow=max_follow))
        else:
            trajectory = runner.oracle_rollout(task)
            out.append(FitTrace(trajectory, fit_example(trajectory)))
    return out


__all__ = [
    "CORRUPTION_KINDS",
    "FitTrace",
    "corrupt_call",
    "corrupt_call_text",
    "draw_kind",
    "fit_example",
    "follow_calls",
    "noisy_indices",
    "noisy_oracle_trace",
    "toy_fit_traces",
]
