"""Per-arm summary statistics of the benchmark: describe, bootstrap, paired differences.

Split from :mod:`miniverl.evaluation.benchmark` (which re-exports every name). Plain Python,
no torch: the aggregation can be tested and reused without a trainer. The contrasts with
a two-level bootstrap and the MDE live in :mod:`miniverl.evaluation.contrasts`.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from miniverl.evaluation.arms import BASELINE_ARM
from miniverl.evaluation.stats import quantile  # one implementation, shared with the contrasts

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_260_407
CONFIDENCE = 0.95
MIN_SEEDS_FOR_INTERVAL = 3
METRICS = (
    "final_success",
    "baseline_success",
    "generated_tokens",
    "teacher_generated_tokens",
    "selected_training_tokens",
    "teacher_query_ratio",
    "wall_seconds",
    "optimizer_steps",
)


def describe(values: Sequence[float | int | None]) -> dict[str, Any]:
    """n, mean, sample standard deviation (n - 1; None below two values), min and max."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {
        "n": len(xs),
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else None,
        "min": min(xs),
        "max": max(xs),
    }


def bootstrap_interval(
    values: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean; None below :data:`MIN_SEEDS_FOR_INTERVAL` values.

    Seeded, so the same rows always give the same interval. With fewer than three
    values the resampling distribution has too few atoms to say anything.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n < MIN_SEEDS_FOR_INTERVAL:
        return None
    rng = random.Random(seed)
    means = sorted(sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    alpha = (1.0 - confidence) / 2.0
    return quantile(means, alpha), quantile(means, 1.0 - alpha)


def significance_note(n_seeds: int, baseline_arm: str | None = BASELINE_ARM) -> str:
    """The sentence the CLI prints and benchmark.json records about statistical claims."""
    if n_seeds < MIN_SEEDS_FOR_INTERVAL:
        unit = "seed" if n_seeds == 1 else "seeds"
        extra = (
            ""
            if n_seeds == 1
            else f"; a bootstrap interval needs at least {MIN_SEEDS_FOR_INTERVAL}"
        )
        return f"no statistical significance is claimed ({n_seeds} {unit}{extra})"
    against = (
        f"the paired difference to {baseline_arm}"
        if baseline_arm
        else "differences (no baseline arm ran)"
    )
    return (
        f"mean ± standard deviation over {n_seeds} seeds; {int(CONFIDENCE * 100)}% percentile-bootstrap intervals of {against} "
        f"({BOOTSTRAP_RESAMPLES} resamples of seeds, seed {BOOTSTRAP_SEED}); an interval is a description of seed variation, not a significance test"
    )


def aggregate(
    rows: Sequence[Mapping[str, Any]], arms: Sequence[str], baseline_arm: str | None = BASELINE_ARM
) -> dict[str, dict[str, Any]]:
    """Per arm: :func:`describe` of every metric, and the seed-paired difference to ``baseline_arm``."""
    by_arm: dict[str, dict[int, Mapping[str, Any]]] = {arm: {} for arm in arms}
    for row in rows:
        if row["arm"] in by_arm:
            by_arm[row["arm"]][int(row["seed"])] = row
    baseline = by_arm.get(baseline_arm or "", {})
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        per_seed = by_arm[arm]
        stats: dict[str, Any] = {
            metric: describe([r.get(metric) for r in per_seed.values()]) for metric in METRICS
        }
        diff: dict[str, Any] | None = None
        if baseline_arm and arm != baseline_arm and baseline:
            paired = sorted(
                s
                for s in per_seed
                if s in baseline
                and per_seed[s].get("final_success") is not None
                and baseline[s].get("final_success") is not None
            )
            differences = [
                float(per_seed[s]["final_success"]) - float(baseline[s]["final_success"])
                for s in paired
            ]
            interval = bootstrap_interval(differences)
            diff = {
                "against": baseline_arm,
                "metric": "final_success",
                "seeds": paired,
                "values": differences,
                **describe(differences),
                "interval": list(interval) if interval else None,
                "confidence": CONFIDENCE,
                "resamples": BOOTSTRAP_RESAMPLES if interval else None,
                "bootstrap_seed": BOOTSTRAP_SEED if interval else None,
            }
        stats["difference_to_baseline"] = diff
        out[arm] = stats
    return out


def seed_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (arm, seed): numeric metrics averaged over the seed's arm seeds."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["arm"], int(row["seed"])), []).append(row)
    out = []
    for (arm, seed), members in groups.items():
        merged: dict[str, Any] = {"arm": arm, "seed": seed}
        for metric in METRICS:
            values = [m.get(metric) for m in members if m.get(metric) is not None]
            merged[metric] = statistics.fmean(float(v) for v in values) if values else None
        out.append(merged)
    return out


__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "METRICS",
    "MIN_SEEDS_FOR_INTERVAL",
    "aggregate",
    "bootstrap_interval",
    "describe",
    "quantile",
    "seed_rows",
    "significance_note",
]
