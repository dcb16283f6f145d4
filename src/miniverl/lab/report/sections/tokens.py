"""Token provenance, the per-token view and teacher entropy."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from miniverl.inspection.run_dir import RunData
from miniverl.lab.report import plots
from miniverl.lab.report.tables import (
    CONTEXT_SPAN_VALUES,
    MAX_CONTEXT_CHARS,
    MAX_STEP_ROWS,
    MODEL_SPAN_VALUES,
    NOT_RECORDED,
    SPAN_ORDER,
    Figure,
    Section,
    Table,
    TokenPiece,
    TokenView,
    fmt_num,
    fmt_pct,
)
from miniverl.schemas.trajectory import (
    CONTEXT_SPAN_TYPES,
    SpanType,
    Trajectory,
)
from miniverl.trajectory.io import iter_trajectories


def _training_trajectories(data: RunData) -> Iterable[Trajectory]:
    """Validated training rollouts (streamed: a long run's file is not held in memory)."""
    if data.paths.trajectories.is_file():
        tokenizer = (data.manifest or {}).get("tokenizer")
        vocab = tokenizer.get("vocab_size") if isinstance(tokenizer, dict) else None
        yield from iter_trajectories(
            data.paths.trajectories, vocab_size=vocab if isinstance(vocab, int) else None
        )


def provenance_section(data: RunData) -> Section:
    section = Section("provenance")
    by_source: dict[str, Counter[str]] = defaultdict(Counter)
    trajectories_by_source: Counter[str] = Counter()
    for traj in _training_trajectories(data):
        source = str(traj.metadata.get("source") or "unknown")
        trajectories_by_source[source] += 1
        by_source[source].update(traj.token_counts_by_span_type())
    selected: Counter[str] = Counter()
    for cycle in data.cycles:
        selected.update(
            {
                k: int(v)
                for k, v in (
                    (cycle.get("selection") or {}).get("selected_by_span_type") or {}
                ).items()
            }
        )
    loss_by_phase: dict[str, Counter[str]] = defaultdict(Counter)
    for step in data.steps:
        for span, value in (step.get("loss_by_span_type") or {}).items():
            if isinstance(value, int | float):
                loss_by_phase[str(step.get("phase"))][span] += float(value)
    if not by_source and not selected:
        section.notes.append(
            f"{data.paths.trajectories.name} not found: no token provenance to show."
        )
        return section
    sources = sorted(by_source)
    section.notes.append(
        "Tokens of training trajectories by span type ("
        + ", ".join(f"{trajectories_by_source[s]} {s}" for s in sources)
        + "). Only policy-emitted span types (assistant_*) can enter the loss; system, user and tool_result tokens are context "
        "the model conditions on and is never trained to reproduce."
    )
    phases = sorted(loss_by_phase)
    totals = {p: sum(loss_by_phase[p].values()) for p in phases}
    span_types = [
        s for s in SPAN_ORDER if any(by_source[src].get(s) for src in sources) or selected.get(s)
    ]
    rows = []
    for span in span_types:
        in_loss = (
            "never (context)"
            if span in CONTEXT_SPAN_VALUES
            else (
                "yes"
                if selected.get(span) or any(loss_by_phase[p].get(span) for p in phases)
                else "eligible, not selected"
            )
        )
        row = [span, "context" if span in CONTEXT_SPAN_VALUES else "model-generated"]
        row += [str(by_source[src].get(span, 0)) for src in sources]
        row.append(str(selected.get(span, 0)) if span in MODEL_SPAN_VALUES else "0")
        row += [
            fmt_pct(loss_by_phase[p].get(span, 0.0) / totals[p]) if totals[p] else NOT_RECORDED
            for p in phases
        ]
        row.append(in_loss)
        rows.append(row)
    headers = [
        "span type",
        "origin",
        *[f"tokens ({s})" for s in sources],
        "selected positions (cycles)",
        *[f"loss share ({p})" for p in phases],
        "enters the loss",
    ]
    section.tables.append(
        Table(
            headers,
            rows,
            caption="Selected positions are summed over the distillation cycles; loss share is each span type's part of the summed step loss per phase.",
        )
    )
    return section


def _pick_trajectory(data: RunData) -> tuple[Trajectory, list[dict[str, Any]]] | None:
    """The most instructive analysed trajectory: solved first, then one with a tool call, then the most positions."""
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in data.token_rows:
        by_id[str(row.get("trajectory_id"))].append(row)
    if not by_id:
        return None
    candidates: list[tuple[tuple[int, int, int], Trajectory]] = []
    for traj in _training_trajectories(data):
        if traj.trajectory_id in by_id:
            has_call = int(bool(traj.spans_of(SpanType.ASSISTANT_TOOL_CALL)))
            candidates.append(((int(traj.solved), has_call, len(by_id[traj.trajectory_id])), traj))
    if not candidates:
        return None
    best = max(candidates, key=lambda c: c[0])[1]
    return best, sorted(by_id[best.trajectory_id], key=lambda r: int(r.get("target_position", 0)))


def _visible(text: str) -> str:
    """Whitespace tokens must stay visible as chips, and must not break the line of chips."""
    return text.replace("\r", "␍").replace("\n", "↵").replace("\t", "⇥")


def tokens_section(data: RunData) -> Section:
    section = Section("tokens")
    picked = _pick_trajectory(data)
    if picked is None:
        section.notes.append(
            f"{data.paths.token_analysis.name} is missing or empty, or its trajectories are not in {data.paths.trajectories.name}: "
            "there is no per-token view for this run."
        )
        return section
    traj, rows = picked
    by_position = {
        int(r["target_position"]): r for r in rows if isinstance(r.get("target_position"), int)
    }
    divergences = [
        float(r["divergence"]) for r in rows if isinstance(r.get("divergence"), int | float)
    ]
    top = max(divergences) if divergences else 0.0
    pieces: list[TokenPiece] = []
    for span in traj.spans:
        kind = span.span_type.value
        if span.span_type in CONTEXT_SPAN_TYPES:
            text = (
                span.text
                if len(span.text) <= MAX_CONTEXT_CHARS
                else span.text[: MAX_CONTEXT_CHARS // 2]
                + " … "
                + span.text[-MAX_CONTEXT_CHARS // 2 :]
            )
            pieces.append(
                TokenPiece(
                    "context",
                    kind,
                    text,
                    f"{kind} [{span.start}, {span.end}): {span.length} context tokens, never in the loss",
                )
            )
            continue
        for position in range(span.start, span.end):
            row = by_position.get(position)
            if row is None:
                pieces.append(
                    TokenPiece(
                        "unselected",
                        kind,
                        "·",
                        f"{kind} position {position}: emitted by the policy, not selected",
                    )
                )
                continue
            div = row.get("divergence")
            title = f"{kind} position {position}, token id {row.get('token_id')}, weight {fmt_num(row.get('weight'), 3)}"
            title += f", student log p {fmt_num(row.get('student_log_prob'), 3)}, teacher entropy {fmt_num(row.get('teacher_entropy'), 3)}"
            if isinstance(div, int | float):
                title += f", divergence {float(div):.4f}"
            pieces.append(
                TokenPiece(
                    "token",
                    kind,
                    _visible(str(row.get("token_text", ""))),
                    title,
                    divergence=f"{float(div):.3f}" if isinstance(div, int | float) else None,
                    intensity=(float(div) / top)
                    if isinstance(div, int | float) and top > 0
                    else 0.0,
                )
            )
    present = list(dict.fromkeys(s.span_type.value for s in traj.spans))
    legend = [(s, plots.SPAN_COLORS.get(s, "#888888"), s in MODEL_SPAN_VALUES) for s in present]
    measured = {str(r.get("measured")) for r in rows if r.get("measured")}
    verdict = "solved" if traj.solved else "not solved"
    description = (
        f"{traj.trajectory_id} (task {traj.task_id}, {traj.termination_reason.value}, {verdict}, cycle {rows[0].get('cycle', NOT_RECORDED)}); "
        f"{len(rows)} selected positions"
        + (f", measured {', '.join(sorted(measured))}" if measured else "")
    )
    section.token_view = TokenView(traj.trajectory_id, description, pieces, legend)
    section.notes.append(
        "Only tokens the policy emitted carry a divergence (from token_analysis.jsonl); context spans are greyed and carry no number. "
        "The underline darkens with the divergence relative to the largest one shown."
        + ("" if divergences else " This run has no teacher, so no divergence was recorded.")
    )
    per_span: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per_span[str(r.get("span_type"))].append(r)
    span_rows = []
    for span in present:
        tokens = sum(s.length for s in traj.spans if s.span_type.value == span)
        values = [
            float(r["divergence"])
            for r in per_span.get(span, [])
            if isinstance(r.get("divergence"), int | float)
        ]
        span_rows.append(
            [
                span,
                str(tokens),
                str(len(per_span.get(span, []))) if span in MODEL_SPAN_VALUES else "0 (context)",
                fmt_num(statistics.fmean(values)) if values else NOT_RECORDED,
                fmt_num(max(values)) if values else NOT_RECORDED,
            ]
        )
    section.tables.append(
        Table(
            ["span type", "tokens", "selected", "mean divergence", "max divergence"],
            span_rows,
            caption=f"Trajectory {traj.trajectory_id}.",
        )
    )
    ranked = sorted(
        (r for r in rows if isinstance(r.get("divergence"), int | float)),
        key=lambda r: -float(r["divergence"]),
    )[:10]
    if ranked:
        section.tables.append(
            Table(
                [
                    "target position",
                    "span type",
                    "token",
                    "divergence",
                    "student log p",
                    "teacher entropy",
                ],
                [
                    [
                        fmt_num(r.get("target_position")),
                        str(r.get("span_type")),
                        json.dumps(str(r.get("token_text", "")), ensure_ascii=False),
                        fmt_num(r.get("divergence")),
                        fmt_num(r.get("student_log_prob")),
                        fmt_num(r.get("teacher_entropy")),
                    ]
                    for r in ranked
                ],
                caption="The ten largest per-token divergences of this trajectory.",
            )
        )
    return section


def entropy_section(data: RunData) -> Section:
    section = Section("entropy")
    step_rows = [s for s in data.steps if isinstance(s.get("teacher_entropy_mean"), int | float)]
    by_span: dict[str, list[float]] = defaultdict(list)
    div_by_span: dict[str, list[float]] = defaultdict(list)
    for r in data.token_rows:
        if isinstance(r.get("teacher_entropy"), int | float):
            by_span[str(r.get("span_type"))].append(float(r["teacher_entropy"]))
        if isinstance(r.get("divergence"), int | float):
            div_by_span[str(r.get("span_type"))].append(float(r["divergence"]))
    if not step_rows and not by_span:
        section.notes.append(
            "No teacher entropy recorded: this run queried no teacher (an sft run, or no selected positions)."
        )
        return section
    threshold = data.config_value("loss.entropy_threshold")
    threshold = float(threshold) if isinstance(threshold, int | float) else None
    lower_bound = any(s.get("teacher_entropy_is_lower_bound") for s in step_rows) or any(
        r.get("teacher_entropy_is_lower_bound") for r in data.token_rows
    )
    if lower_bound:
        section.notes.append(
            "Lower bound: these teacher entropies come from bucketed targets (the top-k ids plus one "
            "tail bucket), so each is the entropy of K + 1 buckets, a lower bound on the teacher's "
            "full-vocabulary entropy. high_entropy_fraction and the entropy_aware gate threshold "
            "this bucketed estimate."
        )
    section.notes.append(
        "Teacher entropy is recorded per selected position because high-entropy teacher tokens are where reverse KL is reported to destabilize "
        "(docs/design.md §3.7)."
        + (
            f" high_entropy_fraction counts positions above loss.entropy_threshold = {threshold:g} nats."
            if threshold is not None
            else ""
        )
    )
    section.figures.append(
        Figure(
            plots.entropy_figure(step_rows, by_span, threshold),
            "Teacher entropy per optimizer step and per selected token.",
        )
    )
    if by_span:
        rows = []
        for span in [s for s in SPAN_ORDER if s in by_span] + sorted(
            s for s in by_span if s not in SPAN_ORDER
        ):
            values = by_span[span]
            divs = div_by_span.get(span, [])
            rows.append(
                [
                    span,
                    str(len(values)),
                    fmt_num(statistics.fmean(values)),
                    fmt_num(statistics.median(values)),
                    fmt_num(statistics.fmean(divs)) if divs else NOT_RECORDED,
                ]
            )
        section.tables.append(
            Table(
                [
                    "span type",
                    "positions",
                    "mean entropy (lower bound)" if lower_bound else "mean entropy",
                    "median entropy",
                    "mean divergence",
                ],
                rows,
                caption=f"Last cycle, from {data.paths.token_analysis.name}.",
            )
        )
    if step_rows:
        section.tables.append(
            Table(
                [
                    "step",
                    "phase",
                    "cycle",
                    "teacher entropy mean (lower bound)" if lower_bound else "teacher entropy mean",
                    "high entropy fraction",
                ],
                [
                    [
                        fmt_num(s.get("global_optimizer_step")),
                        str(s.get("phase")),
                        fmt_num(s.get("cycle")),
                        fmt_num(s.get("teacher_entropy_mean")),
                        fmt_num(s.get("high_entropy_fraction")),
                    ]
                    for s in step_rows[:MAX_STEP_ROWS]
                ],
                collapsed=len(step_rows) > 20,
            )
        )
    return section
