"""Benchmark setup and comparison sections (a ``benchmark.json`` directory)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from miniverl.lab.report import plots
from miniverl.lab.report.tables import (
    NOT_RECORDED,
    Figure,
    Section,
    Table,
    fmt_num,
    fmt_pct,
)


def learning_rate_note(bench: Mapping[str, Any]) -> str | None:
    """Where the arms' ``train.lr`` came from, when ``benchmark --lr-from`` set it (lab/benchmark/lr_grid.py)."""
    record = bench.get("learning_rates")
    if not record:
        return None
    grid = ", ".join(f"{float(r):g}" for r in record.get("grid") or [])
    selected = ", ".join(f"{arm} {float(r):g}" for arm, r in (record.get("selected") or {}).items())
    return (
        f"Learning rates: {selected}, selected from the shared grid [{grid}] on the "
        f"{record.get('split', NOT_RECORDED)} split over seeds {record.get('seeds', NOT_RECORDED)} "
        f"× {record.get('arm_seeds', NOT_RECORDED)} arm seed(s) (lr_grid.json sha256 "
        f"{str(record.get('lr_grid_sha256', NOT_RECORDED))[:16]}…). Rule: {record.get('rule', NOT_RECORDED)}."
    )


def benchmark_sections(bench: Mapping[str, Any]) -> list[Section]:
    setup = Section("benchmark_setup")
    arms_in: Mapping[str, Any] = bench.get("arms") or {}
    order = [a for a in bench.get("arm_order") or [] if a in arms_in]
    arms = {name: arms_in[name] for name in order + [a for a in arms_in if a not in order]}
    seeds = bench.get("seeds") or []
    setup.notes.append(
        f"{len(arms)} arm{'s' * (len(arms) != 1)} × {len(seeds)} seed{'s' * (len(seeds) != 1)} ({', '.join(str(s) for s in seeds)}) from recipe {bench.get('recipe', NOT_RECORDED)} "
        f"(base config digest {str(bench.get('base_config_digest', NOT_RECORDED))[:16]}…). One shared SFT cold start per seed is loaded weights-only into every arm; "
        "no optimizer state crosses between arms."
    )
    if bench.get("base_overrides"):
        setup.notes.append("Base overrides: " + " ".join(str(o) for o in bench["base_overrides"]))
    lr_note = learning_rate_note(bench)
    if lr_note:
        setup.notes.append(lr_note)
    setup.tables.append(
        Table(
            ["arm", "override keys"],
            [
                [name, " ".join(spec.get("overrides") or []) or "(none)"]
                for name, spec in arms.items()
            ],
        )
    )
    held = bench.get("held_fixed") or {}
    if held:
        setup.tables.append(
            Table(
                ["held fixed across arms", "value"],
                [
                    [
                        k,
                        json.dumps(v, sort_keys=True, ensure_ascii=False)
                        if not isinstance(v, str)
                        else v,
                    ]
                    for k, v in (held.get("values") or {}).items()
                ],
            )
        )
    colds = bench.get("cold_starts") or []
    if colds:
        setup.tables.append(
            Table(
                ["seed", "cold start", "student sha256", "baseline", "after warm-up", "seconds"],
                [
                    [
                        fmt_num(c.get("seed")),
                        str(c.get("dir", NOT_RECORDED)),
                        str(c.get("student_sha256", NOT_RECORDED))[:16] + "…",
                        fmt_pct(c.get("baseline_success")),
                        fmt_pct(c.get("after_warmup_success")),
                        fmt_num(c.get("wall_seconds"), 1),
                    ]
                    for c in colds
                ],
            )
        )
    for note in bench.get("refuses_to_claim") or []:
        setup.notes.append(str(note))

    comparison = Section("benchmark")
    significance = bench.get("significance") or {}
    if significance.get("note"):
        comparison.notes.append(str(significance["note"]))
    aggregates: Mapping[str, Any] = bench.get("aggregates") or {}
    baseline_arm = bench.get("baseline_arm")
    names = [a for a in arms if a in aggregates]
    agg_rows = []
    means: list[float | None] = []
    spreads: list[tuple[float, float] | None] = []
    deltas: list[float | None] = []
    intervals: list[tuple[float, float] | None] = []
    for name in names:
        agg = aggregates[name]
        final = agg.get("final_success") or {}
        diff = agg.get("difference_to_baseline") or {}
        interval = diff.get("interval")
        means.append(final.get("mean"))
        spreads.append(
            (final["min"], final["max"])
            if final.get("n", 0) > 1 and final.get("min") is not None
            else None
        )
        deltas.append(diff.get("mean"))
        intervals.append((interval[0], interval[1]) if interval else None)

        def mean_sd(key: str, digits: int = 1, agg: Mapping[str, Any] = agg) -> str:
            stats = agg.get(key) or {}
            if stats.get("mean") is None:
                return NOT_RECORDED
            sd = stats.get("std")
            return fmt_num(float(stats["mean"]), digits) + (
                f" ± {float(sd):.{digits}f}" if sd is not None else ""
            )

        agg_rows.append(
            [
                name,
                str(final.get("n", 0)),
                fmt_pct(final.get("mean"))
                + (f" ± {100 * float(final['std']):.1f}" if final.get("std") is not None else ""),
                fmt_pct((agg.get("baseline_success") or {}).get("mean")),
                ("+" if (diff.get("mean") or 0) >= 0 else "")
                + f"{100 * float(diff['mean']):.1f} pp"
                if diff.get("mean") is not None
                else NOT_RECORDED,
                f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}] pp"
                if interval
                else NOT_RECORDED,
                mean_sd("generated_tokens", 0),
                mean_sd("selected_training_tokens", 0),
                mean_sd("teacher_query_ratio", 3),
                mean_sd("wall_seconds", 1),
                mean_sd("optimizer_steps", 0),
            ]
        )
    if agg_rows:
        comparison.tables.append(
            Table(
                [
                    "arm",
                    "seeds",
                    "final success (mean ± sd)",
                    "baseline",
                    f"Δ vs {baseline_arm or 'baseline arm'}",
                    "95% bootstrap interval",
                    "generated tokens",
                    "selected training tokens",
                    "teacher query ratio",
                    "wall clock (s)",
                    "optimizer steps",
                ],
                agg_rows,
                caption="Quantities that cannot be matched by construction (generated tokens, selected training tokens, teacher query ratio, wall clock) are measured per arm, not held fixed.",
            )
        )
        comparison.figures.append(
            Figure(
                plots.benchmark_bars(names, means, spreads, deltas, intervals, baseline_arm),
                "Final held-out success per arm, and the paired difference to the baseline arm.",
            )
        )
    fixed = bench.get("fixed_state_recovery") or []
    if fixed:
        fixed_arms = [a for a in names if any(a in r["arms"] for r in fixed)]
        comparison.tables.append(
            Table(
                ["seed", "states", "cold start", *fixed_arms],
                [
                    [
                        fmt_num(r["seed"]),
                        fmt_num(r["states"]),
                        fmt_num(r["cold_start"]),
                        *(
                            " / ".join(str(n) for n in r["arms"].get(a, [])) or NOT_RECORDED
                            for a in fixed_arms
                        ),
                    ]
                    for r in fixed
                ],
                caption="Recovery at fixed states: of the cold start's own deviated episodes on the "
                "evaluation tasks (the same states for every arm of a seed), how many each policy, "
                "continuing greedily from the state after the first deviation, ended solved "
                "(one figure per arm seed).",
            )
        )
    rows = bench.get("rows") or []
    if rows:
        comparison.tables.append(
            Table(
                [
                    "arm",
                    "seed",
                    "baseline",
                    "final",
                    "generated tokens",
                    "teacher generated tokens",
                    "selected training tokens",
                    "teacher query ratio",
                    "wall clock (s)",
                    "optimizer steps",
                    "run directory",
                ],
                [
                    [
                        str(r.get("arm")),
                        fmt_num(r.get("seed")),
                        fmt_pct(r.get("baseline_success")),
                        fmt_pct(r.get("final_success")),
                        fmt_num(r.get("generated_tokens")),
                        fmt_num(r.get("teacher_generated_tokens")),
                        fmt_num(r.get("selected_training_tokens")),
                        fmt_num(r.get("teacher_query_ratio")),
                        fmt_num(r.get("wall_seconds"), 1),
                        fmt_num(r.get("optimizer_steps")),
                        str(r.get("run_dir", NOT_RECORDED)),
                    ]
                    for r in rows
                ],
                caption="One row per arm and seed.",
            )
        )
    return [comparison, setup]
