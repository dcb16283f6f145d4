"""Selection, memory and throughput sections."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from miniverl.inspection.run_dir import RunData
from miniverl.lab.report.tables import (
    NOT_RECORDED,
    Section,
    Table,
    fmt_counts,
    fmt_num,
)


def selection_section(data: RunData) -> Section:
    section = Section("selection")
    objective = (data.manifest or {}).get("objective") or {}
    selector = objective.get("selector") or data.config_value("selection.selector")
    ratio = objective.get("selection_ratio") or data.config_value("selection.ratio")
    if not data.cycles:
        section.notes.append("No cycle records: nothing was selected.")
        return section
    section.notes.append(
        f"Selector {selector or NOT_RECORDED} (ratio {fmt_num(ratio, 2)}). teacher_queried_position_ratio = selected positions / model-generated tokens. "
        "It measures the LM-head projection work, cache size and number of loss positions; the teacher still runs a full forward pass over every sequence."
    )
    rows = []
    totals: Counter[str] = Counter()
    for c in data.cycles:
        sel = c.get("selection") or {}
        for key in (
            "trajectories",
            "trajectories_with_selection",
            "model_tokens",
            "critical_tokens",
            "selected_positions",
        ):
            totals[key] += int(sel.get(key) or 0)
        rows.append(
            [
                fmt_num(c.get("cycle")),
                str(c.get("mode", NOT_RECORDED)),
                fmt_num(sel.get("trajectories")),
                fmt_num(sel.get("trajectories_with_selection")),
                fmt_num(sel.get("model_tokens")),
                fmt_num(sel.get("critical_tokens")),
                fmt_num(sel.get("selected_positions")),
                fmt_num(sel.get("teacher_queried_position_ratio")),
                "skipped (no selected positions)" if c.get("skipped") else "trained",
                fmt_counts(sel.get("selected_by_span_type")),
            ]
        )
    overall = (
        totals["selected_positions"] / totals["model_tokens"] if totals["model_tokens"] else 0.0
    )
    rows.append(
        [
            "all",
            "",
            str(totals["trajectories"]),
            str(totals["trajectories_with_selection"]),
            str(totals["model_tokens"]),
            str(totals["critical_tokens"]),
            str(totals["selected_positions"]),
            fmt_num(overall),
            f"{sum(1 for c in data.cycles if c.get('skipped'))} skipped",
            "",
        ]
    )
    section.tables.append(
        Table(
            [
                "cycle",
                "mode",
                "trajectories",
                "with selection",
                "model tokens",
                "critical tokens",
                "selected positions",
                "teacher_queried_position_ratio",
                "outcome",
                "selected by span type",
            ],
            rows,
        )
    )
    return section


STATUS_WORDS = {"not_run_no_cuda": "not measured (no GPU)", "measured": "measured"}
"""How the report words a recorded GPU-memory status (the records keep the machine's token)."""


def _words(status: str) -> str:
    return STATUS_WORDS.get(status, status)


def memory_section(data: RunData) -> Section:
    section = Section("memory")
    m = data.manifest or {}
    statuses = Counter(
        _words(str((s.get("gpu") or {}).get("status", NOT_RECORDED))) for s in data.steps
    )
    measured = [s["gpu"] for s in data.steps if (s.get("gpu") or {}).get("status") == "measured"]
    gpu = m.get("gpu") or {}
    devices = ", ".join(
        f"{d.get('name')} ({d.get('total_memory_gib')} GiB)" for d in gpu.get("devices") or []
    ) or _words(str(gpu.get("status", NOT_RECORDED)))
    recorded = (m.get("measurement_status") or {}).get("gpu_memory")
    rows = [
        ["GPU", devices],
        [
            "GPU memory measurement",
            _words(str(recorded)) if recorded else fmt_counts(statuses),
        ],
        ["memory strategy", str((m.get("memory_plan") or {}).get("strategy", NOT_RECORDED))],
        [
            "projection chunk sizes used",
            ", ".join(
                str(c)
                for c in sorted(
                    {
                        s.get("projection_chunk_size")
                        for s in data.steps
                        if s.get("projection_chunk_size") is not None
                    }
                )
            )
            or NOT_RECORDED,
        ],
        [
            "OOM chunk retries",
            str(sum(1 for e in data.events if e.event == "oom_chunk_retry")),
        ],
    ]
    if measured:
        for key in ("peak_allocated_gib", "peak_reserved_gib"):
            values = [float(g[key]) for g in measured if isinstance(g.get(key), int | float)]
            rows.append(
                [
                    f"{key.replace('_', ' ')} (max over steps)",
                    fmt_num(max(values), 3) if values else NOT_RECORDED,
                ]
            )
    elif data.steps:
        status = next(iter(statuses)) if len(statuses) == 1 else fmt_counts(statuses)
        rows.append(["peak allocated / reserved", f"{status}: nothing was measured, not a zero"])
    section.tables.append(Table(["memory", "value"], rows))
    if data.steps:
        by_phase: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for s in data.steps:
            by_phase[str(s.get("phase"))].append(s)
        rows = []
        for phase, steps in by_phase.items():
            rates = [
                float(s["train_selected_tokens_per_second"])
                for s in steps
                if isinstance(s.get("train_selected_tokens_per_second"), int | float)
            ]
            seconds = [
                float(s["seconds"]) for s in steps if isinstance(s.get("seconds"), int | float)
            ]
            rows.append(
                [
                    phase,
                    str(len(steps)),
                    str(sum(int(s.get("selected_positions") or 0) for s in steps)),
                    fmt_num(sum(seconds), 3) if seconds else NOT_RECORDED,
                    fmt_num(statistics.fmean(rates), 1) if rates else NOT_RECORDED,
                    fmt_num(statistics.median(rates), 1) if rates else NOT_RECORDED,
                ]
            )
        section.tables.append(
            Table(
                [
                    "phase",
                    "steps",
                    "selected positions",
                    "update seconds",
                    "train_selected_tokens_per_second (mean)",
                    "(median)",
                ],
                rows,
                caption="Update time only (forward, backward, optimizer step); rollouts and teacher scoring are in the cycle seconds below.",
            )
        )
    cycle_seconds = [
        float(c["seconds"]) for c in data.cycles if isinstance(c.get("seconds"), int | float)
    ]
    timing = [
        ["cycles", str(len(data.cycles))],
        ["cycle seconds (sum)", fmt_num(sum(cycle_seconds), 2) if cycle_seconds else NOT_RECORDED],
        ["run seconds", fmt_num((data.eval_summary or {}).get("seconds"), 2)],
    ]
    section.tables.append(Table(["time", "value"], timing))
    return section
