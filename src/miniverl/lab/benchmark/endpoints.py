"""calc_chain endpoints: what a greedy episode got right, where it first went wrong, and if it recovered.

The episode endpoints are pure standard-library Python, so their definitions are tested
on hand-built episodes. The two model-scored endpoints at the end of the module (teacher
log-prob of the student's own samples, student NLL on oracle traces:
:func:`score_exposure`) import torch inside their functions, so the module still imports
from a plain install.

**The episode structure** (``environments/calc_chain.py``). A task holds a start value
``x0`` and ``k`` steps ``(op_i, y_i)``; the oracle calls ``e_i = "r_{i-1} OP_i y_i"`` for
``i = 1..k`` (``r_0 = x0``, ``r_i`` the value after step i) and answers ``r_k``. A student
episode is the ordered list of its turns: tool calls (each valid or malformed, each with
the tool's result) and at most one final answer.

**The pointer.** Walking the turns, ``i`` is the next oracle step (it starts at 1). A call
whose parsed expression equals ``e_i`` (integers and operator compared, whitespace ignored)
is *correct* and advances ``i``. A call equal to an ``e_j`` already done (``j < i``) is a
*repeat*: wasted, not an error. Everything else is an *error at step i*:

- ``malformed``: the call is not a valid calculator call, the tool refused it, or its
  expression is not ``a OP b`` with integers;
- ``operand_copy``: a valid ``a OP b`` whose operator or right operand differs from
  ``(op_i, y_i)`` in the prompt, or, at step 1, whose left operand differs from ``x0``;
- ``result_copy``: at step ``i >= 2``, a valid call whose left operand differs from
  ``r_{i-1}`` (the previous tool result on the oracle path); a call may be both;
- ``early_answer``: a final answer while ``i <= k``;
- ``answer_copy``: a final answer after all k steps that differs from ``r_k``;
- ``no_answer``: the episode ended without a final answer and without any earlier error
  (so a truncated but otherwise clean episode still counts as having erred).

**first_error_step** is the pointer ``i`` at the first error (1..k for a call, ``k + 1``
for the answer step); ``None`` for an error-free episode. **Recovery rate** is
``P(solved | the episode contains an error)``; an error-free episode is never counted.
**Flagged recovery rate** is ``P(solved | the tool or the parser refused a call of the
episode)``: the episodes whose transcript shows an error observation (``ok: false``), which in
the checked environment is every error before the answer. It is the positive control's
endpoint: recovering from an error the policy was told about. ``solved`` is the
environment's verification, not re-derived here.

**Per-skill accuracy** is measured only at *clean states*: before the first call, or right
after a correct call, so the context holds no off-path tool result that a faithful copy
would reproduce. At a clean state, a valid non-repeat call is one *operand copy*
opportunity (operator and right operand, plus the left operand at step 1) and, at step
``i >= 2``, one *result copy* opportunity (left operand == ``r_{i-1}``); a final answer
after all k steps is one result-copy opportunity (answer == ``r_k``). Accuracy is
successes / opportunities (``None`` with none).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

ERROR_KINDS = (
    "malformed",
    "operand_copy",
    "result_copy",
    "early_answer",
    "answer_copy",
    "no_answer",
)
PRIMARY_KS = (3, 5)
"""The pre-registered primary chain lengths: k = 3 (longest trained) and k = 5 (length generalisation)."""
MIN_CURVE_POINTS = 8
"""The protocol evaluates at least this many points along training (``eval.every``)."""

_SYMBOLS = {"add": "+", "subtract": "-", "multiply": "*"}
_EXPRESSION = re.compile(r"^\s*([+-]?\d+)\s*([-+*])\s*([+-]?\d+)\s*$")


@dataclass(frozen=True)
class CallEvent:
    """One tool-call turn: the expression argument (None when unparsable) and whether the tool accepted it."""

    expression: str | None
    ok: bool


@dataclass(frozen=True)
class AnswerEvent:
    """The final answer as the verifier parsed it (None when it could not)."""

    answer: str | None


Event = CallEvent | AnswerEvent


@dataclass(frozen=True)
class ChainTask:
    """The oracle's view of one task: start value and steps ``(op, operand)``."""

    start: int
    steps: tuple[tuple[str, int], ...]

    @property
    def k(self) -> int:
        return len(self.steps)

    def results(self) -> list[int]:
        """``r_1..r_k``."""
        out, value = [], self.start
        for op, y in self.steps:
            value = {"add": value + y, "subtract": value - y, "multiply": value * y}[op]
            out.append(value)
        return out

    def expected(self, i: int) -> tuple[int, str, int]:
        """``e_i`` as ``(left, symbol, right)`` for 1-based ``i``."""
        left = self.start if i == 1 else self.results()[i - 2]
        op, y = self.steps[i - 1]
        return left, _SYMBOLS[op], y


@dataclass
class EpisodeAnalysis:
    """Endpoints of one episode; see the module docstring for every definition."""

    k: int
    solved: bool
    errors: list[tuple[int, str]] = field(default_factory=list)
    first_error_step: int | None = None
    first_error_kind: str | None = None
    steps_done: int = 0
    repeats: int = 0
    operand_copy: list[bool] = field(default_factory=list)
    result_copy: list[bool] = field(default_factory=list)
    flagged: bool = False

    @property
    def had_error(self) -> bool:
        return self.first_error_step is not None

    @property
    def recovered(self) -> bool:
        return self.had_error and self.solved

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "had_error": self.had_error, "recovered": self.recovered}


def parse_expression(expression: str | None) -> tuple[int, str, int] | None:
    """``"12 + 7"`` -> ``(12, "+", 7)``; None for anything else."""
    if expression is None:
        return None
    match = _EXPRESSION.match(expression)
    if match is None:
        return None
    return int(match.group(1)), match.group(2), int(match.group(3))


def analyze_episode(task: ChainTask, events: Sequence[Event], solved: bool) -> EpisodeAnalysis:
    """Walk one episode's turns with the oracle pointer (module docstring)."""
    out = EpisodeAnalysis(k=task.k, solved=solved)
    results = task.results()
    done: set[tuple[int, str, int]] = set()
    i = 1
    clean = True

    def error(kind: str) -> None:
        out.errors.append((i, kind))
        if out.first_error_step is None:
            out.first_error_step, out.first_error_kind = i, kind

    answered = False
    for event in events:
        if isinstance(event, AnswerEvent):
            answered = True
            if i <= task.k:
                error("early_answer")
            else:
                right = _same_number(event.answer, results[-1])
                if clean:
                    out.result_copy.append(right)
                if not right:
                    error("answer_copy")
            break
        out.flagged = out.flagged or not event.ok
        call = parse_expression(event.expression) if event.ok else None
        if call is None:
            error("malformed")
            clean = False
            continue
        if i <= task.k and call == task.expected(i):
            if clean:
                out.operand_copy.append(True)
                if i >= 2:
                    out.result_copy.append(True)
            done.add(call)
            i += 1
            clean = True
            continue
        if call in done:
            out.repeats += 1
            continue
        if i > task.k:
            error("operand_copy")
            clean = False
            continue
        left, symbol, right = task.expected(i)
        operand_ok = (call[1], call[2]) == (symbol, right) and (i >= 2 or call[0] == left)
        result_ok = i == 1 or call[0] == left
        if clean:
            out.operand_copy.append(operand_ok)
            if i >= 2:
                out.result_copy.append(result_ok)
        if not operand_ok:
            error("operand_copy")
        if not result_ok:
            error("result_copy")
        clean = False
    if not answered and out.first_error_step is None:
        error("no_answer")
    out.steps_done = i - 1
    return out


def _same_number(text: str | None, value: int) -> bool:
    if text is None:
        return False
    try:
        return float(text.strip().replace(",", "")) == float(value)
    except ValueError:
        return False


# ---------------------------------------------------------------------- from trajectories


def chain_task_of(data: Mapping[str, Any]) -> ChainTask:
    """A :class:`ChainTask` from a calc_chain ``Task.data`` (``start``, ``steps``)."""
    return ChainTask(int(data["start"]), tuple((str(op), int(y)) for op, y in data["steps"]))


def events_of(trajectory: Any) -> list[Event]:
    """The call and answer events of a ``Trajectory`` (its ``turns`` and ``verification``)."""
    events: list[Event] = []
    for turn in trajectory.turns:
        if turn.tool_call is not None:
            call = turn.tool_call
            expression = call.arguments.get("expression") if call.valid else None
            ok = bool(
                call.valid
                and turn.tool_result is not None
                and turn.tool_result.ok
                and isinstance(expression, str)
            )
            events.append(CallEvent(expression if isinstance(expression, str) else None, ok))
        if turn.is_final:
            verification = trajectory.verification
            events.append(AnswerEvent(verification.predicted if verification else None))
    return events


def analyze_trajectory(trajectory: Any, task_data: Mapping[str, Any]) -> EpisodeAnalysis:
    return analyze_episode(chain_task_of(task_data), events_of(trajectory), bool(trajectory.solved))


# ---------------------------------------------------------------------- aggregates


def _rate(flags: Iterable[bool]) -> float | None:
    values = list(flags)
    return sum(values) / len(values) if values else None


def summarize_episodes(analyses: Sequence[EpisodeAnalysis]) -> dict[str, Any]:
    """Success per k, error rate, mean first-error step, recovery rate and per-skill accuracy."""
    by_k: dict[int, list[EpisodeAnalysis]] = {}
    for a in analyses:
        by_k.setdefault(a.k, []).append(a)
    erred = [a for a in analyses if a.had_error]
    first = [a.first_error_step for a in erred if a.first_error_step is not None]
    kinds = {kind: sum(1 for a in erred if a.first_error_kind == kind) for kind in ERROR_KINDS}
    return {
        "episodes": len(analyses),
        "success": _rate(a.solved for a in analyses),
        "success_by_k": {str(k): _rate(a.solved for a in v) for k, v in sorted(by_k.items())},
        "episodes_by_k": {str(k): len(v) for k, v in sorted(by_k.items())},
        "error_rate": _rate(a.had_error for a in analyses),
        "error_rate_by_k": {str(k): _rate(a.had_error for a in v) for k, v in sorted(by_k.items())},
        "first_error_step_mean": statistics.fmean(first) if first else None,
        "first_error_kinds": kinds,
        "recovery_rate": _rate(a.solved for a in erred),
        "recovery_episodes": len(erred),
        "flagged_recovery_rate": _rate(a.solved for a in analyses if a.flagged),
        "flagged_episodes": sum(a.flagged for a in analyses),
        "operand_copy_accuracy": _rate(x for a in analyses for x in a.operand_copy),
        "result_copy_accuracy": _rate(x for a in analyses for x in a.result_copy),
        "operand_copy_opportunities": sum(len(a.operand_copy) for a in analyses),
        "result_copy_opportunities": sum(len(a.result_copy) for a in analyses),
    }


def area_under_curve(points: Sequence[tuple[float, float]]) -> float | None:
    """Trapezoidal area under ``(step, value)`` divided by the step range: the curve's mean value.

    Normalised so arms with equal step ranges compare directly and a flat curve at ``v``
    gives ``v``. Points are sorted by step; duplicate steps keep the last value. None with
    fewer than two distinct steps (no curve).
    """
    dedup = dict(sorted((float(s), float(v)) for s, v in points))
    xs = sorted(dedup)
    if len(xs) < 2:
        return None
    area = sum(
        (xs[j + 1] - xs[j]) * (dedup[xs[j]] + dedup[xs[j + 1]]) / 2 for j in range(len(xs) - 1)
    )
    return area / (xs[-1] - xs[0])


def curve_is_dense_enough(
    points: Sequence[tuple[float, float]], minimum: int = MIN_CURVE_POINTS
) -> bool:
    """True when the curve has at least ``minimum`` distinct evaluation steps."""
    return len({float(s) for s, _ in points}) >= minimum


def exposure_gap(
    teacher_nll_on_student: float | None, student_nll_on_oracle: float | None
) -> float | None:
    """Teacher NLL of the student's own greedy tokens minus student NLL of oracle tokens (nats/token).

    Both are per-token means over model-generated positions. The first measures how far the
    student's own states drift from what the teacher would do; the second how well the
    student fits the oracle's states. A positive gap means the student is worse (to the
    teacher) on its own states than it is on the oracle's: the exposure bias that
    on-policy training is meant to close.
    """
    if teacher_nll_on_student is None or student_nll_on_oracle is None:
        return None
    return teacher_nll_on_student - student_nll_on_oracle


# ---------------------------------------------------------------------- model-scored endpoints
#
# Both are per-token means (nats per token) over the model-generated positions ``j > 0`` of
# each trajectory, scored with the usual ``j -> j - 1`` alignment: the distribution at
# position ``j - 1`` predicts token ``j`` (``trajectory.alignment.build_alignment_map``).
# Both models score the same token ids: the teacher sees the student's context as the
# student saw it (no privileged rendering), because the endpoint asks how plausible the
# student's own actions are in the student's own states.


def token_nll_sum(backend: Any, trajectories: Sequence[Any]) -> tuple[float, int]:
    """``(sum of -log p(token_j | ids_<j), number of tokens)`` over model-generated ``j > 0``."""
    import torch

    from miniverl.trajectory.alignment import build_alignment_map
    from miniverl.trajectory.masks import model_target_positions

    total, count = 0.0, 0
    backend.set_train(False)
    with torch.no_grad():
        for traj in trajectories:
            targets = model_target_positions(traj.model_generated_mask)
            if not targets:
                continue
            alignment = build_alignment_map(traj, targets)
            hidden = backend.hidden_states_at(
                traj.token_ids, alignment.student_prediction_positions
            )
            log_probs = torch.log_softmax(backend.project(hidden).double(), dim=-1)
            ids = torch.tensor(
                alignment.target_token_ids, dtype=torch.long, device=log_probs.device
            )
            total -= float(log_probs.gather(1, ids[:, None]).sum())
            count += len(ids)
    return total, count


def mean_token_nll(backend: Any, trajectories: Sequence[Any]) -> float | None:
    total, count = token_nll_sum(backend, trajectories)
    return total / count if count else None


def score_exposure(
    student: Any, teacher: Any, student_greedy: Sequence[Any], oracle: Sequence[Any]
) -> dict[str, float | None]:
    """The three exposure endpoints: teacher log-prob per token of the student's greedy
    samples, student NLL per token of oracle traces, and :func:`exposure_gap` of the two."""
    teacher_nll = mean_token_nll(teacher, student_greedy)
    student_nll = mean_token_nll(student, oracle)
    return {
        "teacher_logprob_on_student": None if teacher_nll is None else -teacher_nll,
        "student_nll_on_oracle": student_nll,
        "exposure_gap": exposure_gap(teacher_nll, student_nll),
    }


__all__ = [
    "ERROR_KINDS",
    "MIN_CURVE_POINTS",
    "PRIMARY_KS",
    "AnswerEvent",
    "CallEvent",
    "ChainTask",
    "EpisodeAnalysis",
    "analyze_episode",
    "analyze_trajectory",
    "area_under_curve",
    "chain_task_of",
    "curve_is_dense_enough",
    "events_of",
    "exposure_gap",
    "mean_token_nll",
    "parse_expression",
    "score_exposure",
    "summarize_episodes",
    "token_nll_sum",
]
