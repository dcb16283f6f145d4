"""The headline: what a reader needs in the first screen of the report.

Held-out success per stage (and per chain length k where the environment has one), the
objective in one line, and for a benchmark its contrasts with their intervals. A
``miniverl demo --fast`` run carries a smoke-test banner: its budgets are shrunk until the
pipeline merely runs, so its 0% bars are not a result.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from miniverl.config.modes import WARMUP_MODE
from miniverl.config.presets import DEMO_COMPARISON_MODE
from miniverl.errors import MiniverlError
from miniverl.inspection.run_dir import RunData
from miniverl.lab.report import plots
from miniverl.lab.report.tables import (
    NOT_RECORDED,
    STAGE_ORDER,
    Figure,
    Section,
    Table,
    fmt_num,
    fmt_pct,
)

SMOKE_TEST_RUN_NAMES = frozenset({"demo-fast", f"demo-fast-{DEMO_COMPARISON_MODE}"})
"""``run.name`` of the ``miniverl demo --fast`` preset's two runs (``config.presets.demo_config``)."""

SMOKE_TEST_BANNER = (
    "SMOKE TEST (miniverl demo --fast): every budget is shrunk so that the pipeline runs end "
    "to end in under a minute. The success rates below are not a result; run "
    "'miniverl demo' for the real demo."
)

STAGE_LABELS = {"baseline": "baseline", "after_warmup": "after SFT warm-up", "final": "final"}

_CHAIN_PROMPT = re.compile(r"Start with -?\d+\. Then (.+?)\. Report the final value\.")
"""A calc_chain task prompt (``environments.calc_chain.render_prompt``); k = its step count."""


def is_smoke_test(data: RunData) -> bool:
    return data.config_value("run.name") in SMOKE_TEST_RUN_NAMES


def objective_line(data: RunData) -> str | None:
    """The run's objective in one sentence, from the manifest's objective block."""
    objective = (data.manifest or {}).get("objective") or {}
    if not objective:
        return None
    label = objective.get("label") or NOT_RECORDED
    parts = [f"Objective: {label} (run.mode {objective.get('mode', NOT_RECORDED)})"]
    if objective.get("mode") != WARMUP_MODE.name and objective.get("divergence"):
        target = (
            f"top-{objective['top_k']} " if isinstance(objective.get("top_k"), int) else ""
        ) + str(objective.get("supervision_shape") or objective.get("loss_mode") or "")
        parts.append(f"{objective['divergence']} against {target.strip()} teacher targets")
    if objective.get("selector"):
        parts.append(f"selector {objective['selector']}")
    warmup = objective.get("sft_warmup_cycles")
    if isinstance(warmup, int) and warmup:
        parts.append(f"after {warmup} SFT warm-up cycle{'s' * (warmup != 1)}")
    return ", ".join(parts) + "."


def success_by_k(data: RunData) -> dict[str, dict[int, tuple[int, int]]]:
    """Stage -> k -> (solved, tasks) from ``eval_trajectories.jsonl`` of a calc_chain run.

    Empty for other environments (no chain length) or when the file is absent.
    """
    env = (data.manifest or {}).get("environment") or {}
    path = data.paths.eval_trajectories
    if env.get("name") != "calc_chain" or not path.is_file():
        return {}
    from miniverl.trajectory.io import iter_trajectories

    out: dict[str, dict[int, tuple[int, int]]] = {}
    for t in iter_trajectories(path):
        stage = str(t.metadata.get("eval_tag"))
        if stage not in STAGE_ORDER:
            continue
        user = next((s.text for s in t.spans if s.span_type.value == "user"), "")
        match = _CHAIN_PROMPT.search(user)
        if match is None:
            continue
        k = match.group(1).count(", then ") + 1
        solved, tasks = out.setdefault(stage, {}).get(k, (0, 0))
        out[stage][k] = (solved + int(t.solved), tasks + 1)
    return out


def _run_table(
    data: RunData, evaluations: Mapping[str, Mapping[str, Any]], notes: list[str]
) -> Table | None:
    stages = [s for s in STAGE_ORDER if s in evaluations]
    if not stages:
        return None
    try:
        by_k = success_by_k(data)
    except MiniverlError as exc:
        by_k = {}
        notes.append(f"Success per k is not shown: {exc.message}")
    ks = sorted({k for per_k in by_k.values() for k in per_k})
    rows = []
    for stage in stages:
        r = evaluations[stage]
        row = [
            STAGE_LABELS[stage],
            str(r.get("split", NOT_RECORDED)),
            f"{fmt_num(r.get('solved'))}/{fmt_num(r.get('tasks'))}",
            fmt_pct(r.get("success_rate")),
        ]
        for k in ks:
            solved, tasks = by_k.get(stage, {}).get(k, (0, 0))
            row.append(f"{fmt_pct(solved / tasks)} ({solved}/{tasks})" if tasks else NOT_RECORDED)
        rows.append(row)
    return Table(
        ["stage", "split", "solved", "held-out success", *[f"k={k}" for k in ks]],
        rows,
        caption="Held-out success per stage"
        + (" and per chain length k" if ks else "")
        + "; every stage is measured on the same held-out tasks.",
    )


def _p(value: Any) -> str:
    if not isinstance(value, int | float):
        return NOT_RECORDED
    return "< 0.001" if value < 0.0005 else f"{value:.3f}"


def _contrast_table(bench: Mapping[str, Any]) -> Table | None:
    """The benchmark's contrasts (``benchmark.json`` ``contrasts``): the t-interval over seed
    means is the headline, the Holm-adjusted p covers the primary family (primary contrasts
    at the primary endpoints), the two-level bootstrap is secondary."""
    contrasts = [c for c in bench.get("contrasts") or [] if isinstance(c, Mapping)]
    if not contrasts:
        return None
    contrasts = sorted(contrasts, key=lambda c: not c.get("primary"))
    rows = []
    for c in contrasts:
        interval = c.get("interval")
        bootstrap = c.get("bootstrap_interval")
        mean = c.get("mean_difference")
        rows.append(
            [
                f"{c.get('arm')} − {c.get('reference')}",
                str(c.get("endpoint", NOT_RECORDED)),
                "primary" if c.get("primary") else "secondary",
                f"{100 * float(mean):+.1f} pp" if isinstance(mean, int | float) else NOT_RECORDED,
                f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}] pp"
                if interval
                else NOT_RECORDED,
                _p(c.get("p_value")),
                _p(c.get("p_holm")),
                f"[{100 * bootstrap[0]:.1f}, {100 * bootstrap[1]:.1f}] pp"
                if bootstrap
                else NOT_RECORDED,
                f"{100 * float(c['mde']):.1f} pp"
                if isinstance(c.get("mde"), int | float)
                else NOT_RECORDED,
                "yes" if c.get("distinguishable") else "no",
            ]
        )
    return Table(
        [
            "contrast",
            "endpoint",
            "kind",
            "difference",
            "95% t-interval",
            "p",
            "Holm-adjusted p",
            "95% two-level bootstrap",
            "MDE",
            "distinguishable",
        ],
        rows,
        caption=str(bench.get("statistics_note") or "Paired differences in held-out success."),
    )


def _arm_table(bench: Mapping[str, Any]) -> Table | None:
    """Final success per arm and its paired difference to the baseline arm (with interval)."""
    aggregates: Mapping[str, Any] = bench.get("aggregates") or {}
    order = [a for a in bench.get("arm_order") or [] if a in aggregates]
    names = order + [a for a in aggregates if a not in order]
    if not names:
        return None
    baseline_arm = bench.get("baseline_arm")
    rows = []
    for name in names:
        agg = aggregates[name] or {}
        final = agg.get("final_success") or {}
        diff = agg.get("difference_to_baseline") or {}
        interval = diff.get("interval")
        rows.append(
            [
                name,
                str(final.get("n", 0)),
                fmt_pct(final.get("mean")),
                f"{100 * float(diff['mean']):+.1f} pp"
                if isinstance(diff.get("mean"), int | float)
                else NOT_RECORDED,
                f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}] pp"
                if interval
                else NOT_RECORDED,
            ]
        )
    return Table(
        [
            "arm",
            "seeds",
            "final held-out success",
            f"Δ vs {baseline_arm or 'baseline arm'}",
            "95% interval",
        ],
        rows,
    )


def _count(result: Mapping[str, Any] | None) -> str:
    if not result:
        return NOT_RECORDED
    return f"{fmt_num(result.get('solved'))}/{fmt_num(result.get('tasks'))}"


def comparison_block(comparison: Mapping[str, Any], section: Section) -> None:
    """``miniverl demo``'s arms side by side (its ``comparison.json``): the plain sentence,
    the table of the shared start, each arm and the teacher (held-out success and recovery
    from the warm-up student's own errors), and each arm's held-out success at every
    evaluation against the teacher's line. Added to ``section`` in that order."""
    arms: dict[str, Mapping[str, Any]] = {
        str(arm.get("name", NOT_RECORDED)): arm
        for arm in comparison.get("arms") or []
        if isinstance(arm, Mapping)
    }
    teacher = comparison.get("teacher_success")
    recovery = comparison.get("recovery")
    recovery = recovery if isinstance(recovery, Mapping) else {}
    got = recovery.get("recovered")
    got = got if isinstance(got, Mapping) else {}
    states = recovery.get("states")

    def recovered(key: str) -> str:
        value = got.get(key)
        return f"{value}/{states}" if isinstance(value, int) else NOT_RECORDED

    if comparison.get("sentence"):
        section.notes.append(str(comparison["sentence"]))
    first = next(iter(arms.values()), {})
    rows = [
        [
            "SFT warm-up (shared start)",
            _count(first.get("start")),
            fmt_pct((first.get("start") or {}).get("success_rate")),
            recovered("start"),
        ]
    ]
    for name, arm in arms.items():
        rows.append(
            [
                f"{name} ({arm.get('trains_on', NOT_RECORDED)})",
                _count(arm.get("final")),
                fmt_pct((arm.get("final") or {}).get("success_rate")),
                recovered(name),
            ]
        )
    if isinstance(teacher, int | float):
        solved, tasks = recovery.get("teacher_solved"), recovery.get("tasks")
        rows.append(
            [
                "teacher (the ceiling)",
                f"{solved}/{tasks}" if isinstance(tasks, int) else NOT_RECORDED,
                fmt_pct(teacher),
                recovered("teacher"),
            ]
        )
    sha = str(comparison.get("start_weights_sha256") or NOT_RECORDED)
    section.tables.append(
        Table(
            ["", "held-out solved", "success", "recovered from the warm-up's own errors"],
            rows,
            caption="Greedy held-out success after the same number of updates from the same "
            f"warm-up weights (SHA-256 {sha[:16]}…). Recovered: each policy continues "
            "greedily from the state after the warm-up student's first error in each held-out "
            "episode where it made one (the tool's flag included); counted when the episode "
            "ends solved. Run directories: "
            + ", ".join(f"{n} {a.get('run_dir', NOT_RECORDED)}" for n, a in arms.items())
            + ".",
        )
    )
    curves = {
        name: [(float(x), float(y)) for x, y in arm.get("curve") or []]
        for name, arm in arms.items()
    }
    section.figures.append(
        Figure(
            plots.arm_curves(curves, teacher if isinstance(teacher, int | float) else None),
            "Held-out success of each arm at every evaluation, from the shared warm-up (update "
            "0), with the teacher's own success as the ceiling"
            + (" (smoke test: not a result)." if section.banner else "."),
        )
    )


def headline_section(data: RunData, evaluations: Mapping[str, Mapping[str, Any]] | None) -> Section:
    """The first section of every report; ``evaluations`` is None for a benchmark directory.

    A demo run with ``comparison.json`` leads with its arms side by side
    (:func:`comparison_block`); its objective in full is the objective section's.
    """
    section = Section("headline")
    if data.is_training_run and is_smoke_test(data):
        section.banner = SMOKE_TEST_BANNER
    if data.comparison:
        comparison_block(data.comparison, section)
    line = objective_line(data) if data.is_training_run and not data.comparison else None
    if line:
        section.notes.append(line)
    if evaluations is not None:
        table = _run_table(data, evaluations, section.notes)
        if table is None:
            section.notes.append("No held-out evaluation recorded yet.")
        else:
            section.tables.append(table)
        bars = [
            (tag, float(r["success_rate"]))
            for tag, r in evaluations.items()
            if isinstance(r.get("success_rate"), int | float)
        ]
        if bars and not data.comparison:  # a comparison's curves carry these stages
            section.figures.append(
                Figure(
                    plots.success_bars(bars),
                    "Held-out success per evaluation stage"
                    + (" (smoke test: not a result)." if section.banner else "."),
                )
            )
    bench = data.benchmark
    if bench is not None:
        for table in (_arm_table(bench), _contrast_table(bench)):
            if table is not None:
                section.tables.append(table)
        significance = (bench.get("significance") or {}).get("note")
        if significance:
            section.notes.append(str(significance))
    return section


__all__ = ["SMOKE_TEST_BANNER", "headline_section", "is_smoke_test", "objective_line"]
