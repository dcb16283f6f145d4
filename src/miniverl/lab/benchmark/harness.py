"""``miniverl benchmark``: arms that differ only in their objective (docs/design.md §4.1).

A single end-to-end number cannot say whether on-policy distillation helped, because the
SFT cold start usually does most of the work. The harness therefore runs, per seed, ONE
shared SFT cold start, exports it weights-only, and starts every arm from those exact
bytes with a fresh optimizer, so no momentum leaks between arms. The splits, the number
of cycles and optimizer steps, the rollout bounds and the evaluation settings are held
fixed — checked on the arms' validated configs, not assumed — and each arm is recorded
as the override keys it applied to the base recipe.

What cannot be matched by construction (generated tokens, selected training tokens,
teacher query ratio, wall clock) is measured per arm instead of being pretended away.
With one or two seeds the harness says that no statistical significance is claimed;
with three or more it reports mean, standard deviation and a seeded, paired bootstrap
interval of the difference to ``sft_oracle`` (a reference ceiling; see
:mod:`miniverl.lab.benchmark.arms`). Nothing in here imports torch at module
level: the aggregation is plain Python and can be tested and reused without a trainer.

Before any arm of a seed runs, that seed's cold start must have passed the teacher gate
(:func:`~miniverl.lab.teachers.gate.refuse_failed_gates`); otherwise the benchmark
raises :class:`~miniverl.errors.TeacherGateError` and writes no ``benchmark.json``. The arm
definitions live in :mod:`~miniverl.lab.benchmark.arms`, the statistics in
:mod:`~miniverl.lab.benchmark.stats`, the trainer behind each cell in
:mod:`~miniverl.lab.benchmark.cell_runner`; this module plans, runs, records and prints
(:func:`print_benchmark` reads only a benchmark.json mapping).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from miniverl import __version__
from miniverl.config.models import RunConfig
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.lab.benchmark.arms import (
    FIXED_KEYS,
    arm_baseline,
    arm_config,
    arm_config_for_arm_seed,
    arm_record,
    check_arm_overrides,
    cold_start_config,
    resolve_arms,
    verify_held_fixed,
)
from miniverl.lab.benchmark.stats import (
    DEFAULT_BOOTSTRAP_SEED,
    DEFAULT_RESAMPLES,
    MIN_VALUES_FOR_INTERVAL,
    aggregate,
    describe,
    scipy_stats,
    seed_rows,
    significance_note,
)
from miniverl.lab.config import load_recipe, with_lab
from miniverl.lab.teachers.gate import refuse_failed_gates
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import read_json, write_json
from miniverl.utils.logging import utc_now
from miniverl.utils.runs import RunPaths

REFUSES_TO_CLAIM = (
    "The shared SFT cold start is not attributed to any arm: every arm of a seed starts from the same weights, "
    "and each arm's baseline success is the cold start's.",
    "Generated tokens, selected training tokens, teacher query ratio and wall clock cannot be matched by construction; "
    "they are measured per arm, not held fixed, and a difference in success is not normalized by them.",
    "generated_tokens counts tokens the student sampled in training rollouts; offline_kd's fixed teacher rollouts are "
    "counted separately as teacher_generated_tokens (as are seqkd's and gkd_mix's fresh teacher samples), and sft_oracle "
    "and kd_oracle sample nothing (they train on oracle traces).",
    "teacher_query_ratio is selected positions / model-generated tokens of the trained trajectories; the teacher still "
    "runs a full forward pass over each scored sequence. sft_oracle and seqkd query no teacher scores and have no ratio.",
    "Intervals resample seeds, not tasks: they describe seed-to-seed variation on this held-out split only.",
)


def _load_base(
    recipe: str | Path | RunConfig, overrides: Sequence[str]
) -> tuple[RunConfig, str, str | None]:
    """The base config (its lab section validated, ``lab/config.py``), the recipe's file name
    (never its directory) and the SHA-256 of its bytes."""
    if isinstance(recipe, RunConfig):
        return with_lab(recipe).with_overrides(overrides), "<config>", None
    path = Path(recipe)
    config = load_recipe(path, overrides)
    return config, path.name, sha256_file(path)


# ---------------------------------------------------------------------- the harness


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def plan_digest(base: RunConfig) -> str:
    """What every stored cell must have been computed under: the base config.

    The matching mode is not part of it. A cold start and the reference arm (opd) are the
    same computation step-matched or compute-matched, so a compute-matched run reuses them
    from a step-matched directory (and the reverse); every other arm's cell records the
    cap it ran under (``compute_cap``), and :func:`run_benchmark` reruns a cell whose cap
    is not the one this run would give it (``lab/benchmark/budgets.py`` ``expected_cap``,
    ``same_cap``). It hashes ``{"base": base.digest(), "compute_matched": null}``: the base
    config's digest beside a constant key, the form every ``plan.json`` carries.
    """
    from miniverl.utils.hashing import sha256_bytes
    from miniverl.utils.io import to_json_text

    return sha256_bytes(
        to_json_text({"base": base.digest(), "compute_matched": None}).encode("utf-8")
    )


def run_benchmark(
    recipe_path_or_config: str | Path | RunConfig,
    *,
    arms: Sequence[str] | None,
    seeds: Sequence[int],
    output_dir: str | Path,
    overrides: Sequence[str] = (),
    quiet: bool = True,
    arm_definitions: Mapping[str, Sequence[str]] | None = None,
    arm_seeds: int = 1,
    compute_matched: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    run_cell: Any = None,
    learning_rates: Mapping[str, Any] | None = None,
    protocol: str | Path | None = None,
) -> dict[str, Any]:
    """Run every (seed, arm seed, arm) cell from one shared cold start per seed; write benchmark.json and a report.

    All configs are built and checked before anything trains, so a refused arm costs
    nothing. ``arm_definitions`` replaces :data:`DEFAULT_ARMS` (name -> override keys).
    Finished cells are stored under ``cells/`` and reused on a rerun with the same base
    config (``lab/benchmark/cells.py``) when the validated config a cell ran under (its
    ``config_digest``) is the one this plan would run it with, so spelling out a value the
    recipe already has (``--lr-from`` selecting the recipe's own ``train.lr``) reuses it, and
    any real change reruns it; ``run_cell`` replaces the trainer (tests).
    ``learning_rates`` (where the arms' ``train.lr`` came from, e.g. the shared grid of
    ``lab/benchmark/lr_grid.py``) is recorded verbatim in benchmark.json. ``protocol`` is the
    pre-registered protocol file (``lab/benchmark/protocol.py``): frozen into ``output_dir``
    before any cell runs; with ``eval.split=test`` no cell runs without one (stored cells
    are still recomputed).
    """
    scipy_stats()  # the contrasts need it: refuse now rather than after every cell has trained
    from miniverl.lab.benchmark.budgets import (
        BUDGET_FIELDS,
        MATCHABLE,
        REFERENCE_ARM,
        expected_cap,
        same_cap,
    )
    from miniverl.lab.benchmark.cells import COLD_START, CellStore, plan_cells, run_cells

    console = Console(quiet=quiet, highlight=False)
    unsilenced = Console(stderr=True, highlight=False)  # a stored cell about to be recomputed
    seeds = [int(s) for s in dict.fromkeys(seeds)]
    if not seeds:
        raise ConfigError("benchmark needs at least one seed", hint="e.g. --seeds 1,2,3")
    if arm_seeds < 1:
        raise ConfigError(f"--arm-seeds must be at least 1, got {arm_seeds}")
    if compute_matched is not None and compute_matched not in MATCHABLE:
        raise ConfigError(
            f"cannot match arms on {compute_matched!r}", hint=f"choose from {', '.join(MATCHABLE)}"
        )
    base, recipe_label, recipe_sha256 = _load_base(recipe_path_or_config, list(overrides))
    chosen = resolve_arms(arms, arm_definitions)
    for name, arm_overrides in chosen.items():
        check_arm_overrides(name, arm_overrides)
    if compute_matched is not None and REFERENCE_ARM not in chosen:
        raise ConfigError(
            f"compute-matched mode gives every arm {REFERENCE_ARM}'s budget, but {REFERENCE_ARM} is not among the arms",
            hint=f"add {REFERENCE_ARM} to --arms",
        )

    root = Path(output_dir)
    bench_paths = RunPaths(root)
    digest = plan_digest(base)
    plan_file = root / "plan.json"
    if plan_file.exists():
        if read_json(plan_file).get("plan_digest") != digest:
            raise RunDirectoryError(
                f"{root} already holds a benchmark of another base config",
                hint="choose another --output directory, or rerun with the same recipe and overrides to resume",
            )
    elif bench_paths.benchmark_json.exists() or any(
        (root / f"seed-{seed}").exists() and any((root / f"seed-{seed}").iterdir())
        for seed in seeds
    ):
        raise RunDirectoryError(
            f"{root} already holds a benchmark", hint="choose another --output directory"
        )

    from miniverl.lab.benchmark.protocol import (
        freeze_protocol,
        missing_seeds,
        primary_endpoints,
        refuse_unprotocolled_cell,
    )

    on_test = base.eval.split == "test"
    frozen = freeze_protocol(root, protocol, seeds=seeds, arms=list(chosen))
    missing = missing_seeds(frozen, seeds)

    plans: dict[int, tuple[RunConfig, dict[str, RunConfig]]] = {}
    held: dict[str, Any] = {}
    for seed in seeds:
        arm_configs = {name: arm_config(base, name, ovr, seed) for name, ovr in chosen.items()}
        held = verify_held_fixed(arm_configs)
        plans[seed] = (cold_start_config(base, seed), arm_configs)
    held_values = {k: v for k, v in held.items() if k != "run.seed"}
    baseline_arm = arm_baseline(list(chosen))
    write_json(
        plan_file,
        {
            "plan_digest": digest,
            "base_config_digest": base.digest(),
            "compute_matched": compute_matched,
        },
    )

    from miniverl.lab.report.report import write_report

    if run_cell is None:
        from miniverl.lab.benchmark.cell_runner import make_trainer_cell_runner

        run_cell = make_trainer_cell_runner(
            root, plans, quiet=quiet, compute_matched=compute_matched
        )

    def still_valid(cell: Any, payload: Mapping[str, Any], done: Mapping[Any, Any]) -> str | None:
        if cell.is_cold_start:
            return None
        cold = done.get(type(cell)(cell.seed, 0, COLD_START))
        if cold is None or payload.get("cold_start_student_sha256") != cold.get("student_sha256"):
            return "recorded for other cold-start weights"
        reference = done.get(type(cell)(cell.seed, cell.arm_seed, REFERENCE_ARM))
        if not same_cap(payload, expected_cap(cell.arm, reference, compute_matched)):
            return "recorded under another compute cap (or none)"
        recorded = payload.get("arm_config_digest", payload.get("config_digest"))
        if recorded is not None:
            config = arm_config_for_arm_seed(plans[cell.seed][1][cell.arm], cell.arm_seed)
            if recorded != config.digest():
                return "recorded under another validated arm config (config_digest differs)"
            return None
        if payload.get("arm_overrides") not in (None, list(chosen[cell.arm])):
            return "recorded for another definition of the arm"
        return None

    def wrapped(cell: Any, done: Mapping[Any, Any]) -> Mapping[str, Any]:
        if on_test and frozen is None:
            refuse_unprotocolled_cell(cell.name)
        if not cell.is_cold_start:
            refuse_failed_gates([done[type(cell)(cell.seed, 0, COLD_START)]])
        payload = dict(run_cell(cell, done))
        if not cell.is_cold_start:
            payload["arm_overrides"] = list(chosen[cell.arm])
        return payload

    def progress(cell: Any, reused: bool) -> None:
        what = (
            "shared SFT cold start"
            if cell.is_cold_start
            else f"arm {cell.arm} (arm seed {cell.arm_seed})"
        )
        console.print(f"[bold]seed {cell.seed}[/]: {what}{' (stored, reused)' if reused else ''}")

    started = time.perf_counter()
    store = CellStore(root, digest)
    plan = plan_cells(
        seeds, arm_seeds, list(chosen), first=REFERENCE_ARM if compute_matched else None
    )

    def vetoed(cell: Any, payload: Mapping[str, Any], done: Mapping[Any, Any]) -> str | None:
        reason = still_valid(cell, payload, done)
        if reason is not None:
            unsilenced.print(f"[bold]seed {cell.seed}[/]: stored {cell.name} not reused: {reason}")
        return reason

    done, reused = run_cells(plan, store, wrapped, on_cell=progress, still_valid=vetoed)
    cold_starts = [done[c] for c in plan if c.is_cold_start]
    refuse_failed_gates(cold_starts)
    rows = [done[c] for c in plan if not c.is_cold_start]

    from miniverl.lab.benchmark.contrasts import (
        FIXED_RECOVERY,
        against_the_cold_start,
        all_contrasts,
        statistics_note,
        stop_or_go,
    )
    from miniverl.lab.benchmark.endpoints import PRIMARY_KS
    from miniverl.lab.benchmark.fixed_states import recovery_by_seed

    names = list(chosen)
    family = (
        {}
        if frozen is None
        else {
            "primary_endpoints": primary_endpoints(frozen["content"]),
            "primary_pairs": frozen["content"]["primary_contrasts"],
        }
    )
    fixed = [FIXED_RECOVERY] if any(r.get("fixed_state_recovery") for r in rows) else []
    contrasts = all_contrasts(
        rows,
        names,
        resamples=resamples,
        bootstrap_seed=DEFAULT_BOOTSTRAP_SEED,
        ks=(*PRIMARY_KS, None, *fixed),
        **family,
    ) + against_the_cold_start(
        cold_starts, rows, names, resamples=resamples, bootstrap_seed=DEFAULT_BOOTSTRAP_SEED
    )
    result: dict[str, Any] = {
        "schema": "miniverl.benchmark/2",
        "miniverl_version": __version__,
        "created_at": utc_now(),
        "recipe": recipe_label,
        "recipe_sha256": recipe_sha256,
        "base_overrides": list(overrides),
        "base_config_digest": base.digest(),
        "base_config": base.to_dict(),
        "seeds": seeds,
        "arm_seeds": arm_seeds,
        "compute_matched": compute_matched,
        "arms": {name: arm_record(name, chosen[name], plans[seeds[0]][1][name]) for name in names},
        "arm_order": names,
        "baseline_arm": baseline_arm,
        "held_fixed": {
            "keys": [k for k in FIXED_KEYS if k != "run.seed"] + ["optimizer_steps"],
            "values": held_values,
        },
        "measured_not_matched": [
            "generated_tokens",
            "selected_training_tokens",
            "teacher_query_ratio",
            "wall_seconds",
            "budget",
        ],
        "cold_starts": cold_starts,
        "teacher_gate": {str(c["seed"]): c.get("teacher_gate") for c in cold_starts},
        "rows": rows,
        "aggregates": aggregate(seed_rows(rows), names, baseline_arm),
        "budgets": {
            name: {
                key: describe([(r.get("budget") or {}).get(key) for r in rows if r["arm"] == name])
                for key in BUDGET_FIELDS
            }
            for name in names
        },
        "contrasts": contrasts,
        "fixed_state_recovery": recovery_by_seed(cold_starts, rows),
        "protocol": {
            "required": on_test,
            "frozen": frozen,
            "missing_seeds": missing,
            "note": (
                f"protocol {frozen['file']} frozen at {frozen['frozen_at']} (sha256 {frozen['sha256']}), "
                f"stored as {frozen['stored_as']}"
                + (
                    f"; a piece of it: seeds {missing} are not in this run, "
                    "so these contrasts are not the pre-registered analysis (merge every piece's "
                    "cells into one directory and run it over all the protocol's seeds)"
                    if missing
                    else ""
                )
            )
            if frozen is not None
            else "no protocol file was frozen for this directory"
            + (
                ": every test-split cell was recomputed from cells stored before protocols were frozen, "
                "so these results are not pre-registered"
                if on_test
                else ""
            ),
        },
        "statistics_note": statistics_note(len(seeds), arm_seeds),
        "stop_or_go": stop_or_go(cold_starts, rows, names),
        "significance": {
            "seeds": len(seeds),
            "intervals_reported": len(seeds) >= MIN_VALUES_FOR_INTERVAL
            and baseline_arm is not None,
            "note": significance_note(len(seeds), baseline_arm),
        },
        "cells": {
            "planned": len(plan),
            "reused": [c.name for c in reused],
            "discarded": store.discarded,
        },
        "refuses_to_claim": list(REFUSES_TO_CLAIM),
        "learning_rates": dict(learning_rates) if learning_rates is not None else None,
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    write_json(bench_paths.benchmark_json, result)
    write_report(root)
    return result


# ---------------------------------------------------------------------- console output


def print_benchmark(result: Mapping[str, Any], console: Console) -> None:
    """The comparison table and the significance sentence, as the CLI shows them."""
    baseline_arm = result.get("baseline_arm")
    n_arms, n_seeds = len(result["arms"]), len(result["seeds"])
    table = Table(
        title=f"miniverl benchmark: {n_arms} arm{'s' * (n_arms != 1)} × {n_seeds} seed{'s' * (n_seeds != 1)} ({result.get('recipe')})"
    )
    for column in (
        "arm",
        "seeds",
        "final success",
        f"Δ vs {baseline_arm or '-'}",
        "95% interval",
        "generated tok",
        "selected tok",
        "teacher query ratio",
        "wall s",
        "opt steps",
    ):
        table.add_column(column, justify="left" if column == "arm" else "right")

    def mean_sd(
        stats: Mapping[str, Any], scale: float = 1.0, digits: int = 1, unit: str = ""
    ) -> str:
        if stats.get("mean") is None:
            return "-"
        text = f"{scale * stats['mean']:.{digits}f}{unit}"
        return text + (
            f" ± {scale * stats['std']:.{digits}f}" if stats.get("std") is not None else ""
        )

    for name in result.get("arm_order") or result["aggregates"]:
        agg = result["aggregates"][name]
        diff = agg.get("difference_to_baseline") or {}
        interval = diff.get("interval")
        table.add_row(
            name,
            str(agg["final_success"]["n"]),
            mean_sd(agg["final_success"], 100.0, 1, "%"),
            f"{100 * diff['mean']:+.1f} pp" if diff.get("mean") is not None else "-",
            f"[{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]" if interval else "-",
            mean_sd(agg["generated_tokens"], digits=0),
            mean_sd(agg["selected_training_tokens"], digits=0),
            mean_sd(agg["teacher_query_ratio"], digits=3),
            mean_sd(agg["wall_seconds"], digits=1),
            mean_sd(agg["optimizer_steps"], digits=0),
        )
    if not console.is_terminal and console.width < 160:
        console = Console(file=console.file, width=160, highlight=False)
    console.print(table)
    from miniverl.lab.report.sections.benchmark import learning_rate_note

    lr_note = learning_rate_note(result)
    if lr_note:
        console.print(lr_note, markup=False)
    console.print(result["significance"]["note"])
    from miniverl.lab.benchmark.fixed_states import recovery_lines

    for line in recovery_lines(result.get("fixed_state_recovery") or []):
        console.print("recovery at fixed states, " + line, markup=False)
    if (result.get("protocol") or {}).get("note"):
        console.print(result["protocol"]["note"], markup=False)
    print_contrasts(result, console)
    console.print(
        f"wall clock {result['wall_seconds']:.1f} s (including {len(result['cold_starts'])} shared cold start(s))"
    )


def _interval_text(interval: Sequence[float] | None) -> str:
    return f"[{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]" if interval else "-"


def contrast_table(contrasts: Sequence[Mapping[str, Any]]) -> Table:
    """One row per contrast and endpoint: estimate, t-interval, p, Holm-adjusted p (primary
    family only), two-level bootstrap interval and t-based MDE, all in pp."""
    from miniverl.lab.benchmark.stats import p_text

    table = Table(title="contrasts (arm - reference, pp)")
    for column in (
        "contrast",
        "endpoint",
        "primary",
        "Δ",
        "95% t-interval",
        "p",
        "Holm p",
        "bootstrap 95%",
        "MDE",
    ):
        table.add_column(column, justify="left" if column == "contrast" else "right")
    for c in contrasts:
        mean = c.get("mean_difference")
        table.add_row(
            f"{c['arm']} - {c['reference']}",
            str(c["endpoint"]),
            "yes" if c.get("primary") else "",
            f"{100 * mean:+.1f}" if mean is not None else "-",
            _interval_text(c.get("interval")),
            p_text(c["p_value"]) if c.get("p_value") is not None else "-",
            p_text(c["p_holm"]) if c.get("p_holm") is not None else "-",
            _interval_text(c.get("bootstrap_interval")),
            f"{100 * c['mde']:.1f}" if c.get("mde") is not None else "-",
        )
    return table


def print_contrasts(result: Mapping[str, Any], console: Console) -> None:
    """Pre-registered primary contrasts first, each with its interval, MDE and plain verdict; then stop-or-go."""
    contrasts = result.get("contrasts") or []
    if contrasts:
        if result.get("statistics_note"):
            console.print(result["statistics_note"])
        console.print(contrast_table(contrasts))
        for primary in (True, False):
            chosen = [c for c in contrasts if bool(c.get("primary")) is primary]
            if chosen:
                console.print(
                    "[bold]pre-registered primary contrasts[/]"
                    if primary
                    else "[bold]secondary contrasts[/]"
                )
            for c in chosen:
                console.print(f"  {c['verdict']}", markup=False)
                for note in c.get("notes") or []:
                    console.print(f"    note: {note}", markup=False)
    sparse = [
        r for r in result.get("rows") or [] if (r.get("curve") or {}).get("dense_enough") is False
    ]
    if sparse:
        console.print(
            f"{len(sparse)} arm cell(s) have learning curves with fewer than 8 evaluation points; "
            "the protocol sets eval.every so that cycles / eval.every >= 7 (docs/benchmark.md)",
            markup=False,
        )
    budgets = result.get("budgets") or {}
    shown = (
        "optimizer_steps",
        "trained_tokens",
        "student_generated_tokens",
        "teacher_scored_tokens",
        "cpu_seconds",
    )
    for name, fields in budgets.items():
        parts = [
            f"{key} {fields[key]['mean']:.0f}"
            if key != "cpu_seconds"
            else f"cpu {fields[key]['mean']:.1f} s"
            for key in shown
            if (fields.get(key) or {}).get("mean") is not None
        ]
        if parts:
            console.print(f"budget {name} (mean per cell): {', '.join(parts)}", markup=False)
    gate = result.get("stop_or_go")
    if gate:
        console.print(f"[bold]stop-or-go[/]: {gate['status']}")
        for check in gate["checks"]:
            value = check["value"]
            shown = f"{value:.3f}" if isinstance(value, float) else value
            console.print(
                f"  {check['check']}: {check['status']} (value {shown}, threshold {check['threshold']}; {check['detail']})",
                markup=False,
            )
    cells = result.get("cells")
    if cells and cells.get("reused"):
        console.print(f"{len(cells['reused'])} of {cells['planned']} cells were stored and reused")
    if cells and cells.get("discarded"):
        console.print(
            f"{len(cells['discarded'])} stored cell(s) were not reused and ran again: "
            + "; ".join(f"{d['cell']} ({d['reason']})" for d in cells["discarded"])
        )


__all__ = [
    "REFUSES_TO_CLAIM",
    "contrast_table",
    "plan_digest",
    "print_benchmark",
    "print_contrasts",
    "run_benchmark",
]
