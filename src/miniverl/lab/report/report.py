"""``report.html`` and ``summary.md`` for a run or benchmark directory (docs/design.md §5).

Torch-free by construction: the report reads only the JSON/JSONL/YAML artifacts a run
leaves behind, so ``miniverl report`` works from a bare install on a laptop that never
trained anything. Every section is built once as plain tables and notes, then rendered
twice — as HTML through a Jinja2 template with autoescaping, and as Markdown — so the two
files cannot disagree about a number.

The HTML is a single self-contained file: inline CSS, figures inlined as sanitized SVG
(see :mod:`miniverl.lab.report.plots`), no script, no font, no external URL. Optional
artifacts may be missing (an ``sft`` run has no teacher cache and no divergence, an
interrupted run has no ``eval.json``, a benchmark directory has no manifest); each
section then says what is absent instead of showing zeros.

This module writes the two files; the pieces live one import away:
:mod:`~miniverl.inspection.run_dir` (the run-directory reader), :mod:`~miniverl.lab.report.tables`
(formatting and the section model), :mod:`~miniverl.lab.report.sections` (one builder per
section) and :mod:`~miniverl.lab.report.render` (HTML and Markdown).
"""

from __future__ import annotations

from pathlib import Path

from miniverl.inspection.run_dir import load_run
from miniverl.lab.report.render import render_html, render_markdown
from miniverl.lab.report.sections import build_sections
from miniverl.utils.io import atomic_write_text


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.html`` and ``summary.md`` into ``run_dir`` (atomically); return their paths.

    The sections are built once and rendered twice, so the HTML and the Markdown show the
    same numbers.
    """
    data = load_run(run_dir)
    sections = build_sections(data)
    html = render_html(data, sections)
    markdown = render_markdown(data, sections)
    atomic_write_text(data.paths.report_html, html)
    atomic_write_text(data.paths.summary_md, markdown)
    return data.paths.report_html, data.paths.summary_md


__all__ = ["write_report"]
