"""lab/benchmark/stats.py's scipy-based statistics against the hand-written float64 code they
replaced, on every stored study's inputs.

The stored studies (``results/*/*/cells``) are quoted in the README and docs to one decimal
of a percentage point and three of a p-value. The reference below is the standard-library
implementation that produced those quotes: Student's t from the regularized incomplete beta
function (modified Lentz continued fraction, Numerical Recipes 6.4) and binomial CDF tables
summed from log-gamma terms. Every t-interval, p-value, MDE and seeds-needed the stored cells
can produce must agree with it to :data:`TOLERANCE`, and every two-level bootstrap replicate
must be identical, so a figure rendered from the stored cells cannot move.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import random
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from miniverl.lab.benchmark import stats
from miniverl.lab.benchmark.contrasts import contrast_pairs, endpoint_label, outcome_table

RESULTS = Path(__file__).resolve().parents[2] / "results"
TOLERANCE = 1e-9
DELTA = 0.10
"""The smallest effect the studies plan for (docs/benchmark.md, Power procedure)."""


# ---------------------------------------------------------------------- the reference


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def ref_incomplete_beta(a: float, b: float, x: float) -> float:
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def ref_t_cdf(t: float, df: float) -> float:
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * ref_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.cache
def ref_t_quantile(q: float, df: float) -> float:
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -ref_t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while ref_t_cdf(hi, df) < q:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if ref_t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def ref_t_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    n = len(values)
    mean = statistics.fmean(values)
    half = ref_t_quantile(0.5 + confidence / 2.0, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


def ref_t_test_p(values: Sequence[float]) -> float:
    n = len(values)
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    if sd == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    t = mean / (sd / math.sqrt(n))
    return ref_incomplete_beta((n - 1) / 2.0, 0.5, (n - 1) / (n - 1 + t * t))


def ref_mde(sd: float, n: int, alpha: float = stats.ALPHA, power: float = stats.POWER) -> float:
    t_sum = ref_t_quantile(1.0 - alpha / 2.0, n - 1) + ref_t_quantile(power, n - 1)
    return t_sum * sd / math.sqrt(n)


def ref_seeds_needed(sd: float, effect: float) -> int:
    def enough(n: int) -> bool:
        return ref_mde(sd, n) <= effect * (1 + 1e-12)

    lo, hi = 1, 2
    while not enough(hi):
        lo, hi = hi, 2 * hi
        if hi > stats.MAX_SEEDS_NEEDED:
            raise ValueError(f"more than {stats.MAX_SEEDS_NEEDED} seeds would be needed")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


TAIL_SDS = 20


def _ref_binomial_cdf(n: int, p: float) -> tuple[int, list[float]]:
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    lo = max(0, math.floor(mean - TAIL_SDS * sd - 10))
    hi = min(n, math.ceil(mean + TAIL_SDS * sd + 10))
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    cdf: list[float] = []
    total = 0.0
    for x in range(lo, hi + 1):
        total += math.exp(
            log_n - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * log_p + (n - x) * log_q
        )
        cdf.append(total)
    return lo, [c / total for c in cdf]


class RefTaskResampler(stats.TaskResampler):
    """The module's resampler with the hand-summed binomial tables."""

    def _binomial(self, rng: random.Random, trials: int, count: int, weight: int) -> int:
        if trials == 0 or count == 0:
            return 0
        if count == weight:
            return trials
        key = (trials, count, weight)
        if key not in self._ref_tables:
            self._ref_tables[key] = _ref_binomial_cdf(trials, count / weight)
        lo, cdf = self._ref_tables[key]
        return lo + min(bisect.bisect_right(cdf, rng.random()), len(cdf) - 1)

    def __init__(self, values: Sequence[float]) -> None:
        super().__init__(values)
        self._ref_tables: dict[tuple[int, int, int], tuple[int, list[float]]] = {}


def ref_two_level_bootstrap(table: Sequence[Sequence[float]]) -> list[float]:
    resamplers = [RefTaskResampler(row) for row in table]
    rng = random.Random(stats.DEFAULT_BOOTSTRAP_SEED)
    n = len(resamplers)
    return sorted(
        sum(resamplers[rng.randrange(n)].draw(rng) for _ in range(n)) / n
        for _ in range(stats.DEFAULT_RESAMPLES)
    )


# ---------------------------------------------------------------------- the stored inputs


@functools.cache
def _studies() -> dict[str, list[dict[str, Any]]]:
    """Study directory (relative to results/) -> the payloads of its arm cells."""
    out: dict[str, list[dict[str, Any]]] = {}
    for cells_dir in sorted(RESULTS.glob("*/*/cells")):
        payloads = [
            json.loads(path.read_text(encoding="utf-8"))["payload"]
            for path in sorted(cells_dir.glob("*.json"))
        ]
        arm_cells = [p for p in payloads if p.get("arm") and p.get("tasks")]
        if arm_cells:
            out[cells_dir.parent.relative_to(RESULTS).as_posix()] = arm_cells
    return out


def _seeds(study: str) -> int:
    return len({c["seed"] for c in _studies()[study]})


def _endpoints(cells: Sequence[dict[str, Any]]) -> list[int | None]:
    return [*sorted({int(t["k"]) for c in cells for t in c["tasks"]}), None]


@functools.cache
def _outcomes(study: str, arm: str, k: int | None) -> dict[str, dict[str, float]]:
    return outcome_table(_studies()[study], arm, k)


def _contrast_tables(
    study: str, pairs: Sequence[tuple[str, str]]
) -> Iterator[tuple[str, list[list[float]]]]:
    """(label, seed-ordered per-task paired differences), paired as ``contrasts.contrast``
    pairs them."""
    for arm, reference in pairs:
        for k in _endpoints(_studies()[study]):
            a, b = _outcomes(study, arm, k), _outcomes(study, reference, k)
            rows = {}
            for seed in sorted(set(a) & set(b)):
                shared = sorted(set(a[seed]) & set(b[seed]))
                if shared:
                    rows[seed] = [a[seed][t] - b[seed][t] for t in shared]
            if rows:
                label = f"{arm} - {reference} ({endpoint_label(k)})"
                yield label, [rows[s] for s in sorted(rows)]


def _quoted_pairs(study: str) -> list[tuple[str, str]]:
    return [(a, r) for a, r, _ in contrast_pairs(sorted({c["arm"] for c in _studies()[study]}))]


def _seed_vectors(study: str) -> Iterator[tuple[str, list[float]]]:
    """Every seed-level vector the studies feed to a t-interval or t-test: the seed means of
    every pair's paired differences, and every arm's per-seed success, each as a fraction and
    in percent (the stored-results tests quote both)."""
    arms = sorted({c["arm"] for c in _studies()[study]})
    pairs = [(a, r) for a in arms for r in arms if a < r]
    for label, table in _contrast_tables(study, pairs):
        yield label, [statistics.fmean(row) for row in table]
    for arm in arms:
        for k in _endpoints(_studies()[study]):
            table = _outcomes(study, arm, k)
            yield (
                f"{arm} ({endpoint_label(k)})",
                [statistics.fmean(table[s].values()) for s in sorted(table)],
            )


# ---------------------------------------------------------------------- the comparisons


def test_the_reference_still_gives_table_values() -> None:
    """A broken reference would make every comparison below meaningless."""
    assert ref_t_quantile(0.975, 4) == pytest.approx(2.776445105, abs=1e-9)
    assert ref_t_quantile(0.8, 2) == pytest.approx(0.6 / math.sqrt(0.32), rel=1e-12)
    assert ref_t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-15)
    lo, cdf = _ref_binomial_cdf(7, 0.5)
    assert lo == 0 and cdf[3] == pytest.approx(0.5, abs=1e-15)


MULTI_SEED = [s for s in sorted(_studies()) if _seeds(s) >= 2]
"""The studies with a standard deviation over seeds (a one-seed grid has no interval)."""


def test_the_stored_studies_are_found() -> None:
    assert len(MULTI_SEED) >= 10 and all(_seeds(s) >= 3 for s in MULTI_SEED), MULTI_SEED


@pytest.mark.parametrize("study", MULTI_SEED)
def test_t_statistics_match_the_reference(study: str) -> None:
    checked = 0
    for label, fractions in _seed_vectors(study):
        if len(fractions) < 2:
            continue
        for values in (fractions, [100 * v for v in fractions]):
            got, want = stats.t_interval(values), ref_t_interval(values, stats.CONFIDENCE)
            assert got == pytest.approx(want, abs=TOLERANCE), (label, values)
            p, want_p = stats.t_test_p(values), ref_t_test_p(values)
            assert p == pytest.approx(want_p, abs=TOLERANCE), (label, values)
            sd = statistics.stdev(values)
            assert stats.minimum_detectable_effect(sd, len(values)) == pytest.approx(
                ref_mde(sd, len(values)), abs=TOLERANCE
            ), (label, values)
        checked += 1
    assert checked >= 4, study


@pytest.mark.parametrize("study", MULTI_SEED)
def test_seeds_needed_matches_the_reference(study: str) -> None:
    checked = 0
    for label, table in _contrast_tables(study, _quoted_pairs(study)):
        if len(table) < 2:
            continue
        sd = statistics.stdev(statistics.fmean(row) for row in table)
        if sd == 0.0:
            continue
        for effect in (DELTA, 2 * DELTA):
            try:
                want: int | str = ref_seeds_needed(sd, effect)
            except ValueError as exc:
                want = str(exc)
            try:
                got: int | str = stats.seeds_needed(sd, effect)
            except ValueError as exc:
                got = str(exc)
            assert got == want, (label, sd, effect)
        checked += 1
    assert checked >= 1, study


@pytest.mark.slow
@pytest.mark.parametrize("study", MULTI_SEED)
def test_two_level_bootstrap_replicates_are_identical(study: str) -> None:
    """Every quoted contrast with an interval: the same 10,000 sorted replicates, bit for bit."""
    checked = 0
    for label, table in _contrast_tables(study, _quoted_pairs(study)):
        if len(table) < stats.MIN_VALUES_FOR_INTERVAL:
            continue
        assert stats.two_level_bootstrap(table) == ref_two_level_bootstrap(table), label
        checked += 1
    assert checked >= 1, study
