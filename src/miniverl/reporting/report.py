"""``report.html`` and ``summary.md`` for a run or benchmark directory (docs/design.md §5).

Torch-free by construction: the report reads only the JSON/JSONL/YAML artifacts a run
leaves behind, so ``miniverl report`` works from a bare install on a laptop that never
trained anything. Every section is built once as plain tables and notes, then rendered
twice — as HTML through a Jinja2 template with autoescaping, and as Markdown — so the two
files cannot disagree about a number.

The HTML is a single self-contained file: inline CSS, figures inlined as sanitized SVG
(see :mod:`miniverl.reporting.plots`), no script, no font, no external URL. Optional
artifacts may be missing (an ``sft`` run has no teacher cache and no divergence, an
interrupted run has no ``eval.json``, a benchmark directory has no manifest); each
section then says what is absent instead of showing zeros.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from miniverl import __version__
from miniverl.errors import RunDirectoryError
from miniverl.reporting import plots
from miniverl.schemas.trajectory import (
    CONTEXT_SPAN_TYPES,
    MODEL_GENERATED_SPAN_TYPES,
    SpanType,
    Trajectory,
)
from miniverl.trajectory.io import iter_trajectories
from miniverl.utils.io import atomic_write_text, read_json
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import iter_jsonl, load_yaml_file

NOT_RECORDED = "—"
STAGE_ORDER = ("baseline", "after_warmup", "final")
SPAN_ORDER = [t.value for t in SpanType]
MODEL_SPAN_VALUES = frozenset(t.value for t in MODEL_GENERATED_SPAN_TYPES)
CONTEXT_SPAN_VALUES = frozenset(t.value for t in CONTEXT_SPAN_TYPES)
MAX_STEP_ROWS = 500
PAGE_ROWS = 50
"""HTML tables longer than this are split into collapsed pages of this many rows."""
COLLAPSE_ROWS = 20
"""HTML tables longer than this start collapsed."""
MD_MAX_ROWS = 12
MD_LONG_TABLE = 30
"""summary.md shows the first MD_MAX_ROWS rows of tables longer than MD_LONG_TABLE (< 20 KB)."""
CURVE_TABLE_ROWS = 12
MAX_CONTEXT_CHARS = 1200
CURVE_SERIES = (
    ("sft_loss", "SFT loss (cross-entropy)"),
    ("kd_divergence", "distillation divergence"),
    ("sampled_token_nll", "sampled-token NLL"),
    ("grad_norm", "grad norm"),
    ("lr", "learning rate"),
)
SECTION_TITLES = {
    "identity": "Run identity",
    "objective": "Objective",
    "curves": "Learning curves",
    "success": "Held-out success",
    "failures": "Failure taxonomy",
    "provenance": "Token provenance",
    "tokens": "Per-token view",
    "entropy": "Teacher entropy",
    "selection": "Selection",
    "memory": "Memory and throughput",
    "benchmark_setup": "Benchmark setup",
    "benchmark": "Benchmark comparison",
    "events": "Lifecycle events",
}


# ---------------------------------------------------------------------- formatting


def fmt_num(value: Any, digits: int = 4) -> str:
    """Fixed-precision text for a number; ``—`` for a value that was not recorded."""
    if value is None or value == "":
        return NOT_RECORDED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}f}"
    return str(value)


def fmt_pct(rate: Any) -> str:
    """A rate in [0, 1] as a percentage with one decimal."""
    if not isinstance(rate, int | float) or isinstance(rate, bool):
        return NOT_RECORDED
    return f"{100.0 * rate:.1f}%"


def fmt_lr(value: Any) -> str:
    """Learning rates span orders of magnitude, so they get scientific notation."""
    return (
        f"{value:.3e}"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else NOT_RECORDED
    )


_NUMERIC_CELL = re.compile(r"^[+-]?(\d[\d,]*(\.\d+)?(e[+-]?\d+)?|nan|inf)(%| pp)?( ± [\d.]+%?)?$")


def looks_numeric(cell: str) -> bool:
    """Right-align cells that are a number (with an optional unit and spread)."""
    return bool(_NUMERIC_CELL.match(cell))


def fmt_counts(counts: Mapping[str, Any] | None) -> str:
    """A small counter as one cell (``a 3, b 1``), keeping the recorded order."""
    if not counts:
        return NOT_RECORDED
    return ", ".join(f"{k} {v}" for k, v in counts.items())


# ---------------------------------------------------------------------- section model


@dataclass
class Table:
    """A table shared by the HTML and Markdown renderings (cells are already text)."""

    headers: list[str]
    rows: list[list[str]]
    caption: str = ""
    collapsed: bool = False


@dataclass
class Figure:
    """An already sanitized inline SVG (see :func:`plots.inline_svg`) and its caption."""

    svg: str
    caption: str


@dataclass
class TokenPiece:
    """One element of the per-token view: a context span, or one policy-emitted token."""

    kind: str
    span_type: str
    text: str
    title: str
    divergence: str | None = None
    intensity: float = 0.0


@dataclass
class TokenView:
    """One trajectory rendered span by span, for the per-token section of the HTML."""

    trajectory_id: str
    description: str
    pieces: list[TokenPiece]
    legend: list[tuple[str, str, bool]]


@dataclass
class Section:
    """One report section: the unit both renderings iterate over."""

    key: str
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    preformatted: list[tuple[str, str]] = field(default_factory=list)
    token_view: TokenView | None = None

    @property
    def title(self) -> str:
        return SECTION_TITLES[self.key]


# ---------------------------------------------------------------------- loading


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL artifact; a missing file is empty.

    A final line without its newline is an interrupted append (see
    ``utils.io.append_jsonl``) and is ignored; a malformed complete line is corruption
    and raises, because a report must not quietly drop data. Limits: ``utils.safe_load``.
    """
    if not path.exists() and not path.is_symlink():
        return []
    return [record for _, record in iter_jsonl(path, allow_partial_tail=True)]


def _read_json_or_none(path: Path) -> Any:
    if not path.exists() and not path.is_symlink():
        return None
    return read_json(path)


@dataclass
class RunData:
    """Everything the report reads from one directory; absent artifacts are empty/None."""

    paths: RunPaths
    manifest: dict[str, Any] | None
    eval_summary: dict[str, Any] | None
    eval_tags: dict[str, dict[str, Any]]
    steps: list[dict[str, Any]]
    cycles: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    events: list[dict[str, Any]]
    token_rows: list[dict[str, Any]]
    benchmark: dict[str, Any] | None
    config_text: str | None
    config: dict[str, Any] | None

    @property
    def is_training_run(self) -> bool:
        return self.manifest is not None or bool(self.steps) or self.eval_summary is not None

    @property
    def run_id(self) -> str:
        if self.manifest and self.manifest.get("run_id"):
            return str(self.manifest["run_id"])
        return self.paths.root.resolve().name

    def config_value(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def _eval_tag_files(paths: RunPaths) -> dict[str, dict[str, Any]]:
    """``eval.<tag>.json`` files written by ``miniverl eval --run``."""
    head, _, tail = paths.eval_tag_json("TAG").name.partition("TAG")
    found: dict[str, dict[str, Any]] = {}
    if not paths.root.is_dir():
        return found
    for candidate in sorted(paths.root.glob(f"{head}*{tail}")):
        tag = candidate.name[len(head) : len(candidate.name) - len(tail)]
        if not tag:
            continue
        try:
            expected = paths.eval_tag_json(tag)
        except ValueError:
            continue
        payload = _read_json_or_none(expected)
        if isinstance(payload, dict):
            found[tag] = payload
    return found


def load_run(run_dir: str | Path) -> RunData:
    """Read every artifact the report uses from ``run_dir``."""
    paths = RunPaths(run_dir)
    if not paths.root.is_dir():
        raise RunDirectoryError(
            f"{paths.root} is not a directory",
            hint="pass a run directory written by 'miniverl train' or 'miniverl benchmark'",
        )
    metrics = read_jsonl(paths.metrics)
    config_text = config = None
    if paths.config_resolved.exists() or paths.config_resolved.is_symlink():
        config = load_yaml_file(paths.config_resolved)
        config_text = paths.config_resolved.read_text(encoding="utf-8")
    if config is not None and not isinstance(config, dict):
        raise RunDirectoryError(f"{paths.config_resolved} is not a mapping of config sections")
    data = RunData(
        paths=paths,
        manifest=_read_json_or_none(paths.manifest),
        eval_summary=_read_json_or_none(paths.eval_json),
        eval_tags=_eval_tag_files(paths),
        steps=[r for r in metrics if r.get("kind") == "step"],
        cycles=[r for r in metrics if r.get("kind") == "cycle"],
        evals=[r for r in metrics if r.get("kind") == "eval"],
        events=read_jsonl(paths.events),
        token_rows=read_jsonl(paths.token_analysis),
        benchmark=_read_json_or_none(paths.benchmark_json),
        config_text=config_text,
        config=config if isinstance(config, dict) else None,
    )
    if not data.is_training_run and data.benchmark is None:
        raise RunDirectoryError(
            f"{paths.root} holds neither a run ({paths.manifest.name}, {paths.metrics.name}) nor a {paths.benchmark_json.name}",
            hint="point 'miniverl report' at a directory written by 'miniverl train', 'miniverl demo' or 'miniverl benchmark'",
        )
    return data


def _evaluations(data: RunData) -> dict[str, dict[str, Any]]:
    """Every held-out evaluation in stage order, each tagged with the file it came from.

    ``eval.json`` wins over the metrics records of the same tag; an ``eval.<tag>.json``
    re-evaluation whose tag collides with a training stage is listed under its file name.
    """
    found: dict[str, dict[str, Any]] = {}
    for record in data.evals:
        if record.get("tag"):
            found[str(record["tag"])] = {**record, "source": data.paths.metrics.name}
    if data.eval_summary:
        for tag, record in (data.eval_summary.get("evaluations") or {}).items():
            if isinstance(record, dict):
                found[tag] = {**record, "source": data.paths.eval_json.name}
    for tag, record in data.eval_tags.items():
        name = data.paths.eval_tag_json(tag).name
        found[tag if tag not in found else name] = {**record, "source": name}
    ordered = {tag: found[tag] for tag in STAGE_ORDER if tag in found}
    ordered.update({tag: rec for tag, rec in found.items() if tag not in ordered})
    return ordered


def _optimizer_steps(data: RunData) -> int | None:
    if data.eval_summary and isinstance(data.eval_summary.get("global_optimizer_step"), int):
        return int(data.eval_summary["global_optimizer_step"])
    committed = [s.get("global_optimizer_step") for s in data.steps if s.get("committed", True)]
    numbers = [c for c in committed if isinstance(c, int)]
    if numbers:
        return max(numbers)
    if data.manifest and isinstance(data.manifest.get("global_optimizer_step"), int):
        return int(data.manifest["global_optimizer_step"])
    return None


# ---------------------------------------------------------------------- sections


def _identity(data: RunData) -> Section:
    m = data.manifest or {}
    section = Section("identity")
    if not data.manifest:
        section.notes.append(
            f"{data.paths.manifest.name} not found: identity fields are limited to what the other artifacts record."
        )
    run_end = [e for e in data.events if e.get("event") == "run_end"]
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
        ["optimizer steps", fmt_num(_optimizer_steps(data))],
        [
            "parameter version",
            fmt_num(summary.get("parameter_version", m.get("parameter_version"))),
        ],
        ["wall clock (s)", fmt_num(summary.get("seconds"), 2)],
        ["python", str((m.get("python") or {}).get("version") or NOT_RECORDED)],
        ["os", " ".join(str(v) for v in (m.get("os") or {}).values()) or NOT_RECORDED],
    ]
    section.tables.append(Table(["field", "value"], rows))
    toy = m.get("toy_teacher") or summary.get("toy_teacher")
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
                        else ("yes" if toy["reused"] else "no (fitted by this run)"),
                    ],
                    ["cache digest", str(toy.get("cache_digest") or NOT_RECORDED)],
                    ["weights sha256", str(toy.get("weights_sha256") or NOT_RECORDED)],
                ],
                caption="The toy teacher is fitted on oracle traces at run start, or reused from the cache when every input matches (toy backend only).",
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


def _objective(data: RunData) -> Section:
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


def split_loss_series(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Step records with ``sft_loss`` (warm-up cross-entropy) and ``kd_divergence`` apart.

    The two live on different scales, so each gets its own panel of the curves figure.
    """
    return [
        {
            **s,
            "sft_loss": s.get("loss") if s.get("phase") == "sft" else None,
            "kd_divergence": s.get("divergence_loss") if s.get("phase") != "sft" else None,
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


def _curves(data: RunData, evaluations: Mapping[str, Mapping[str, Any]] | None = None) -> Section:
    section = Section("curves")
    evaluations = evaluations if evaluations is not None else _evaluations(data)
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


def _success(data: RunData, evaluations: Mapping[str, Mapping[str, Any]]) -> Section:
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
    bars = [
        (tag, float(r["success_rate"]))
        for tag, r in evaluations.items()
        if isinstance(r.get("success_rate"), int | float)
    ]
    if bars:
        section.figures.append(
            Figure(plots.success_bars(bars), "Held-out success per evaluation stage.")
        )
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


def _failures(data: RunData, evaluations: Mapping[str, Mapping[str, Any]]) -> Section:
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
            [c, *[_count_share(per_source[s].get(c, 0), totals[s]) for s in per_source]]
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


def _count_share(count: int, total: int) -> str:
    return f"{count} ({100.0 * count / total:.1f}%)" if total else str(count)


def _training_trajectories(data: RunData) -> Iterable[Trajectory]:
    """Validated training rollouts (streamed: a long run's file is not held in memory)."""
    if data.paths.trajectories.is_file():
        tokenizer = (data.manifest or {}).get("tokenizer")
        vocab = tokenizer.get("vocab_size") if isinstance(tokenizer, dict) else None
        yield from iter_trajectories(
            data.paths.trajectories, vocab_size=vocab if isinstance(vocab, int) else None
        )


def _provenance(data: RunData) -> Section:
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


def _tokens(data: RunData) -> Section:
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


def _entropy(data: RunData) -> Section:
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


def _selection(data: RunData) -> Section:
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


def _memory(data: RunData) -> Section:
    section = Section("memory")
    m = data.manifest or {}
    statuses = Counter(str((s.get("gpu") or {}).get("status", NOT_RECORDED)) for s in data.steps)
    measured = [s["gpu"] for s in data.steps if (s.get("gpu") or {}).get("status") == "measured"]
    gpu = m.get("gpu") or {}
    devices = ", ".join(
        f"{d.get('name')} ({d.get('total_memory_gib')} GiB)" for d in gpu.get("devices") or []
    ) or str(gpu.get("status", NOT_RECORDED))
    rows = [
        ["GPU", devices],
        [
            "GPU memory measurement",
            str((m.get("measurement_status") or {}).get("gpu_memory") or fmt_counts(statuses)),
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
            str(sum(1 for e in data.events if e.get("event") == "oom_chunk_retry")),
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
        rows.append(
            ["peak allocated / reserved", f"{status} (nothing was measured; this is not a zero)"]
        )
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


def _benchmark_sections(bench: Mapping[str, Any]) -> list[Section]:
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


def _events(data: RunData) -> Section:
    section = Section("events")
    if not data.events:
        section.notes.append(f"{data.paths.events.name} not found.")
        return section
    counts = Counter(str(e.get("event")) for e in data.events)
    section.tables.append(
        Table(
            ["event", "count"],
            [[name, str(n)] for name, n in counts.items()],
            caption=f"From {data.paths.events.name}, in order of first occurrence.",
        )
    )
    skipped = [e for e in data.events if e.get("event") == "cycle_skipped_no_selected_positions"]
    if skipped:
        section.notes.append(
            f"{len(skipped)} cycle(s) were skipped because the selector found nothing to supervise: "
            + ", ".join(str(e.get("cycle")) for e in skipped)
            + "."
        )
    return section


def build_sections(data: RunData) -> list[Section]:
    """Every section the directory supports, in reading order."""
    sections: list[Section] = []
    if data.is_training_run:
        evaluations = _evaluations(data)
        sections += [
            _identity(data),
            _objective(data),
            _curves(data, evaluations),
            _success(data, evaluations),
            _failures(data, evaluations),
            _provenance(data),
            _tokens(data),
            _entropy(data),
            _selection(data),
            _memory(data),
        ]
    if data.benchmark is not None:
        sections += _benchmark_sections(data.benchmark)
    if data.is_training_run:
        sections.append(_events(data))
    return sections


# ---------------------------------------------------------------------- rendering


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("miniverl.reporting", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_html(data: RunData, sections: Sequence[Section]) -> str:
    """The self-contained HTML report; SVG is the only markup not escaped (see plots)."""
    template = _environment().get_template("report.html.j2")
    return template.render(
        title=f"miniverl report: {data.run_id}",
        run_id=data.run_id,
        kind="benchmark" if data.benchmark is not None and not data.is_training_run else "run",
        version=__version__,
        sections=sections,
        svg=Markup,
        numeric=looks_numeric,
        page_rows=PAGE_ROWS,
        collapse_rows=COLLAPSE_ROWS,
        span_colors=plots.SPAN_COLORS,
    )


def _md_cell(text: str) -> str:
    return (
        text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ") or " "
    )


def render_markdown(data: RunData, sections: Sequence[Section]) -> str:
    """The same tables and notes as the HTML, as GitHub-flavoured Markdown."""
    out = [
        f"# miniverl report: {data.run_id}",
        "",
        f"Generated by miniverl {__version__} from the artifacts in this directory. Figures are in report.html.",
        "",
    ]
    for section in sections:
        out += [f"## {section.title}", ""]
        for note in section.notes:
            out += [note, ""]
        if section.token_view is not None:
            out += [f"Trajectory: {section.token_view.description}.", ""]
        for table in section.tables:
            if table.caption:
                out += [f"*{table.caption}*", ""]
            out.append("| " + " | ".join(_md_cell(h) for h in table.headers) + " |")
            out.append("|" + "|".join("---" for _ in table.headers) + "|")
            shown = table.rows if len(table.rows) <= MD_LONG_TABLE else table.rows[:MD_MAX_ROWS]
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in shown]
            out.append("")
            if len(table.rows) > len(shown):
                out += [
                    f"*{len(table.rows) - len(shown)} more rows of this table are in report.html.*",
                    "",
                ]
        for name, _ in section.preformatted:
            out += [f"The full text of `{name}` is in report.html and in the run directory.", ""]
    return "\n".join(out).rstrip() + "\n"


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.html`` and ``summary.md`` into ``run_dir`` (atomically); return their paths."""
    data = load_run(run_dir)
    sections = build_sections(data)
    html = render_html(data, sections)
    markdown = render_markdown(data, sections)
    atomic_write_text(data.paths.report_html, html)
    atomic_write_text(data.paths.summary_md, markdown)
    return data.paths.report_html, data.paths.summary_md


__all__ = [
    "SECTION_TITLES",
    "RunData",
    "Section",
    "Table",
    "build_sections",
    "fmt_num",
    "fmt_pct",
    "load_run",
    "read_jsonl",
    "render_html",
    "render_markdown",
    "write_report",
]
