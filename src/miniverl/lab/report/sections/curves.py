"""Learning curves, held-out success and the failure taxonomy."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from miniverl.config.modes import WARMUP_MODE
from miniverl.inspection.run_dir import RunData
from miniverl.lab.report import plots
from miniverl.lab.report.sections.common import collect_evaluations
from miniverl.lab.report.tables import (
    CURVE_SERIES,
    CURVE_TABLE_ROWS,
    MAX_STEP_ROWS,
    NOT_RECORDED,
    Figure,
    Section,
    Table,
    count_share,
    fmt_lr,
    fmt_num,
    fmt_pct,
)


def split_loss_series(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Step records with ``sft_loss`` (warm-up cross-entropy) and ``kd_divergence`` apart.

    The two live on different scales, so each gets its own panel of the curves figure.
    """
    return [
        {
            **s,
            "sft_loss": s.get("loss") if s.get("phase") == WARMUP_MODE.name else None,
            "kd_divergence": s.get("divergence_loss")
            if s.get("phase") != WARMUP_MODE.name
            else None,
        }
        for s in steps
    ]


def _held_out_points(
    data: RunData, evaluations: Mapping[str, Mapping[str, Any]]
) -> list[tuple[float, float, str]]:
    """(x, success, label) of every training-time evaluation on the distillation-cycle axis."""
    last_cycle = max(
        (int(c["cycle"]) for c in data.cycles if isinstance(c.get("cycle"), int)), default=0
    )
    points = []
    for tag, r in evaluations.items():
        rate = r.get("success_rate")
        training_time = r.get("source") in (data.paths.metrics.name, data.paths.eval_json.name)
        if not isinstance(rate, int | float) or not training_time:
            continue
        if tag == "baseline":
            points.append((-1.0, float(rate), "baseline"))
        elif tag == "after_warmup":
            points.append((-0.5, float(rate), "warm-up"))
        elif tag == "final":
            points.append((float(last_cycle), float(rate), "final"))
        elif tag.startswith("cycle-") and tag[6:].isdigit():
            points.append((float(int(tag[6:])), float(rate), ""))
    return sorted(points)


def _cycle_table(data: RunData, held_out: Sequence[tuple[float, float, str]]) -> Table | None:
    """At most CURVE_TABLE_ROWS evenly spaced cycles: the curve's numbers, for summary.md."""
    cycles = [c for c in data.cycles if isinstance(c.get("cycle"), int)]
    if not cycles:
        return None
    stride = max(1, math.ceil(len(cycles) / CURVE_TABLE_ROWS))
    picked = cycles[::stride]
    if picked[-1] is not cycles[-1]:
        picked.append(cycles[-1])
    by_cycle = {int(x): rate for x, rate, _ in held_out if x >= 0}
    rows = []
    for c in picked:
        ro = c.get("rollouts") or {}
        rows.append(
            [
                fmt_num(c["cycle"]),
                f"{fmt_num(ro.get('solved'))}/{fmt_num(ro.get('tasks'))} ({fmt_pct(ro.get('success_rate'))})"
                if ro
                else NOT_RECORDED,
                fmt_pct(by_cycle[int(c["cycle"])]) if int(c["cycle"]) in by_cycle else NOT_RECORDED,
                fmt_num(c.get("mean_loss", c.get("loss"))),
                fmt_num(c.get("mean_divergence")),
            ]
        )
    caption = (
        f"Every cycle ({len(cycles)})"
        if stride == 1
        else f"Every {stride}th of {len(cycles)} cycles, and the last (all are in {data.paths.metrics.name})"
    )
    return Table(
        ["cycle", "rollout success", "held-out success", "mean loss", "mean divergence"],
        rows,
        caption=caption,
    )


def curves_section(
    data: RunData, evaluations: Mapping[str, Mapping[str, Any]] | None = None
) -> Section:
    section = Section("curves")
    evaluations = evaluations if evaluations is not None else collect_evaluations(data)
    held_out = _held_out_points(data, evaluations)
    rollouts = [
        (int(c["cycle"]), float(c["rollouts"]["success_rate"]))
        for c in data.cycles
        if isinstance(c.get("cycle"), int)
        and isinstance((c.get("rollouts") or {}).get("success_rate"), int | float)
    ]
    if rollouts or held_out:
        section.figures.append(
            Figure(
                plots.success_per_cycle(rollouts, held_out),
                "Success per distillation cycle: sampled rollouts on training prompts (thin) and held-out "
                "evaluations (squares; baseline and warm-up sit left of cycle 0; set eval.every for more points).",
            )
        )
        table = _cycle_table(data, held_out)
        if table is not None:
            section.tables.append(table)
    if not data.steps:
        section.notes.append(f"No optimizer steps recorded in {data.paths.metrics.name}.")
        return section
    phases = Counter(str(s.get("phase")) for s in data.steps)
    committed = sum(1 for s in data.steps if s.get("committed", True))
    section.notes.append(
        f"{len(data.steps)} optimizer steps recorded ({committed} committed): "
        + ", ".join(f"{n} {p}" for p, n in phases.items())
        + ". SFT warm-up steps optimize cross-entropy on oracle traces, so their divergence is 0 by construction."
    )
    section.figures.append(
        Figure(
            plots.learning_curves(split_loss_series(data.steps), CURVE_SERIES),
            "Per optimizer step, colored by phase. The SFT warm-up's cross-entropy and the "
            "distillation divergence have separate axes: their scales differ.",
        )
    )
    rows = [
        [
            fmt_num(s.get("global_optimizer_step")),
            str(s.get("phase", NOT_RECORDED)),
            fmt_num(s.get("cycle")),
            fmt_num(s.get("loss")),
            fmt_num(s.get("divergence_loss")),
            fmt_num(s.get("sampled_token_nll")),
            fmt_num(s.get("grad_norm")),
            fmt_lr(s.get("lr")),
            fmt_num(s.get("selected_positions")),
            fmt_num(s.get("committed", True)),
        ]
        for s in data.steps[:MAX_STEP_ROWS]
    ]
    caption = (
        "Every optimizer step"
        if len(data.steps) <= MAX_STEP_ROWS
        else f"The first {MAX_STEP_ROWS} of {len(data.steps)} steps (all are in {data.paths.metrics.name})"
    )
    section.tables.append(
        Table(
            [
                "step",
                "phase",
                "cycle",
                "loss",
                "divergence",
                "sampled-token NLL",
                "grad norm",
                "lr",
                "selected positions",
                "committed",
            ],
            rows,
            caption=caption,
            collapsed=len(rows) > 20,
        )
    )
    return section


def success_section(data: RunData, evaluations: Mapping[str, Mapping[str, Any]]) -> Section:
    section = Section("success")
    if not evaluations:
        section.notes.append("No held-out evaluation recorded.")
        return section
    rows = []
    for tag, r in evaluations.items():
        rows.append(
            [
                tag,
                str(r.get("split", NOT_RECORDED)),
                f"{fmt_num(r.get('solved'))}/{fmt_num(r.get('tasks'))}",
                fmt_pct(r.get("success_rate")),
                fmt_num(r.get("mean_generated_tokens"), 1),
                fmt_num(r.get("parameter_version")),
                fmt_num(r.get("temperature"), 2),
                str(r.get("source")),
            ]
        )
    section.tables.append(
        Table(
            [
                "stage",
                "split",
                "solved",
                "success",
                "mean generated tokens",
                "parameter version",
                "temperature",
                "source",
            ],
            rows,
        )
    )
    # The bar chart of these rates is the headline's (first screen), not repeated here.
    if "after_warmup" in evaluations and "final" in evaluations:
        section.notes.append(
            "The SFT warm-up runs before distillation and often does most of the work (docs/design.md §4.1): "
            "compare after_warmup with final, and use 'miniverl benchmark' to separate the two effects. "
            "A single end-to-end number is not evidence that distillation helped."
        )
    return section


def _training_rollout_counts(data: RunData, key: str) -> dict[str, int]:
    total: Counter[str] = Counter()
    for cycle in data.cycles:
        total.update({k: int(v) for k, v in ((cycle.get("rollouts") or {}).get(key) or {}).items()})
    return dict(total)


def failures_section(data: RunData, evaluations: Mapping[str, Mapping[str, Any]]) -> Section:
    section = Section("failures")
    sources: dict[str, dict[str, dict[str, int]]] = {"termination": {}, "failure_categories": {}}
    for key in sources:
        for tag, r in evaluations.items():
            sources[key][f"eval {tag}"] = {k: int(v) for k, v in (r.get(key) or {}).items()}
        training = _training_rollout_counts(data, key)
        if training:
            sources[key]["training rollouts"] = training
    if not any(sources["termination"].values()):
        section.notes.append("No rollouts recorded (no evaluation and no policy rollouts).")
        return section
    section.notes.append(
        "Every trajectory ends with exactly one termination reason; verifier categories come from the exact verifier (no LLM judge)."
    )
    for key, label in (
        ("termination", "termination reason"),
        ("failure_categories", "verifier category"),
    ):
        per_source = sources[key]
        categories = sorted({c for counts in per_source.values() for c in counts})
        if not categories:
            section.tables.append(Table([label], [["none recorded"]]))
            continue
        totals = {s: sum(per_source[s].values()) for s in per_source}
        rows = [
            [c, *[count_share(per_source[s].get(c, 0), totals[s]) for s in per_source]]
            for c in categories
        ]
        section.tables.append(Table([label, *[f"{s} (n={totals[s]})" for s in per_source]], rows))
    section.figures.append(
        Figure(
            plots.counts_bars("termination reasons", sources["termination"], normalize=True),
            "Termination reasons as a share of each source's trajectories (sources differ in size by orders of magnitude).",
        )
    )
    return section
