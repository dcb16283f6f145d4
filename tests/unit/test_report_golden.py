"""Golden output of ``miniverl report`` for fixed synthetic run directories.

The fixtures in ``tests/data/report_golden/`` are the expected ``summary.md`` byte for byte
and the expected ``report.html`` once its SVG id prefixes are renumbered (below).
Regenerate deliberately with ``MINIVERL_REGEN_GOLDEN=1`` when an intended report change
lands, and review the diff.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from pathlib import Path

import pytest
from test_report import build_run, fake_benchmark

from miniverl.lab.report.report import write_report

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "report_golden"


def _renumber_figures(html: str) -> str:
    """Number the SVG id prefixes ``f<N>-`` from 0 in order of appearance.

    ``plots.inline_svg`` takes ``N`` from a process-wide counter (ids stay unique when one
    process renders several reports), so the absolute numbers depend on what the process
    drew before; the report's content does not. This is the only normalization applied.
    """
    order: dict[str, str] = {}

    def renumber(match: re.Match[str]) -> str:
        return order.setdefault(match.group(1), f"f{len(order)}-")

    return re.sub(r"\bf(\d+)-", renumber, html)


def _build(case: str, root: Path) -> Path:
    run = root / f"golden-{case}"
    if case == "benchmark":
        fake_benchmark(run, [1, 2, 3])
    else:
        build_run(run, mode=case)
        if case == "opd":
            fake_benchmark(run, [1, 2])
    return run


@pytest.mark.parametrize("case", ["opd", "sft", "offline_kd", "benchmark"])
def test_report_output_is_byte_identical_to_the_golden_files(tmp_path: Path, case: str) -> None:
    run = _build(case, tmp_path)
    html_path, md_path = write_report(run)
    expected = GOLDEN / case
    if os.environ.get("MINIVERL_REGEN_GOLDEN") == "1":
        expected.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(md_path, expected / "summary.md")
        shutil.copyfile(html_path, expected / "report.html")
    assert md_path.read_bytes() == (expected / "summary.md").read_bytes()
    for got, name in ((md_path, "summary.md"), (html_path, "report.html")):
        want = _renumber_figures((expected / name).read_text(encoding="utf-8"))
        now = _renumber_figures(got.read_text(encoding="utf-8"))
        diff = difflib.unified_diff(
            want.splitlines(), now.splitlines(), "golden", "now", lineterm=""
        )
        assert now == want, "\n".join(list(diff)[:60])
