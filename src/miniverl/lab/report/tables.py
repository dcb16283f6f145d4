"""Formatting helpers and the section model (tables, figures, token views) shared by every
report section and both renderings (HTML and Markdown).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from miniverl.schemas.trajectory import (
    CONTEXT_SPAN_TYPES,
    MODEL_GENERATED_SPAN_TYPES,
    SpanType,
)

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
    "headline": "Headline",
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
    banner: str | None = None
    """A warning shown above everything else in the section (the smoke-test notice)."""

    @property
    def title(self) -> str:
        return SECTION_TITLES[self.key]


def count_share(count: int, total: int) -> str:
    return f"{count} ({100.0 * count / total:.1f}%)" if total else str(count)
