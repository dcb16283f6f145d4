"""What ``miniverl benchmark`` prints: the arm table, the contrasts, budgets and stop-or-go.

Split from :mod:`miniverl.evaluation.benchmark` (which re-exports both functions); reads
only a benchmark.json mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table


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
    from miniverl.reporting.sections.benchmark import learning_rate_note

    lr_note = learning_rate_note(result)
    if lr_note:
        console.print(lr_note, markup=False)
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


__all__ = ["print_benchmark", "print_contrasts"]
