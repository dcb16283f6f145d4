"""The benchmark's statistics: per-arm summaries, contrasts with a t-interval over seed means
(headline) and a two-level bootstrap (secondary), Holm's adjustment, the t-based MDE.

No torch. The per-arm summaries are standard-library Python; the contrasts take the
t-distribution, the t-test and binomial CDFs from ``scipy.stats`` (the ``lab`` extra),
imported on first use (:func:`scipy_stats`), so this module imports, and the per-arm
summaries run, from a plain install. ``report`` and ``export`` read the figures stored in
``benchmark.json`` and never import this module; ``benchmark`` checks for scipy before any
cell trains.

**Per-arm summaries** (:func:`aggregate`, :func:`describe`, :func:`seed_rows`): mean,
sample standard deviation and range of every measured metric over seeds, and a seeded
one-level percentile bootstrap of the seed-paired difference in final success to the
baseline arm (:func:`bootstrap_interval`: seeds resampled, not tasks).

**The data.** A contrast compares arm A with arm B on the same held-out tasks. For each
seed (the independent unit: one cold start; several arm seeds of one cold start are
averaged per task by the caller, because they share the cold start) there is one paired
difference per task, ``A_t - B_t`` (e.g. 1 - 0 when A solved task t and B did not).
The contrast's estimate is the mean over seeds of each seed's mean task difference.

**The headline interval** is Student's t over the ``n`` seed means ``d_s``::

    mean(d) -+ t_{1 - alpha/2, n - 1} * sd(d) / sqrt(n)

with its two-sided one-sample t-test of 0 (``p_value``), both from
``scipy.stats.ttest_1samp``. The seed is the unit the experiment replicates, and with five
seeds a percentile bootstrap is too narrow (it resamples five atoms, so it cannot see the
t-distribution's tails). Across a family of contrasts, :func:`holm_adjusted` gives Holm's
step-down adjusted p-values (family-wise error at ``alpha``; scipy has no Holm adjustment,
``false_discovery_control`` being Benjamini-Hochberg).

**The secondary interval** is a percentile bootstrap of the estimate with two levels,
matching the two sources of variation: draw ``S`` seeds with replacement from the ``S``
seeds, then, independently for every drawn seed, draw its ``T_s`` tasks with replacement
(pairs stay together, so the contrast stays paired), and average. :func:`two_level_bootstrap`
samples the task level as the equivalent multinomial counts over the seed's distinct values
(sequential binomials, inverse-CDF on ``scipy.stats.binom`` tables), so a resample costs
O(distinct values x log T) per seed instead of O(T); ``tests/unit/test_stats.py`` checks the
result against an exact enumeration of every equally likely resample. It draws from
``random.Random`` rather than through ``scipy.stats.bootstrap``, which resamples one level
with numpy's generator and so could not reproduce the stored intervals.

**The minimum detectable effect** for paired seeds, two-sided level ``alpha`` and power
``1 - beta``::

    MDE = (t_{1 - alpha/2, n - 1} + t_{1 - beta, n - 1}) * sigma_diff / sqrt(n)

with ``sigma_diff`` the sample standard deviation (n - 1) of the per-seed mean
differences and ``n`` the number of seeds (defaults: alpha = 0.05, power = 0.8; factor
3.71 at n = 5, against 2.80 for the normal approximation, which is optimistic with few
seeds). ``sigma_diff`` already contains the task sampling noise of a seed's mean.
:func:`seeds_needed` inverts it for a target effect.

**Fewer than three values**: no interval or p-value is computed over fewer than
:data:`MIN_VALUES_FOR_INTERVAL` seeds (the verdict says so), and a bootstrap over seeds
with fewer than three tasks carries a note saying so.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

from miniverl.errors import SchemaValidationError
from miniverl.lab.benchmark.arms import BASELINE_ARM
from miniverl.utils.lazy import require

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8
MIN_VALUES_FOR_INTERVAL = 3
DEFAULT_RESAMPLES = 10_000
DEFAULT_BOOTSTRAP_SEED = 20_260_407


def scipy_stats() -> ModuleType:
    """``scipy.stats``, or :class:`~miniverl.errors.BackendError` naming the ``lab`` extra.

    Imported here rather than at module level so that the per-arm summaries, and the
    modules that import them, need no scipy."""
    return require("scipy.stats", "the benchmark's contrasts")


# ---------------------------------------------------------------------- the bootstrap


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (numpy's default method)."""
    if not sorted_values:
        raise ValueError("quantile of an empty sequence")
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


class TaskResampler:
    """Draws the mean of a with-replacement resample of one seed's task values.

    The resample's value counts are multinomial(T, counts / T); they are drawn as
    sequential binomials by inverse CDF, with one cached ``scipy.stats.binom`` CDF table
    over 0..trials per (trials, p).
    """

    def __init__(self, values: Sequence[float]) -> None:
        if not values:
            raise ValueError("a seed needs at least one task value")
        counts = Counter(float(v) for v in values)
        self.values = sorted(counts)
        self.counts = [counts[v] for v in self.values]
        self.n = len(values)
        self._tables: dict[tuple[int, int, int], list[float]] = {}

    def _binomial(self, rng: random.Random, trials: int, count: int, weight: int) -> int:
        """A draw of Binomial(trials, count / weight)."""
        if trials == 0 or count == 0:
            return 0
        if count == weight:
            return trials
        key = (trials, count, weight)
        if key not in self._tables:
            binom = scipy_stats().binom
            self._tables[key] = binom.cdf(range(trials + 1), trials, count / weight).tolist()
        cdf = self._tables[key]
        return min(bisect.bisect_right(cdf, rng.random()), trials)

    def draw(self, rng: random.Random) -> float:
        remaining, weight, total = self.n, self.n, 0.0
        for value, count in zip(self.values[:-1], self.counts[:-1], strict=True):
            drawn = self._binomial(rng, remaining, count, weight)
            total += value * drawn
            remaining -= drawn
            weight -= count
        total += self.values[-1] * remaining
        return total / self.n


def two_level_bootstrap(
    table: Sequence[Sequence[float]],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> list[float]:
    """Sorted bootstrap replicates of ``mean over seeds of (mean over tasks)``.

    ``table[s]`` holds seed s's per-task values (paired differences for a contrast). Each
    replicate draws ``len(table)`` seeds with replacement, then each drawn seed's tasks
    with replacement, independently per draw. Seeded: the same table gives the same list.
    """
    if not table:
        raise ValueError("the bootstrap needs at least one seed")
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    resamplers = [TaskResampler(row) for row in table]
    rng = random.Random(seed)
    n = len(resamplers)
    replicates = [
        sum(resamplers[rng.randrange(n)].draw(rng) for _ in range(n)) / n for _ in range(resamples)
    ]
    return sorted(replicates)


def percentile_interval(
    replicates: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The central ``confidence`` interval of sorted bootstrap replicates."""
    tail = (1.0 - confidence) / 2.0
    return quantile(replicates, tail), quantile(replicates, 1.0 - tail)


# ---------------------------------------------------------------------- Student's t


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """``mean -+ t_{(1+confidence)/2, n-1} * sd / sqrt(n)`` over ``values`` (n >= 2), as
    ``scipy.stats.ttest_1samp`` gives it; with sd 0 (every seed agreed) the point ``(mean, mean)``."""
    if len(values) < 2:
        raise ValueError("a t-interval needs at least two values")
    mean = statistics.fmean(values)
    if statistics.stdev(values) == 0.0:
        return mean, mean
    low, high = scipy_stats().ttest_1samp(values, 0.0).confidence_interval(confidence)
    return float(low), float(high)


def t_test_p(values: Sequence[float]) -> float:
    """Two-sided p of the one-sample t-test of mean 0 over ``values`` (n >= 2).

    With sd 0 the statistic is undefined: p is 1 when every value is 0, and 0 otherwise
    (every seed agreed on a nonzero difference). The check uses the exact
    ``statistics.stdev``: numpy's float sum can leave a spread of 1e-17 on equal values."""
    if len(values) < 2:
        raise ValueError("a t-test needs at least two values")
    if statistics.stdev(values) == 0.0:
        return 1.0 if statistics.fmean(values) == 0.0 else 0.0
    return float(scipy_stats().ttest_1samp(values, 0.0).pvalue)


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Sorted ascending, the i-th smallest (0-based) of ``m`` becomes
    ``min(1, max_{j <= i} (m - j) p_(j))``; a hypothesis is rejected at level alpha when
    its adjusted p is at most alpha, which controls the family-wise error rate."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


# ---------------------------------------------------------------------- power


def _t_sum(n: int, alpha: float, power: float) -> float:
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("alpha and power must lie strictly between 0 and 1")
    if n < 2:
        raise ValueError("the MDE needs n >= 2 (a standard deviation over seeds)")
    t = scipy_stats().t
    return float(t.ppf(1.0 - alpha / 2.0, n - 1) + t.ppf(power, n - 1))


def minimum_detectable_effect(
    sd_diff: float, n: int, *, alpha: float = ALPHA, power: float = POWER
) -> float:
    """``(t_{1-alpha/2, n-1} + t_{power, n-1}) * sd_diff / sqrt(n)`` (same unit as ``sd_diff``)."""
    return _t_sum(n, alpha, power) * sd_diff / math.sqrt(n)


MAX_SEEDS_NEEDED = 100_000


def seeds_needed(
    sd_diff: float, effect: float, *, alpha: float = ALPHA, power: float = POWER
) -> int:
    """Smallest n >= 2 whose :func:`minimum_detectable_effect` is at most ``effect``.

    The t-based MDE falls monotonically in n, so the answer is found by doubling then
    bisection; above :data:`MAX_SEEDS_NEEDED` it raises."""
    if effect <= 0:
        raise ValueError("effect must be positive")

    def enough(n: int) -> bool:
        return minimum_detectable_effect(sd_diff, n, alpha=alpha, power=power) <= effect * (
            1 + 1e-12
        )

    lo, hi = 1, 2
    while not enough(hi):
        lo, hi = hi, 2 * hi
        if hi > MAX_SEEDS_NEEDED:
            raise ValueError(f"more than {MAX_SEEDS_NEEDED} seeds would be needed")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


# ---------------------------------------------------------------------- contrasts


def paired_differences(
    arm: Mapping[Hashable, Sequence[float]], reference: Mapping[Hashable, Sequence[float]]
) -> dict[Hashable, list[float]]:
    """Seed -> per-task ``arm - reference``; both tables must hold the same seeds and task counts."""
    if set(arm) != set(reference):
        raise SchemaValidationError(
            f"the arms were run on different seeds ({sorted(map(str, arm))} vs {sorted(map(str, reference))})",
            hint="a contrast pairs seeds: compare arms only on the seeds both finished",
        )
    out: dict[Hashable, list[float]] = {}
    for key in arm:
        a, b = list(arm[key]), list(reference[key])
        if len(a) != len(b) or not a:
            raise SchemaValidationError(
                f"seed {key}: the arms have {len(a)} and {len(b)} task outcomes",
                hint="a contrast pairs tasks: both arms must be evaluated on the same non-empty task list",
            )
        out[key] = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    return out


@dataclass(frozen=True)
class ContrastResult:
    """One contrast ``arm - reference``; differences are fractions (x 100 = percentage points).

    ``interval`` is the headline: the Student t-interval over the seed means
    (``interval_method`` ``"t"``, ``df`` = seeds - 1) with ``p_value`` its two-sided t-test of
    0; ``bootstrap_interval`` is the secondary two-level percentile bootstrap.
    """

    arm: str
    reference: str
    seeds: list[str]
    tasks_per_seed: list[int]
    seed_differences: list[float]
    mean_difference: float
    sd_seed_differences: float | None
    interval: tuple[float, float] | None
    interval_method: str
    df: int | None
    p_value: float | None
    bootstrap_interval: tuple[float, float] | None
    confidence: float
    resamples: int | None
    bootstrap_seed: int | None
    mde: float | None
    alpha: float
    power: float
    distinguishable: bool
    verdict: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["interval"] = list(self.interval) if self.interval else None
        data["bootstrap_interval"] = (
            list(self.bootstrap_interval) if self.bootstrap_interval else None
        )
        return data


def _pp(x: float) -> str:
    return f"{100 * x:+.1f} pp"


def p_text(p: float) -> str:
    """A p-value as the verdicts print it: three decimals, ``< 0.001`` below that."""
    return "< 0.001" if p < 0.0005 else f"{p:.3f}"


def compare_arms(
    arm: str,
    reference: str,
    arm_outcomes: Mapping[Hashable, Sequence[float]],
    reference_outcomes: Mapping[Hashable, Sequence[float]],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
    alpha: float = ALPHA,
    power: float = POWER,
) -> ContrastResult:
    """The paired contrast: its t-interval and t-test over seed means (the headline), its
    two-level bootstrap interval (secondary), its t-based MDE and a plain verdict.

    ``*_outcomes`` map seed -> per-task outcome (e.g. 1.0 solved, 0.0 not) in the same task
    order for both arms.
    """
    diffs = paired_differences(arm_outcomes, reference_outcomes)
    keys = sorted(diffs, key=str)
    table = [diffs[k] for k in keys]
    seed_means = [statistics.fmean(row) for row in table]
    n = len(seed_means)
    mean = statistics.fmean(seed_means)
    sd = statistics.stdev(seed_means) if n > 1 else None
    mde = minimum_detectable_effect(sd, n, alpha=alpha, power=power) if sd is not None else None
    notes: list[str] = []
    interval: tuple[float, float] | None = None
    bootstrap: tuple[float, float] | None = None
    p_value: float | None = None
    label = f"{arm} vs {reference}"
    level = f"{round(confidence * 100)}%"
    if n >= MIN_VALUES_FOR_INTERVAL:
        interval = t_interval(seed_means, confidence)
        p_value = t_test_p(seed_means)
        bootstrap = percentile_interval(
            two_level_bootstrap(table, resamples=resamples, seed=seed), confidence
        )
        few_tasks = [str(k) for k, row in zip(keys, table, strict=True) if len(row) < 3]
        if few_tasks:
            notes.append(
                f"seed(s) {', '.join(few_tasks)} have fewer than 3 tasks: the task level of the bootstrap interval rests on fewer than 3 values"
            )
    else:
        notes.append(
            f"no interval is quoted: only {n} seed{'s' * (n != 1)}, and an interval needs at least {MIN_VALUES_FOR_INTERVAL}"
        )
    if mde is not None and n < MIN_VALUES_FOR_INTERVAL:
        notes.append(f"the MDE rests on a standard deviation of only {n} values")
    mde_text = (
        f"; with {n} seeds and the observed sd of the seed differences ({100 * sd:.1f} pp) only a difference of "
        f"at least {100 * mde:.1f} pp would be detected with {round(power * 100)}% power (two-sided alpha {alpha:g}, t with {n - 1} df)"
        if mde is not None and sd is not None
        else ""
    )
    if interval is None or bootstrap is None or p_value is None:
        distinguishable = False
        verdict = (
            f"{label}: {_pp(mean)} over {n} seed{'s' * (n != 1)}; the arms cannot be told apart "
            f"(fewer than {MIN_VALUES_FOR_INTERVAL} seeds, no interval){mde_text}."
        )
    else:
        shown = (
            f"{level} t-interval [{_pp(interval[0])}, {_pp(interval[1])}] over {n} seed means, "
            f"p = {p_text(p_value)}; two-level bootstrap [{_pp(bootstrap[0])}, {_pp(bootstrap[1])}]"
        )
        if interval[0] <= 0.0 <= interval[1]:
            distinguishable = False
            verdict = f"{label}: the arms cannot be told apart: {_pp(mean)}, {shown} (the t-interval includes 0){mde_text}."
        else:
            distinguishable = True
            direction = "better" if mean > 0 else "worse"
            verdict = f"{label}: {arm} is {direction} by {_pp(mean)} ({shown}){mde_text}."
    return ContrastResult(
        arm=arm,
        reference=reference,
        seeds=[str(k) for k in keys],
        tasks_per_seed=[len(row) for row in table],
        seed_differences=seed_means,
        mean_difference=mean,
        sd_seed_differences=sd,
        interval=interval,
        interval_method="t",
        df=n - 1 if interval else None,
        p_value=p_value,
        bootstrap_interval=bootstrap,
        confidence=confidence,
        resamples=resamples if bootstrap else None,
        bootstrap_seed=seed if bootstrap else None,
        mde=mde,
        alpha=alpha,
        power=power,
        distinguishable=distinguishable,
        verdict=verdict,
        notes=notes,
    )


# ---------------------------------------------------------------------- per-arm summaries
#
# What benchmark.json records per arm beside the contrasts: every metric described over
# seeds (arm seeds averaged first, :func:`seed_rows`), and a one-level seeded bootstrap of
# the seed-paired difference in final success to the baseline arm (:func:`aggregate`).

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
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean; None below :data:`MIN_VALUES_FOR_INTERVAL` values.

    Seeded, so the same rows always give the same interval. With fewer than three
    values the resampling distribution has too few atoms to say anything.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n < MIN_VALUES_FOR_INTERVAL:
        return None
    rng = random.Random(seed)
    means = sorted(sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    alpha = (1.0 - confidence) / 2.0
    return quantile(means, alpha), quantile(means, 1.0 - alpha)


def significance_note(n_seeds: int, baseline_arm: str | None = BASELINE_ARM) -> str:
    """The sentence the CLI prints and benchmark.json records about statistical claims."""
    if n_seeds < MIN_VALUES_FOR_INTERVAL:
        unit = "seed" if n_seeds == 1 else "seeds"
        extra = (
            ""
            if n_seeds == 1
            else f"; a bootstrap interval needs at least {MIN_VALUES_FOR_INTERVAL}"
        )
        return f"no statistical significance is claimed ({n_seeds} {unit}{extra})"
    against = (
        f"the paired difference to {baseline_arm}"
        if baseline_arm
        else "differences (no baseline arm ran)"
    )
    return (
        f"mean ± standard deviation over {n_seeds} seeds; {int(CONFIDENCE * 100)}% percentile-bootstrap intervals of {against} "
        f"({DEFAULT_RESAMPLES} resamples of seeds, seed {DEFAULT_BOOTSTRAP_SEED}); an interval is a description of seed variation, not a significance test"
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
                "resamples": DEFAULT_RESAMPLES if interval else None,
                "bootstrap_seed": DEFAULT_BOOTSTRAP_SEED if interval else None,
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
    "ALPHA",
    "CONFIDENCE",
    "DEFAULT_BOOTSTRAP_SEED",
    "DEFAULT_RESAMPLES",
    "METRICS",
    "MIN_VALUES_FOR_INTERVAL",
    "POWER",
    "ContrastResult",
    "TaskResampler",
    "aggregate",
    "bootstrap_interval",
    "compare_arms",
    "describe",
    "holm_adjusted",
    "minimum_detectable_effect",
    "p_text",
    "paired_differences",
    "percentile_interval",
    "quantile",
    "scipy_stats",
    "seed_rows",
    "seeds_needed",
    "significance_note",
    "t_interval",
    "t_test_p",
    "two_level_bootstrap",
]
