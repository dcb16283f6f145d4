"""Corrective traces: an oracle episode with one tool call corrupted, the environment's answer
to it, then the oracle's corrective re-call and the rest of its episode.

Why: a teacher's traces contain no failed tool call, so nothing trained on them ever sees the
state after an error. A corrective trace shows exactly that state and what to do in it. Two
consumers use the same traces: the DART-style SFT arm (``train.sft_noise_fraction``,
``training/sources.py``) and a fitted teacher (``lab/teachers/toy_fit.py``). The corrupted
call itself is never a training target (:attr:`CorrectiveTrace.excluded_turns`); the
environment's answer to it is context, as every tool result is.

The corruption kinds (:data:`CORRUPTION_KINDS`): ``operand_digit`` (one digit of one number
changed), ``random_operands`` (every number replaced by an unrelated one), ``malformed_json``
(the call's JSON cut), ``bad_expression`` (the last operand dropped), ``wrong_key`` (the
call's ``"name"`` key or its argument's key misnamed), ``extra_call`` (the last call made again
after the chain is done, where the answer is due; its correction is the final answer). Each is
one of the errors the checked ``calc_chain`` flags, so a teacher fitted on these traces has
seen a recovery from every flag it can meet at a student's state.
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
    "operand_digit": 0.35,
    "malformed_json": 0.15,
    "bad_expression": 0.15,
    "random_operands": 0.0,
    "wrong_key": 0.15,
    "extra_call": 0.2,
}
"""Every corruption kind -> its default relative weight in the corrective traces of
``train.sft_noise_fraction`` (the lab's ``lab.toy_fit.noise_kinds`` has its own default)."""
WRONG_KEYS: dict[str, tuple[str, ...]] = {
    "name": ("family", "tool", "function"),
    "argument": ("expr", "input", "formula"),
}
"""``wrong_key``: the misnamings drawn for the call's ``"name"`` key and for its argument's key."""
_NUMBER = re.compile(r"\d+")
_SIGNED = re.compile(r"-?\d+")


@dataclass(frozen=True)
class CorrectiveTrace:
    """One corrective trace and its provenance: ``corrupted_turn`` is the corrupted call's
    turn, ``corrupted_text`` what that turn "generated", ``followed`` how many more turns
    carried on the wrong chain before the correction (excluded from training too)."""

    trajectory: Trajectory
    corrupted_turn: int
    kind: str
    corrupted_text: str
    followed: int = 0

    @property
    def excluded_turns(self) -> list[int]:
        return list(range(self.corrupted_turn, self.corrupted_turn + 1 + self.followed))

    @property
    def targets(self) -> list[int]:
        """Every model-generated target position outside :attr:`excluded_turns`."""
        return targets_outside(self.trajectory, self.excluded_turns)

    @property
    def example(self) -> tuple[list[int], list[int]]:
        """``(token_ids, target_positions)``: what a cross-entropy fit trains on."""
        return list(self.trajectory.token_ids), self.targets


def targets_outside(trajectory: Trajectory, excluded_turns: Sequence[int] = ()) -> list[int]:
    """The model-generated target positions of ``trajectory`` outside ``excluded_turns``."""
    excluded = {
        j
        for span in trajectory.spans
        if span.is_model_generated and span.turn_id in set(excluded_turns)
        for j in range(span.start, span.end)
    }
    return [j for j in model_target_positions(trajectory.model_generated_mask) if j not in excluded]


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
    needs a number falls back to ``malformed_json`` for a call without one. ``extra_call``
    leaves ``call`` as it is: the error is where it is made (:func:`noisy_oracle_trace` places
    it after the chain's last call).
    """
    if kind not in CORRUPTION_KINDS:
        raise ConfigError(
            f"unknown corruption kind {kind!r}; expected one of {sorted(CORRUPTION_KINDS)}"
        )
    if kind == "extra_call":
        return format_tool_call(call), kind, call
    if kind == "wrong_key":
        return _misnamed_key(call, rng)
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


def _misnamed_key(call: ToolCall, rng: random.Random) -> tuple[str, str, ToolCall | None]:
    """``call`` rendered with its ``"name"`` key misnamed (unparseable: ``None``) or, for a
    call with arguments, half the time its first argument's key misnamed (a call the tool
    refuses)."""
    if call.arguments and rng.random() < 0.5:
        key = sorted(call.arguments)[0]
        wrong = rng.choice([k for k in WRONG_KEYS["argument"] if k not in call.arguments])
        arguments = {wrong if k == key else k: v for k, v in call.arguments.items()}
        bad = ToolCall(call.name, arguments)
        return format_tool_call(bad), "wrong_key", bad
    good = format_tool_call(call)
    cut = good.rindex('"name":')
    wrong = rng.choice(WRONG_KEYS["name"])
    return good[:cut] + f'"{wrong}":' + good[cut + len('"name":') :], "wrong_key", None


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
    trajectory_id: str | None = None,
) -> CorrectiveTrace:
    """The oracle's episode with tool call ``step`` corrupted (``kind``), then its correction.

    ``kind`` and ``step`` default to draws from ``rng`` (``kinds`` weights, default
    :data:`CORRUPTION_KINDS`; a uniform tool-call step). An ``extra_call`` is made at
    ``step = len(calls)``, after the last call (a drawn or given step is replaced), and
    corrected by the oracle's final answer. ``follow`` follow-on calls (default:
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
    kind = kind or draw_kind(rng, kinds)
    extra = kind == "extra_call"
    text, applied, bad = corrupt_call(calls[-1] if extra else calls[step], kind, rng)
    if extra:  # made after the last call, where the answer is due; nothing follows it
        step, bad, follow = len(calls), None, 0
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
        trajectory_id=trajectory_id or f"{task.task_id}:noisy-{applied}-{step}-{len(carried)}",
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
            "lab.toy_fit.noise_fraction: 0",
        )
    if oracle_steps_done(expected, trajectory.turns[: step + 1 + len(carried)]) != step:
        raise TrajectoryError(
            f"task {task.task_id}: the corrupted call {text!r} (or a follow-on call) did the "
            f"oracle's step {step}"
        )
    return CorrectiveTrace(trajectory, step, applied, text, followed=len(carried))


__all__ = [
    "CORRUPTION_KINDS",
    "WRONG_KEYS",
    "CorrectiveTrace",
    "corrupt_call",
    "corrupt_call_text",
    "draw_kind",
    "follow_calls",
    "noisy_oracle_trace",
    "targets_outside",
]
