"""The report: the curves a researcher reads first, normalised failure shares,
paginated long tables and a summary.md under 20 KB (on demo --fast and on a long run)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from miniverl.inspection.run_dir import load_run
from miniverl.lab.report import plots
from miniverl.lab.report.render import render_html, render_markdown
from miniverl.lab.report.report import write_report
from miniverl.lab.report.sections.curves import split_loss_series
from miniverl.lab.report.tables import CURVE_SERIES, PAGE_ROWS, Section, Table
from miniverl.utils.runs import RunPaths

SUMMARY_LIMIT = 20_000


def _copy(run: Path, target: Path) -> Path:
    shutil.copytree(run, target, ignore=shutil.ignore_patterns("checkpoints", "teacher-cache"))
    return target


def test_sft_loss_and_divergence_are_separate_series() -> None:
    steps = [
        {"phase": "sft", "loss": 9.0, "divergence_loss": 0.0, "global_optimizer_step": 1},
        {"phase": "opd", "loss": 0.4, "divergence_loss": 0.3, "global_optimizer_step": 2},
    ]
    split = split_loss_series(steps)
    assert [s["sft_loss"] for s in split] == [9.0, None]
    assert [s["kd_divergence"] for s in split] == [None, 0.3]
    keys = [k for k, _ in CURVE_SERIES]
    assert keys[:2] == ["sft_loss", "kd_divergence"] and "loss" not in keys


def test_demo_report_leads_with_success_per_cycle(demo_fast_run: Path, tmp_path: Path) -> None:
    run = _copy(demo_fast_run, tmp_path / "run")
    html_path, md_path = write_report(run)
    html, md = html_path.read_text(), md_path.read_text()
    curves = html[html.index("<h2>Learning curves</h2>") :]
    first_svg = curves[: curves.index("</svg>")]
    assert "distillation cycle" in first_svg and "held-out success" in first_svg
    cycles = [
        json.loads(line)
        for line in RunPaths(run).metrics.read_text().splitlines()
        if '"kind": "cycle"' in line
    ]
    ro = cycles[-1]["rollouts"]
    assert f"| {cycles[-1]['cycle']} | {ro['solved']}/{ro['tasks']} (" in md
    assert len(md.encode()) < SUMMARY_LIMIT


def test_termination_reasons_are_shares_of_each_source(demo_fast_run: Path) -> None:
    data = load_run(demo_fast_run)
    section = next(s for s in _sections(data) if s.key == "failures")
    table = section.tables[0]
    assert table.headers[0] == "termination reason"
    for col, header in enumerate(table.headers[1:], start=1):
        n = int(re.search(r"\(n=(\d+)\)$", header).group(1))
        counts = [int(row[col].split()[0]) for row in table.rows]
        shares = [float(row[col].split("(")[1].rstrip("%)")) for row in table.rows]
        assert sum(counts) == n and abs(sum(shares) - 100.0) < 0.5
        for c, share in zip(counts, shares, strict=True):
            assert abs(share - 100.0 * c / n) < 0.051


def _sections(data):  # type: ignore[no-untyped-def]
    from miniverl.lab.report.sections import build_sections

    return build_sections(data)


def test_long_tables_are_collapsed_and_paginated(demo_fast_run: Path) -> None:
    data = load_run(demo_fast_run)
    rows = [[str(i), f"v{i}"] for i in range(2 * PAGE_ROWS + 7)]
    section = Section("events", tables=[Table(["i", "value"], rows, caption="long")])
    html = render_html(data, [section])
    body = html[html.index("<h2>Lifecycle events</h2>") :]
    assert f"long ({len(rows)} rows, 3 pages of {PAGE_ROWS})" in body
    assert body.count('<details class="page"') == 3
    assert body.count('<details class="page" open>') == 1
    assert f"rows {2 * PAGE_ROWS + 1}&ndash;{len(rows)} of {len(rows)}" in body
    assert body.count("<tr><td") == len(rows)
    md = render_markdown(data, [section])
    assert "| 11 | v11 |" in md and "| 12 | v12 |" not in md
    assert f"*{len(rows) - 12} more rows of this table are in report.html.*" in md


def test_summary_stays_small_on_a_long_run(demo_fast_run: Path, tmp_path: Path) -> None:
    """400 cycles x 8 steps (the full demo's shape), built from the fast run's records."""
    run = _copy(demo_fast_run, tmp_path / "long")
    paths = RunPaths(run)
    records = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    cycle = next(r for r in records if r["kind"] == "cycle" and not r.get("skipped"))
    evals = [r for r in records if r["kind"] == "eval"]
    out, g = [], 0
    for c in range(400):
        for k in range(8):
            g += 1
            out.append({**steps[-1], "cycle": c, "step": k, "global_optimizer_step": g})
        out.append({**cycle, "cycle": c})
        if c % 10 == 9:
            out.append({**evals[-1], "tag": f"cycle-{c:04d}", "cycle": c})
    paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in out))
    _, md_path = write_report(run)
    size = len(md_path.read_bytes())
    assert size < SUMMARY_LIMIT, size
    md = md_path.read_text()
    assert "| 399 |" in md  # the last cycle always closes the curve table


def test_normalized_bars_differ_from_counts() -> None:
    counts = {"eval": {"a": 1, "b": 3}, "training": {"a": 100, "b": 300}}
    assert plots.counts_bars("t", counts, normalize=True) != plots.counts_bars("t", counts)
