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
interval of the difference to ``sft_only``. Nothing in here imports torch at module
level: the aggregation is plain Python and can be tested and reused without a trainer.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from miniverl import __version__
from miniverl.config.models import RunConfig, parse_override
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.utils.io import read_json, sha256_file, write_json
from miniverl.utils.logging import utc_now
from miniverl.utils.runs import RunPaths

BASELINE_ARM = "sft_only"
DEFAULT_ARMS: dict[str, tuple[str, ...]] = {
    "sft_only": ("run.mode=sft",),
    "offline_kd": ("run.mode=offline_kd", "loss.divergence=forward_kl"),
    "opd": ("run.mode=opd", "loss.divergence=forward_kl"),
    "opd_reverse_kl": ("run.mode=opd", "loss.divergence=reverse_kl"),
    "opd_entropy_aware": ("run.mode=opd", "loss.divergence=entropy_aware"),
}
"""Each arm is the set of override keys it applies to the base recipe (recorded verbatim)."""

ARM_DESCRIPTIONS: dict[str, str] = {
    "sft_only": "continues oracle-trace SFT for the same number of optimizer steps",
    "offline_kd": "one fixed set of teacher rollouts and one frozen teacher cache (forward KL)",
    "opd": "on-policy distillation, forward KL",
    "opd_reverse_kl": "on-policy distillation, reverse KL",
    "opd_entropy_aware": "on-policy distillation, entropy-aware forward/reverse KL",
}

FIXED_KEYS: tuple[str, ...] = (
    "environment",
    "eval",
    "models",
    "run.seed",
    "train.cycles",
    "train.rollouts_per_cycle",
    "rollout.max_turns",
    "rollout.max_new_tokens_per_turn",
    "rollout.max_total_tokens",
    "rollout.max_parse_errors",
    "rollout.max_repeated_calls",
)
"""Config keys no arm may override: splits, evaluation, the models the cold start was
trained for, the seed (set by the harness), cycles, rollouts per cycle and rollout bounds."""

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_260_407
CONFIDENCE = 0.95
MIN_SEEDS_FOR_INTERVAL = 3
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
REFUSES_TO_CLAIM = (
    "The shared SFT cold start is not attributed to any arm: every arm of a seed starts from the same weights, "
    "and each arm's baseline success is the cold start's.",
    "Generated tokens, selected training tokens, teacher query ratio and wall clock cannot be matched by construction; "
    "they are measured per arm, not held fixed, and a difference in success is not normalized by them.",
    "generated_tokens counts tokens the student sampled in training rollouts; offline_kd's fixed teacher rollouts are "
    "counted separately as teacher_generated_tokens, and sft_only samples nothing (it trains on oracle traces).",
    "teacher_query_ratio is selected positions / model-generated tokens of the trained trajectories; the teacher still "
    "runs a full forward pass over each scored sequence. sft_only queries no teacher and has no ratio.",
    "Intervals resample seeds, not tasks: they describe seed-to-seed variation on this held-out split only.",
)


# ---------------------------------------------------------------------- statistics


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


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (numpy's default method)."""
    if not sorted_values:
        raise ValueError("quantile of an empty sequence")
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def bootstrap_interval(
    values: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean; None below :data:`MIN_SEEDS_FOR_INTERVAL` values.

    Seeded, so the same rows always give the same interval. With fewer than three
    values the resampling distribution has too few atoms to say anything.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n < MIN_SEEDS_FOR_INTERVAL:
        return None
    rng = random.Random(seed)
    means = sorted(sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    alpha = (1.0 - confidence) / 2.0
    return quantile(means, alpha), quantile(means, 1.0 - alpha)


def significance_note(n_seeds: int, baseline_arm: str | None = BASELINE_ARM) -> str:
    """The sentence the CLI prints and benchmark.json records about statistical claims."""
    if n_seeds < MIN_SEEDS_FOR_INTERVAL:
        unit = "seed" if n_seeds == 1 else "seeds"
        extra = (
            ""
            if n_seeds == 1
            else f"; a bootstrap interval needs at least {MIN_SEEDS_FOR_INTERVAL}"
        )
        return f"no statistical significance is claimed ({n_seeds} {unit}{extra})"
    against = (
        f"the paired difference to {baseline_arm}"
        if baseline_arm
        else "differences (no baseline arm ran)"
    )
    return (
        f"mean ± standard deviation over {n_seeds} seeds; {int(CONFIDENCE * 100)}% percentile-bootstrap intervals of {against} "
        f"({BOOTSTRAP_RESAMPLES} resamples of seeds, seed {BOOTSTRAP_SEED}); an interval is a description of seed variation, not a significance test"
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
                "resamples": BOOTSTRAP_RESAMPLES if interval else None,
                "bootstrap_seed": BOOTSTRAP_SEED if interval else None,
            }
        stats["difference_to_baseline"] = diff
        out[arm] = stats
    return out


# ---------------------------------------------------------------------- configs


def _dotted(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


def _touches(override_key: str, fixed: str) -> bool:
    return (
        override_key == fixed
        or override_key.startswith(fixed + ".")
        or fixed.startswith(override_key + ".")
    )


def check_arm_overrides(arm: str, overrides: Sequence[str]) -> None:
    """Refuse an arm whose overrides touch anything the benchmark holds fixed."""
    for item in overrides:
        key = ".".join(parse_override(item)[0])
        hit = next((fixed for fixed in FIXED_KEYS if _touches(key, fixed)), None)
        if hit is not None:
            raise ConfigError(
                f"benchmark arm {arm!r} overrides {key!r}, which the benchmark holds fixed ({hit})",
                hint="arms may change the objective (run.mode, loss.*, selection.*, teacher.*, train.lr, ...); "
                "put split, cycle, rollout-bound, model and evaluation changes in the base overrides instead",
            )


def fixed_view(config: RunConfig) -> dict[str, Any]:
    """The values of :data:`FIXED_KEYS` plus the planned optimizer steps of the arm phase."""
    data = config.to_dict()
    view = {key: _dotted(data, key) for key in FIXED_KEYS}
    view["optimizer_steps"] = config.train.cycles * config.train.steps_per_rollout_batch()
    return view


def verify_held_fixed(configs: Mapping[str, RunConfig]) -> dict[str, Any]:
    """Compare the arms' validated configs key by key; refuse any difference."""
    names = list(configs)
    reference = fixed_view(configs[names[0]])
    for name in names[1:]:
        view = fixed_view(configs[name])
        for key, value in reference.items():
            if view[key] != value:
                raise ConfigError(
                    f"benchmark arms {names[0]!r} and {name!r} differ in {key} ({value!r} vs {view[key]!r}), which must be held fixed",
                    hint="every arm must run the same splits, cycles, optimizer steps, rollout bounds and evaluation settings",
                )
    return reference


def cold_start_config(base: RunConfig, seed: int) -> RunConfig:
    """The shared cold start: the base recipe with no distillation cycles.

    ``train()`` then fits the toy teacher, evaluates the baseline, runs the SFT warm-up
    and evaluates again. ``sft`` mode skips the warm-up and loads no teacher, so an sft
    base recipe is run in opd mode for the cold start only.
    """
    overrides = [
        f"run.seed={seed}",
        "train.cycles=0",
        f"run.name={base.run.name}-cold-start-s{seed}",
    ]
    if base.run.mode == "sft":
        overrides.append("run.mode=opd")
    return base.with_overrides(overrides)


def arm_config(base: RunConfig, arm: str, overrides: Sequence[str], seed: int) -> RunConfig:
    """The base recipe plus the arm's override keys, at ``seed`` (the harness owns the seed)."""
    return base.with_overrides(
        [*overrides, f"run.seed={seed}", f"run.name={base.run.name}-{arm}-s{seed}"]
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


def resolve_arms(
    arms: Sequence[str] | None, definitions: Mapping[str, Sequence[str]] | None = None
) -> dict[str, tuple[str, ...]]:
    """Arm name -> override keys, in the requested order; unknown names are refused."""
    known = {name: tuple(spec) for name, spec in (definitions or DEFAULT_ARMS).items()}
    names = list(dict.fromkeys(arms)) if arms else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"unknown benchmark arm(s) {', '.join(unknown)}", hint=f"choose from {', '.join(known)}"
        )
    if not names:
        raise ConfigError("no benchmark arms selected")
    return {name: known[name] for name in names}


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
            if e.event == "rollouts_collected" and e.get("offline_kd_pool")
        ),
        "selected_training_tokens": sum(int(s.get("selected_positions") or 0) for s in steps),
        "teacher_query_ratio": None
        if mode == "sft" or not model_tokens
        else selected_in_cycles / model_tokens,
        "optimizer_steps": summary.get("global_optimizer_step"),
        "skipped_cycles": sum(1 for c in cycles if c.get("skipped")),
        "cold_start_student_sha256": loaded[-1].get("student_sha256") if loaded else None,
    }


# ---------------------------------------------------------------------- the harness


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def arm_config_for_arm_seed(config: RunConfig, arm_seed: int) -> RunConfig:
    """An arm's config at ``arm_seed``: arm seed 0 is unchanged; others get a derived ``run.seed``.

    Splits come from ``environment.split_seed``, so the held-out tasks stay the same.
    """
    from miniverl.evaluation.cells import arm_phase_seed

    if arm_seed == 0:
        return config
    return config.with_overrides(
        [
            f"run.seed={arm_phase_seed(config.run.seed, arm_seed)}",
            f"run.name={config.run.name}-a{arm_seed}",
        ]
    )


def _seed_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
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


def plan_digest(base: RunConfig, compute_matched: str | None) -> str:
    """What every stored cell must have been computed under: the base config and the matching mode."""
    from miniverl.utils.io import sha256_bytes, to_json_text

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
) -> dict[str, Any]:
    """Run every (seed, arm seed, arm) cell from one shared cold start per seed; write benchmark.json and a report.

    All configs are built and checked before anything trains, so a refused arm costs
    nothing. ``arm_definitions`` replaces :data:`DEFAULT_ARMS` (name -> override keys).
    Finished cells are stored under ``cells/`` and reused on a rerun with the same base
    config (``evaluation/cells.py``); ``run_cell`` replaces the trainer (tests).
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
    baseline_arm = BASELINE_ARM if BASELINE_ARM in chosen else None
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
        if payload.get("arm_overrides") not in (None, list(chosen[cell.arm])):
            return "recorded for another definition of the arm"
        return None

    def wrapped(cell: Any, done: Mapping[Any, Any]) -> Mapping[str, Any]:
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
        "arms": {
            name: {"overrides": list(chosen[name]), "description": ARM_DESCRIPTIONS.get(name, "")}
            for name in names
        },
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
        "rows": rows,
        "aggregates": aggregate(_seed_rows(rows), names, baseline_arm),
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
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    write_json(bench_paths.benchmark_json, result)
    write_report(root)
    return result


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
    console.print(result["significance"]["note"])
    print_contrasts(result, console)
    console.print(
        f"wall clock {result['wall_seconds']:.1f} s (including {len(result['cold_starts'])} shared cold start(s))"
    )


def print_contrasts(result: Mapping[str, Any], console: Console) -> None:
    """Pre-registered primary contrasts first, each with its interval, MDE and plain verdict; then stop-or-go."""
    contrasts = result.get("contrasts") or []
    if contrasts:
        if result.get("statistics_note"):
            console.print(result["statistics_note"])
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


__all__ = [
    "ARM_DESCRIPTIONS",
    "BASELINE_ARM",
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "DEFAULT_ARMS",
    "FIXED_KEYS",
    "aggregate",
    "arm_config",
    "arm_config_for_arm_seed",
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
    "significance_note",
    "verify_held_fixed",
]
