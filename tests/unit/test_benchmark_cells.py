"""The benchmark's cell grid: resume after a kill, torn cells, arm seeds, contrasts and stop-or-go.

A fake cell runner stands in for the trainer, so these tests run the real
``run_benchmark`` path (planning, cell store, contrasts, benchmark.json) in well under a second.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from helpers import REPO_ROOT, subprocess_env, tiny_config
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.lab.benchmark.arms import DEFAULT_ARMS, arm_config, arm_config_for_arm_seed
from miniverl.lab.benchmark.budgets import BudgetCap, cap_from_reference, cap_outcome
from miniverl.lab.benchmark.cell_runner import measure_arm
from miniverl.lab.benchmark.cells import Cell, arm_phase_seed, plan_cells
from miniverl.lab.benchmark.contrasts import (
    ceiling_check,
    contrast_pairs,
    error_rate_check,
    stop_or_go,
    teacher_gate_check,
)
from miniverl.lab.benchmark.harness import print_benchmark, run_benchmark
from miniverl.lab.benchmark.stats import (
    holm_adjusted,
    percentile_interval,
    t_interval,
    t_test_p,
    two_level_bootstrap,
)
from miniverl.utils.failpoints import FAILPOINT_EXIT_CODE
from miniverl.utils.runs import RunPaths

ARMS = ["sft_only", "offline_kd", "opd"]
# opd - offline_kd per (seed, task), after averaging 2 arm seeds: the brute-force table.
TABLE = {1: [1.0, -1.0], 2: [1.0, -0.5], 3: [0.0, 0.5]}


OPD = {1: [(1, 1), (0, 0)], 2: [(1, 1), (0, 1)], 3: [(0, 0), (1, 0)]}
OFF = {1: [(0, 0), (1, 1)], 2: [(0, 0), (1, 1)], 3: [(0, 0), (0, 0)]}


def outcome(cell: Cell, task: int) -> float:
    """Per (seed, task, arm seed); the arm-seed means of opd - offline_kd are TABLE."""
    if cell.arm in ("opd", "offline_kd"):
        return float((OPD if cell.arm == "opd" else OFF)[cell.seed][task][cell.arm_seed % 2])
    return 1.0  # sft_only solves everything


def fake_payload(cell: Cell, done: Any, log: Path | None = None) -> dict[str, Any]:
    if log is not None:
        with log.open("a") as handle:
            handle.write(cell.name + "\n")
    if cell.is_cold_start:
        return {
            "seed": cell.seed,
            "student_sha256": f"cold-{cell.seed}",
            "teacher_gate": {"value": 0.97, "threshold": 0.95, "passed": True},
            "start_endpoints": {"episodes_by_k": {"3": 10}, "error_rate_by_k": {"3": 0.4}},
        }
    tasks = [{"task_id": f"t{i}", "k": 3, "solved": outcome(cell, i)} for i in range(2)]
    return {
        "arm": cell.arm,
        "seed": cell.seed,
        "arm_seed": cell.arm_seed,
        "cold_start_student_sha256": f"cold-{cell.seed}",
        "final_success": sum(t["solved"] for t in tasks) / 2,
        "optimizer_steps": 4,
        "tasks": tasks,
    }


SCRIPT = """
import sys
from pathlib import Path
from helpers import tiny_config
from test_benchmark_cells import fake_payload
from miniverl.lab.benchmark.harness import run_benchmark
out, log = Path(sys.argv[1]), Path(sys.argv[2])
run_benchmark(tiny_config(), arms=%r, seeds=[1, 2, 3], arm_seeds=2, output_dir=out, resamples=2000,
              run_cell=lambda cell, done: fake_payload(cell, done, log))
"""


def _results(out: Path) -> dict[str, Any]:
    data = json.loads((out / "benchmark.json").read_text())
    return {
        key: data[key] for key in ("rows", "cold_starts", "contrasts", "stop_or_go", "aggregates")
    }


def _child(
    code: str, *args: Path, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(extra_paths=[Path(__file__).parent.parent, Path(__file__).parent])
    if failpoint:
        env["MINIVERL_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_benchmark_killed_after_cell_2_resumes_without_recomputing(tmp_path: Path) -> None:
    out, log = tmp_path / "bench", tmp_path / "calls.log"
    code = SCRIPT % (ARMS,)
    killed = _child(code, out, log, failpoint="benchmark:cell_saved@2")
    assert killed.returncode == FAILPOINT_EXIT_CODE, killed.stderr
    assert log.read_text().split() == ["s1-a0-cold-start", "s1-a0-sft_only"]
    assert not (out / "benchmark.json").exists()
    assert sorted(p.name for p in (out / "cells").iterdir()) == [
        "s1-a0-cold-start.json",
        "s1-a0-sft_only.json",
    ]
    resumed = _child(code, out, log)
    assert resumed.returncode == 0, resumed.stderr
    rerun = log.read_text().split()[2:]
    assert "s1-a0-cold-start" not in rerun and "s1-a0-sft_only" not in rerun
    assert len(rerun) == 3 * (1 + 2 * 3) - 2
    data = json.loads((out / "benchmark.json").read_text())
    assert data["cells"]["reused"] == ["s1-a0-cold-start", "s1-a0-sft_only"]

    fresh, log2 = tmp_path / "fresh", tmp_path / "calls2.log"
    whole = _child(code, fresh, log2)
    assert whole.returncode == 0, whole.stderr
    assert len(log2.read_text().split()) == 21
    assert _results(out) == _results(fresh)


def test_torn_and_foreign_cells_are_redone_never_trusted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def runner(cell: Cell, done: Any) -> dict[str, Any]:
        calls.append(cell.name)
        return fake_payload(cell, done)

    kwargs = dict(
        arms=["offline_kd", "opd"], seeds=[1], output_dir=tmp_path, resamples=200, run_cell=runner
    )
    run_benchmark(tiny_config(), **kwargs)
    assert calls == ["s1-a0-cold-start", "s1-a0-offline_kd", "s1-a0-opd"]
    cells = tmp_path / "cells"
    torn = cells / "s1-a0-opd.json"
    torn.write_text(torn.read_text()[:-40])  # a torn write
    edited = cells / "s1-a0-offline_kd.json"
    record = json.loads(edited.read_text())
    record["payload"]["final_success"] = 1.0  # edited without a new digest
    edited.write_text(json.dumps(record))
    calls.clear()
    result = run_benchmark(tiny_config(), **kwargs)
    assert calls == ["s1-a0-offline_kd", "s1-a0-opd"]
    reasons = {d["cell"]: d["reason"] for d in result["cells"]["discarded"]}
    assert "unreadable" in reasons["s1-a0-opd"] and "SHA-256" in reasons["s1-a0-offline_kd"]
    # a redone cold start with other weights invalidates the arm cells that used the old ones
    cold = cells / "s1-a0-cold-start.json"
    cold.unlink()
    calls.clear()
    original = fake_payload

    def other_weights(cell: Cell, done: Any) -> dict[str, Any]:
        calls.append(cell.name)
        payload = original(cell, done)
        if cell.is_cold_start:
            payload["student_sha256"] = "cold-other"
        else:
            payload["cold_start_student_sha256"] = "cold-other"
        return payload

    capsys.readouterr()
    result = run_benchmark(tiny_config(), **{**kwargs, "run_cell": other_weights})
    assert calls == ["s1-a0-cold-start", "s1-a0-offline_kd", "s1-a0-opd"]
    said = " ".join(capsys.readouterr().err.split())
    for arm in ("offline_kd", "opd"):
        assert (
            f"seed 1: stored s1-a0-{arm} not reused: recorded for other cold-start weights" in said
        )
    assert {d["reason"] for d in result["cells"]["discarded"]} == {
        "recorded for other cold-start weights"
    }
    printed = io.StringIO()
    print_benchmark(result, Console(file=printed, width=400))
    assert (
        "2 stored cell(s) were not reused and ran again: "
        "s1-a0-offline_kd (recorded for other cold-start weights); "
        "s1-a0-opd (recorded for other cold-start weights)"
    ) in printed.getvalue()


def test_a_directory_of_another_plan_or_a_legacy_benchmark_is_refused(tmp_path: Path) -> None:
    run_benchmark(
        tiny_config(),
        arms=["opd"],
        seeds=[1],
        output_dir=tmp_path / "a",
        resamples=10,
        run_cell=fake_payload,
    )
    with pytest.raises(RunDirectoryError, match="another base config"):
        run_benchmark(
            tiny_config("train.lr=0.5"),
            arms=["opd"],
            seeds=[1],
            output_dir=tmp_path / "a",
            run_cell=fake_payload,
        )
    with pytest.raises(ConfigError, match="arm-seeds"):
        run_benchmark(
            tiny_config(), arms=["opd"], seeds=[1], arm_seeds=0, output_dir=tmp_path / "b"
        )
    with pytest.raises(ConfigError, match="opd is not among the arms"):
        run_benchmark(
            tiny_config(),
            arms=["offline_kd"],
            seeds=[1],
            compute_matched="wall_seconds",
            output_dir=tmp_path / "c",
        )
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


# ---------------------------------------------------------------------- statistics through the harness


def _exact_two_level(table: list[list[float]]) -> dict[float, float]:
    s = len(table)
    dist: dict[float, float] = defaultdict(float)
    for seeds in itertools.product(range(s), repeat=s):
        rows = [table[i] for i in seeds]
        weight = 1.0 / (s**s * math.prod(len(r) ** len(r) for r in rows))
        for combos in itertools.product(*(itertools.product(r, repeat=len(r)) for r in rows)):
            dist[round(sum(sum(c) / len(c) for c in combos) / s, 12)] += weight
    return dict(dist)


def _exact_quantile(dist: dict[float, float], q: float) -> float:
    cumulative = 0.0
    for x in sorted(dist):
        cumulative += dist[x]
        if cumulative >= q - 1e-12:
            return x
    return max(dist)


@pytest.fixture(scope="module")
def three_seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("three")
    return run_benchmark(
        tiny_config(),
        arms=ARMS,
        seeds=[1, 2, 3],
        arm_seeds=2,
        output_dir=out,
        resamples=20_000,
        run_cell=fake_payload,
    )


def test_contrast_is_the_t_interval_and_two_level_bootstrap_of_the_arm_seed_averaged_table(
    three_seeds: dict[str, Any],
) -> None:
    primary = [c for c in three_seeds["contrasts"] if c["primary"]]
    assert next((c["arm"], c["reference"]) for c in primary) == ("opd", "offline_kd")
    assert three_seeds["contrasts"][0]["primary"]  # primary contrasts come first
    k3 = next(c for c in primary if c["endpoint"] == "k=3")
    table = [TABLE[s] for s in (1, 2, 3)]
    assert k3["seed_differences"] == pytest.approx([sum(r) / 2 for r in table])
    expected = percentile_interval(
        two_level_bootstrap(table, resamples=20_000, seed=k3["bootstrap_seed"])
    )
    assert k3["bootstrap_interval"] == pytest.approx(list(expected))
    assert k3["interval"] == pytest.approx(list(t_interval(k3["seed_differences"])))
    assert k3["p_value"] == pytest.approx(t_test_p(k3["seed_differences"]))
    family = [c for c in three_seeds["contrasts"] if c["holm_family"]]
    assert {(c["arm"], c["endpoint"]) for c in family} == {("opd", "k=3"), ("opd", "k=5")}
    tested = [c for c in family if c["p_value"] is not None]
    assert tested and [c["p_holm"] for c in tested] == pytest.approx(
        holm_adjusted([c["p_value"] for c in tested])
    )
    assert all(c["p_holm"] is None for c in three_seeds["contrasts"] if not c["holm_family"])
    exact = _exact_two_level(table)
    low, high = k3["bootstrap_interval"]
    assert _exact_quantile(exact, 0.015) - 1e-9 <= low <= _exact_quantile(exact, 0.035) + 1e-9
    assert _exact_quantile(exact, 0.965) - 1e-9 <= high <= _exact_quantile(exact, 0.985) + 1e-9
    assert k3["mde"] is not None and "cannot be told apart" in k3["verdict"]
    assert "k=3" in k3["verdict"]


def test_no_interval_over_fewer_than_three_seeds_and_it_says_so(tmp_path: Path, capsys) -> None:
    from rich.console import Console

    from miniverl.lab.benchmark.harness import print_contrasts

    result = run_benchmark(
        tiny_config(),
        arms=ARMS,
        seeds=[1, 2],
        output_dir=tmp_path,
        resamples=100,
        run_cell=fake_payload,
    )
    for c in result["contrasts"]:
        assert c["interval"] is None and not c["distinguishable"]
        assert any(
            "no interval is quoted: only 2 seeds" in n or "no seed has outcomes" in n
            for n in c["notes"]
        )
    assert sum(1 for c in result["contrasts"] if c["seeds"]) == 4  # 2 contrasts x (k=3, all)
    assert "no interval is quoted" in result["statistics_note"]
    sft = next(c for c in result["contrasts"] if c["arm"] == "sft_only" and c["endpoint"] == "k=3")
    assert sft["sd_seed_differences"] == 0.0 and any("sd 0" in n for n in sft["notes"])
    print_contrasts(result, Console(width=200))
    printed = capsys.readouterr().out
    assert printed.index("pre-registered primary") < printed.index("secondary")
    assert "opd vs offline_kd (k=3)" in printed and "cannot be told apart" in printed


def test_the_recovery_endpoint_is_the_seed_paired_difference_of_flagged_recovery_rates() -> None:
    from miniverl.lab.benchmark.contrasts import RECOVERY, contrast, outcome_table
    from miniverl.lab.benchmark.stats import t_interval

    rates = {"opd": [0.6, 0.5, 0.9, 0.7], "offline_kd": [0.1, 0.2, 0.0, 0.3]}
    cells = [
        {"arm": arm, "seed": seed, "arm_seed": a, "endpoints": {"flagged_recovery_rate": r + d}}
        for arm, values in rates.items()
        for seed, r in enumerate(values, start=1)
        for a, d in ((0, -0.05), (1, 0.05))
    ]
    cells.append({"arm": "opd", "seed": 9, "endpoints": {"flagged_recovery_rate": None}})
    assert outcome_table(cells, "opd", RECOVERY)["1"] == {RECOVERY: pytest.approx(0.6)}
    row = contrast(cells, "opd", "offline_kd", RECOVERY, resamples=200, bootstrap_seed=0)
    diffs = [a - b for a, b in zip(rates["opd"], rates["offline_kd"], strict=True)]
    assert row["endpoint"] == "recovery" and len(row["seeds"]) == 4  # seed 9 has no rate
    assert row["interval"] == pytest.approx(t_interval(diffs))
    assert "(recovery)" in row["verdict"]


def test_contrast_order_is_data_driven() -> None:
    arms = [
        "sft_oracle",
        "seqkd",
        "offline_kd",
        "opd",
        "opd_reverse_kl",
        "offline_kd_reverse_kl",
        "gkd_mix",
    ]
    pairs = contrast_pairs(arms)
    assert pairs[:2] == [
        ("opd", "offline_kd", True),
        ("opd_reverse_kl", "offline_kd_reverse_kl", True),
    ]
    assert ("gkd_mix", "offline_kd", False) in pairs and ("seqkd", "offline_kd", False) in pairs
    assert all(a != "offline_kd" for a, _, _ in pairs)
    assert contrast_pairs(["sft_only", "opd"]) == [("opd", "sft_only", False)]


# ---------------------------------------------------------------------- stop-or-go


def test_stop_or_go_checks_recorded(three_seeds: dict[str, Any]) -> None:
    gate = three_seeds["stop_or_go"]
    checks = {c["check"]: c for c in gate["checks"]}
    assert checks["teacher_gate_passed"]["status"] == "go"
    assert checks["student_errors_at_start"]["value"] == pytest.approx(0.4)
    # fake sft_only solves every k=3 task: at ceiling, so the protocol must stop
    assert checks["oracle_sft_not_at_ceiling"]["value"] == 1.0
    assert checks["oracle_sft_not_at_ceiling"]["status"] == "stop" and gate["status"] == "stop"


def test_each_check_fails_on_its_own() -> None:
    failed_gate = [{"teacher_gate": {"value": 0.9, "threshold": 0.95, "passed": False}}]
    assert teacher_gate_check(failed_gate)["status"] == "stop"
    assert teacher_gate_check([{}])["status"] == "not_measured"
    few = [{"start_endpoints": {"episodes_by_k": {"3": 10}, "error_rate_by_k": {"3": 0.2}}}]
    assert error_rate_check(few)["status"] == "stop"
    enough = [{"start_endpoints": {"episodes_by_k": {"3": 10}, "error_rate_by_k": {"3": 0.3}}}]
    assert error_rate_check(enough)["status"] == "go"
    cells = [
        {
            "arm": "sft_oracle",
            "tasks": [{"k": 3, "solved": 1}, {"k": 3, "solved": 0}, {"k": 2, "solved": 1}],
        }
    ]
    gate = stop_or_go(enough, cells, ["sft_oracle"])
    checks = {c["check"]: c for c in gate["checks"]}
    assert checks["oracle_sft_not_at_ceiling"]["value"] == 0.5
    assert gate["status"] == "incomplete"  # no teacher gate recorded
    at_ceiling = [
        {"arm": "sft_only", "tasks": [{"k": 3, "solved": int(i < 19)} for i in range(20)]}
    ]
    assert ceiling_check(at_ceiling, ["sft_only"])["value"] == 0.95
    assert ceiling_check(at_ceiling, ["sft_only"])["status"] == "stop"  # 0.95 is the ceiling
    assert ceiling_check(at_ceiling[:0], ["opd"])["status"] == "not_measured"


# ---------------------------------------------------------------------- budgets and arm seeds


def test_compute_cap_accounting() -> None:
    cap = cap_from_reference({"wall_seconds": 10.0}, "wall_seconds")
    for _ in range(3):
        cap.charge(3.0)
    assert not cap.exhausted and cap.steps_charged == 3
    cap.charge(1.0)
    assert cap.exhausted
    cap.enforced = True
    assert cap_outcome(cap, {"wall_seconds": 10.0})["bound"] is True
    loose = BudgetCap("teacher_scored_tokens", 100)
    out = cap_outcome(loose, {"teacher_scored_tokens": 150})
    assert out["overran_unenforced"] and out["ratio_to_reference"] == 1.5 and not out["bound"]
    with pytest.raises(ValueError, match="cannot match"):
        BudgetCap("optimizer_steps", 5)
    with pytest.raises(ValueError, match="no positive"):
        cap_from_reference({"wall_seconds": 0}, "wall_seconds")


def test_plan_puts_the_reference_first_and_arm_seeds_differ() -> None:
    plan = plan_cells([4], 2, ["sft_only", "offline_kd", "opd"], first="opd")
    assert [c.name for c in plan] == [
        "s4-a0-cold-start",
        "s4-a0-opd",
        "s4-a0-sft_only",
        "s4-a0-offline_kd",
        "s4-a1-opd",
        "s4-a1-sft_only",
        "s4-a1-offline_kd",
    ]
    assert arm_phase_seed(4, 0) == 4 and arm_phase_seed(4, 1) not in (4, arm_phase_seed(5, 1))


def test_cli_refuses_a_bad_compute_resource_before_creating_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from helpers import TOY_CALCULATOR
    from miniverl.cli.main import app

    recipe = tmp_path / "toy_calculator.yaml"
    recipe.write_bytes(TOY_CALCULATOR.read_bytes())
    out = tmp_path / "o"
    result = CliRunner().invoke(
        app, ["benchmark", str(recipe), "--compute-matched", "steps", "--output", str(out)]
    )
    assert result.exit_code == 2 and "--compute-matched must be one of" in result.output
    assert not out.exists()


def test_seeds_run_in_separate_directories_merge_by_copying_their_cells(tmp_path: Path) -> None:
    """docs/benchmark.md, "Running in pieces": one process per seed group, then one directory."""
    import shutil

    calls: list[str] = []

    def runner(cell: Cell, done: Any) -> dict[str, Any]:
        calls.append(cell.name)
        return fake_payload(cell, done)

    kwargs = dict(arms=["offline_kd", "opd"], resamples=50, run_cell=runner)
    run_benchmark(tiny_config(), seeds=[1], output_dir=tmp_path / "a", **kwargs)
    run_benchmark(tiny_config(), seeds=[2], output_dir=tmp_path / "b", **kwargs)
    for cell in (tmp_path / "b" / "cells").iterdir():
        shutil.copy(cell, tmp_path / "a" / "cells" / cell.name)
    calls.clear()
    merged = run_benchmark(tiny_config(), seeds=[1, 2], output_dir=tmp_path / "a", **kwargs)
    assert calls == [] and len(merged["cells"]["reused"]) == 6
    with pytest.raises(RunDirectoryError, match="another base config"):
        run_benchmark(tiny_config("train.lr=0.5"), seeds=[2], output_dir=tmp_path / "a", **kwargs)


def test_compute_matching_reuses_cold_starts_and_opd_and_reruns_every_other_arm(
    tmp_path: Path,
) -> None:
    """The plan digest leaves out the matching mode; a stored arm cell must record the cap
    this run would give it (none step-matched; opd's spend of the same seed compute-matched)."""
    calls: list[str] = []
    spend = {"opd": 100.0}

    def runner(cell: Cell, done: Any, resource: str | None) -> dict[str, Any]:
        calls.append(cell.name)
        payload = fake_payload(cell, done)
        if cell.is_cold_start:
            return payload
        payload["budget"] = {"teacher_scored_tokens": spend["opd"] + cell.seed}
        cap = None
        if resource and cell.arm != "opd":
            reference = done[Cell(cell.seed, cell.arm_seed, "opd")]
            cap = cap_from_reference(reference["budget"], resource)
        payload["compute_cap"] = cap_outcome(cap, payload["budget"])
        return payload

    def run(mode: str | None) -> dict[str, Any]:
        calls.clear()
        return run_benchmark(
            tiny_config(),
            arms=["offline_kd", "opd"],
            seeds=[1, 2],
            output_dir=tmp_path / "bench",
            resamples=50,
            compute_matched=mode,
            run_cell=lambda cell, done: runner(cell, done, mode),
        )

    run(None)
    assert len(calls) == 6
    matched = run("teacher_scored_tokens")
    assert sorted(calls) == ["s1-a0-offline_kd", "s2-a0-offline_kd"]
    caps = {r["seed"]: r["compute_cap"] for r in matched["rows"] if r["arm"] == "offline_kd"}
    assert {s: caps[s]["limit"] for s in caps} == {1: 101.0, 2: 102.0}
    run("teacher_scored_tokens")
    assert calls == []
    run(None)
    assert sorted(calls) == ["s1-a0-offline_kd", "s2-a0-offline_kd"], (
        "a capped cell is not step-matched"
    )
    run("teacher_scored_tokens")
    (tmp_path / "bench" / "cells" / "s1-a0-opd.json").unlink()
    spend["opd"] = 200.0
    run("teacher_scored_tokens")
    assert sorted(calls) == ["s1-a0-offline_kd", "s1-a0-opd"], "a new opd spend is a new cap"


def test_a_stored_cell_is_reused_for_the_config_it_ran_under_not_for_how_it_was_spelled(
    tmp_path: Path,
) -> None:
    """``--lr-from`` selecting the recipe's own rate reuses a cell; another rate reruns it.

    A trainer-made payload records the digest of the validated config it trained under;
    a payload without one (older fakes) is matched on its override keys instead.
    """
    base = tiny_config()
    rate = base.train.lr
    spelled = {"opd": (*DEFAULT_ARMS["opd"], f"train.lr={rate}")}
    other = {"opd": (*DEFAULT_ARMS["opd"], f"train.lr={rate * 10}")}
    calls: list[str] = []

    def runner(definitions: dict[str, tuple[str, ...]], digest: bool = True) -> Any:
        def run(cell: Cell, done: Any) -> dict[str, Any]:
            calls.append(cell.name)
            payload = fake_payload(cell, done)
            if digest and not cell.is_cold_start:
                config = arm_config(base, cell.arm, definitions[cell.arm], cell.seed)
                payload["config_digest"] = arm_config_for_arm_seed(config, cell.arm_seed).digest()
            return payload

        return run

    def bench(out: Path, definitions: dict[str, tuple[str, ...]], digest: bool = True) -> Any:
        calls.clear()
        return run_benchmark(
            base,
            arms=["opd"],
            arm_definitions=definitions,
            seeds=[1],
            arm_seeds=2,
            output_dir=out,
            resamples=50,
            run_cell=runner(definitions, digest),
        )

    bench(tmp_path / "a", {"opd": DEFAULT_ARMS["opd"]})
    assert calls == ["s1-a0-cold-start", "s1-a0-opd", "s1-a1-opd"]
    same = bench(tmp_path / "a", spelled)
    assert calls == [] and same["cells"]["discarded"] == []
    assert same["arms"]["opd"]["overrides"][-1] == f"train.lr={rate}"
    changed = bench(tmp_path / "a", other)
    assert calls == ["s1-a0-opd", "s1-a1-opd"]
    assert {d["reason"] for d in changed["cells"]["discarded"]} == {
        "recorded under another validated arm config (config_digest differs)"
    }

    bench(tmp_path / "b", {"opd": DEFAULT_ARMS["opd"]}, digest=False)
    legacy = bench(tmp_path / "b", spelled, digest=False)
    assert calls == ["s1-a0-opd", "s1-a1-opd"]
    assert {d["reason"] for d in legacy["cells"]["discarded"]} == {
        "recorded for another definition of the arm"
    }


def _planted_arm_run(root: Path, mode: str) -> Path:
    """The artifacts measure_arm reads, with every count known: 2 cycles, 2 steps, 3 events."""
    paths = RunPaths(root)
    root.mkdir(parents=True)
    metrics = [
        {"kind": "cycle", "cycle": 1, "rollouts": {"generated_tokens": 10},
         "selection": {"model_tokens": 8, "selected_positions": 4}},
        {"kind": "step", "cycle": 1, "selected_positions": 3},
        {"kind": "cycle", "cycle": 2, "skipped": True, "rollouts": {"generated_tokens": 5},
         "selection": {"model_tokens": 8, "selected_positions": 2}},
        {"kind": "step", "cycle": 2, "selected_positions": 4},
        {"kind": "eval", "tag": "final", "success_rate": 0.5},
    ]  # fmt: skip
    events = [
        {"event": "benchmark_cold_start_loaded", "student_sha256": "old"},
        {"event": "rollouts_collected", "generated_tokens": 100},  # the student's: not counted
        {"event": "rollouts_collected", "generated_tokens": 7, "offline_kd_pool": True},
        {"event": "rollouts_collected", "generated_tokens": 9, "teacher_sampled": True},
        {"event": "benchmark_cold_start_loaded", "student_sha256": "new"},
    ]
    for path, rows in ((paths.metrics, metrics), (paths.events, events)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    summary = {
        "mode": mode, "objective": {"divergence": "reverse_kl"}, "config_digest": "d",
        "baseline": {"success_rate": 0.25}, "final": {"success_rate": 0.5, "solved": 2, "tasks": 4},
        "global_optimizer_step": 2,
    }  # fmt: skip
    paths.eval_json.write_text(json.dumps(summary), encoding="utf-8")
    return root


@pytest.mark.parametrize(("mode", "ratio"), [("opd", 6 / 16), ("sft", None), ("seqkd", None)])
def test_measure_arm_reads_back_what_the_run_spent(
    tmp_path: Path, mode: str, ratio: float | None
) -> None:
    got = measure_arm(_planted_arm_run(tmp_path / mode, mode))
    assert got == {
        "mode": mode,
        "objective": {"divergence": "reverse_kl"},
        "config_digest": "d",
        "baseline_success": 0.25,
        "final_success": 0.5,
        "final_solved": 2,
        "final_tasks": 4,
        "generated_tokens": 15,
        "teacher_generated_tokens": 16,
        "selected_training_tokens": 7,
        "teacher_query_ratio": ratio,
        "optimizer_steps": 2,
        "skipped_cycles": 1,
        "cold_start_student_sha256": "new",
    }


def test_a_ledger_gives_the_spend_of_the_checkpoint_a_cell_resumes_from(tmp_path: Path) -> None:
    from miniverl.lab.benchmark.budgets import CELL_COST_SCHEMA, Spend, read_ledger, spend_at

    key = {"config_digest": "c" * 64, "cold_start_student_sha256": "s" * 64}
    entries = {
        "cycle-0001": {"cycle": 1, "wall_seconds": 3.0, "cpu_seconds": 2.0, "pieces": 1},
        "cycle-0003": {"cycle": 3, "wall_seconds": 9.0, "cpu_seconds": 7.0, "pieces": 2},
    }
    path = tmp_path / "cell-cost.json"
    path.write_text(json.dumps({"schema": CELL_COST_SCHEMA, **key, "checkpoints": entries}))
    ledger = read_ledger(path, key)
    assert ledger is not None
    assert spend_at(ledger, "cycle-0001") == Spend(3.0, 2.0, 1)
    assert spend_at(ledger, "final") == Spend(9.0, 7.0, 2)  # killed after the last checkpoint
    assert spend_at(ledger, "cycle-0005") is None  # saved, then killed before the ledger
    assert spend_at({"checkpoints": {"cycle-0001": {"cycle": 1}}}, "cycle-0001") is None
    assert spend_at({"checkpoints": {"cycle-0001": "edited"}}, "final") is None
    assert read_ledger(path, {**key, "config_digest": "d" * 64}) is None
    assert read_ledger(tmp_path / "absent.json", key) is None
    path.write_text('{"schema": "miniverl.cell_cost/0"')
    assert read_ledger(path, key) is None


def test_the_negative_control_arm_plans_on_a_recipe_whose_cold_start_refits_the_teacher() -> None:
    """``opd_self`` on a recipe whose cold start refits a toy teacher (``lab.toy_fit.dagger``,
    ``init_from``): the arm is accepted while its checkpoint is the ``cold_start`` placeholder,
    and pointing it at the seed's cold start drops the fit (the arm's teacher is the student)."""
    from miniverl.lab.benchmark.arms import resolve_arms, with_cold_start_teacher
    from miniverl.lab.config import lab_of, load_recipe

    recipe = load_recipe(REPO_ROOT / "recipes" / "toy_calc_chain_checked_refit.yaml")
    fit = lab_of(recipe).toy_fit
    assert fit.dagger.enabled and fit.init_from is not None
    arm = recipe.with_overrides(list(resolve_arms(["opd_self"])["opd_self"]))
    pointed = with_cold_start_teacher(arm, "/tmp/cold")
    assert pointed.models.teacher.checkpoint == "/tmp/cold"
    assert not lab_of(pointed).toy_fit.dagger.enabled and lab_of(pointed).toy_fit.init_from is None
    with pytest.raises(ConfigError, match=r"lab\.toy_fit\.init_from starts a fit from one"):
        recipe.with_overrides(["models.teacher.checkpoint=/tmp/cold"])
