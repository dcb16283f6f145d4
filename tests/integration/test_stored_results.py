"""The figures the README, docs/benchmark.md and LOG.md quote come from the cells in ``results/``.

``results/calc_chain_oracle/pilot`` holds the pilot's 25 finished cells and five shared cold
starts; ``results/calc_chain_oracle/lr-grid`` the learning-rate grid's cells, cold starts and
``lr_grid.json``; ``results/calc_chain_oracle/selected-rates`` the test-split protocol at the
grid's selected rates: eight arms at 5 seeds x 2 arm seeds (results/README.md). These tests
check the quoted figures against the code rather than against a label: rerunning the command
over a copy of the directory, with a trainer that fails the test if it is ever called, must
reuse every cell (same base config and validated arm config, intact payload digests) and
recompute the same contrasts and the same selection; each stored cold-start weight file must
be the one its cell records, so the rest of the protocol can start from it; and
``benchmark --lr-from`` must accept the stored grid for the test-split protocol of the same
recipe.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from miniverl.config.models import RunConfig
from miniverl.lab.benchmark.contrasts import PRIMARY_CONTRASTS
from miniverl.lab.benchmark.harness import run_benchmark
from miniverl.lab.benchmark.lr_grid import benchmark_arms_from_grid, lr_text, run_lr_grid
from miniverl.lab.benchmark.stats import minimum_detectable_effect, seeds_needed
from miniverl.lab.benchmark.stats import p_text as stats_p_text
from miniverl.lab.config import load_recipe
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import read_json

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "results" / "calc_chain_oracle"
PILOT, GRID, SELECTED = STORED / "pilot", STORED / "lr-grid", STORED / "selected-rates"
PILOT_OVERRIDES = ["eval.split=test", "eval.every=50", "eval.max_tasks=1200"]
DELTA = 0.10
"""The pre-registered smallest effect worth detecting (docs/benchmark.md, Power procedure)."""
Z_975, Z_80 = 1.959963984540054, 0.8416212335729143


def _refuse_to_train(cell: Any, done: Any) -> dict[str, Any]:
    raise AssertionError(f"stored cell {cell} was not reused: it would have been trained again")


def _pp(value: float) -> float:
    return round(100 * value, 1)


def _assert_contrast(got: dict[str, Any], arms: tuple[str, str], figures: tuple[Any, ...]) -> None:
    """One contrast row of benchmark.json against its pinned figures; ``arms`` = (reference, arm).

    ``figures``: mean, 95% t-interval over the seed means, 95% two-level bootstrap, per-seed
    differences, sd of the seed differences and t-based MDE (all in pp, one decimal), the
    two-sided p and the Holm-adjusted p (three decimals; None outside the primary family).
    """
    mean, interval, bootstrap, per_seed, sd, mde, p, p_holm = figures
    endpoint = got["endpoint"]
    assert (got["reference"], got["arm"]) == arms, endpoint
    assert got["interval_method"] == "t" and got["df"] == len(per_seed) - 1, endpoint
    assert _pp(got["mean_difference"]) == mean, endpoint
    assert [_pp(v) for v in got["interval"]] == interval, endpoint
    assert [_pp(v) for v in got["bootstrap_interval"]] == bootstrap, endpoint
    assert [_pp(v) for v in got["seed_differences"]] == per_seed, endpoint
    assert (_pp(got["sd_seed_differences"]), _pp(got["mde"])) == (sd, mde), endpoint
    assert round(got["p_value"], 3) == p, endpoint
    assert (None if got["p_holm"] is None else round(got["p_holm"], 3)) == p_holm, endpoint


EXPECTED: dict[str, dict[tuple[str, str, str], tuple[Any, ...]]] = {
    # Every contrast row each stored command writes, as (reference, arm, endpoint): figures
    # (:func:`_assert_contrast`). docs/benchmark.md and README quote them through the marked
    # regions that test_every_figure_the_docs_quote_is_recomputed_from_the_stored_cells renders.
    "pilot": {
        ("offline_kd", "opd", "k=3"): (
            -7.8,
            [-16.6, 1.1],
            [-13.8, -2.2],
            [-14.8, -0.8, -5.2, -2.0, -16.0],
            7.2,
            11.9,
            0.073,
            0.146,
        ),
        ("offline_kd", "opd", "k=5"): (
            0.0,
            [0.0, 0.0],
            [0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            0.0,
            0.0,
            1.0,
            1.0,
        ),
        ("offline_kd", "opd", "all"): (
            -23.6,
            [-33.5, -13.7],
            [-30.0, -17.4],
            [-16.5, -14.2, -33.2, -28.1, -25.9],
            8.0,
            13.3,
            0.003,
            None,
        ),
    },
    "full-arm-set": {
        ("offline_kd", "opd", "k=3"): (
            -7.0,
            [-14.6, 0.7],
            [-12.2, -2.4],
            [-15.5, -1.5, -3.2, -3.0, -11.5],
            6.2,
            10.3,
            0.066,
            0.218,
        ),
        ("offline_kd", "opd", "k=5"): (
            0.0,
            [0.0, 0.0],
            [0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            0.0,
            0.0,
            1.0,
            1.0,
        ),
        ("offline_kd", "opd", "all"): (
            -22.4,
            [-32.9, -11.8],
            [-29.2, -15.7],
            [-15.9, -13.3, -32.2, -30.2, -20.2],
            8.5,
            14.1,
            0.004,
            None,
        ),
        ("offline_kd_reverse_kl", "opd_reverse_kl", "k=3"): (
            -5.6,
            [-11.4, 0.2],
            [-10.0, -2.3],
            [-13.2, -1.2, -6.0, -2.8, -4.8],
            4.6,
            7.7,
            0.054,
            0.218,
        ),
        ("offline_kd_reverse_kl", "opd_reverse_kl", "k=5"): (
            -0.1,
            [-0.2, 0.1],
            [-0.2, 0.0],
            [-0.2, 0.0, 0.0, 0.0, 0.0],
            0.1,
            0.2,
            0.374,
            0.748,
        ),
        ("offline_kd_reverse_kl", "opd_reverse_kl", "all"): (
            -2.2,
            [-3.1, -1.4],
            [-3.0, -1.6],
            [-3.1, -2.3, -1.5, -2.7, -1.7],
            0.7,
            1.1,
            0.002,
            None,
        ),
        ("offline_kd", "offline_kd_reverse_kl", "k=3"): (
            1.8,
            [-4.1, 7.8],
            [-1.7, 6.3],
            [-2.8, -0.2, 2.8, -0.2, 9.8],
            4.8,
            8.0,
            0.44,
            None,
        ),
        ("offline_kd", "offline_kd_reverse_kl", "k=5"): (
            0.1,
            [-0.1, 0.2],
            [0.0, 0.2],
            [0.2, 0.0, 0.0, 0.0, 0.0],
            0.1,
            0.2,
            0.374,
            None,
        ),
        ("offline_kd", "offline_kd_reverse_kl", "all"): (
            1.9,
            [-3.4, 7.2],
            [-1.1, 5.6],
            [0.9, 2.0, 1.0, -3.0, 8.7],
            4.2,
            7.0,
            0.372,
            None,
        ),
        ("offline_kd", "sft_oracle", "k=3"): (
            1.7,
            [-2.7, 6.2],
            [-1.0, 5.3],
            [-0.8, -0.5, 1.5, 0.5, 8.0],
            3.6,
            6.0,
            0.339,
            None,
        ),
        ("offline_kd", "sft_oracle", "k=5"): (
            0.1,
            [-0.1, 0.2],
            [0.0, 0.2],
            [0.2, 0.0, 0.0, 0.0, 0.0],
            0.1,
            0.2,
            0.374,
            None,
        ),
        ("offline_kd", "sft_oracle", "all"): (
            1.5,
            [-2.8, 5.7],
            [-1.1, 4.3],
            [0.7, 1.9, 1.2, -3.0, 6.6],
            3.4,
            5.7,
            0.386,
            None,
        ),
        ("offline_kd", "seqkd", "k=3"): (
            2.1,
            [-3.4, 7.6],
            [-1.2, 6.4],
            [0.5, -1.0, 2.8, -1.2, 9.5],
            4.4,
            7.4,
            0.349,
            None,
        ),
        ("offline_kd", "seqkd", "k=5"): (
            0.1,
            [-0.1, 0.2],
            [0.0, 0.2],
            [0.0, 0.2, 0.0, 0.0, 0.0],
            0.1,
            0.2,
            0.374,
            None,
        ),
        ("offline_kd", "seqkd", "all"): (
            1.4,
            [-3.3, 6.1],
            [-1.6, 4.5],
            [1.3, 2.0, 0.6, -3.7, 6.9],
            3.8,
            6.3,
            0.448,
            None,
        ),
        ("offline_kd", "kd_oracle", "k=3"): (
            0.3,
            [-2.8, 3.4],
            [-2.0, 2.9],
            [-1.8, -0.8, 1.2, -1.5, 4.2],
            2.5,
            4.2,
            0.802,
            None,
        ),
        ("offline_kd", "kd_oracle", "k=5"): (
            0.0,
            [0.0, 0.0],
            [0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            0.0,
            0.0,
            1.0,
            None,
        ),
        ("offline_kd", "kd_oracle", "all"): (
            0.8,
            [-2.7, 4.3],
            [-1.5, 3.1],
            [0.4, 1.5, 0.9, -3.2, 4.7],
            2.8,
            4.7,
            0.546,
            None,
        ),
        ("offline_kd", "gkd_mix", "k=3"): (
            -3.0,
            [-8.4, 2.4],
            [-7.1, 0.3],
            [-10.2, -1.2, -2.2, -2.8, 1.5],
            4.4,
            7.3,
            0.2,
            None,
        ),
        ("offline_kd", "gkd_mix", "k=5"): (
            0.1,
            [-0.1, 0.3],
            [0.0, 0.3],
            [0.0, 0.0, 0.0, 0.2, 0.2],
            0.1,
            0.2,
            0.178,
            None,
        ),
        ("offline_kd", "gkd_mix", "all"): (
            -2.1,
            [-5.7, 1.4],
            [-4.6, -0.0],
            [-0.9, -0.7, -3.0, -6.7, 0.7],
            2.9,
            4.8,
            0.173,
            None,
        ),
    },
    "reverse-kl-arm-seed-0": {
        ("offline_kd_reverse_kl", "opd_reverse_kl", "k=3"): (
            -6.1,
            [-12.5, 0.3],
            [-10.8, -2.2],
            [-14.0, -1.0, -6.0, -2.0, -7.5],
            5.2,
            8.6,
            0.058,
            0.116,
        ),
        ("offline_kd_reverse_kl", "opd_reverse_kl", "k=5"): (
            0.0,
            [0.0, 0.0],
            [0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            0.0,
            0.0,
            1.0,
            1.0,
        ),
        ("offline_kd_reverse_kl", "opd_reverse_kl", "all"): (
            -2.2,
            [-3.4, -1.1],
            [-3.2, -1.5],
            [-3.8, -1.8, -1.8, -1.6, -2.3],
            0.9,
            1.5,
            0.006,
            None,
        ),
    },
}


@pytest.fixture(scope="module")
def recomputed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """benchmark.json of every stored command, rewritten from a copy of its stored cells."""
    out: dict[str, dict[str, Any]] = {}
    work = tmp_path_factory.mktemp("pilot") / "pilot"
    shutil.copytree(PILOT, work)
    out["pilot"] = run_benchmark(
        ROOT / "recipes" / "toy_calc_chain_oracle.yaml",
        arms=["offline_kd", "opd"],
        seeds=[1, 2, 3, 4, 5],
        output_dir=work,
        overrides=PILOT_OVERRIDES,
        arm_seeds=2,
        run_cell=_refuse_to_train,
    )
    base = RunConfig.from_yaml(ROOT / "recipes" / "toy_calc_chain_oracle.yaml", PILOT_OVERRIDES)
    for command, (arms, arm_seeds, _checks, _status) in AT_SELECTED_RATES.items():
        work = tmp_path_factory.mktemp(command) / "selected"
        shutil.copytree(SELECTED, work)
        definitions, learning_rates = benchmark_arms_from_grid(arms, GRID, base)
        out[command] = run_benchmark(
            ROOT / "recipes" / "toy_calc_chain_oracle.yaml",
            arms=arms,
            seeds=[1, 2, 3, 4, 5],
            output_dir=work,
            overrides=PILOT_OVERRIDES,
            arm_definitions=definitions,
            arm_seeds=arm_seeds,
            learning_rates=learning_rates,
            run_cell=_refuse_to_train,
        )
    return out


def test_the_pilot_contrasts_are_recomputed_from_its_stored_cells(
    recomputed: dict[str, dict[str, Any]],
) -> None:
    result = recomputed["pilot"]
    got = {(c["reference"], c["arm"], c["endpoint"]): c for c in result["contrasts"]}
    assert set(got) == set(EXPECTED["pilot"])
    for key, figures in EXPECTED["pilot"].items():
        _assert_contrast(got[key], key[:2], figures)
    gates = result["teacher_gate"]
    assert [gates[str(s)]["value"] for s in range(1, 6)] == [1.0] * 5
    assert [gates[str(s)]["actions"] for s in range(1, 6)] == [182, 178, 182, 185, 181]
    checks = {c["check"]: c for c in result["stop_or_go"]["checks"]}
    assert checks["student_errors_at_start"]["value"] == 0.95
    assert checks["oracle_sft_not_at_ceiling"]["status"] == "not_measured"
    assert (
        result["protocol"]["frozen"] is None and "not pre-registered" in result["protocol"]["note"]
    )


SELECTED_RATES = {
    "offline_kd": "0.003",
    "opd": "0.001",
    "offline_kd_reverse_kl": "0.0003",
    "opd_reverse_kl": "0.0003",
    "sft_oracle": "0.0003",
    "seqkd": "0.0003",
    "kd_oracle": "0.001",
    "gkd_mix": "0.0003",
    "opd_entropy_aware": "0.0003",
}
"""The grid's selection (results/calc_chain_oracle/lr-grid/lr_grid.json), as README quotes it."""

GATE_AND_ERRORS = {
    "teacher_gate_passed": ("go", [1.0] * 5),
    "student_errors_at_start": ("go", 0.95),
}
ORACLE_SFT_CHECK = ("go", 0.088)

AT_SELECTED_RATES = {
    # One benchmark command each: arms, arm seeds, the stop-or-go checks as (status, value)
    # and the overall status; the contrasts are EXPECTED[command].
    "full-arm-set": (
        [
            "offline_kd",
            "opd",
            "offline_kd_reverse_kl",
            "opd_reverse_kl",
            "sft_oracle",
            "seqkd",
            "kd_oracle",
            "gkd_mix",
        ],
        2,
        {**GATE_AND_ERRORS, "oracle_sft_not_at_ceiling": ORACLE_SFT_CHECK},
        "go",
    ),
    # The reverse-KL pair on arm seed 0 alone (results/calc_chain_oracle/LOG.md, 2026-12-01 18:50).
    "reverse-kl-arm-seed-0": (
        ["offline_kd_reverse_kl", "opd_reverse_kl"],
        1,
        {**GATE_AND_ERRORS, "oracle_sft_not_at_ceiling": ("not_measured", None)},
        "incomplete",
    ),
}


@pytest.mark.parametrize("command", list(AT_SELECTED_RATES))
def test_the_protocol_at_the_selected_rates_is_recomputed_from_its_stored_cells(
    recomputed: dict[str, dict[str, Any]], command: str
) -> None:
    """Every contrast and stop-or-go check at the grid's selected rates, from the stored cells.

    ``opd``'s cells are the pilot's (same validated config at its selected 0.001), reused.
    """
    arms, _arm_seeds, checks, status = AT_SELECTED_RATES[command]
    result = recomputed[command]
    assert result["cells"]["discarded"] == []
    for arm in arms:
        assert result["arms"][arm]["overrides"][-1] == f"train.lr={SELECTED_RATES[arm]}"
    got = {(c["reference"], c["arm"], c["endpoint"]): c for c in result["contrasts"]}
    assert set(got) == set(EXPECTED[command])
    for key, figures in EXPECTED[command].items():
        _assert_contrast(got[key], key[:2], figures)
    pairs = [(c["arm"], c["reference"]) in PRIMARY_CONTRASTS for c in result["contrasts"]]
    assert pairs == sorted(pairs, reverse=True)
    assert [c["primary"] for c in result["contrasts"]] == [
        pair and c["endpoint"] in ("k=3", "k=5")
        for pair, c in zip(pairs, result["contrasts"], strict=True)
    ]
    family = [c for c in result["contrasts"] if c["holm_family"]]
    assert {c["endpoint"] for c in family} == {"k=3", "k=5"} and all(c["primary"] for c in family)
    recorded = {c["check"]: (c["status"], c["value"]) for c in result["stop_or_go"]["checks"]}
    assert recorded == checks
    assert result["stop_or_go"]["status"] == status


def test_the_pilot_opd_cells_are_opd_at_its_selected_rate() -> None:
    """Same payload, byte for byte: the selected-rates directory did not retrain ``opd``."""
    for seed in range(1, 6):
        for arm_seed in (0, 1):
            name = f"s{seed}-a{arm_seed}-opd.json"
            assert read_json(SELECTED / "cells" / name) == read_json(PILOT / "cells" / name)


def rerun_grid(grid: Path, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(stored ``lr_grid.json``, the record of ``run_lr_grid`` over a copy of ``grid``'s cells,
    with a trainer that fails if any cell is not reused)."""
    stored = read_json(grid / "lr_grid.json")
    work = tmp_path / "grid"
    shutil.copytree(grid, work)
    record = run_lr_grid(
        ROOT / "recipes" / Path(stored["recipe"]).name,
        arms=list(stored["arms"]),
        grid=stored["grid"],
        seeds=stored["seeds"],
        output_dir=work,
        overrides=stored["base_overrides"],
        arm_seeds=stored["arm_seeds"],
        run_cell=_refuse_to_train,
    )
    return stored, record


def test_the_stored_grid_is_recomputed_from_its_own_cells(tmp_path: Path) -> None:
    stored, record = rerun_grid(GRID, tmp_path)
    assert record["table"] == stored["table"]
    assert record["selected"] == stored["selected"]
    assert record["training_digest"] == stored["training_digest"]
    assert record["teacher_gate"] == stored["teacher_gate"]


def test_opd_entropy_aware_is_opd_reverse_kl_under_the_smoothed_oracle() -> None:
    """The gate of ``entropy_aware`` never opens here, so the arm repeats ``opd_reverse_kl`` exactly.

    The smoothed oracle puts 1 - eps + eps/V on its action and eps/V elsewhere: its entropy
    (about 0.014 nats, and the bucketed loss sees a lower bound of it) stays far below
    ``loss.entropy_threshold``, so the forward-KL term is never added. README and
    docs/benchmark.md say so; this pins it to the stored grid cells and the recipe.
    """
    import math

    from miniverl.models.tokenizers import ToyTokenizer

    config = load_recipe(ROOT / "recipes" / "toy_calc_chain_oracle.yaml")
    eps, vocab = config.lab.oracle_teacher.smoothing, ToyTokenizer().vocab_size
    high, low = 1 - eps + eps / vocab, eps / vocab
    entropy = -high * math.log(high) - (vocab - 1) * low * math.log(low)
    assert entropy < 0.02 < config.loss.entropy_threshold
    rates = read_json(GRID / "lr_grid.json")["grid"]
    for seed in (1, 2, 3):
        for rate in rates:
            pair = [
                read_json(GRID / "cells" / f"s{seed}-a0-{arm}@lr={lr_text(rate)}.json")["payload"]
                for arm in ("opd_entropy_aware", "opd_reverse_kl")
            ]
            assert pair[0]["config_digest"] != pair[1]["config_digest"]
            for key in ("curve", "tasks", "endpoints", "exposure", "final_solved"):
                assert pair[0][key] == pair[1][key], (seed, rate, key)
            tokens = [
                {k: v for k, v in p["budget"].items() if not k.endswith("_seconds")} for p in pair
            ]
            assert tokens[0] == tokens[1], (seed, rate)


@pytest.mark.parametrize(
    "stored", [PILOT, GRID, SELECTED], ids=["pilot", "lr-grid", "selected-rates"]
)
def test_each_stored_cold_start_is_the_weights_its_cell_records(stored: Path) -> None:
    cold_cells = sorted((stored / "cells").glob("*-cold-start.json"))
    assert cold_cells
    for path in cold_cells:
        payload = read_json(path)["payload"]
        weights = stored / payload["dir"] / "student.safetensors"
        assert sha256_file(weights) == payload["student_sha256"], path.name


def test_the_test_split_protocol_takes_its_rates_from_the_stored_grid() -> None:
    stored = read_json(GRID / "lr_grid.json")
    base = RunConfig.from_yaml(ROOT / "recipes" / stored["recipe"], PILOT_OVERRIDES)
    arms = list(stored["arms"])
    definitions, record = benchmark_arms_from_grid(arms, GRID, base)
    for arm in arms:
        assert definitions[arm][-1] == f"train.lr={lr_text(stored['selected'][arm])}"
        assert SELECTED_RATES[arm] == lr_text(stored["selected"][arm])
    assert record["selected"] == stored["selected"]
    assert record["lr_grid_sha256"] == sha256_file(GRID / "lr_grid.json")


T_975_DF4 = 2.7764451051977987
"""The 0.975 quantile of Student's t with 4 degrees of freedom (5 seeds)."""


def _t4_cdf(t: float) -> float:
    """Student's t CDF for 4 degrees of freedom, in closed form, independent of the code under test."""
    u = t / math.sqrt(1 + t * t / 4)
    return 0.5 + 0.375 * u * (1 - t * t / (12 * (1 + t * t / 4)))


T_INTERVALS_AT_K3 = {
    # (reference, arm): 95% t-interval over the 5 seed means in pp, two-sided p; the README and
    # docs/benchmark.md quote them beside the two-level bootstrap.
    ("offline_kd", "opd"): ([-14.6, 0.7], 0.066),
    ("offline_kd_reverse_kl", "opd_reverse_kl"): ([-11.4, 0.2], 0.054),
}


@pytest.mark.parametrize("pair", sorted(T_INTERVALS_AT_K3), ids="-vs-".join)
def test_the_k3_primary_contrasts_t_interval_over_seed_means(pair: tuple[str, str]) -> None:
    """A t-interval over the five seed means, the conservative reading of a 5-seed bootstrap.

    Each seed's success at k = 3 is the mean of its two arm seeds' cells (the two-level
    bootstrap's seed-level value); the difference is arm minus reference, in pp.
    """
    assert abs(_t4_cdf(T_975_DF4) - 0.975) < 1e-9 and abs(_t4_cdf(0.0) - 0.5) < 1e-12

    def seed_mean(arm: str, seed: int) -> float:
        cells = [SELECTED / "cells" / f"s{seed}-a{a}-{arm}.json" for a in (0, 1)]
        return sum(read_json(c)["payload"]["endpoints"]["success_by_k"]["3"] for c in cells) / 2

    reference, arm = pair
    diffs = [100 * (seed_mean(arm, s) - seed_mean(reference, s)) for s in range(1, 6)]
    mean = sum(diffs) / 5
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4 / 5)
    interval, p = T_INTERVALS_AT_K3[pair]
    assert [round(mean - T_975_DF4 * se, 1), round(mean + T_975_DF4 * se, 1)] == interval
    assert round(2 * (1 - _t4_cdf(abs(mean) / se)), 3) == p


ARM_TABLE = {
    # arm: final success over all k in % (mean, SD over the 5 seeds, each seed the mean of its
    # two arm seeds), then success at k = 1, 2, 3 (mean over the 10 cells); the README and
    # docs/benchmark.md ("Every arm on the test split") quote these.
    "offline_kd": (23.8, 7.6, 0.824, 0.530, 0.070),
    "sft_oracle": (25.3, 6.5, 0.891, 0.535, 0.088),
    "seqkd": (25.2, 6.2, 0.892, 0.525, 0.091),
    "kd_oracle": (24.6, 6.5, 0.872, 0.529, 0.073),
    "gkd_mix": (21.7, 5.8, 0.850, 0.409, 0.041),
    "opd": (1.4, 2.8, 0.084, 0.000, 0.001),
    "offline_kd_reverse_kl": (25.7, 6.6, 0.899, 0.549, 0.089),
    "opd_reverse_kl": (23.4, 7.0, 0.898, 0.475, 0.033),
}


def _matches_quote(value: float, quoted: float, decimals: int) -> bool:
    """``quoted`` is ``value`` rounded to ``decimals`` places (either way at an exact half)."""
    return abs(value - quoted) <= 0.5 * 10**-decimals + 1e-9


@pytest.mark.parametrize("arm", sorted(ARM_TABLE))
def test_each_arms_test_split_figures_are_its_stored_cells(arm: str) -> None:
    payloads = {
        (seed, a): read_json(SELECTED / "cells" / f"s{seed}-a{a}-{arm}.json")["payload"]
        for seed in range(1, 6)
        for a in (0, 1)
    }
    per_seed = [
        100 * (payloads[s, 0]["final_success"] + payloads[s, 1]["final_success"]) / 2
        for s in range(1, 6)
    ]
    mean = sum(per_seed) / 5
    sd = math.sqrt(sum((v - mean) ** 2 for v in per_seed) / 4)
    quoted_mean, quoted_sd, *by_k = ARM_TABLE[arm]
    assert _matches_quote(mean, quoted_mean, 1) and _matches_quote(sd, quoted_sd, 1), (mean, sd)
    for k, quoted in zip(("1", "2", "3"), by_k, strict=True):
        value = sum(p["endpoints"]["success_by_k"][k] for p in payloads.values()) / 10
        assert _matches_quote(value, quoted, 3), (k, value)


GRID_TABLE = {
    # arm: final validation success at lr 0.0003, 0.001, 0.003 (mean of seeds 1-3), as
    # docs/benchmark.md quotes the grid.
    "offline_kd": (0.461, 0.439, 0.472),
    "opd": (0.000, 0.044, 0.017),
    "offline_kd_reverse_kl": (0.483, 0.478, 0.411),
    "opd_reverse_kl": (0.444, 0.372, 0.083),
    "opd_entropy_aware": (0.444, 0.372, 0.083),
    "sft_oracle": (0.467, 0.467, 0.444),
    "seqkd": (0.467, 0.467, 0.461),
    "kd_oracle": (0.467, 0.506, 0.500),
    "gkd_mix": (0.450, 0.372, 0.422),
}


def test_the_quoted_grid_table_is_the_stored_lr_grid() -> None:
    stored = read_json(GRID / "lr_grid.json")
    assert sorted(stored["table"]) == sorted(GRID_TABLE)
    for arm, rows in stored["table"].items():
        assert [row["lr"] for row in rows] == [0.0003, 0.001, 0.003], arm
        for row, quoted in zip(rows, GRID_TABLE[arm], strict=True):
            assert _matches_quote(row["mean"], quoted, 3), (arm, row)


# ---------------------------------------------------------------------- the quoted figures
#
# README and docs/benchmark.md quote the calc_chain_oracle figures only inside regions marked
# ``<!-- stored-results:NAME -->`` ... ``<!-- /stored-results:NAME -->``; each region's text is
# rendered here from the recomputed benchmark.json and the stored lr_grid.json, and must match
# byte for byte (rewrite them with MINIVERL_REGEN_DOCS=1 and review the diff). Outside the
# regions the results sections quote no decimal figure (:data:`FREE_FIGURES` aside).

README = ROOT / "README.md"
BENCHMARK_DOC = ROOT / "docs" / "benchmark.md"
_REGION = re.compile(
    r"(<!-- stored-results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /stored-results:(?P=name) -->)",
    re.S,
)
RESULT_SECTIONS = {
    README: [],
    BENCHMARK_DOC: [
        ("## Power procedure", "## The teacher gate, and the refusal"),
        ("## Result with the oracle teacher", "### Where the forward-KL collapse comes from"),
        ("### Limits", "## SmolLM2-135M-Instruct on calc_chain"),
    ],
}
FREE_FIGURES = {"0.001", "0.0003", "0.003", "0.05"}
"""Decimals the results prose may name outside a region: ε, the grid's learning rates, α."""


def _num(value: float) -> str:
    """pp with one decimal, a typographic minus, and no sign on zero."""
    x = round(100 * value, 1)
    return "0.0" if x == 0 else f"{x:+.1f}".replace("-", "−")


def _interval(pair: list[float]) -> str:
    return f"[{_num(pair[0])}, {_num(pair[1])}]"


def _p(value: float | None) -> str:
    return "–" if value is None else stats_p_text(value)


def _contrast_row(c: dict[str, Any]) -> str:
    label = f"`{c['arm']}` − `{c['reference']}`"
    return (
        f"| {label} | {c['endpoint'].replace('=', ' = ')} | {_num(c['mean_difference'])} | "
        f"{_interval(c['interval'])} | {_p(c['p_value'])} | {_p(c['p_holm'])} | "
        f"{_interval(c['bootstrap_interval'])} | "
        f"{', '.join(_num(v) for v in c['seed_differences'])} | "
        f"{_num(c['sd_seed_differences'])} | {_num(c['mde'])} |"
    )


def _by_k(rows: list[dict[str, Any]], arm: str, k: str) -> float:
    cells = [r for r in rows if r["arm"] == arm]
    return sum(r["endpoints"]["success_by_k"][k] for r in cells) / len(cells)


def _final(result: dict[str, Any], arm: str) -> str:
    final = result["aggregates"][arm]["final_success"]
    return f"{100 * final['mean']:.1f}% ± {100 * final['std']:.1f}"


def render_regions(recomputed: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Region name -> its Markdown, from the recomputed results and the stored grid."""
    full = recomputed["full-arm-set"]
    contrasts = full["contrasts"]
    family = sum(1 for c in contrasts if c["p_holm"] is not None)
    head = (
        "| contrast | endpoint | mean | 95% t-interval, 5 seed means | p | "
        f"Holm-adjusted p ({family} primary tests) | 95% two-level bootstrap | per seed (1..5) | "
        "σ_diff | MDE (t) |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    regions = {
        "primary-contrasts": head
        + "\n".join(_contrast_row(c) for c in contrasts if c["primary"])
        + "\n",
        "secondary-contrasts": head.replace(f"Holm-adjusted p ({family} primary tests)", "Holm p")
        + "\n".join(_contrast_row(c) for c in contrasts if not c["primary"])
        + "\n",
    }
    rates = full["learning_rates"]["selected"]
    lines = [
        "| arm (selected rate) | all k | k = 1 | k = 2 | k = 3 |",
        "|---|---|---|---|---|",
    ]
    for arm in full["arm_order"]:
        lines.append(
            f"| `{arm}` ({lr_text(rates[arm])}) | {_final(full, arm)} | "
            + " | ".join(f"{_by_k(full['rows'], arm, k):.3f}" for k in ("1", "2", "3"))
            + " |"
        )
    regions["arms"] = "\n".join(lines) + "\n"
    grid = read_json(GRID / "lr_grid.json")
    lines = [
        "| arm | " + " | ".join(f"lr {lr_text(r)}" for r in grid["grid"]) + " | selected |",
        "|---|" + "---|" * (len(grid["grid"]) + 1),
    ]
    for arm in grid["arms"]:
        cells = []
        for row in grid["table"][arm]:
            text = f"{row['mean']:.3f}"
            cells.append(f"**{text}**" if row["lr"] == grid["selected"][arm] else text)
        lines.append(f"| `{arm}` | " + " | ".join(cells) + f" | {lr_text(grid['selected'][arm])} |")
    regions["grid"] = "\n".join(lines) + "\n"
    pilot_k3 = next(c for c in recomputed["pilot"]["contrasts"] if c["endpoint"] == "k=3")
    sd = pilot_k3["sd_seed_differences"]
    normal = math.ceil(((Z_975 + Z_80) * sd / DELTA) ** 2 - 1e-9)
    regions["power"] = (
        f"In the stored pilot (`results/calc_chain_oracle/pilot`) σ_diff at k = 3 is {_num(sd)} pp; at\n"
        f"δ = {round(100 * DELTA)} pp `stats.seeds_needed` gives {seeds_needed(sd, DELTA)} seeds with the t-based MDE. The normal\n"
        f"approximation gives {normal}, the number of seeds the stored protocol ran, so at its 5 seeds the\n"
        f"t-based MDE at k = 3 is {_num(minimum_detectable_effect(sd, 5))} pp, above the δ it was planned for.\n"
    )
    return regions


def check_regions(
    doc: Path, pattern: re.Pattern[str], regions: dict[str, str], seen: set[str]
) -> str:
    """Assert that every ``pattern`` region of ``doc`` is its rendered text; return the text.

    With ``MINIVERL_REGEN_DOCS=1`` the regions are rewritten instead. The names met are
    added to ``seen``, so a caller can check that every rendered region is quoted somewhere.
    """
    regen = os.environ.get("MINIVERL_REGEN_DOCS") == "1"
    text = doc.read_text(encoding="utf-8")
    for match in pattern.finditer(text):
        assert match["name"] in regions, f"{doc.name}: unknown region {match['name']}"
        seen.add(match["name"])
        if not regen:
            assert match["body"] == regions[match["name"]], f"{doc.name}: {match['name']}"
    if regen:
        text = pattern.sub(lambda m: m[1] + regions[m["name"]] + m[4], text)
        doc.write_text(text, encoding="utf-8")
    return text


def _outside_regions(text: str) -> str:
    return _REGION.sub("", text)


def _section(text: str, start: str, end: str | None) -> str:
    begin = text.index(start)
    stop = text.index(end, begin) if end is not None else len(text)
    return text[begin:stop]


def test_every_figure_the_docs_quote_is_recomputed_from_the_stored_cells(
    recomputed: dict[str, dict[str, Any]],
) -> None:
    regions = render_regions(recomputed)
    seen: set[str] = set()
    for doc in (README, BENCHMARK_DOC):
        text = check_regions(doc, _REGION, regions, seen)
        for start, end in RESULT_SECTIONS[doc]:
            prose = [
                line
                for line in _outside_regions(_section(text, start, end)).splitlines()
                if not line.startswith("    ")
            ]
            figures = {
                f for line in prose for f in re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", line)
            }
            assert figures <= FREE_FIGURES, (doc.name, start, sorted(figures - FREE_FIGURES))
    assert seen == set(regions)
