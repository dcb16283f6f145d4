"""Per-trajectory weight normalisation (docs/objectives.md, "Weighting and reduction").

For trajectory r with raw selector weights w_{r,i}:

    ŵ_{r,i} = w_{r,i} / Σ_i w_{r,i},    L_r = Σ_i ŵ_{r,i} (D_{r,i} + c · NLL_{r,i}),

and an optimizer step over a group of G trajectories minimises L = (1/G) Σ_r L_r. A
micro-batch b of B_b rows passes ``weight_normalizer = B_b`` and ``loss_scale = B_b / G``
to :func:`~miniverl.losses.chunked.chunked_selected_position_loss`, so it contributes
(1/G) Σ_{r∈b} L_r and the gradients of all micro-batches add up to exactly ∇L, whatever
the split.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def normalize_trajectory_weights(weight_rows: Sequence[Tensor | Sequence[float]]) -> list[Tensor]:
    """Divide each trajectory's raw weights by their sum, so every row sums to one.

        ``weight_rows``: one ``[n_r]`` row of non-negative weights per trajectory (tensors keep
        their floating dtype and device; plain sequences of Python floats become float64, losing
    nothing). Returns one ``[n_r]``
        tensor per row, in order.

        Zero-weight rows: a row whose weights are all zero (or that has no entries) comes back
        as zeros, never NaN, so it contributes exactly 0 to the loss and its gradient. It still
        counts in G if the caller counts it, which would dilute the other trajectories; the
        trainer therefore removes such rows before counting G, and this function does not
        silently change G for it.
    """
    normalized: list[Tensor] = []
    for row in weight_rows:
        weights = row if isinstance(row, Tensor) else torch.tensor(row, dtype=torch.float64)
        if not weights.is_floating_point():
            weights = weights.to(torch.float64)
        if weights.dim() != 1:
            raise ValueError(
                f"each weight row must be one-dimensional; got shape {tuple(weights.shape)}"
            )
        if weights.numel() and (
            not bool(torch.isfinite(weights).all()) or bool((weights < 0).any())
        ):
            raise ValueError("token weights must be finite and non-negative")
        total = float(weights.double().sum())
        if total == 0.0:
            normalized.append(torch.zeros_like(weights))
        else:
            normalized.append((weights.double() / total).to(weights.dtype))
    return normalized


__all__ = ["normalize_trajectory_weights"]
