"""The benchmark's statistics and its held-fixed checks, without training anything (fast)."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from helpers import tiny_config
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.lab.benchmark.arms import (
    BASELINE_ARM,
    DEFAULT_ARMS,
    arm_config,
    check_arm_overrides,
    cold_start_config,
    fixed_view,
    resolve_arms,
    verify_held_fixed,
)
from miniverl.lab.benchmark.harness import run_benchmark
from miniverl.lab.benchmark.stats import (
    DEFAULT_RESAMPLES,
    aggregate,
    bootstrap_interval,
    describe,
    quantile,
    significance_note,
)
from miniverl.utils.io import write_json


def _brute_mean_std(xs: list[float]) -> tuple[float, float]:
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def _exact_bootstrap_means(xs: list[float]) -> list[float]:
    """Every equally likely resample of ``xs`` (n^n of them), as sorted means."""
    n = len(xs)
    return sorted(sum(combo) / n for combo in itertools.product(xs, repeat=n))


def _exact_quantile(sorted_means: list[float], q: float) -> float:
    return sorted_means[min(len(sorted_means) - 1, max(0, math.ceil(q * len(sorted_means)) - 1))]


@pytest.mark.parametrize(
    "xs", [[0.25, 0.5, 1.0], [0.1, 0.4, 0.4, 0.9, 0.0], [-0.25, 0.125, 0.5, 0.0]]
)
def test_describe_matches_brute_force(xs: list[float]) -> None:
    stats = describe(xs)
    mean, std = _brute_mean_std(xs)
    assert stats["n"] == len(xs)
    assert stats["mean"] == pytest.approx(mean, abs=1e-15) and stats["std"] == pytest.approx(
        std, abs=1e-15
    )
    assert stats["min"] == min(xs) and stats["max"] == max(xs)


def test_describe_edge_cases() -> None:
    assert describe([]) == {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    assert describe([0.5, None]) == {"n": 1, "mean": 0.5, "std": None, "min": 0.5, "max": 0.5}


def test_quantile_matches_linear_interpolation() -> None:
    values = sorted(random.Random(3).random() for _ in range(37))
    for q in (0.0, 0.025, 0.3, 0.5, 0.975, 1.0):
        h = (len(values) - 1) * q
        lo, hi = math.floor(h), math.ceil(h)
        assert quantile(values, q) == pytest.approx(
            values[lo] + (h - lo) * (values[hi] - values[lo]), abs=1e-15
        )


def test_bootstrap_interval_of_three_values_is_the_exact_extremes() -> None:
    xs = [0.0, 0.25, 1.0]
    exact = _exact_bootstrap_means(xs)
    low, high = bootstrap_interval(xs)  # type: ignore[misc]
    # The smallest and largest resample means each have probability 1/27 > 2.5%.
    assert low == pytest.approx(exact[0], abs=1e-12) and high == pytest.approx(exact[-1], abs=1e-12)


@pytest.mark.parametrize("xs", [[0.0, 0.25, 0.25, 0.5, 1.0], [-0.5, 0.0, 0.25, 0.25, 0.75, 0.5]])
def test_bootstrap_interval_brackets_the_exact_quantiles(xs: list[float]) -> None:
    exact = _exact_bootstrap_means(xs)
    low, high = bootstrap_interval(xs)  # type: ignore[misc]
    assert _exact_quantile(exact, 0.015) - 1e-12 <= low <= _exact_quantile(exact, 0.035) + 1e-12
    assert _exact_quantile(exact, 0.965) - 1e-12 <= high <= _exact_quantile(exact, 0.985) + 1e-12
    assert low <= sum(xs) / len(xs) <= high


def test_bootstrap_is_seeded_and_refuses_fewer_than_three_values() -> None:
    xs = [0.1, 0.3, 0.2, 0.6]
    assert bootstrap_interval(xs) == bootstrap_interval(list(xs))
    rng = random.Random(5)
    continuous = [rng.random() for _ in range(10)]
    assert bootstrap_interval(continuous, seed=1, resamples=500) != bootstrap_interval(
        continuous, seed=2, resamples=500
    )
    assert bootstrap_interval([0.1, 0.2]) is None and bootstrap_interval([]) is None
    assert bootstrap_interval([0.4, 0.4, 0.4]) == (pytest.approx(0.4), pytest.approx(0.4))


def test_aggregate_pairs_differences_by_seed() -> None:
    finals = {"sft_oracle": {1: 0.5, 2: 0.25, 3: 0.75}, "opd": {1: 0.75, 2: 0.5, 3: 0.5}}
    rows = [
        {
            "arm": arm,
            "seed": seed,
            "final_success": value,
            "baseline_success": 0.0,
            "wall_seconds": float(seed),
            "teacher_query_ratio": None if arm == "sft_oracle" else 1.0,
        }
        for arm, per in finals.items()
        for seed, value in reversed(list(per.items()))
    ]
    out = aggregate(rows, ["sft_oracle", "opd"], BASELINE_ARM)
    assert out["sft_oracle"]["difference_to_baseline"] is None
    assert out["sft_oracle"]["teacher_query_ratio"]["n"] == 0
    diff = out["opd"]["difference_to_baseline"]
    assert diff["seeds"] == [1, 2, 3] and diff["values"] == [0.25, 0.25, -0.25]
    mean, std = _brute_mean_std(diff["values"])
    assert diff["mean"] == pytest.approx(mean) and diff["std"] == pytest.approx(std)
    assert diff["interval"] == [pytest.approx(-0.25), pytest.approx(0.25)]
    assert diff["resamples"] == DEFAULT_RESAMPLES
    assert out["opd"]["final_success"]["mean"] == pytest.approx(sum(finals["opd"].values()) / 3)


def test_aggregate_without_a_baseline_arm_has_no_differences() -> None:
    rows = [{"arm": "opd", "seed": s, "final_success": 0.5} for s in (1, 2, 3)]
    assert aggregate(rows, ["opd"], None)["opd"]["difference_to_baseline"] is None


def test_significance_notes() -> None:
    assert significance_note(1) == "no statistical significance is claimed (1 seed)"
    assert significance_note(2).startswith("no statistical significance is claimed (2 seeds")
    assert "bootstrap" in significance_note(3) and "sft_oracle" in significance_note(3)


# ---------------------------------------------------------------------- held fixed


def test_default_arms_hold_everything_fixed() -> None:
    base = tiny_config()
    configs = {
        name: arm_config(base, name, overrides, 1) for name, overrides in DEFAULT_ARMS.items()
    }
    for name, overrides in DEFAULT_ARMS.items():
        check_arm_overrides(name, overrides)
    view = verify_held_fixed(configs)
    assert view["optimizer_steps"] == base.train.cycles
    assert {c.run.mode for c in configs.values()} == {
        "sft",
        "seqkd",
        "offline_kd",
        "kd_oracle",
        "opd",
        "gkd_mix",
    }
    assert configs["offline_kd_reverse_kl"].loss.divergence == "reverse_kl"
    assert configs["offline_kd_reverse_kl"].run.mode == "offline_kd"
    assert configs["gkd_mix"].train.gkd_student_fraction == 0.5
    assert {configs[n].loss.divergence for n in ("opd", "opd_reverse_kl", "opd_entropy_aware")} == {
        "forward_kl",
        "reverse_kl",
        "entropy_aware",
    }


@pytest.mark.parametrize(
    "override",
    [
        "environment.eval_tasks=3",
        "train.cycles=5",
        "rollout.max_turns=3",
        "eval.temperature=0.5",
        "run.seed=9",
        "models.toy_fit.max_steps=5",
        "rollout=1",
    ],
)
def test_an_arm_touching_a_fixed_key_is_refused(override: str) -> None:
    with pytest.raises(ConfigError, match="holds fixed"):
        check_arm_overrides("bad", ["run.mode=opd", override])


def test_a_different_step_count_is_refused() -> None:
    base = tiny_config()
    configs = {
        "opd": arm_config(base, "opd", DEFAULT_ARMS["opd"], 1),
        "replay": arm_config(
            base,
            "replay",
            ["run.mode=opd", "train.opd_freshness=replay", "train.replay_passes=2"],
            1,
        ),
    }
    with pytest.raises(ConfigError, match="optimizer_steps"):
        verify_held_fixed(configs)


def test_cold_start_config_has_no_cycles_and_keeps_a_teacher() -> None:
    base = tiny_config("run.mode=sft")
    cold = cold_start_config(base, 5)
    assert cold.train.cycles == 0 and cold.run.seed == 5 and cold.run.mode == "opd"
    assert fixed_view(cold)["environment"] == fixed_view(base)["environment"]


def test_run_benchmark_refuses_before_training(tmp_path: Path) -> None:
    base = tiny_config()
    with pytest.raises(ConfigError, match="unknown benchmark arm"):
        run_benchmark(base, arms=["opd", "nope"], seeds=[1], output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match="holds fixed"):
        run_benchmark(
            base,
            arms=["bad"],
            seeds=[1],
            output_dir=tmp_path / "b",
            arm_definitions={"bad": ["train.cycles=9"]},
        )
    with pytest.raises(ConfigError, match="differ in optimizer_steps"):
        run_benchmark(
            base,
            arms=None,
            seeds=[1],
            output_dir=tmp_path / "c",
            arm_definitions={
                "opd": DEFAULT_ARMS["opd"],
                "replay": ["train.opd_freshness=replay", "train.replay_passes=2"],
            },
        )
    with pytest.raises(ConfigError, match="at least one seed"):
        run_benchmark(base, arms=["opd"], seeds=[], output_dir=tmp_path / "d")
    write_json(tmp_path / "e" / "benchmark.json", {})
    with pytest.raises(RunDirectoryError, match="already holds a benchmark"):
        run_benchmark(base, arms=["opd"], seeds=[1], output_dir=tmp_path / "e")
    assert not any((tmp_path / name).exists() for name in "abcd")
    assert resolve_arms(["opd", "sft_only", "opd"]) == {
        "opd": DEFAULT_ARMS["opd"],
        "sft_only": DEFAULT_ARMS["sft_oracle"],
    }, "the deprecated alias keeps its name and runs sft_oracle's definition"
    assert "sft_only" not in resolve_arms(None)
    assert "opd_privileged" not in resolve_arms(None), "named-only arms never run by default"
    assert resolve_arms(["opd_privileged"])["opd_privileged"][-1] == (
        "teacher.mode=privileged_context"
    )


def test_cli_refuses_bad_arguments_before_training(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from helpers import TOY_CALCULATOR
    from miniverl.cli.main import app

    recipe = tmp_path / "toy_calculator.yaml"
    recipe.write_bytes(TOY_CALCULATOR.read_bytes())
    runner = CliRunner()
    bad_seeds = runner.invoke(
        app, ["benchmark", str(recipe), "--seeds", "1,x", "--output", str(tmp_path / "o")]
    )
    assert bad_seeds.exit_code == 2 and "comma-separated integers" in bad_seeds.output
    bad_arm = runner.invoke(
        app, ["benchmark", str(recipe), "--arms", "opd,nope", "--output", str(tmp_path / "o")]
    )
    assert bad_arm.exit_code == 1 and "unknown benchmark arm" in bad_arm.output
    assert not (tmp_path / "o").exists()


def test_every_default_arm_records_its_sampling_and_loss_temperature() -> None:
    from miniverl.lab.benchmark.arms import arm_record

    base = tiny_config("rollout.temperature=1.0", "loss.temperature=2.0")
    records = {
        name: arm_record(name, ovr, arm_config(base, name, ovr, 1))
        for name, ovr in DEFAULT_ARMS.items()
    }
    temps = {n: (r["sampling_temperature"], r["loss_temperature"]) for n, r in records.items()}
    assert temps == {
        "sft_oracle": (None, None),
        "seqkd": (1.0, None),
        "offline_kd": (1.0, 2.0),
        "kd_oracle": (None, 2.0),
        "opd": (1.0, 2.0),
        "opd_reverse_kl": (1.0, 2.0),
        "offline_kd_reverse_kl": (1.0, 2.0),
        "gkd_mix": (1.0, 2.0),
        "opd_entropy_aware": (1.0, 2.0),
    }
    assert records["sft_oracle"]["reference_ceiling"] is True
    assert not any(r["reference_ceiling"] for n, r in records.items() if n != "sft_oracle")
    alias = arm_record("sft_only", ("run.mode=sft",), arm_config(base, "sft_only", (), 1))
    assert alias["deprecated_alias_of"] == "sft_oracle" and alias["reference_ceiling"] is True
