"""The toy positive control's stored pilots and protocol are the ones its LOG quotes.

``results/toy_positive_control/pilot-2/`` and ``pilot-3/seed-S-run/`` hold what each pilot's
benchmark wrote (cells, the plan, each cold start's records, fixed states and both teacher
gates); no weights, their SHA-256 is in the cells. Every recovery count and gate figure the
LOG's table quotes is read back from these files here, and the fixed-state outcomes are
recounted from each cell's per-state records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from helpers import load_benchmark_script

ROOT = Path(__file__).resolve().parents[2] / "results" / "toy_positive_control"
LOG = " ".join((ROOT / "LOG.md").read_text(encoding="utf-8").split())
ARMS = ("offline_kd", "opd", "sft_corrective", "opd_self")
REFIT_ARMS = (*ARMS, "opd_reverse_kl", "offline_kd_reverse_kl")


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _cell(run: Path, seed: int, arm: str) -> dict[str, Any]:
    return _json(run / "cells" / f"s{seed}-a0-{arm}.json")["payload"]


def _recovered(cell: dict[str, Any]) -> tuple[int, int]:
    """``(recovered, states)`` recounted from the cell's per-state outcomes."""
    block = cell.get("fixed_state_recovery") or cell["fixed_states"]["cold_start"]
    outcomes = block["outcomes"]
    assert block["recovered"] == sum(o["solved"] for o in outcomes)
    assert block["states"] == len(outcomes)
    return block["recovered"], block["states"]


def _table_rows(seed: int) -> tuple[list[int], list[int]]:
    """The LOG's pilot-3 table: the seed's success row and its recovery row."""
    rows = {}
    for line in (ROOT / "LOG.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip(" *") for c in line.strip().strip("|").split("|")]
        if cells[0].startswith(f"{seed}: "):
            rows[cells[0].split(" ")[1]] = [int(c) for c in cells[1:]]
    return rows["success"], rows["recovered"]


def test_pilot_3s_table_is_its_stored_cells() -> None:
    """Both seeds' rows: successes of 60 and recoveries at the cold start's own deviated
    states, for the cold start and the four arms, in the table's column order."""
    for seed in (1, 2):
        run = ROOT / "pilot-3" / f"seed-{seed}-run"
        cold = _cell(run, seed, "cold-start")
        cells = [_cell(run, seed, arm) for arm in ARMS]
        success = [round(cold["after_warmup_success"] * 60)] + [c["final_solved"] for c in cells]
        recovered = [_recovered(cold)[0]] + [_recovered(c)[0] for c in cells]
        states = {_recovered(c)[1] for c in [cold, *cells]}
        assert len(states) == 1, "every arm continues from the same states"
        assert [c["final_tasks"] for c in cells] == [60] * 4
        assert _table_rows(seed) == (success, recovered), seed
        assert f"{seed}: recovered of {states.pop()}" in LOG
        for c in cells:
            assert c["cold_start_student_sha256"] == cold["student_sha256"]


def test_pilot_3s_teacher_is_the_stored_checkpoint_and_its_gates_are_the_quoted_ones() -> None:
    from miniverl.utils.hashing import sha256_file

    teacher = ROOT / "teacher" / "adapter.safetensors"
    sha = sha256_file(teacher)
    assert sha[:8] in LOG
    assert _json(ROOT / "teacher" / "eval.json")["final"]["solved"] == 59
    repro = _json(ROOT / "teacher" / "repro-command.json")
    assert repro == {
        "command": "train",
        "overrides": [],
        "recipe": "recipes/toy_teacher_checked.yaml",
    }
    assert f"final adapter SHA-256 `{sha[:8]}…`, the stored `teacher/adapter.safetensors`" in LOG
    for seed, (off, recovered, states) in {1: ("0.620", 38, 43), 2: ("0.866", 26, 32)}.items():
        run = ROOT / "pilot-3" / f"seed-{seed}-run"
        assert _json(run / f"seed-{seed}" / "teacher-checkpoint.json")["sha256"] == sha
        gate = _json(run / f"seed-{seed}" / "teacher-state-gate.json")
        assert gate["privileged_rule"] == "any_new_number" and not gate["passed"]
        assert f"{gate['off_path_agreement']:.3f}" == off and off in LOG
        assert (gate["recovered"], gate["recovery_states"]) == (recovered, states)
        assert f"{recovered} of {states}" in LOG
        assert gate["on_path_agreement"] > 0.999
        recorded = _cell(run, seed, "cold-start")["teacher_gate"]["states"]
        assert recorded["off_path_agreement"] == gate["off_path_agreement"]
        turn = _json(run / f"seed-{seed}" / "cold-start" / "teacher-gate.json")
        assert f"{turn['value']:.3f}" in LOG and not turn["passed"]


def test_pilot_3s_probes_reproduce_the_gate_and_give_the_teacher_departs_figures() -> None:
    """The probe's first line under the gate's own rule is the stored gate; the figures with
    ``teacher_departs`` are the ones the LOG quotes."""
    gate = _json(ROOT / "pilot-3" / "seed-2-run" / "seed-2" / "teacher-state-gate.json")
    same = json.loads(
        (ROOT / "pilot-3" / "probe-seed-2-any_new_number.txt").read_text().splitlines()[0]
    )
    assert same == {k: gate[k] for k in same}
    for seed, off in ((2, "0.909"), (1, "0.705")):
        text = (ROOT / "pilot-3" / f"probe-seed-{seed}-teacher_departs.txt").read_text()
        figures = json.loads(text.splitlines()[0])
        assert f"{figures['off_path_agreement']:.3f}" == off and f"**{off}**" in LOG


def test_pilot_2_is_the_first_recovery_through_opd() -> None:
    run = ROOT / "pilot-2"
    cold, offline, opd = (_cell(run, 1, arm) for arm in ("cold-start", "offline_kd", "opd"))
    assert [_recovered(c) for c in (cold, offline, opd)] == [(0, 43), (0, 43), (12, 43)]
    assert (offline["final_solved"], opd["final_solved"]) == (13, 24)
    assert (
        "**At the cold start's 43 own deviated states: cold start 0, `offline_kd` 0, `opd` 12.**"
        in LOG
    )
    pilot_3 = _cell(ROOT / "pilot-3" / "seed-1-run", 1, "cold-start")
    assert cold["student_sha256"] == pilot_3["student_sha256"]
    assert pilot_3["student_sha256"][:8] in LOG


def test_the_toy_protocol_is_frozen_and_its_commands_load() -> None:
    """``test/protocol.yaml`` is the frozen bytes; six arms at seeds 11-18, ``fixed_recovery``
    and all-k primary for both pairs; its grid and test overrides validate and train the same
    way, so ``--lr-from`` will accept the grid."""
    from miniverl.lab.benchmark.lr_grid import training_digest
    from miniverl.lab.benchmark.protocol import freeze_protocol, primary_endpoints
    from miniverl.lab.config import load_recipe

    test = ROOT / "test"
    arms = ["opd", "offline_kd", "opd_reverse_kl", "offline_kd_reverse_kl"]
    arms += ["sft_corrective", "opd_self"]
    frozen = freeze_protocol(test, test / "protocol.yaml", seeds=list(range(11, 19)), arms=arms)
    assert frozen is not None and frozen["frozen_at"] == "2026-12-07T14:03:28+00:00"
    assert primary_endpoints(frozen["content"]) == ["fixed_recovery", None]
    assert frozen["content"]["primary_contrasts"] == [
        ["opd", "offline_kd"],
        ["opd_reverse_kl", "offline_kd_reverse_kl"],
    ]
    assert frozen["sha256"][:8] in LOG and frozen["frozen_at"][11:19] in LOG
    text = (test / "protocol.yaml").read_text(encoding="utf-8")
    gate = ["eval.teacher_gate_required=false"]
    assert "GATE = eval.teacher_gate_required=false." in " ".join(text.split())
    on_test = ["eval.split=test", "eval.max_tasks=90"]
    assert "GATE eval.split=test # eval.max_tasks=90" in " ".join(text.split())
    recipe = ROOT.parents[1] / "recipes" / "toy_calc_chain_checked.yaml"
    grid = load_recipe(recipe, gate)
    run = load_recipe(recipe, [*gate, *on_test])
    assert run.lab.fixed_state_recovery and run.eval.split == "test"
    assert run.lab.teacher_gate.privileged == "teacher_departs"
    assert training_digest(grid.to_dict()) == training_digest(run.to_dict())


def test_pilot_3s_teacher_audit_has_no_eos_target_and_the_quoted_agreements() -> None:
    for seed, after in ((1, "0.970 of 13,113"), (2, "0.970 of 3,976")):
        text = " ".join(
            (ROOT / "pilot-3" / f"teacher-audit-seed-{seed}-opd.txt").read_text().split()
        )
        assert "e90380268129" in text and "800 student rollouts re-scored" in text
        assert text.count("EOS 0") == 3, "no EOS target on the path, after an error, or deviated"
        figure = re.search(r"after_error positions (\d+) .*? agreement ([\d.]+) of", text)
        assert figure is not None
        assert f"{figure.group(2)} of {int(figure.group(1)):,}" == after and after in LOG


def test_the_grid_table_is_its_stored_cells_and_lr_grid_selects_as_quoted() -> None:
    grid = ROOT / "lr-grid"
    selected = _json(grid / "lr_grid.json")["selected"]
    rates = _json(grid / "lr_grid.json")["grid"]
    assert rates == [0.0005, 0.001, 0.002]
    rows = {}
    for line in _first_study().splitlines():
        cells = [c.strip(" `") for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in selected:
            rows[cells[0]] = cells[1:]
    assert set(rows) == set(selected)
    for arm, (success, recovered, chosen) in rows.items():
        payloads = [_json(grid / "cells" / f"s3-a0-{arm}@lr={lr}.json")["payload"] for lr in rates]
        assert success == " / ".join(str(p["final_solved"]) for p in payloads), arm
        assert recovered == " / ".join(str(_recovered(p)[0]) for p in payloads), arm
        assert float(chosen) == selected[arm]
    gate = _json(grid / "seed-3" / "teacher-state-gate.json")
    assert gate["privileged_rule"] == "teacher_departs" and not gate["passed"]
    assert f"recovery {gate['recovered']} of {gate['recovery_states']}" in LOG


TEST_ARMS = (
    "offline_kd",
    "opd",
    "offline_kd_reverse_kl",
    "opd_reverse_kl",
    "sft_corrective",
    "opd_self",
)


def _test_rows(seeds: str = "1[1-8]", text: str | None = None) -> dict[tuple[int, str], list[str]]:
    """The LOG's test-run table: ``(seed, "success" | "recovered")`` -> its cells."""
    rows = {}
    text = (ROOT / "LOG.md").read_text(encoding="utf-8") if text is None else text
    for line in text.splitlines():
        cells = [c.strip(" *") for c in line.strip().strip("|").split("|")]
        head = re.fullmatch(rf"({seeds}): (success|recovered) of \d+", cells[0])
        if head:
            rows[(int(head.group(1)), head.group(2))] = cells[1:]
    return rows


def test_the_test_run_is_the_frozen_protocols_and_the_log_quotes_its_cells_and_verdicts() -> None:
    """Every seed's row of the LOG's table is its stored cells (successes of 90 test tasks, and
    recoveries at the cold start's own deviated states recounted per state), the teacher gate
    column is the cold-start cell's, the analysis ran over every protocol seed under the frozen
    protocol, and each primary contrast's verdict is quoted word for word."""
    _check_test_run(ROOT / "test", range(11, 19), _test_rows(), LOG)


PRIMARY = {
    ("opd", "offline_kd", "fixed_recovery"),
    ("opd", "offline_kd", "all"),
    ("opd_reverse_kl", "offline_kd_reverse_kl", "fixed_recovery"),
    ("opd_reverse_kl", "offline_kd_reverse_kl", "all"),
}


def _check_test_run(
    test: Path,
    seeds: range,
    rows: dict[tuple[int, str], list[str]],
    log: str,
    arms: tuple[str, ...] = TEST_ARMS,
    primary: set[tuple[str, str, str]] = PRIMARY,
) -> None:
    analysis = _json(test / "analysis.json")
    assert analysis["protocol"]["frozen"]["sha256"] == _json(test / "protocol.json")["sha256"]
    assert analysis["protocol"]["missing_seeds"] == []
    assert sorted(int(s) for s in analysis["seeds"]) == list(seeds)
    for seed in seeds:
        cold = _cell(test, seed, "cold-start")
        cells = [_cell(test, seed, arm) for arm in arms]
        assert {c["cold_start_student_sha256"] for c in cells} == {cold["student_sha256"]}
        success = [round(cold["after_warmup_success"] * 90)] + [c["final_solved"] for c in cells]
        recovered = [_recovered(c)[0] for c in [cold, *cells]]
        n = len(arms) + 1
        assert [int(x) for x in rows[(seed, "success")][:n]] == success, seed
        assert [int(x) for x in rows[(seed, "recovered")][:n]] == recovered, seed
        gate = cold["teacher_gate"]["states"]
        verdict = "passes" if not gate["failures"] else "fails"
        assert rows[(seed, "success")][n].startswith(f"{verdict} ({gate['off_path_agreement']:.3f}")
    contrasts = [c for c in analysis["contrasts"] if c["primary"]]
    assert {(c["arm"], c["reference"], c["endpoint"]) for c in contrasts} == primary
    for contrast in contrasts:
        assert " ".join(contrast["verdict"].split()) in log, contrast["verdict"]


REFIT = ROOT / "refit-pilot"


def _refit_row(seed: int) -> str:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    text = text[text.index("## 2026-12-07 (later) — pilot 4") :]
    return next(line for line in text.splitlines() if line.startswith(f"| seed {seed} ("))


def test_pilot_4s_gate_table_is_the_stored_gates_before_and_after_the_refit() -> None:
    """Each row of the LOG's refit table: agreement on the path and after a deviation, and
    recovered of states, before and after, read from ``refit-pilot/seed-S/gate.json``; and
    the verdict is what the recipe's thresholds say of the figures after."""
    for seed in (3, 1, 2):
        gate = _json(REFIT / f"seed-{seed}" / "gate.json")
        row = _refit_row(seed)
        for when in ("before", "after"):
            f = gate[when]["figures"]
            figures = (
                f"{f['on_path_agreement']:.3f} / {f['off_path_agreement']:.3f} / "
                f"{f['recovered']} of {f['recovery_states']}"
            )
            assert figures in row.replace("**", ""), (seed, when, figures, row)
            assert f["privileged_rule"] == "teacher_departs" and f["tasks"] == 60
        assert ("passes" in row) == (gate["after"]["failures"] == []), row
        assert gate["before"]["failures"], seed  # every teacher failed before its refit
        assert gate["args"]["steps"] == "600" and gate["args"]["lr"] == "0.0003"


def test_pilot_4s_arms_recover_as_the_log_says_from_the_refitted_teachers() -> None:
    """The arms table: each cell's recovery recounted from its per-state outcomes, the arms'
    teacher the refitted one the LOG names, and the benchmark's own state gate at the cold
    start passing with it."""
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    text = text[text.index("## 2026-12-07 (later) — pilot 4") :]
    for seed, opd, offline in ((3, 4, 0), (2, 19, 0)):
        run = REFIT / f"arms-seed-{seed}"
        got = {arm: _recovered(_cell(run, seed, arm)) for arm in ("opd", "offline_kd")}
        states = got["opd"][1]
        assert got == {"opd": (opd, states), "offline_kd": (offline, states)}
        row = next(
            line for line in text.splitlines() if line.startswith(f"| {seed} ({states} states)")
        )
        assert f"| **{opd}** |" in row and row.rstrip().endswith(f"| {offline} |")
        # both arms ran with the refitted teacher whose SHA-256 the LOG gives
        teacher = _json(run / "teacher-checkpoint.json")
        assert teacher["path"] == f"runs/refit-s{seed}/teacher.safetensors"
        assert f"seed {seed} `{teacher['sha256'][:8]}…`" in LOG
        states_gate = _cell(run, seed, "cold-start")["teacher_gate"]["states"]
        assert states_gate["failures"] == [], states_gate


REFIT_GRID = ROOT / "refit-grid"
REFIT_RECIPE = ROOT.parents[1] / "recipes" / "toy_calc_chain_checked_refit.yaml"


def _first_study() -> str:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    return text[: text.index("— a second pre-registered study")]


def _refit_study() -> str:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    return text[text.index("— a second pre-registered study") :]


def test_the_refit_protocol_is_committed_and_its_commands_load_one_training_setting() -> None:
    """``refit-test/protocol.yaml``: six arms at the new seeds 21-28, both primary pairs at
    ``fixed_recovery`` and all-k; its SHA-256 is the one the LOG quotes; its grid and test
    commands validate to the same training settings (so ``--lr-from`` accepts the grid), and
    the recipe refits the control's stored teacher inside each cold start."""
    import yaml

    from miniverl.lab.benchmark.lr_grid import training_digest
    from miniverl.lab.benchmark.protocol import primary_endpoints
    from miniverl.lab.config import load_recipe
    from miniverl.utils.hashing import sha256_file

    path = ROOT / "refit-test" / "protocol.yaml"
    protocol = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert protocol["seeds"] == list(range(21, 29))
    assert primary_endpoints(protocol) == ["fixed_recovery", None]
    assert protocol["primary_contrasts"] == [
        ["opd", "offline_kd"],
        ["opd_reverse_kl", "offline_kd_reverse_kl"],
    ]
    assert f"(SHA-256 `{sha256_file(path)[:8]}…`)" in " ".join(_refit_study().split())
    gate = ["eval.teacher_gate_required=false"]
    grid = load_recipe(REFIT_RECIPE, gate)
    run = load_recipe(REFIT_RECIPE, [*gate, "eval.split=test", "eval.max_tasks=90"])
    assert training_digest(grid.to_dict()) == training_digest(run.to_dict())
    fit = run.lab.toy_fit
    assert fit.dagger.enabled and (fit.max_steps, fit.lr, fit.batch_size) == (600, 3e-4, 16)
    assert run.models.teacher.checkpoint is None
    start = ROOT.parents[1] / fit.init_from
    assert sha256_file(start).startswith("e9038026")


def test_the_refit_grid_table_is_its_stored_cells_and_the_gate_is_the_quoted_one() -> None:
    grid = _json(REFIT_GRID / "lr_grid.json")
    assert grid["recipe"] == REFIT_RECIPE.name and grid["grid"] == [0.0005, 0.001, 0.002]
    rows = {}
    for line in _refit_study().splitlines():
        cells = [c.strip(" `") for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in grid["selected"]:
            rows[cells[0]] = cells[1:]
    assert set(rows) == set(grid["selected"]) and len(rows) == 6
    for arm, (success, recovered, chosen) in rows.items():
        payloads = [
            _json(REFIT_GRID / "cells" / f"s3-a0-{arm}@lr={lr}.json")["payload"]
            for lr in grid["grid"]
        ]
        assert success == " / ".join(str(p["final_solved"]) for p in payloads), arm
        assert recovered == " / ".join(str(_recovered(p)[0]) for p in payloads), arm
        assert float(chosen) == grid["selected"][arm]
    cold = _cell(REFIT_GRID, 3, "cold-start")
    states = cold["teacher_gate"]["states"]
    gate = _json(REFIT_GRID / "seed-3" / "teacher-state-gate.json")
    assert gate["privileged_rule"] == "teacher_departs"
    assert gate["off_path_agreement"] == states["off_path_agreement"]
    assert states["failures"] == ["recovery_rate 0.759 < 0.800"]
    study = " ".join(_refit_study().split())
    assert f"after a deviation **{states['off_path_agreement']:.3f}** (passes" in study
    assert f"recovery **{gate['recovered']} of {gate['recovery_states']}** (0.759, fails" in study
    marker = _json(REFIT_GRID / "seed-3" / "cold-start" / "cold_start.json")
    teacher = REFIT_GRID / "seed-3" / "cold-start" / "toy-teacher.safetensors"
    from miniverl.utils.hashing import sha256_file

    assert sha256_file(teacher) == marker["toy_teacher_sha256"] == cold["toy_teacher_sha256"]
    assert f"teacher `{marker['toy_teacher_sha256'][:8]}…`" in study
    assert marker["toy_teacher"]["init_from"]["sha256"].startswith("e9038026")
    assert marker["toy_teacher"]["steps"] == 600


def _refit_result() -> str:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    return text[text.index("— the refit study's pre-registered test: the result") :]


def test_the_refit_test_run_is_the_frozen_protocols_and_the_log_quotes_its_cells_and_verdicts() -> (
    None
):
    """The refit study's table is its stored cells, its analysis ran over seeds 21-28 under the
    committed protocol, each primary verdict is quoted; every seed's teacher is the control's
    teacher refitted in its own cold start (the stored weights match the marker), and the LOG's
    count of passing seeds (none) is the cells'."""
    from miniverl.utils.hashing import sha256_file

    test = ROOT / "refit-test"
    result = _refit_result()
    frozen = _json(test / "protocol.json")
    assert frozen["sha256"] == sha256_file(test / "protocol.yaml")
    _check_test_run(test, range(21, 29), _test_rows("2[1-8]", result), " ".join(result.split()))
    passing = []
    for seed in range(21, 29):
        marker = _json(test / f"seed-{seed}" / "cold-start" / "cold_start.json")
        weights = test / f"seed-{seed}" / "cold-start" / "toy-teacher.safetensors"
        assert sha256_file(weights) == marker["toy_teacher_sha256"]
        assert marker["toy_teacher"]["init_from"]["sha256"].startswith("e9038026")
        assert marker["toy_teacher"]["steps"] == 600
        if not _cell(test, seed, "cold-start")["teacher_gate"]["states"]["failures"]:
            passing.append(seed)
    assert passing == [] and "the refitted teacher fails at all eight" in " ".join(result.split())


def test_the_refit_studys_secondary_opd_minus_sft_corrective_is_the_quoted_one() -> None:
    """``opd`` - ``sft_corrective`` at the fixed states, recomputed from the stored cells with the
    benchmark's own t-interval, and the negative control's count of states."""
    from miniverl.lab.benchmark.stats import t_interval, t_test_p

    test = ROOT / "refit-test"
    rates = {
        arm: [_recovered(_cell(test, s, arm)) for s in range(21, 29)]
        for arm in ("opd", "sft_corrective", "opd_self", "offline_kd")
    }
    diffs = [
        100 * (a / n - b / m)
        for (a, n), (b, m) in zip(rates["opd"], rates["sft_corrective"], strict=True)
    ]
    low, high = t_interval(diffs)
    mean = sum(diffs) / len(diffs)

    def pp(x: float) -> str:
        return f"{x:+.1f}".replace("-", "−")

    quoted = (
        f"{pp(mean)} pp, 95% t-interval [{pp(low)} pp, {pp(high)} pp], p = {t_test_p(diffs):.2f}"
    )
    assert quoted in " ".join(_refit_result().split()), quoted
    states = sum(n for _, n in rates["opd"])
    assert states == 479 and sum(a for a, _ in rates["opd_self"]) == 0
    assert (sum(a for a, _ in rates["opd"]), sum(a for a, _ in rates["offline_kd"])) == (33, 0)


def test_pilot_5s_longer_refit_table_is_its_stored_gates() -> None:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    text = text[text.index("— pilot 5: three times the refit") :]
    for seed in (3, 1):
        gate = _json(ROOT / "refit-pilot-5" / f"seed-{seed}" / "gate.json")
        assert gate["args"]["steps"] == "1800" and gate["args"]["lr"] == "0.0003"
        row = next(line for line in text.splitlines() if line.startswith(f"| seed {seed} ("))
        for when in ("before", "after"):
            f = gate[when]["figures"]
            figures = (
                f"{f['on_path_agreement']:.3f} / {f['off_path_agreement']:.3f} / "
                f"{f['recovered']} of {f['recovery_states']}"
            )
            assert figures in row, (seed, when, row)
        assert gate["after"]["failures"] == [
            f"off_path_agreement {gate['after']['figures']['off_path_agreement']:.3f} < 0.900"
        ]
        assert row.rstrip().endswith("| fails after a deviation |")


def _post_hoc() -> str:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    return text[text.index("— the refit study read further, post hoc") :]


def _gate_split(test: Path, seeds: Any) -> tuple[int, int, int]:
    """Over ``seeds``' stored state gates, the positions after a deviation split in two:
    ``(labelled agreeing, labelled, privileged predictions)``; the gate counts each privileged
    prediction as a position and a miss, so the labelled ones are the rest."""
    right = labelled = leaked = 0
    for seed in seeds:
        gate = _json(test / f"seed-{seed}" / "teacher-state-gate.json")
        right += gate["off_path_correct"]
        labelled += gate["off_path_positions"] - gate["privileged_predictions"]
        leaked += gate["privileged_predictions"]
    return right, labelled, leaked


def test_the_refit_teachers_misses_after_a_deviation_are_the_privileged_predictions_quoted() -> (
    None
):
    """The LOG's split of each seed's gate after a deviation: labelled positions agreeing,
    privileged predictions, the gate's figure and the teacher's recovery, from the stored gate;
    and its totals (every miss but one is a privileged prediction)."""
    text = _post_hoc()
    for seed in range(21, 29):
        gate = _json(ROOT / "refit-test" / f"seed-{seed}" / "teacher-state-gate.json")
        right, n, leaked = _gate_split(ROOT / "refit-test", [seed])
        row = (
            f"| {seed} | {right} of {n} | {leaked} | "
            f"{gate['off_path_agreement']:.3f} | {gate['recovered']} of {gate['recovery_states']} |"
        )
        assert row in text, row
    agree, labelled, privileged = _gate_split(ROOT / "refit-test", range(21, 29))
    said = " ".join(text.split())
    assert f"({agree:,} of {labelled:,} positions over the eight seeds)" in said
    assert f"the {privileged} digits it writes" in said
    assert labelled - agree == 1


def test_the_first_actions_at_the_fixed_states_are_the_stored_replay_of_the_cells() -> None:
    """``fixed-state-actions.json`` (``benchmarks/fixed_state_actions.py``) replays the cells'
    own states: per seed and policy its states and solved counts are the cell's fixed-state
    recovery; the LOG's table is its sums and its per-seed counts of ``opd``'s named calls."""
    test = ROOT / "refit-test"
    per_seed = _json(test / "fixed-state-actions.json")["per_seed"]
    assert sorted(per_seed) == [str(s) for s in range(21, 29)]
    totals: dict[str, dict[str, int]] = {}
    for seed, policies in per_seed.items():
        assert sorted(policies) == sorted(["cold-start", *REFIT_ARMS])
        for name, got in policies.items():
            assert (got.get("solved", 0), got["states"]) == _recovered(_cell(test, int(seed), name))
            kinds = ("named", "repeat", "other", "malformed", "answer")
            assert sum(got.get(k, 0) for k in kinds) == got["states"]
            for key, value in got.items():
                totals.setdefault(name, {}).setdefault(key, 0)
                totals[name][key] += value
    text = _post_hoc()
    for name, t in totals.items():
        label = name.replace("cold-start", "cold start")
        label = label if label == "cold start" else f"`{label}`"
        counts = [t.get(k, 0) for k in ("named", "repeat", "other", "malformed", "answer")]
        cells = [f"**{c}**" if (name == "opd" and i == 0) else str(c) for i, c in enumerate(counts)]
        row = (
            f"| {label} | {' | '.join(cells)} | {t.get('solved', 0)} | "
            f"{t.get('solved_after_named', 0)} of {t.get('named', 0)} |"
        )
        assert row in text, row
    named = [per_seed[str(s)]["opd"].get("named", 0) for s in range(21, 29)]
    said = " ".join(text.split())
    assert f"{', '.join(str(n) for n in named[:-1])} and {named[-1]} states" in said
    assert all(per_seed[str(s)]["offline_kd"].get("named", 0) == 0 for s in range(21, 29))
    c = load_benchmark_script("fixed_state_actions").named_first_contrast(
        per_seed, "opd", "offline_kd"
    )
    assert f"+{c['mean']:.1f} pp [+{c['low']:.1f}, +{c['high']:.1f}]" in said


def _action_study() -> str:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    return text[text.index("— a third study, pre-registered") :]


def _action_result() -> str:
    text = (ROOT / "LOG.md").read_text(encoding="utf-8")
    return text[text.index("— the third study's result") :]


def test_the_action_protocol_is_the_frozen_one_and_names_its_primary_before_the_cells() -> None:
    """``action-test/protocol.yaml``: four arms at new seeds 31-38, the refit study's recipe and
    grid, ``named_first`` (by the script) as its one primary; the stored freeze is this file's
    SHA-256 (the one the LOG quotes); the harness refuses a test-split cell without it."""
    import yaml

    from miniverl.utils.hashing import sha256_file

    test = ROOT / "action-test"
    path = test / "protocol.yaml"
    protocol = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert protocol["seeds"] == list(range(31, 39))
    assert protocol["arms"] == ["opd", "offline_kd", "sft_corrective", "opd_self"]
    assert protocol["primary_contrasts"] == [["opd", "offline_kd"]]
    text = " ".join(path.read_text(encoding="utf-8").split())
    assert "Primary endpoint (one test, no multiplicity): named_first" in text
    assert "benchmarks/fixed_state_actions.py" in text and "--lr-from results/toy_positive" in text
    frozen = _json(test / "protocol.json")
    assert frozen["sha256"] == sha256_file(path)
    assert f"SHA-256 `{frozen['sha256'][:8]}…`" in " ".join(_action_study().split())


def test_the_action_study_is_the_frozen_protocols_and_the_log_quotes_its_cells() -> None:
    """The LOG's table is the stored cells (successes, fixed-state recoveries recounted per state,
    each seed's teacher gate); the benchmark's analysis ran over seeds 31-38 under the frozen
    protocol and its one primary pair's verdicts are quoted; every seed's teacher is the control's
    teacher refitted in its own cold start, and none passes its gate."""
    from miniverl.utils.hashing import sha256_file

    test = ROOT / "action-test"
    result = _action_result()
    primary = {("opd", "offline_kd", "fixed_recovery"), ("opd", "offline_kd", "all")}
    rows = _test_rows("3[1-8]", result)
    _check_test_run(test, range(31, 39), rows, " ".join(result.split()), ARMS, primary)
    for seed in range(31, 39):
        marker = _json(test / f"seed-{seed}" / "cold-start" / "cold_start.json")
        weights = test / f"seed-{seed}" / "cold-start" / "toy-teacher.safetensors"
        assert sha256_file(weights) == marker["toy_teacher_sha256"]
        assert marker["toy_teacher"]["init_from"]["sha256"].startswith("e9038026")
        assert _cell(test, seed, "cold-start")["teacher_gate"]["states"]["failures"]


def test_the_action_studys_primary_is_the_stored_replay_and_the_log_quotes_it() -> None:
    """``named_first`` per seed and policy from ``fixed-state-actions.json``; its solved counts
    are the cells' fixed-state recoveries (the same states, the same replay); the primary
    contrast, the secondary ones and the negative control recomputed with the script's own
    function are the ones the LOG quotes; the teacher's labelled agreement after a deviation."""
    test = ROOT / "action-test"
    record = _json(test / "fixed-state-actions.json")
    per_seed = record["per_seed"]
    text = _action_result()
    said = " ".join(text.split())
    for seed in range(31, 39):
        policies = per_seed[str(seed)]
        assert sorted(policies) == sorted(["cold-start", *ARMS])
        for name, got in policies.items():
            assert (got.get("solved", 0), got["states"]) == _recovered(_cell(test, seed, name))
        named = [policies[p].get("named", 0) for p in ("cold-start", *ARMS)]
        row = f"| {seed} | {policies['opd']['states']} | {' | '.join(map(str, named))} |"
        assert row in text, row
    contrast = load_benchmark_script("fixed_state_actions").named_first_contrast
    quoted = {
        ("opd", "offline_kd"): "**Primary, `named_first`, `opd` − `offline_kd`: ",
        ("opd", "sft_corrective"): "`opd` − `sft_corrective` ",
        ("sft_corrective", "offline_kd"): "`sft_corrective` − `offline_kd` ",
        ("opd_self", "cold-start"): "`opd_self` − cold start on `named_first`: ",
    }
    for (a, b), lead in quoted.items():
        c = contrast(per_seed, a, b)
        assert c == record["contrasts"][f"{a} - {b}"]
        figures = f"{c['mean']:+.1f} pp [{c['low']:+.1f}, {c['high']:+.1f}]".replace("-", "−")
        if (a, b) == ("opd", "offline_kd"):
            figures = figures.replace(" [", ", 95% t-interval [") + f", p = {c['p']:.3g}"
        assert lead + figures in said, (a, b, figures)
    assert contrast(per_seed, "opd", "offline_kd")["low"] > 0
    assert all(per_seed[str(s)]["offline_kd"].get("named", 0) == 0 for s in range(31, 39))
    agree, labelled, privileged = _gate_split(test, range(31, 39))
    assert f"agrees at {agree:,} of {labelled:,}; the misses are the {privileged}" in said
