"""The report of a real ``miniverl demo --fast`` run: self-contained, complete, and exact.

Uses the session-wide ``demo_fast_run`` fixture (tests/integration/conftest.py), so the
whole suite trains the demo once; ``miniverl report`` is then run again on a copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import REPORT_FORBIDDEN, REPORT_RUN_SECTIONS
from miniverl.cli.main import app
from miniverl.lab.report.tables import SECTION_TITLES
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.slow

HEADINGS = [SECTION_TITLES[k] for k in REPORT_RUN_SECTIONS]


@pytest.fixture(scope="module")
def report(demo_fast_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    copy = tmp_path_factory.mktemp("report-demo") / demo_fast_run.name
    shutil.copytree(
        demo_fast_run,
        copy,
        ignore=shutil.ignore_patterns("report.html", "summary.md", "checkpoints", "teacher-cache"),
    )
    result = CliRunner().invoke(app, ["report", str(copy)])
    assert result.exit_code == 0, result.output
    paths = RunPaths(copy)
    return (
        copy,
        paths.report_html.read_text(encoding="utf-8"),
        paths.summary_md.read_text(encoding="utf-8"),
    )


def _records(run: Path, kind: str) -> list[dict]:
    lines = RunPaths(run).metrics.read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_self_contained(report: tuple[Path, str, str]) -> None:
    _, html, _ = report
    lowered = html.lower()
    for needle in REPORT_FORBIDDEN:
        assert needle not in lowered, needle
    assert "<svg" in html and "<style>" in html


def test_the_train_command_wrote_the_same_kind_of_report(demo_fast_run: Path) -> None:
    html = RunPaths(demo_fast_run).report_html.read_text(encoding="utf-8")
    assert "http" not in html.lower() and f"<h2>{SECTION_TITLES['curves']}</h2>" in html


def test_every_section_heading(report: tuple[Path, str, str]) -> None:
    _, html, md = report
    for title in HEADINGS:
        assert f"<h2>{title}</h2>" in html, title
        assert f"## {title}" in md, title


def test_numbers_equal_the_artifacts(report: tuple[Path, str, str]) -> None:
    run, html, md = report
    summary = json.loads(RunPaths(run).eval_json.read_text())
    final = summary["final"]
    steps = _records(run, "step")
    cycles = _records(run, "cycle")
    for text in (html, md):
        assert f"{100 * final['success_rate']:.1f}%" in text
        assert f"{final['solved']}/{final['tasks']}" in text
        assert f"{steps[-1]['loss']:.4f}" in text and f"{steps[0]['grad_norm']:.4f}" in text
        assert f"{cycles[-1]['selection']['teacher_queried_position_ratio']:.4f}" in text
        assert summary["config_digest"] in text
    assert f"| optimizer steps | {summary['global_optimizer_step']} |" in md
    assert summary["global_optimizer_step"] == len([s for s in steps if s["committed"]])
    assert f"{len(steps)} optimizer steps recorded" in md
    assert "not_run_no_cuda" not in html and "compute saved" not in html.lower()
    assert "not measured (no GPU)" in html and "not measured (no GPU)" in md
    rows = [json.loads(x) for x in RunPaths(run).token_analysis.read_text().splitlines()]
    assert f"{rows[0]['divergence']:.3f}" in html or any(
        f"{r['divergence']:.3f}" in html for r in rows
    )
