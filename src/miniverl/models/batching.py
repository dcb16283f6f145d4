"""Padded trajectory batches for one backbone forward over several trajectories.

Right padding with attention 0 keeps padding mask-isolated: with causal attention a
real position only sees earlier positions, and every pad sits after every real token of
its row, so no real hidden state can depend on a pad.
"""

from __future__ import annotations

from collections.abc import Sequence

from miniverl.models.base import PaddedTrajectoryBatch
from miniverl.utils.lazy import import_torch


def build_padded_trajectory_batch(
    token_ids: Sequence[Sequence[int]],
    selected_positions: Sequence[Sequence[int]],
    pad_token_id: int,
    device: str = "cpu",
) -> PaddedTrajectoryBatch:
    """Batch ``B`` sequences and the prediction positions to gather from each.

    ``selected_positions[r]`` are *prediction* positions (``j - 1``) of row ``r``, strictly
    increasing; the gathered hidden states come back row by row in that order.
    """
    torch = import_torch("padded trajectory batches")
    if len(token_ids) != len(selected_positions):
        raise ValueError(
            f"got {len(token_ids)} sequences but {len(selected_positions)} position lists"
        )
    if not token_ids:
        raise ValueError("a padded batch needs at least one sequence")
    width = max(len(ids) for ids in token_ids)
    input_ids = torch.full((len(token_ids), width), int(pad_token_id), dtype=torch.long)
    attention = torch.zeros((len(token_ids), width), dtype=torch.long)
    rows: list[int] = []
    positions: list[int] = []
    for r, (ids, pos) in enumerate(zip(token_ids, selected_positions, strict=True)):
        if not ids:
            raise ValueError(f"sequence {r} is empty")
        input_ids[r, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        attention[r, : len(ids)] = 1
        for p in pos:
            if not 0 <= p < len(ids):
                raise ValueError(f"row {r}: prediction position {p} is outside [0, {len(ids)})")
        rows.extend([r] * len(pos))
        positions.extend(int(p) for p in pos)
    return PaddedTrajectoryBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        row_index=torch.tensor(rows, dtype=torch.long, device=device),
        position_index=torch.tensor(positions, dtype=torch.long, device=device),
        row_sizes=[len(p) for p in selected_positions],
    )


def length_buckets(lengths: Sequence[int], max_rows: int) -> list[list[int]]:
    """Deterministic buckets of at most ``max_rows`` indices, grouped by similar length.

    Indices are ordered by (length, index) so ties never depend on anything but input
    order, then cut into consecutive buckets; each bucket is returned in index order.
    """
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [sorted(order[k : k + max_rows]) for k in range(0, len(order), max_rows)]
