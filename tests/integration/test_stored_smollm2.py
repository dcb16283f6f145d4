"""Every figure the README, docs/benchmark.md and the LOG quote for SmolLM2-135M-Instruct on
calc_chain, recomputed from ``results/smollm2_calc_chain/`` without training.

``test/`` is the pre-registered run of five arms at seeds 1-3 (``test/protocol.yaml``);
``test-privileged/`` the pre-registered addendum that adds the privileged-context teacher arm
(``opd_privileged``) against ``opd``; ``test-selected-rates/`` the five arms again, each at the
rate the validation grid (``lr-grid/``) selected (``miniverl benchmark --lr-from``), from cold
starts recomputed on another CPU; ``test-power/`` the same five arms at the eight fresh seeds
the power procedure asked for, with that run as its pilot. The student weights are not stored,
so the benchmark is rerun over a copy of each directory with a trainer that fails the test if
it is ever called: every cell must be reused (same base config, validated arm config,
cold-start SHA-256 and intact payload digest), and the tables and contrast lines are rebuilt from the ``benchmark.json`` that
rerun writes. A region between ``<!-- smollm2-results:NAME -->`` markers must be the rendered
text verbatim (``MINIVERL_REGEN_DOCS=1`` rewrites them).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_stored_positive_control import _contrast_line, _stored_cell
from test_stored_results import _refuse_to_train, check_regions, rerun_grid

from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.lab.benchmark.cell_runner import _eval_trajectories, chain_endpoints
from miniverl.lab.benchmark.harness import run_benchmark
from miniverl.lab.benchmark.stats import t_interval
from miniverl.utils.hashing import sha256_file

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "results" / "smollm2_calc_chain"
RECIPE = ROOT / "recipes" / "smollm2_calc_chain.yaml"
OVERRIDES = [
    "eval.split=test",
    "eval.max_tasks=100",
    "train.cycles=10",
    "eval.baseline=false",
    "eval.after_warmup=false",
    "eval.teacher_gate_required=false",
]
SEEDS = [1, 2, 3]
FIVE = ["sft_oracle", "seqkd", "offline_kd", "opd", "gkd_mix"]
RUNS = {
    "test": FIVE,
    "test-privileged": ["opd", "opd_privileged"],
    "test-selected-rates": FIVE,
    "test-power": FIVE,
}
POWER_SEEDS = list(range(4, 12))
RUN_SEEDS = {name: SEEDS for name in RUNS} | {"test-power": POWER_SEEDS}
GRID = STUDY / "lr-grid"
LR_FROM = {"test-selected-rates": GRID, "test-power": GRID}
"""The runs whose arms take their learning rates from a validation grid (``--lr-from``)."""
KS = ("1", "2", "3", "4", "5")
DOCS = (ROOT / "README.md", ROOT / "docs" / "benchmark.md", STUDY / "LOG.md")
_REGION = re.compile(
    r"(<!-- smollm2-results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /smollm2-results:(?P=name) -->)",
    re.S,
)


@pytest.fixture(scope="module")
def rerun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """benchmark.json of each stored run, rewritten over a copy of its stored cells."""
    from miniverl.lab.benchmark.lr_grid import benchmark_arms_from_grid

    out = {}
    for name, arms in RUNS.items():
        copy = tmp_path_factory.mktemp(name) / name
        shutil.copytree(STUDY / name, copy)
        definitions = rates = None
        if name in LR_FROM:
            base = RunConfig.from_yaml(RECIPE, OVERRIDES)
            definitions, rates = benchmark_arms_from_grid(arms, LR_FROM[name], base)
        out[name] = run_benchmark(
            RECIPE,
            arms=arms,
            seeds=RUN_SEEDS[name],
            output_dir=copy,
            overrides=OVERRIDES,
            run_cell=_refuse_to_train,
            protocol=copy / "protocol.yaml",
            arm_definitions=definitions,
            learning_rates=rates,
        )
        assert len(out[name]["cells"]["reused"]) == len(RUN_SEEDS[name]) * (len(arms) + 1)
    return out


def _pct(values: list[float]) -> str:
    """Mean success in % with its 95% t-interval over the seed means, clipped to [0, 100]."""
    mean = 100 * sum(values) / len(values)
    low, high = t_interval([100 * v for v in values])
    return f"{mean:.0f} [{max(low, 0.0):.0f}, {min(high, 100.0):.0f}]"


def _arm_row(label: str, endpoints: list[dict[str, Any]], cost: str) -> str:
    by_k = [_pct([e["success_by_k"][k] for e in endpoints]) for k in KS]
    every = _pct([e["success"] for e in endpoints])
    return f"| {label} | " + " | ".join(by_k) + f" | {every} | {cost} |"


def _arm_cost(rows: list[dict[str, Any]]) -> str:
    def mean(field: str) -> str:
        return f"{sum(r['budget'][field] for r in rows) / len(rows):,.0f}"

    return (
        f"{mean('cpu_seconds')} | {mean('student_generated_tokens')} / "
        f"{mean('teacher_generated_tokens')} | {mean('teacher_scored_tokens')}"
    )


def _raw_endpoints() -> dict[str, Any]:
    """The untrained model's endpoints on the same 100 test tasks, from its stored episodes."""
    run = STUDY / "raw"
    config = RunConfig.from_yaml(run / "config.original.yaml")
    env = make_environment(config.environment.name, **config.environment.params)
    tasks = {
        t.task_id: t for split in build_splits(env, config.environment).values() for t in split
    }
    endpoints = chain_endpoints(_eval_trajectories(run)["final"], tasks)
    assert endpoints is not None and endpoints["episodes"] == 100
    return endpoints


def _arms_table(bench: dict[str, Any], run: str, arms: list[str], *, cold_start: bool) -> str:
    lines = [
        "| arm | k = 1 | k = 2 | k = 3 | k = 4 | k = 5 | all k | CPU-s per cell | tokens generated (student / teacher) per cell | teacher-scored tokens per cell |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if cold_start:
        raw = _raw_endpoints()
        lines.append(
            "| raw model (one greedy run) | "
            + " | ".join(f"{100 * raw['success_by_k'][k]:.0f}" for k in KS)
            + f" | {100 * raw['success']:.0f} | – | – | – |"
        )
        starts = sorted(bench["cold_starts"], key=lambda c: c["seed"])
        cpu = sum(c["cpu_seconds"] for c in starts) / len(starts)
        lines.append(
            _arm_row(
                "shared cold start",
                [c["start_endpoints"] for c in starts],
                f"{cpu:,.0f} (warm-up, adapter fit, gates, test evaluation) | – | –",
            )
        )
    for arm in arms:
        rows = sorted((r for r in bench["rows"] if r["arm"] == arm), key=lambda r: r["seed"])
        assert [r["seed"] for r in rows] == RUN_SEEDS[run], (run, arm)
        lines.append(_arm_row(f"`{arm}`", [r["endpoints"] for r in rows], _arm_cost(rows)))
    return "\n".join(lines) + "\n"


def _contrasts(bench: dict[str, Any], primary: bool) -> str:
    return "".join(
        f"- {_contrast_line(c)}\n" for c in bench["contrasts"] if c["primary"] is primary
    )


def _gate_table(bench: dict[str, Any], run: str) -> str:
    lines = [
        "| seed | on the oracle's path (top-1, positions) | after a deviation (top-1, positions) | recovery (teacher solves from the first deviated state) | adapter fit CPU-s | held-out probe |",
        "|---|---|---|---|---|---|",
    ]
    for seed in RUN_SEEDS[run]:
        gate = json.loads((STUDY / run / f"seed-{seed}" / "teacher-state-gate.json").read_text())
        fit = json.loads((STUDY / run / f"seed-{seed}" / "teacher-adapter-fit.json").read_text())
        cell = next(c for c in bench["cold_starts"] if c["seed"] == seed)["teacher_gate"]["states"]
        for field in ("on_path_agreement", "off_path_agreement", "recovery_rate", "failures"):
            assert gate[field] == cell[field], (seed, field)
        lines.append(
            f"| {seed} | {gate['on_path_agreement']:.3f} ({gate['on_path_correct']}/{gate['on_path_positions']}) | "
            f"{gate['off_path_agreement']:.3f} ({gate['off_path_correct']}/{gate['off_path_positions']}) | "
            f"{gate['recovery_rate']:.3f} ({gate['recovered']}/{gate['recovery_states']}) | "
            f"{fit['cost']['cpu_seconds']:,.0f} | "
            f"{round(fit['heldout_success'] * fit['heldout_probe_tasks'])}/{fit['heldout_probe_tasks']} |"
        )
    return "\n".join(lines) + "\n"


def _grid_table() -> str:
    """The validation grid as README and docs quote it: final validation success per rate."""
    grid = json.loads((GRID / "lr_grid.json").read_text(encoding="utf-8"))
    rates = grid["grid"]
    lines = [
        "| arm | " + " | ".join(f"lr = {lr:g}" for lr in rates) + " | selected |",
        "|---|" + "---|" * (len(rates) + 1),
    ]
    for arm, entries in grid["table"].items():
        cells = [f"{100 * e['mean']:.1f}%" for e in entries]
        lines.append(f"| `{arm}` | " + " | ".join(cells) + f" | {grid['selected'][arm]:g} |")
    return "\n".join(lines) + "\n"


POWER = STUDY / "test-power"
"""The confirmatory run at fresh seeds that ``test-selected-rates/`` (the pilot) sized."""
DELTA = 0.10
"""The smallest effect worth detecting in the power procedure of docs/benchmark.md (10 pp)."""


def _power_table(pilot: dict[str, Any]) -> str:
    """Seeds each primary contrast needs at ``DELTA``, from the pilot's seed differences."""
    from miniverl.lab.benchmark.stats import minimum_detectable_effect, seeds_needed

    lines = [
        "| primary contrast | sd of the seed differences | MDE at 3 seeds | "
        f"seeds for {100 * DELTA:.0f} pp | MDE at {len(POWER_SEEDS)} seeds |",
        "|---|---|---|---|---|",
    ]
    for c in pilot["contrasts"]:
        if c["primary"]:
            sd = c["sd_seed_differences"]
            lines.append(
                f"| `{c['arm']}` − `{c['reference']}`, {c['endpoint']} | {100 * sd:.1f} pp | "
                f"{100 * c['mde']:.1f} pp | {seeds_needed(sd, DELTA)} | "
                f"{100 * minimum_detectable_effect(sd, len(POWER_SEEDS)):.1f} pp |"
            )
    return "\n".join(lines) + "\n"


def render_regions(rerun: dict[str, dict[str, Any]]) -> dict[str, str]:
    test, privileged, selected, power = (rerun[name] for name in RUNS)
    return {
        "lr-grid": _grid_table(),
        "arms": _arms_table(test, "test", RUNS["test"], cold_start=True),
        "primary": _contrasts(test, True),
        "secondary": _contrasts(test, False),
        "gate": _gate_table(test, "test"),
        "privileged-arms": _arms_table(
            privileged, "test-privileged", ["opd_privileged"], cold_start=False
        ),
        "privileged-primary": _contrasts(privileged, True),
        "selected-arms": _arms_table(
            selected, "test-selected-rates", RUNS["test-selected-rates"], cold_start=True
        ),
        "selected-primary": _contrasts(selected, True),
        "selected-gate": _gate_table(selected, "test-selected-rates"),
        "selected-power": _power_table(selected),
        "power-arms": _arms_table(power, "test-power", RUNS["test-power"], cold_start=True),
        "power-primary": _contrasts(power, True),
        "power-secondary": _contrasts(power, False),
        "power-gate": _gate_table(power, "test-power"),
    }


def test_every_quoted_region_is_recomputed_from_the_stored_cells(
    rerun: dict[str, dict[str, Any]],
) -> None:
    regions = render_regions(rerun)
    seen: set[str] = set()
    for doc in DOCS:
        check_regions(doc, _REGION, regions, seen)
    assert seen == set(regions)


def test_the_protocols_were_frozen_and_name_what_ran(rerun: dict[str, dict[str, Any]]) -> None:
    for name, arms in RUNS.items():
        record = json.loads((STUDY / name / "protocol.json").read_text())
        assert sha256_file(STUDY / name / record["stored_as"]) == record["sha256"]
        assert record["content"]["arms"] == arms
        assert record["content"]["seeds"] == RUN_SEEDS[name]
        assert rerun[name]["protocol"]["frozen"]["sha256"] == record["sha256"]
        family = [c for c in rerun[name]["contrasts"] if c["primary"]]
        pairs = {(c["arm"], c["reference"]) for c in family}
        assert pairs == {tuple(p) for p in record["content"]["primary_contrasts"]}
        assert {c["endpoint"] for c in family} == set(record["content"]["endpoints"])
        assert all(c["p_holm"] is not None for c in family)
    frozen = [rerun[name]["protocol"]["frozen"]["frozen_at"] for name in RUNS]
    assert frozen == sorted(frozen) and len(set(frozen)) == len(frozen), (
        "each addendum was frozen after the run before it"
    )
    grid_done = json.loads((GRID / "lr_grid.json").read_text())["created_at"]
    assert grid_done < frozen[2], "the grid was finished before its follow-up was frozen"
    assert rerun["test-selected-rates"]["learning_rates"]["lr_grid_sha256"] == sha256_file(
        GRID / "lr_grid.json"
    )


def test_every_arm_started_from_its_seeds_cold_start_and_is_intact() -> None:
    for name, arms in RUNS.items():
        for seed in RUN_SEEDS[name]:
            cold = _stored_cell(STUDY / name, seed, "cold-start")["student_sha256"]
            started = {
                _stored_cell(STUDY / name, seed, arm)["cold_start_student_sha256"] for arm in arms
            }
            assert started == {cold}, (name, seed)
    for seed in SEEDS:
        first, addendum = (
            {arm: _stored_cell(STUDY / name, seed, arm) for arm in ("cold-start", "opd")}
            for name in ("test", "test-privileged")
        )
        assert addendum["opd"] == first["opd"], (
            f"seed {seed}: the addendum's opd is not the stored cell"
        )
        for field in ("student_sha256", "start_endpoints", "teacher_gate"):
            assert addendum["cold-start"][field] == first["cold-start"][field], (seed, field)
        fits = [
            json.loads((STUDY / name / f"seed-{seed}" / "teacher-adapter-fit.json").read_text())
            for name in ("test", "test-privileged")
        ]
        assert fits[0]["adapter_sha256"] == fits[1]["adapter_sha256"], (
            f"seed {seed}: another adapter"
        )


def test_the_selected_rates_run_is_every_arm_at_its_grids_rate(
    rerun: dict[str, dict[str, Any]],
) -> None:
    """Each arm is the test run's arm with ``train.lr`` set to the grid's selection, so only
    ``opd``'s validated config changed (0.0005 to 0.00015). The cold starts have the test run's
    config but other weights (recomputed on another CPU); the four arms whose config did not
    change still solved exactly the test run's tasks, seed by seed, as README and LOG say."""
    from miniverl.lab.benchmark.lr_grid import lr_text

    grid = json.loads((GRID / "lr_grid.json").read_text())
    test_arms = rerun["test"]["arms"]
    selected = STUDY / "test-selected-rates"
    assert set(rerun["test-selected-rates"]["arms"]) == set(FIVE)
    for arm, spec in rerun["test-selected-rates"]["arms"].items():
        rate = grid["selected"][arm]
        assert spec["overrides"] == [*test_arms[arm]["overrides"], f"train.lr={lr_text(rate)}"]
        for seed in SEEDS:
            cell, before = (_stored_cell(run, seed, arm) for run in (selected, STUDY / "test"))
            assert cell["arm_overrides"] == spec["overrides"], (arm, seed)
            same_config = cell["config_digest"] == before["config_digest"]
            assert same_config is (arm != "opd"), (arm, seed)
            if same_config:
                assert cell["tasks"] == before["tasks"], f"seed {seed}: {arm} solved other tasks"
    for seed in SEEDS:
        cold, before = (_stored_cell(run, seed, "cold-start") for run in (selected, STUDY / "test"))
        records = [
            json.loads((run / f"seed-{seed}" / "cold-start" / "cold_start.json").read_text())
            for run in (selected, STUDY / "test")
        ]
        assert records[0]["config_digest"] == records[1]["config_digest"], seed
        assert records[0]["student_sha256"] == cold["student_sha256"], seed
        assert cold["student_sha256"] != before["student_sha256"], seed
        assert cold["start_endpoints"] == before["start_endpoints"], seed
    docs = " ".join((ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8").split())
    assert "solved exactly the same test tasks in all 12 cells" in docs


def test_the_privileged_arm_is_opd_with_the_privileged_teacher(
    rerun: dict[str, dict[str, Any]],
) -> None:
    arms = rerun["test-privileged"]["arms"]
    assert arms["opd_privileged"]["overrides"] == [
        *arms["opd"]["overrides"],
        "teacher.mode=privileged_context",
    ]


def test_the_untrained_model_ran_on_the_same_test_tasks(rerun: dict[str, dict[str, Any]]) -> None:
    raw = json.loads((STUDY / "raw" / "eval.json").read_text())["final"]
    assert (raw["tasks"], raw["solved"], raw["split"]) == (100, 0, "test")
    episodes = [json.loads(line) for line in (STUDY / "raw" / "eval_trajectories.jsonl").open()]
    cell = next(r for r in rerun["test"]["rows"] if r["arm"] == "opd" and r["seed"] == 1)
    assert sorted(e["task_id"] for e in episodes) == sorted(t["task_id"] for t in cell["tasks"])


def test_the_quoted_total_costs_are_the_cells_own() -> None:
    doc = (ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8")
    for run in ("test", "test-selected-rates", "test-power"):
        total = 0.0
        for seed in RUN_SEEDS[run]:
            total += _stored_cell(STUDY / run, seed, "cold-start")["cpu_seconds"]
            for arm in RUNS[run]:
                total += _stored_cell(STUDY / run, seed, arm)["budget"]["cpu_seconds"]
        quoted = f"record {total:,.0f} CPU-s in all"
        assert quoted in doc, (run, quoted)


def test_the_quoted_first_errors_and_lost_k1_cells_are_the_cells_own() -> None:
    lost = cells = operand = errors = 0
    for arm in RUNS["test"]:
        for seed in SEEDS:
            endpoints = _stored_cell(STUDY / "test", seed, arm)["endpoints"]
            cells += 1
            lost += endpoints["success_by_k"]["1"] < 0.5
            operand += endpoints["first_error_kinds"]["operand_copy"]
            errors += sum(endpoints["first_error_kinds"].values())
    docs = " ".join((ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8").split())
    assert f"in {lost} of the {cells} arm cells the student no longer" in docs
    assert f"({operand} of {errors:,} over the {cells} cells)" in docs


def test_the_stored_grid_is_recomputed_from_its_own_cells(tmp_path: Path) -> None:
    """The validation grid reruns from its cells alone, started from test seed 1's cold start,
    for the training the test cells ran (same training digest), and selects what the docs say."""
    from miniverl.config.models import RunConfig
    from miniverl.lab.benchmark.lr_grid import training_digest

    stored, record = rerun_grid(GRID, tmp_path)
    assert record["table"] == stored["table"] and record["selected"] == stored["selected"]
    cold = json.loads((GRID / "cells" / "s1-a0-cold-start.json").read_text())["payload"]
    test_cold = json.loads((STUDY / "test" / "cells" / "s1-a0-cold-start.json").read_text())
    assert cold["student_sha256"] == test_cold["payload"]["student_sha256"]
    test_base = RunConfig.from_yaml(RECIPE, OVERRIDES)
    assert stored["training_digest"] == training_digest(test_base.to_dict())
    changed = sorted(a for a, lr in stored["selected"].items() if lr != test_base.train.lr)
    assert changed == ["opd"]
    docs = " ".join((ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8").split())
    assert "the grid selected 0.0005 for every arm but `opd`, which it gave 0.00015" in docs


def test_the_power_run_was_frozen_from_the_pilot(rerun: dict[str, dict[str, Any]]) -> None:
    """``test-power/`` is the pilot's protocol at the number of fresh seeds the power procedure
    asks for (``opd`` − ``offline_kd`` over all k at 10 pp), frozen after the pilot; every one
    of its 48 cells is stored, intact and started from its own seed's cold start."""
    from miniverl.lab.benchmark.stats import seeds_needed

    record = json.loads((POWER / "protocol.json").read_text())
    pilot = json.loads((STUDY / "test-selected-rates" / "protocol.json").read_text())
    assert sha256_file(POWER / record["stored_as"]) == record["sha256"]
    assert record["content"]["seeds"] == POWER_SEEDS and not set(POWER_SEEDS) & set(SEEDS)
    assert {k: v for k, v in record["content"].items() if k != "seeds"} == {
        k: v for k, v in pilot["content"].items() if k != "seeds"
    }
    assert record["frozen_at"] > pilot["frozen_at"]
    first = next(
        c
        for c in rerun["test-selected-rates"]["contrasts"]
        if (c["arm"], c["reference"], c["endpoint"]) == ("opd", "offline_kd", "all")
    )
    assert seeds_needed(first["sd_seed_differences"], DELTA) == len(POWER_SEEDS)
    stored = sorted(p.name for p in (POWER / "cells").glob("*.json"))
    assert len(stored) == len(POWER_SEEDS) * (len(FIVE) + 1)
    for name in stored:
        seed, arm = int(name.split("-")[0][1:]), name.removesuffix(".json").split("-a0-")[1]
        assert seed in POWER_SEEDS and arm in ["cold-start", *FIVE], name
        assert f"s{seed}-a0-cold-start.json" in stored, f"{name} without its cold start"
        cold = _stored_cell(POWER, seed, "cold-start")["student_sha256"]
        if arm != "cold-start":
            assert _stored_cell(POWER, seed, arm)["cold_start_student_sha256"] == cold, name
