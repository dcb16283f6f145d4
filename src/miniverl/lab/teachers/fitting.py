"""The one teacher-fitting path: rows, labelled student states, the fit loop and its digest.

A row is ``(token_ids, target_positions)``: target ``j`` is the supervised token, predicted from
position ``j - 1``. Both fits (the toy teacher's ``fit_toy_model`` and the HF adapter's
``fit_adapter``, ``lab/teachers/toy_fit.py``) run :func:`fit_rows`: a seeded shuffle of their
rows, epoch by epoch, each step the project's ``chunked_selected_position_loss`` in pure
cross-entropy form, so a teacher is fitted by the same code path that later trains the student.

Student states (DAgger-style data, and the held-out teacher gate) are built here too, from
token ids alone: :func:`turn_states` cuts a student episode into its assistant turns and pairs
each with the oracle's next action from the state before it
(:func:`~miniverl.environments.oracle_state.next_oracle_action`). Inside a turn the oracle
label is defined wherever the student's tokens so far agree with that action (position ``i``
of the turn is labelled ``action[i]`` for ``i <= agreed``); after the student's first
disagreeing token the action no longer continues the transcript, and the position has no
label. The fit supervises the whole action from the turn's start (:meth:`TurnState.fit_row`);
the gate scores exactly the labelled positions (:meth:`TurnState.gate_row`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from miniverl.environments.base import Task, ToolEnvironment
from miniverl.environments.oracle_state import OracleAction, next_oracle_action
from miniverl.models.base import PaddedTrajectoryBatch
from miniverl.models.batching import build_padded_trajectory_batch
from miniverl.schemas.trajectory import Trajectory

Row = TypeVar("Row")


def draw_rows(
    rows: Sequence[Row], batch_size: int, order: list[int], rng: random.Random
) -> list[Row]:
    """The next ``min(batch_size, len(rows))`` rows of a seeded shuffle; ``order`` carries over.

    When ``order`` runs out a new epoch starts with a fresh shuffle of every row index.
    """
    picked = []
    for _ in range(min(batch_size, len(rows))):
        if not order:
            order.extend(range(len(rows)))
            rng.shuffle(order)
        picked.append(rows[order.pop()])
    return picked


def fit_batch(
    rows: Sequence[tuple[list[int], list[int]]], pad_id: int, device: str
) -> tuple[PaddedTrajectoryBatch, torch.Tensor, torch.Tensor]:
    """Right-padded batch, target ids ``[N]`` and per-row normalized weights ``[N]``.

    Each row's targets ``j`` are gathered at prediction positions ``j - 1``; each row weighs
    the same whatever its length (its weights sum to one).
    """
    batch = build_padded_trajectory_batch(
        [ids for ids, _ in rows], [[j - 1 for j in targets] for _, targets in rows], pad_id, device
    )
    target_ids = [ids[j] for ids, targets in rows for j in targets]
    weights = [1.0 / len(targets) for _, targets in rows for _ in targets]
    return (
        batch,
        torch.tensor(target_ids, dtype=torch.long, device=device),
        torch.tensor(weights, dtype=torch.float32, device=device),
    )


def cross_entropy_fit_step(
    model: Any,
    rows: Sequence[tuple[list[int], list[int]]],
    params: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    *,
    chunk_size: int,
) -> float:
    """One clipped (norm 1) optimizer step of mean per-row cross-entropy; returns the loss (nats).

    ``model`` is any backend or role view with ``tokenizer``, ``device``,
    ``hidden_states_at_batch`` and ``project``. The loss is imported here, not at module
    level: the execution layer (``models/``) does not depend on the supervision layer, and only
    the fit reaches up to it, as ``fit_toy_model`` always has.
    """
    from miniverl.losses.chunked import chunked_selected_position_loss

    batch, target_ids, weights = fit_batch(rows, model.tokenizer.pad_token_id, model.device)
    hidden = model.hidden_states_at_batch(batch, with_grad=True)
    result = chunked_selected_position_loss(
        hidden_states=hidden,
        lm_head=model.project,
        weights=weights,
        weight_normalizer=float(len(rows)),
        provider=None,
        target_token_ids=target_ids,
        ce_weight=1.0,
        chunk_size=chunk_size,
        backward=True,
        loss_scale=1.0,
    )
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(result.loss)


def fit_rows(
    model: Any,
    rows: Sequence[tuple[list[int], list[int]]],
    params: Sequence[torch.nn.Parameter],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    chunk_size: int,
    on_step: Callable[[int, float], None] | None = None,
    stop_when: Callable[[int], bool] | None = None,
    check_every: int = 1,
) -> tuple[list[float], bool]:
    """Up to ``steps`` AdamW steps (betas 0.9/0.95, no decay) over ``rows``; ``(losses, stopped)``.

    The caller puts ``model`` in train mode and sets ``requires_grad``. ``on_step(step, loss)``
    hears every step (1-based); ``stop_when(step)``, asked every ``check_every`` steps, ends
    the fit early when it returns true (``stopped``).
    """
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    history: list[float] = []
    for step in range(1, steps + 1):
        picked = draw_rows(rows, batch_size, order, rng)
        history.append(
            cross_entropy_fit_step(model, picked, params, optimizer, chunk_size=chunk_size)
        )
        if on_step is not None:
            on_step(step, history[-1])
        if stop_when is not None and step % check_every == 0 and stop_when(step):
            return history, True
    return history, False


def rows_sha256(rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> str:
    """SHA-256 of every row's ids and targets, in order: the fitting data of a digest."""
    h = hashlib.sha256()
    for ids, targets in rows:
        h.update(json.dumps([[int(i) for i in ids], [int(j) for j in targets]]).encode())
        h.update(b"\n")
    return h.hexdigest()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class TurnState:
    """One assistant turn of a student episode, with the oracle's action from its state.

    ``prefix`` is every id before the turn's first generated id (the transcript, ending in
    the assistant header), ``generated`` the student's ids in the turn, ``action`` the ids of
    the oracle's next action rendered as oracle traces render it. ``off_path``: an earlier
    turn did not advance the oracle (``steps_done`` < turn index), so ``action`` is a
    corrective one.
    """

    task_id: str
    turn: int
    steps_done: int
    off_path: bool
    is_final: bool
    prefix: list[int] = field(repr=False)
    generated: list[int] = field(repr=False)
    action: list[int] = field(repr=False)

    @property
    def agreed(self) -> int:
        """How many leading ids of the turn equal the action's."""
        return common_prefix(self.generated, self.action)

    @property
    def labelled(self) -> int:
        """Labelled positions of the turn: ``0..agreed`` (the first disagreeing one included)."""
        return min(self.agreed + 1, len(self.action))

    @property
    def deviated(self) -> bool:
        """The student's turn is not the action (it left the oracle's path inside the turn)."""
        return self.generated[: len(self.action)] != self.action

    def fit_row(self) -> tuple[list[int], list[int]]:
        """``prefix + action`` supervising every action id: what to do from this state."""
        ids = self.prefix + self.action
        return ids, list(range(len(self.prefix), len(ids)))

    def gate_row(self) -> tuple[list[int], list[int]]:
        """``prefix + action[:labelled]``: ids the student itself generated, then the label
        at its first disagreeing position; every target is a labelled position."""
        ids = self.prefix + self.action[: self.labelled]
        return ids, list(range(len(self.prefix), len(ids)))

    def after_deviation_row(self) -> tuple[list[int], list[int]]:
        """``prefix + generated`` with the positions after the first disagreeing id: student
        states inside the turn where the oracle label is undefined."""
        ids = self.prefix + self.generated
        begin = len(self.prefix) + self.agreed + 1
        return ids, list(range(begin, len(ids)))


def turn_spans(trajectory: Trajectory) -> dict[int, tuple[int, int]]:
    """``turn id -> (start, end)`` of the model-generated ids of each assistant turn."""
    spans: dict[int, tuple[int, int]] = {}
    for span in trajectory.spans:
        if span.is_model_generated:
            start, end = spans.get(span.turn_id, (span.start, span.end))
            spans[span.turn_id] = (min(start, span.start), max(end, span.end))
    return spans


def turn_states(
    environment: ToolEnvironment,
    task: Task,
    trajectory: Trajectory,
    *,
    encode: Callable[[str], list[int]],
    render: Callable[[OracleAction], str],
    expected_results: Sequence[str],
) -> list[TurnState]:
    """Every assistant turn of ``trajectory`` (an episode of ``task``) as a :class:`TurnState`.

    ``render`` writes an oracle action as oracle traces do (``agent/protocol.py``; passed in
    because the execution layer does not import the agent), ``encode`` tokenizes it and
    ``expected_results`` are ``oracle_tool_results(environment, task)``. The oracle action
    reads only the tool results in the transcript, never the task's answer beyond what the
    oracle's own calls reveal.
    """
    states: list[TurnState] = []
    for turn, (start, end) in sorted(turn_spans(trajectory).items()):
        before = [t for t in trajectory.turns if t.turn_id < turn]
        action = next_oracle_action(environment, task, before, expected_results=expected_results)
        states.append(
            TurnState(
                task_id=task.task_id,
                turn=turn,
                steps_done=action.steps_done,
                off_path=action.steps_done != len(before),
                is_final=action.is_final,
                prefix=list(trajectory.token_ids[:start]),
                generated=list(trajectory.token_ids[start:end]),
                action=encode(render(action)),
            )
        )
    return states


__all__ = [
    "TurnState",
    "common_prefix",
    "cross_entropy_fit_step",
    "draw_rows",
    "fit_batch",
    "fit_rows",
    "rows_sha256",
    "turn_spans",
    "turn_states",
]
