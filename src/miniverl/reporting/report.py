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

The pieces live one import away: :mod:`~miniverl.reporting.load` (the run-directory
reader), :mod:`~miniverl.reporting.tables` (formatting and the section model),
:mod:`~miniverl.reporting.sections` (one builder per section) and
:mod:`~miniverl.reporting.render` (HTML, Markdown, :func:`write_report`). This module
keeps the public names in one place.
"""

from __future__ import annotations

from miniverl.reporting.load import RunData, load_run, read_jsonl
from miniverl.reporting.render import render_html, render_markdown, write_report
from miniverl.reporting.sections import build_sections
from miniverl.reporting.sections.curves import split_loss_series
from miniverl.reporting.tables import (
    CURVE_SERIES,
    PAGE_ROWS,
    SECTION_TITLES,
    Section,
    Table,
    fmt_num,
    fmt_pct,
)

__all__ = [
    "CURVE_SERIES",
    "PAGE_ROWS",
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
    "split_loss_series",
    "write_report",
]
