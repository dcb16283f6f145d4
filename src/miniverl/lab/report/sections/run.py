"""Run identity, objective and lifecycle-event sections."""

from __future__ import annotations

from collections import Counter

from miniverl.inspection.run_dir import RunData
from miniverl.lab.report.sections.common import optimizer_steps
from miniverl.lab.report.tables import (
    NOT_RECORDED,
    Section,
    Table,
    fmt_num,
    fmt_pct,
)


def identity_section(data: RunData) -> Section:
    m = data.manifest or {}
    section = Section("identity")
    if not data.manifest:
        section.notes.append(
            f"{data.paths.manifest.name} not found: identity fields are limited to what the other artifacts record."
        )
    run_end = [e for e in data.events if e.event == "run_end"]
    status = (
        run_end[-1].get("status")
        if run_end
        else ("unknown (no run_end event)" if data.events else NOT_RECORDED)
    )
    env = m.get("environment") or {}
    splits = env.get("split_sizes") or {}
    models = m.get("models") or {}
    tok = m.get("tokenizer") or {}
    summary = data.eval_summary or {}

    def model_cell(role: str) -> str:
        spec = models.get(role)
        if not spec:
            return "not loaded" if role == "teacher" else NOT_RECORDED
        parts = [str(spec.get("model_id"))]
        if spec.get("revision"):
            parts.append(f"@{spec['revision']}")
        parts.append(
            f"({spec.get('precision') or 'auto'}, quantization {spec.get('quantization') or 'none'})"
        )
        return " ".join(parts)

    digest = m.get("config_digest") or summary.get("config_digest")
    rows = [
        ["run id", data.run_id],
        ["status", str(status)],
        ["created", str(m.get("created_at") or NOT_RECORDED)],
        ["miniverl version", str(m.get("miniverl_version") or NOT_RECORDED)],
        ["git commit", str(m.get("git_commit") or NOT_RECORDED)],
        ["mode", str(m.get("mode") or summary.get("mode") or NOT_RECORDED)],
        [
            "objective",
            str(
                (m.get("objective") or {}).get("label") or summary.get("objective") or NOT_RECORDED
            ),
        ],
        ["seed", fmt_num(m.get("seed"))],
        ["deterministic", fmt_num(m.get("deterministic"))],
        ["config digest (sha256)", str(digest or NOT_RECORDED)],
        ["environment", f"{env.get('name', NOT_RECORDED)} ({env.get('difficulty', NOT_RECORDED)})"],
        ["split sizes", ", ".join(f"{k} {v}" for k, v in splits.items()) or NOT_RECORDED],
        ["student", model_cell("student")],
        ["teacher", model_cell("teacher")],
        [
            "tokenizer",
            f"fingerprint {str(tok.get('fingerprint', NOT_RECORDED))[:16]}…, vocab {tok.get('vocab_size', NOT_RECORDED)}"
            if tok
            else NOT_RECORDED,
        ],
        ["optimizer steps", fmt_num(optimizer_steps(data))],
        [
            "parameter version",
            fmt_num(summary.get("parameter_version", m.get("parameter_version"))),
        ],
        ["wall clock (s)", fmt_num(summary.get("seconds"), 2)],
        ["python", str((m.get("python") or {}).get("version") or NOT_RECORDED)],
        ["os", " ".join(str(v) for v in (m.get("os") or {}).values()) or NOT_RECORDED],
    ]
    section.tables.append(Table(["field", "value"], rows))
    toy = m.get("teacher") or summary.get("teacher")
    if toy:
        section.tables.append(
            Table(
                ["toy teacher fit", "value"],
                [
                    ["fit steps", fmt_num(toy.get("steps"))],
                    [
                        "fit tasks (of which extra, outside every split)",
                        f"{fmt_num(toy.get('fit_tasks'))} ({fmt_num(toy.get('extra_tasks'))})",
                    ],
                    ["final loss", fmt_num(toy.get("final_loss"))],
                    ["greedy success (train)", fmt_pct(toy.get("train_success"))],
                    ["greedy success (held-out)", fmt_pct(toy.get("heldout_success"))],
                    ["seconds (of the original fit)", fmt_num(toy.get("seconds"), 2)],
                    [
                        "reused from the teacher cache",
                        NOT_RECORDED
                        if toy.get("reused") is None
                        else ("yes" if toy["reused"] else "no (fitted for this run)"),
                    ],
                    ["cache digest", str(toy.get("cache_digest") or NOT_RECORDED)],
                    ["weights sha256", str(toy.get("weights_sha256") or NOT_RECORDED)],
                ],
                caption="The lab fits the toy teacher on oracle traces before the run starts, or reuses it from the cache when every input matches (toy backend only).",
            )
        )
    if data.config_text:
        section.preformatted.append((data.paths.config_resolved.name, data.config_text))
    return section


_OBJECTIVE_ORDER = (
    "label",
    "mode",
    "divergence",
    "loss_mode",
    "supervision_shape",
    "top_k",
    "temperature",
    "jsd_beta",
    "sampled_token_nll_weight",
    "entropy_threshold",
    "entropy_forward_weight",
    "selector",
    "selection_ratio",
    "teacher_mode",
    "opd_freshness",
    "replay_passes",
    "group_size",
    "trajectory_batch_size",
    "sft_warmup_cycles",
)


def objective_section(data: RunData) -> Section:
    section = Section("objective")
    m = data.manifest or {}
    objective = m.get("objective")
    if not objective:
        section.notes.append(f"No objective block ({data.paths.manifest.name} not found).")
        return section
    keys = [k for k in _OBJECTIVE_ORDER if k in objective] + sorted(
        k for k in objective if k not in _OBJECTIVE_ORDER
    )
    section.tables.append(Table(["objective", "value"], [[k, fmt_num(objective[k])] for k in keys]))
    plan = m.get("memory_plan") or {}
    rows = [
        ["strategy", str(plan.get("strategy", NOT_RECORDED))],
        ["requested", str(plan.get("requested", NOT_RECORDED))],
        ["teacher resident", fmt_num(plan.get("teacher_resident"))],
        ["reason", str(plan.get("reason", NOT_RECORDED))],
        ["projection chunk size", fmt_num(m.get("projection_chunk_size"))],
    ]
    section.tables.append(
        Table(
            ["memory plan", "value"],
            rows,
            caption="memory.strategy as resolved at run start, with the reason written to config.resolved.yaml.",
        )
    )
    return section


def events_section(data: RunData) -> Section:
    section = Section("events")
    if not data.events:
        section.notes.append(f"{data.paths.events.name} not found.")
        return section
    counts = Counter(e.event for e in data.events)
    section.tables.append(
        Table(
            ["event", "count"],
            [[name, str(n)] for name, n in counts.items()],
            caption=f"From {data.paths.events.name}, in order of first occurrence.",
        )
    )
    skipped = [e for e in data.events if e.event == "cycle_skipped_no_selected_positions"]
    if skipped:
        section.notes.append(
            f"{len(skipped)} cycle(s) were skipped because the selector found nothing to supervise: "
            + ", ".join(str(e.get("cycle")) for e in skipped)
            + "."
        )
    return section
