"""One cross-entropy fit step on oracle rows, shared by the toy teacher fit and the HF adapter fit.

A row is ``(token_ids, target_positions)``: target ``j`` is the supervised token, predicted from
position ``j - 1``. Both fits (``training/teacher_fit.py`` ``fit_toy_model`` and
``training/teacher_fit.py``) walk a seeded shuffle of their rows epoch by epoch and update
with the project's ``chunked_selected_position_loss`` in pure cross-entropy form, so a teacher is
fitted by the same code path that later trains the student.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from miniverl.models.base import PaddedTrajectoryBatch
from miniverl.models.batching import build_padded_trajectory_batch

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


__all__ = ["cross_entropy_fit_step", "draw_rows", "fit_batch"]
