"""lab/benchmark/stats.py against brute force and float64 references: exact two-level resampling,
the t-interval and t-test (closed forms and table values), Holm, the t-based MDE."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from scipy.stats import t as student_t

from helpers import run_python
from miniverl.errors import SchemaValidationError
from miniverl.lab.benchmark.stats import (
    TaskResampler,
    bootstrap_interval,
    compare_arms,
    holm_adjusted,
    minimum_detectable_effect,
    paired_differences,
    percentile_interval,
    seeds_needed,
    t_interval,
    t_test_p,
    two_level_bootstrap,
)

T_TABLE = {
    # (q, df): the q quantile of Student's t, from printed tables (Fisher & Yates) to 9 digits.
    (0.975, 1): 12.706204736,
    (0.975, 2): 4.302652730,
    (0.975, 3): 3.182446305,
    (0.975, 4): 2.776445105,
    (0.975, 9): 2.262157163,
    (0.975, 30): 2.042272456,
    (0.995, 7): 3.499483297,
    (0.95, 10): 1.812461123,
}


def _t_cdf_closed_form(t: float, df: int) -> float:
    """Student's t CDF in closed form for df = 1..4 (float64)."""
    if df == 1:
        return 0.5 + math.atan(t) / math.pi
    if df == 2:
        return 0.5 + t / (2.0 * math.sqrt(2.0 + t * t))
    if df == 3:
        u = t / math.sqrt(3.0)
        return 0.5 + (u / (1.0 + u * u) + math.atan(u)) / math.pi
    x = t * t / (4.0 + t * t)
    return 0.5 + 0.5 * math.copysign(math.sqrt(x) * (1.5 - 0.5 * x), t)


def _exact_two_level(table: list[list[float]]) -> dict[float, float]:
    """Every equally likely two-level resample, enumerated: seeds with replacement, then each
    drawn seed's tasks with replacement (independently per draw). value -> probability."""
    s = len(table)
    dist: dict[float, float] = defaultdict(float)
    for seeds in itertools.product(range(s), repeat=s):
        rows = [table[i] for i in seeds]
        weight = 1.0 / (s**s * math.prod(len(r) ** len(r) for r in rows))
        for combos in itertools.product(*(itertools.product(r, repeat=len(r)) for r in rows)):
            dist[round(sum(sum(c) / len(c) for c in combos) / s, 12)] += weight
    return dict(dist)


def _exact_one_level(table: list[list[float]]) -> dict[float, float]:
    """Seeds resampled, tasks never: what a bootstrap that forgets the task level gives."""
    s = len(table)
    means = [sum(row) / len(row) for row in table]
    dist: dict[float, float] = defaultdict(float)
    for seeds in itertools.product(range(s), repeat=s):
        dist[round(sum(means[i] for i in seeds) / s, 12)] += 1.0 / s**s
    return dict(dist)


def _ks(dist: dict[float, float], sample: list[float]) -> float:
    """Largest CDF gap between an exact distribution and a sample, checked at every atom."""
    sample = sorted(sample)
    gap, cumulative = 0.0, 0.0
    for x in sorted(dist):
        cumulative += dist[x]
        below = bisect.bisect_right(sample, x + 1e-9) / len(sample)
        gap = max(gap, abs(below - cumulative))
    return gap


def _ks_exact(a: dict[float, float], b: dict[float, float]) -> float:
    ca = cb = gap = 0.0
    for x in sorted(set(a) | set(b)):
        ca += a.get(x, 0.0)
        cb += b.get(x, 0.0)
        gap = max(gap, abs(ca - cb))
    return gap


def _exact_quantile(dist: dict[float, float], q: float) -> float:
    cumulative = 0.0
    for x in sorted(dist):
        cumulative += dist[x]
        if cumulative >= q - 1e-12:
            return x
    return max(dist)


TABLES = {
    "3 seeds x 2 tasks": [[1.0, -1.0], [1.0, -1.0], [0.0, 0.0]],
    "3 seeds, 3/2/1 tasks": [[1.0, 0.0, -1.0], [0.5, 1.0], [-1.0]],
    "4 seeds x 2 tasks": [[0.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [1.0, 0.5]],
}


@pytest.mark.parametrize("name", list(TABLES))
def test_two_level_bootstrap_matches_exact_enumeration(name: str) -> None:
    table = TABLES[name]
    exact = _exact_two_level(table)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    # The table can tell the levels apart: forgetting the task level is far off.
    assert _ks_exact(exact, _exact_one_level(table)) > 0.1
    replicates = two_level_bootstrap(table, resamples=20_000, seed=11)
    assert replicates == sorted(replicates) and len(replicates) == 20_000
    # DKW: P(sup gap > 0.015) <= 2 exp(-2 * 20000 * 0.015^2) < 3e-4 for a correct sampler.
    assert _ks(exact, replicates) < 0.015
    exact_mean = sum(v * p for v, p in exact.items())
    exact_var = sum((v - exact_mean) ** 2 * p for v, p in exact.items())
    assert exact_mean == pytest.approx(statistics.fmean(statistics.fmean(r) for r in table))
    assert statistics.fmean(replicates) == pytest.approx(
        exact_mean, abs=4 * math.sqrt(exact_var / 20_000)
    )
    assert statistics.pvariance(replicates) == pytest.approx(exact_var, rel=0.05)
    low, high = percentile_interval(replicates)
    assert _exact_quantile(exact, 0.015) - 1e-9 <= low <= _exact_quantile(exact, 0.035) + 1e-9
    assert _exact_quantile(exact, 0.965) - 1e-9 <= high <= _exact_quantile(exact, 0.985) + 1e-9


def test_bootstrap_is_seeded() -> None:
    table = TABLES["3 seeds x 2 tasks"]
    assert two_level_bootstrap(table, resamples=500, seed=3) == two_level_bootstrap(
        table, resamples=500, seed=3
    )
    assert two_level_bootstrap(table, resamples=500, seed=3) != two_level_bootstrap(
        table, resamples=500, seed=4
    )
    with pytest.raises(ValueError, match="at least one seed"):
        two_level_bootstrap([])
    with pytest.raises(ValueError, match="resamples must be >= 1"):
        two_level_bootstrap(table, resamples=0)


def test_task_resampler_matches_the_exact_multinomial() -> None:
    row = [0.0, 1.0, 1.0, -1.0, 0.5]
    exact: dict[float, float] = defaultdict(float)
    for combo in itertools.product(row, repeat=len(row)):
        exact[round(sum(combo) / len(row), 12)] += 1.0 / len(row) ** len(row)
    rng = random.Random(5)
    resampler = TaskResampler(row)
    assert _ks(dict(exact), [resampler.draw(rng) for _ in range(20_000)]) < 0.015


def test_large_seed_resample_has_the_multinomial_moments() -> None:
    rng = random.Random(9)
    row = [float(rng.random() < 0.6) - float(rng.random() < 0.5) for _ in range(600)]
    resampler = TaskResampler(row)
    draws = [resampler.draw(rng) for _ in range(4000)]
    mean, var = statistics.fmean(row), statistics.pvariance(row) / len(row)
    assert statistics.fmean(draws) == pytest.approx(mean, abs=5 * math.sqrt(var / 4000))
    assert statistics.pvariance(draws) == pytest.approx(var, rel=0.1)


# -- minimum detectable effect -------------------------------------------------------------------


@pytest.mark.parametrize(("q", "df"), list(T_TABLE))
def test_t_interval_half_width_is_the_table_quantile(q: float, df: int) -> None:
    values = [math.sin(i + 1.0) for i in range(df + 1)]
    low, high = t_interval(values, confidence=2 * q - 1)
    half = statistics.stdev(values) / math.sqrt(df + 1)
    assert (high - low) / 2 / half == pytest.approx(T_TABLE[(q, df)], abs=1e-6)
    assert (low + high) / 2 == pytest.approx(statistics.fmean(values), abs=1e-12)


def test_t_interval_and_p_value_are_computed_by_hand() -> None:
    values = [1 / 3, -1 / 3, 2 / 3]
    mean, sd = 2 / 9, statistics.stdev(values)
    half = T_TABLE[(0.975, 2)] * sd / math.sqrt(3)
    assert t_interval(values) == pytest.approx((mean - half, mean + half), abs=1e-8)
    t = mean / (sd / math.sqrt(3))
    assert t_test_p(values) == pytest.approx(1.0 - t / math.sqrt(2.0 + t * t), abs=1e-13)
    assert t_test_p([-0.1, 0.1, 0.0, 0.3]) == pytest.approx(
        2 * (1 - _t_cdf_closed_form(0.075 / (statistics.stdev([-0.1, 0.1, 0.0, 0.3]) / 2), 3)),
        abs=1e-13,
    )
    assert t_test_p([0.0, 0.0, 0.0]) == 1.0 and t_test_p([0.2, 0.2, 0.2]) == 0.0


def test_holm_matches_the_textbook_example() -> None:
    """Four hypotheses, family-wise alpha 0.05 (Holm 1979; e.g. Wikipedia's worked example):
    sorted p 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 with the running maximum."""
    adjusted = holm_adjusted([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert [p <= 0.05 for p in adjusted] == [True, False, False, True]
    assert holm_adjusted([0.2, 0.6]) == pytest.approx([0.4, 0.6])
    assert holm_adjusted([0.5, 0.9, 0.8]) == [1.0, 1.0, 1.0]
    assert holm_adjusted([]) == []


def test_holm_on_a_shuffled_family_reports_in_input_order() -> None:
    """m = 5, given out of order. By hand, ascending: 0.001 (input 1) x5 = 0.005; 0.012
    (input 3) x4 = 0.048; 0.03 (input 2) x3 = 0.09; 0.04 (input 0) x2 = 0.08, raised to the
    running maximum 0.09; 0.2 (input 4) x1 = 0.2. Back in input order:
    [0.09, 0.005, 0.09, 0.048, 0.2]."""
    adjusted = holm_adjusted([0.04, 0.001, 0.03, 0.012, 0.2])
    assert adjusted == pytest.approx([0.09, 0.005, 0.09, 0.048, 0.2], abs=1e-15)
    assert [p <= 0.05 for p in adjusted] == [False, True, False, True, False]
    # Descending input with a tie: ascending 0.01 (input 2) x3 = 0.03; the two 0.02s give
    # x2 = 0.04 and x1 = 0.02, raised to 0.04, whichever of them is ranked first.
    assert holm_adjusted([0.02, 0.02, 0.01]) == pytest.approx([0.04, 0.04, 0.03], abs=1e-15)
    # Largest first: 0.3 (input 1) x3 = 0.9; 0.45 (input 2) x2 = 0.9; 0.7 (input 0) x1 = 0.7,
    # raised to 0.9.
    assert holm_adjusted([0.7, 0.3, 0.45]) == pytest.approx([0.9, 0.9, 0.9], abs=1e-15)


def test_mde_is_the_stated_t_formula() -> None:
    """(t_{.975, n-1} + t_{.8, n-1}) sd / sqrt(n); t_{.8, 4} from the df = 4 closed form."""
    t80_4 = student_t.ppf(0.8, 4)
    assert _t_cdf_closed_form(t80_4, 4) == pytest.approx(0.8, abs=1e-13)
    assert minimum_detectable_effect(0.35, 5) == pytest.approx(
        (T_TABLE[(0.975, 4)] + t80_4) * 0.35 / math.sqrt(5), abs=1e-8
    )
    assert minimum_detectable_effect(0.1, 11, alpha=0.1, power=0.9) == pytest.approx(
        (T_TABLE[(0.95, 10)] + student_t.ppf(0.9, 10)) * 0.1 / math.sqrt(11), abs=1e-9
    )
    for n in (2, 5, 17, 190):
        assert seeds_needed(0.3, minimum_detectable_effect(0.3, n)) == n
    assert seeds_needed(0.45, 0.10) == 161
    assert minimum_detectable_effect(0.45, 161) <= 0.10 < minimum_detectable_effect(0.45, 160)
    with pytest.raises(ValueError, match="effect must be positive"):
        seeds_needed(0.1, 0.0)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        minimum_detectable_effect(0.1, 4, power=1.0)
    with pytest.raises(ValueError, match="n >= 2"):
        minimum_detectable_effect(0.1, 1)


@pytest.mark.parametrize(("n", "seed"), [(5, 3), (8, 2)])
def test_an_effect_of_one_mde_is_detected_by_the_t_test_with_the_stated_power(
    n: int, seed: int
) -> None:
    rng = random.Random(seed)
    sd = 0.2
    effect = minimum_detectable_effect(sd, n)
    critical = student_t.ppf(0.975, n - 1)
    trials = 4000
    detected = 0
    for _ in range(trials):
        xs = [rng.gauss(effect, sd) for _ in range(n)]
        detected += abs(statistics.fmean(xs)) / (statistics.stdev(xs) / math.sqrt(n)) > critical
    assert detected / trials == pytest.approx(0.8, abs=0.03)


# -- contrasts and verdicts ------------------------------------------------------------------------


def _outcomes(seed: int, p: float, seeds: int = 5, tasks: int = 40) -> dict[int, list[float]]:
    rng = random.Random(seed)
    return {s: [float(rng.random() < p) for _ in range(tasks)] for s in range(seeds)}


def test_contrast_pairs_tasks_and_reports_values_computed_by_hand() -> None:
    arm = {"a": [1.0, 1.0, 0.0], "b": [1.0, 0.0, 0.0], "c": [0.0, 1.0, 1.0]}
    ref = {"a": [0.0, 1.0, 0.0], "b": [1.0, 1.0, 0.0], "c": [0.0, 0.0, 0.0]}
    result = compare_arms("opd", "offline_kd", arm, ref, resamples=2000)
    assert paired_differences(arm, ref) == {
        "a": [1.0, 0.0, 0.0],
        "b": [0.0, -1.0, 0.0],
        "c": [0.0, 1.0, 1.0],
    }
    assert result.seeds == ["a", "b", "c"] and result.tasks_per_seed == [3, 3, 3]
    assert result.seed_differences == pytest.approx([1 / 3, -1 / 3, 2 / 3])
    assert result.mean_difference == pytest.approx(2 / 9)
    assert result.sd_seed_differences == pytest.approx(statistics.stdev([1 / 3, -1 / 3, 2 / 3]))
    t80_2 = 0.6 / math.sqrt(0.32)  # t_{.8, 2} in closed form: (2q - 1) / sqrt(2q(1 - q))
    assert result.mde == pytest.approx(
        (T_TABLE[(0.975, 2)] + t80_2) * result.sd_seed_differences / math.sqrt(3),
        abs=1e-8,
    )
    half = T_TABLE[(0.975, 2)] * result.sd_seed_differences / math.sqrt(3)
    assert result.interval == pytest.approx((2 / 9 - half, 2 / 9 + half), abs=1e-8)
    assert (result.interval_method, result.df) == ("t", 2)
    assert result.p_value == pytest.approx(t_test_p([1 / 3, -1 / 3, 2 / 3]), abs=1e-15)
    replicates = two_level_bootstrap(list(paired_differences(arm, ref).values()), resamples=2000)
    assert result.bootstrap_interval == percentile_interval(replicates)
    data = json.loads(json.dumps(result.to_dict()))
    assert result.notes == [] and data["interval"] == list(result.interval)
    assert data["bootstrap_interval"] == list(result.bootstrap_interval)


def test_verdict_when_the_arms_differ() -> None:
    result = compare_arms("opd", "offline_kd", _outcomes(1, 0.9), _outcomes(2, 0.2), resamples=2000)
    assert result.distinguishable and result.interval[0] > 0
    lo, hi = result.interval
    blo, bhi = result.bootstrap_interval
    assert result.verdict == (
        f"opd vs offline_kd: opd is better by {100 * result.mean_difference:+.1f} pp (95% t-interval "
        f"[{100 * lo:+.1f} pp, {100 * hi:+.1f} pp] over 5 seed means, p = < 0.001; two-level bootstrap "
        f"[{100 * blo:+.1f} pp, {100 * bhi:+.1f} pp]); "
        f"with 5 seeds and the observed sd of the seed differences ({100 * result.sd_seed_differences:.1f} pp) "
        f"only a difference of at least {100 * result.mde:.1f} pp would be detected with 80% power (two-sided alpha 0.05, t with 4 df)."
    )
    worse = compare_arms("offline_kd", "opd", _outcomes(2, 0.2), _outcomes(1, 0.9), resamples=2000)
    assert worse.distinguishable and "offline_kd is worse by" in worse.verdict


def test_the_headline_is_the_t_interval_even_where_the_bootstrap_excludes_0() -> None:
    """Five seeds, each a clear negative but scattered: the bootstrap of five atoms excludes 0,
    the t-interval does not, and the verdict follows the t-interval."""
    arm = {s: [0.0] * 100 for s in range(5)}
    ref = {s: [1.0] * n + [0.0] * (100 - n) for s, n in enumerate([16, 1, 3, 3, 12])}
    result = compare_arms("opd", "offline_kd", arm, ref, resamples=2000)
    assert result.bootstrap_interval[1] < 0 < result.interval[1]
    assert not result.distinguishable and "(the t-interval includes 0)" in result.verdict
    assert 0.05 < result.p_value < 0.1


def test_verdict_when_the_arms_cannot_be_told_apart() -> None:
    result = compare_arms("opd", "offline_kd", _outcomes(3, 0.5), _outcomes(4, 0.5), resamples=2000)
    lo, hi = result.interval
    assert not result.distinguishable and lo < 0 < hi
    assert result.verdict.startswith(
        f"opd vs offline_kd: the arms cannot be told apart: {100 * result.mean_difference:+.1f} pp, "
        f"95% t-interval [{100 * lo:+.1f} pp, {100 * hi:+.1f} pp] over 5 seed means, p = {result.p_value:.3f}"
    )
    assert f"at least {100 * result.mde:.1f} pp would be detected with 80% power" in result.verdict


@pytest.mark.parametrize("n", [1, 2])
def test_no_interval_below_three_seeds_and_it_says_so(n: int) -> None:
    result = compare_arms("opd", "offline_kd", _outcomes(1, 0.9, n), _outcomes(2, 0.1, n))
    assert result.interval is None and result.resamples is None and not result.distinguishable
    assert result.p_value is None and result.bootstrap_interval is None
    plural = "s" * (n != 1)
    assert result.verdict.startswith(
        f"opd vs offline_kd: {100 * result.mean_difference:+.1f} pp over {n} seed{plural}; "
        "the arms cannot be told apart (fewer than 3 seeds, no interval)"
    )
    assert (
        result.notes[0]
        == f"no interval is quoted: only {n} seed{plural}, and an interval needs at least 3"
    )
    if n == 1:
        assert result.mde is None and result.sd_seed_differences is None and len(result.notes) == 1
    else:
        assert result.notes[1] == "the MDE rests on a standard deviation of only 2 values"


def test_an_interval_over_seeds_with_fewer_than_three_tasks_says_so() -> None:
    result = compare_arms(
        "a",
        "b",
        {1: [1.0, 0.0], 2: [1.0], 3: [0.0, 1.0, 1.0]},
        {1: [0.0, 0.0], 2: [0.0], 3: [0.0, 0.0, 1.0]},
        resamples=500,
    )
    assert result.interval is not None
    assert result.notes == [
        "seed(s) 1, 2 have fewer than 3 tasks: the task level of the bootstrap interval rests on fewer than 3 values"
    ]


def test_contrast_refuses_unpaired_tables() -> None:
    with pytest.raises(SchemaValidationError) as info:
        compare_arms("a", "b", {1: [1.0], 2: [1.0]}, {1: [1.0], 3: [0.0]})
    assert str(info.value) == "the arms were run on different seeds (['1', '2'] vs ['1', '3'])"
    with pytest.raises(SchemaValidationError) as info:
        compare_arms("a", "b", {1: [1.0, 0.0]}, {1: [1.0]})
    assert str(info.value) == "seed 1: the arms have 2 and 1 task outcomes"
    assert "same non-empty task list" in (info.value.hint or "")


_BLOCKED_CHILD = r"""
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'numpy', 'scipy'):
            raise ModuleNotFoundError(name)

sys.meta_path.insert(0, Block())
from miniverl.errors import BackendError
from miniverl.lab.benchmark.stats import aggregate, bootstrap_interval, compare_arms
rows = [{"arm": arm, "seed": seed, "final_success": 0.1 * seed + (arm == "opd")}
        for arm in ("sft_only", "opd") for seed in (1, 2, 3)]
summary = aggregate(rows, ["sft_only", "opd"], "sft_only")
print(summary["opd"]["difference_to_baseline"]["mean"], bootstrap_interval([0.0, 1.0, 2.0], resamples=50))
try:
    compare_arms("a", "b", {1: [1.0], 2: [0.0], 3: [1.0]}, {1: [0.0], 2: [0.0], 3: [0.0]})
except BackendError as exc:
    print(str(exc), "|", exc.hint)
from miniverl.lab.benchmark.harness import run_benchmark
try:
    run_benchmark(sys.argv[1], arms=["opd"], seeds=[1], output_dir=sys.argv[2],
                  run_cell=lambda *a: sys.exit("a cell ran without scipy"))
except BackendError as exc:
    print(str(exc), "|", exc.hint)
print(sorted(m for m in ("torch", "numpy", "scipy") if m in sys.modules))
"""


def test_without_scipy_the_summaries_run_and_the_contrasts_name_the_lab_extra(
    tmp_path: Path,
) -> None:
    """The per-arm summaries are standard-library only; a contrast, and a benchmark before
    any cell trains, raise BackendError with the install hint instead of an ImportError."""
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "toy_calculator.yaml"
    result = run_python(_BLOCKED_CHILD, args=[str(recipe), str(tmp_path / "bench")])
    assert result.returncode == 0, result.stderr
    refused = (
        "scipy.stats is not installed (needed for the benchmark's contrasts) "
        '| from a clone of miniverl: pip install -e ".[lab]" (README, Quick start)'
    )
    assert result.stdout.splitlines() == [
        f"1.0 {bootstrap_interval([0.0, 1.0, 2.0], resamples=50)}",
        refused,
        refused,
        "[]",
    ]
    assert not (tmp_path / "bench").exists()
