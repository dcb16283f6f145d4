"""Target positions vs prediction positions: the off-by-one this project guards.

Two vocabularies for "position", never mixed implicitly:

- target position ``j``: the index of the token whose identity is supervised;
- prediction position ``j - 1``: the index whose output distribution predicts it.

Every conversion goes through :func:`prediction_positions` (or the alignment builders
that call it), and ``j = 0`` is always rejected because no distribution precedes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from miniverl.errors import TrajectoryError
from miniverl.schemas.trajectory import Span, expected_masks


class Masks(NamedTuple):
    attention_mask: list[int]
    model_generated_mask: list[bool]
    critical_mask: list[bool]


def build_masks(spans: Sequence[Span], length: int) -> Masks:
    """Masks implied by a span partition of a ``length``-token sequence.

    The same derivation the ``Trajectory`` validator re-runs on every load, so a
    builder and a reader can never disagree about provenance.
    """
    model, critical = expected_masks(list(spans), length)
    return Masks([1] * length, model, critical)


def model_target_positions(model_generated_mask: Sequence[bool]) -> list[int]:
    """Every model-generated index ``j > 0``: index 0 is excluded even when marked."""
    return [j for j, is_model in enumerate(model_generated_mask) if is_model and j > 0]


def prediction_positions(target_positions: Sequence[int]) -> list[int]:
    """``[j - 1 for j in targets]``; raises for ``j = 0``."""
    out: list[int] = []
    for j in target_positions:
        if j <= 0:
            raise TrajectoryError(
                f"target position {j} has no preceding prediction position; position 0 can never be a training target"
            )
        out.append(j - 1)
    return out


def validate_target_positions(
    target_positions: Sequence[int], model_generated_mask: Sequence[bool]
) -> None:
    """Raise :class:`TrajectoryError` unless every target is a supervisable token.

    This is the check that makes "tool outputs are context, not labels" a tested
    property: a target must lie in the sequence, be > 0, be model-generated, appear
    once, and the list must be strictly increasing.
    """
    n = len(model_generated_mask)
    for j in target_positions:
        if not 0 <= j < n:
            raise TrajectoryError(f"target position {j} is outside [0, {n})")
        if j == 0:
            raise TrajectoryError("position 0 can never be a training target")
        if not model_generated_mask[j]:
            raise TrajectoryError(
                f"target position {j} is not a model-generated token; system, user and tool-result tokens must never be supervised"
            )
    seen: set[int] = set()
    for j in target_positions:
        if j in seen:
            raise TrajectoryError(f"target position {j} appears more than once")
        seen.add(j)
    if any(b <= a for a, b in zip(target_positions, list(target_positions)[1:], strict=False)):
        raise TrajectoryError("target positions must be strictly increasing")
