"""Position selectors (docs/design.md §3.3).

Selection reduces LM-head projection work, cache size and the number of student loss
positions. It does **not** reduce teacher compute: the teacher still runs a full forward
pass over the whole sequence. Reports therefore call the kept fraction
``teacher_queried_position_ratio`` and never "teacher compute saved".

Sub-sampling is seeded with ``derive_seed(run_seed, trajectory_id)`` (SHA-256), so the
same trajectory selects the same positions in every process and on every OS.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from miniverl.config.models import SelectionConfig
from miniverl.schemas.trajectory import Trajectory
from miniverl.trajectory.masks import model_target_positions
from miniverl.utils.seeding import derive_seed

SELECTORS = ("all_model_tokens", "tool_and_final", "uniform_ratio", "hybrid")


@dataclass(frozen=True)
class SelectionResult:
    """Target positions ``j`` (strictly increasing) and their raw weights.

    Positions whose weight would be zero are dropped: they could not change the loss.
    """

    trajectory_id: str
    selector: str
    positions: list[int]
    weights: list[float]
    model_tokens: int
    critical_tokens: int
    span_types: list[str] = field(default_factory=list)

    @property
    def num_selected(self) -> int:
        return len(self.positions)

    @property
    def teacher_queried_position_ratio(self) -> float:
        return self.num_selected / self.model_tokens if self.model_tokens else 0.0


def _sample(candidates: list[int], k: int, rng: random.Random) -> list[int]:
    if k >= len(candidates):
        return list(candidates)
    return sorted(rng.sample(candidates, k))


def select_positions(
    trajectory: Trajectory, config: SelectionConfig, *, run_seed: int
) -> SelectionResult:
    """Target positions and weights for one trajectory under ``config.selector``."""
    candidates = model_target_positions(trajectory.model_generated_mask)
    critical_set = {j for j in candidates if trajectory.critical_mask[j]}
    critical = [j for j in candidates if j in critical_set]
    others = [j for j in candidates if j not in critical_set]
    n_model = len(candidates)
    budget = math.ceil(config.ratio * n_model)
    rng = random.Random(derive_seed(run_seed, trajectory.trajectory_id))

    if config.selector == "all_model_tokens":
        chosen = candidates
    elif config.selector == "tool_and_final":
        chosen = critical
    elif config.selector == "uniform_ratio":
        chosen = _sample(candidates, budget, rng)
    elif config.selector == "hybrid":
        chosen = sorted(critical + _sample(others, max(0, budget - len(critical)), rng))
    else:
        raise ValueError(f"unknown selector {config.selector!r}; expected one of {SELECTORS}")

    positions: list[int] = []
    weights: list[float] = []
    for j in chosen:
        w = config.critical_weight if j in critical_set else config.other_weight
        if w > 0:
            positions.append(j)
            weights.append(float(w))
    return SelectionResult(
        trajectory_id=trajectory.trajectory_id,
        selector=config.selector,
        positions=positions,
        weights=weights,
        model_tokens=n_model,
        critical_tokens=len(critical),
        span_types=trajectory.span_types_at(positions),
    )


def aggregate_selection_stats(results: Iterable[SelectionResult]) -> dict[str, object]:
    """Totals over a cycle for metrics and the report."""
    results = list(results)
    model = sum(r.model_tokens for r in results)
    selected = sum(r.num_selected for r in results)
    by_type: Counter[str] = Counter()
    for r in results:
        by_type.update(r.span_types)
    return {
        "trajectories": len(results),
        "trajectories_with_selection": sum(1 for r in results if r.num_selected),
        "model_tokens": model,
        "critical_tokens": sum(r.critical_tokens for r in results),
        "selected_positions": selected,
        "teacher_queried_position_ratio": (selected / model) if model else 0.0,
        "selected_by_span_type": dict(sorted(by_type.items())),
    }
