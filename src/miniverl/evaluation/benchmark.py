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
:mod:`miniverl.evaluation.arms`). Nothing in here imports torch at module
level: the aggregation is plain Python and can be tested and reused without a trainer.

Before any arm of a seed runs, that seed's cold start must have passed the teacher gate
(:func:`~miniverl.evaluation.teacher_gate.refuse_failed_gates`); otherwise the benchmark
raises :class:`~miniverl.errors.TeacherGateError` and writes no ``benchmark.json``. The arm
definitions live in :mod:`~miniverl.evaluation.arms`, the summary statistics in
:mod:`~miniverl.evaluation.benchmark_stats` and the console output in
:mod:`~miniverl.evaluation.benchmark_print`; this module re-exports their names.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from miniverl import __version__
from miniverl.config.models import RunConfig
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.evaluation.arms import (
    ARM_ALIASES,
    ARM_DESCRIPTIONS,
    BASELINE_ARM,
    DEFAULT_ARMS,
    FIXED_KEYS,
    REFERENCE_CEILING_ARMS,
    arm_baseline,
    arm_config,
    arm_config_for_arm_seed,
    arm_record,
    check_arm_overrides,
    cold_start_config,
    fixed_view,
    resolve_arms,
    verify_held_fixed,
)
from miniverl.evaluation.benchmark_print import print_benchmark, print_contrasts
from miniverl.evaluation.benchmark_stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    METRICS,
    MIN_SEEDS_FOR_INTERVAL,
    aggregate,
    bootstrap_interval,
    describe,
    quantile,
    seed_rows,
    significance_note,
)
from miniverl.evaluation.teacher_gate import refuse_failed_gates
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
    """The base config, the recipe's file name (never its directory) and the SHA-256 of its bytes."""
    if isinstance(recipe, RunConfig):
        return recipe.with_overrides(overrides), "<config>", None
    path = Path(recipe)
    config = RunConfig.from_yaml(path, overrides)
    return config, path.name, sha256_file(path)


# ---------------------------------------------------------------------- measurements


def measure_arm(run_dir: Path) -> dict[str, Any]:
    """What one finished arm run measured, read back from its artifacts."""
    from miniverl.reporting.load import read_eval_summary, read_events, read_metrics
    from miniverl.schemas.records import CycleRecord, StepRecord

    paths = RunPaths(run_dir)
    metrics = read_metrics(paths.metrics)
    events = read_events(paths.events)
    summary = read_eval_summary(paths)
    steps = [r for r in metrics if isinstance(r, StepRecord)]
    cycles = [r for r in metrics if isinstance(r, CycleRecord)]
    mode = summary.get("mode")
    model_tokens = sum(int((c.get("selection") or {}).get("model_tokens") or 0) for c in cycles)
    selected_in_cycles = sum(
        int((c.get("selection") or {}).get("selected_positions") or 0) for c in cycles
    )
    loaded = [e for e in events if e.event == "benchmark_cold_start_loaded"]
    final = summary.get("final") or {}
    baseline = summary.get("baseline") or {}
    return {
        "mode": mode,
        "objective": summary.get("objective"),
        "config_digest": summary.get("config_digest"),
        "baseline_success": baseline.get("success_rate"),
        "final_success": final.get("success_rate"),
        "final_solved": final.get("solved"),
        "final_tasks": final.get("tasks"),
        "generated_tokens": sum(
            int((c.get("rollouts") or {}).get("generated_tokens") or 0) for c in cycles
        ),
        "teacher_generated_tokens": sum(
            int(e.get("generated_tokens") or 0)
            for e in events
            if e.event == "rollouts_collected"
            and (e.get("offline_kd_pool") or e.get("teacher_sampled"))
        ),
        "selected_training_tokens": sum(int(s.get("selected_positions") or 0) for s in steps),
        "teacher_query_ratio": None
        if mode in ("sft", "seqkd") or not model_tokens
        else selected_in_cycles / model_tokens,
        "optimizer_steps": summary.get("global_optimizer_step"),
        "skipped_cycles": sum(1 for c in cycles if c.get("skipped")),
        "cold_start_student_sha256": loaded[-1].get("student_sha256") if loaded else None,
    }


# ---------------------------------------------------------------------- the harness


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def plan_digest(base: RunConfig, compute_matched: str | None) -> str:
    """What every stored cell must have been computed under: the base config and the matching mode."""
    from miniverl.utils.hashing import sha256_bytes
    from miniverl.utils.io import to_json_text

    return sha256_bytes(
        to_json_text({"base": base.digest(), "compute_matched": compute_matched}).encode("utf-8")
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
    resamples: int = BOOTSTRAP_RESAMPLES,
    run_cell: Any = None,
    learning_rates: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every (seed, arm seed, arm) cell from one shared cold start per seed; write benchmark.json and a report.

    All configs are built and checked before anything trains, so a refused arm costs
    nothing. ``arm_definitions`` replaces :data:`DEFAULT_ARMS` (name -> override keys).
    Finished cells are stored under ``cells/`` and reused on a rerun with the same base
    config (``evaluation/cells.py``) when the validated config a cell ran under (its
    ``config_digest``) is the one this plan would run it with, so spelling out a value the
    recipe already has (``--lr-from`` selecting the recipe's own ``train.lr``) reuses it, and
    any real change reruns it; ``run_cell`` replaces the trainer (tests).
    ``learning_rates`` (where the arms' ``train.lr`` came from, e.g. the shared grid of
    ``evaluation/lr_grid.py``) is recorded verbatim in benchmark.json.
    """
    from miniverl.evaluation.budgets import BUDGET_FIELDS, MATCHABLE, REFERENCE_ARM
    from miniverl.evaluation.cells import COLD_START, CellStore, plan_cells, run_cells

    console = Console(quiet=quiet, highlight=False)
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
    digest = plan_digest(base, compute_matched)
    plan_file = root / "plan.json"
    if plan_file.exists():
        if read_json(plan_file).get("plan_digest") != digest:
            raise RunDirectoryError(
                f"{root} already holds a benchmark of another base config or compute-matching mode",
                hint="choose another --output directory, or rerun with the same recipe and overrides to resume",
            )
    elif bench_paths.benchmark_json.exists() or any(
        (root / f"seed-{seed}").exists() and any((root / f"seed-{seed}").iterdir())
        for seed in seeds
    ):
        raise RunDirectoryError(
            f"{root} already holds a benchmark", hint="choose another --output directory"
        )

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

    from miniverl.reporting.report import write_report

    if run_cell is None:
        from miniverl.evaluation.cell_runner import make_trainer_cell_runner

        run_cell = make_trainer_cell_runner(
            root, plans, quiet=quiet, compute_matched=compute_matched
        )

    def still_valid(cell: Any, payload: Mapping[str, Any], done: Mapping[Any, Any]) -> str | None:
        if cell.is_cold_start:
            return None
        cold = done.get(type(cell)(cell.seed, 0, COLD_START))
        if cold is None or payload.get("cold_start_student_sha256") != cold.get("student_sha256"):
            return "recorded for other cold-start weights"
        recorded = payload.get("config_digest")
        if recorded is not None:
            config = arm_config_for_arm_seed(plans[cell.seed][1][cell.arm], cell.arm_seed)
            if recorded != config.digest():
                return "recorded under another validated arm config (config_digest differs)"
            return None
        if payload.get("arm_overrides") not in (None, list(chosen[cell.arm])):
            return "recorded for another definition of the arm"
        return None

    def wrapped(cell: Any, done: Mapping[Any, Any]) -> Mapping[str, Any]:
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
    done, reused = run_cells(plan, store, wrapped, on_cell=progress, still_valid=still_valid)
    cold_starts = [done[c] for c in plan if c.is_cold_start]
    refuse_failed_gates(cold_starts)
    rows = [done[c] for c in plan if not c.is_cold_start]

    from miniverl.evaluation.contrasts import all_contrasts, statistics_note, stop_or_go

    names = list(chosen)
    contrasts = all_contrasts(rows, names, resamples=resamples, bootstrap_seed=BOOTSTRAP_SEED)
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
        "statistics_note": statistics_note(len(seeds), arm_seeds),
        "stop_or_go": stop_or_go(cold_starts, rows, names),
        "significance": {
            "seeds": len(seeds),
            "intervals_reported": len(seeds) >= MIN_SEEDS_FOR_INTERVAL and baseline_arm is not None,
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


__all__ = [
    "ARM_ALIASES",
    "ARM_DESCRIPTIONS",
    "BASELINE_ARM",
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "DEFAULT_ARMS",
    "FIXED_KEYS",
    "METRICS",
    "MIN_SEEDS_FOR_INTERVAL",
    "REFERENCE_CEILING_ARMS",
    "aggregate",
    "arm_baseline",
    "arm_config",
    "arm_config_for_arm_seed",
    "arm_record",
    "bootstrap_interval",
    "check_arm_overrides",
    "cold_start_config",
    "describe",
    "fixed_view",
    "measure_arm",
    "print_benchmark",
    "print_contrasts",
    "quantile",
    "resolve_arms",
    "run_benchmark",
    "seed_rows",
    "significance_note",
    "verify_held_fixed",
]
