"""Headless Chromium opens report.html from disk, offline, without a console error.

Networking is cut three ways (no proxy that works, every host name unresolvable,
background networking off), so a report that tried to fetch anything would log a
failed request; the test scans Chromium's log for console errors and failed loads and
checks that a real screenshot was written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from miniverl.lab.benchmark.stats import aggregate, significance_note
from miniverl.lab.report.report import write_report
from miniverl.utils.io import write_json
from miniverl.utils.runs import RunPaths

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs the Debian chromium package (/usr/bin/chromium)"
    ),
]

CONSOLE_PROBLEMS = re.compile(
    r"Uncaught|:CONSOLE[:(]|net::ERR_|Failed to load resource|Refused to", re.IGNORECASE
)


def _chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
            *extra,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _with_benchmark(run: Path) -> None:
    """Add a three-seed benchmark.json so the comparison section and its chart render too."""
    rows = [
        {"arm": arm, "seed": seed, "run_dir": f"seed-{seed}/{arm}", "final_success": final + 0.05 * seed, "baseline_success": 0.25,
         "generated_tokens": 100, "selected_training_tokens": 90, "teacher_query_ratio": 0.9, "wall_seconds": 1.5, "optimizer_steps": 2}
        for seed in (1, 2, 3)
        for arm, final in (("sft_only", 0.5), ("opd", 0.6))
    ]  # fmt: skip
    write_json(
        RunPaths(run).benchmark_json,
        {
            "seeds": [1, 2, 3], "arms": {"sft_only": {"overrides": ["run.mode=sft"]}, "opd": {"overrides": ["run.mode=opd"]}},
            "arm_order": ["sft_only", "opd"], "baseline_arm": "sft_only", "rows": rows,
            "aggregates": aggregate(rows, ["sft_only", "opd"], "sft_only"), "significance": {"note": significance_note(3)},
        },
    )  # fmt: skip


def test_report_renders_offline_without_console_errors(demo_fast_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "run"
    shutil.copytree(
        demo_fast_run,
        target,
        ignore=shutil.ignore_patterns("checkpoints", "teacher-cache", "report.html", "summary.md"),
    )
    _with_benchmark(target)
    html, _ = write_report(target)
    assert RunPaths(target).report_html == html

    screenshot = tmp_path / "report.png"
    shot = _chromium(
        html, tmp_path / "profile-shot", f"--screenshot={screenshot}", "--window-size=1280,2000"
    )
    dom = _chromium(html, tmp_path / "profile-dom", "--dump-dom")
    for proc in (shot, dom):
        problems = [line for line in proc.stderr.splitlines() if CONSOLE_PROBLEMS.search(line)]
        assert problems == [], problems
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<h2>Benchmark comparison</h2>" in dom.stdout and dom.stdout.count("<svg") >= 6
    # the success-per-cycle curve renders first in the learning-curves section
    curves = dom.stdout[dom.stdout.index("<h2>Learning curves</h2>") :]
    assert "distillation cycle" in curves[: curves.index("</svg>")]
    assert screenshot.is_file() and screenshot.stat().st_size > 20_000
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


VIEWPORT = (1280, 800)

_PROBE = """<script>
const box = (selector) => {
  const node = document.querySelector(selector);
  if (!node) return null;
  const r = node.getBoundingClientRect();
  return {top: r.top, bottom: r.bottom};
};
document.body.setAttribute("data-probe", JSON.stringify({
  viewport: [window.innerWidth, window.innerHeight],
  scroll: window.scrollY,
  headline: box("#headline"),
  banner: box("#smoke-test"),
  table: box("#headline table"),
  chart: box("#headline svg"),
  first_section: document.querySelector("main section").id,
  first_rows: Array.from(document.querySelectorAll("#headline table")[0]?.querySelectorAll("tbody tr") || [])
    .map((tr) => tr.querySelector("td")?.textContent.trim()),
  chart_text: document.querySelector("#headline svg")?.textContent || "",
  first_header: Array.from(document.querySelectorAll("#headline table")[0]?.querySelectorAll("thead th") || [])
    .map((th) => th.textContent.trim()),
}));
</script>
"""
"""Measures the laid-out page. The report itself carries no script, so the probe goes into
a copy of it; both are laid out at the same viewport."""


def test_the_headline_is_in_the_first_viewport(demo_fast_run: Path, tmp_path: Path) -> None:
    """At 1280x800 the first screen shows the smoke-test banner, the headline heading, the
    demo's arms side by side (the shared start, opd, offline_kd, the teacher, each with its
    recovery from the warm-up's own errors) and the chart of their held-out curves; the
    screenshot of that screen is kept in tmp_path."""
    import html as html_lib
    import json

    target = tmp_path / "run"
    shutil.copytree(
        demo_fast_run,
        target,
        ignore=shutil.ignore_patterns("checkpoints", "teacher-cache", "report.html", "summary.md"),
    )
    report, _ = write_report(target)
    size = f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}"
    screenshot = tmp_path / "first-screen.png"
    shot = _chromium(report, tmp_path / "profile-shot", f"--screenshot={screenshot}", size)
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    probe_page = tmp_path / "probe.html"
    probe_page.write_text(
        report.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"),
        encoding="utf-8",
    )
    dom = _chromium(probe_page, tmp_path / "profile-probe", "--dump-dom", size)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-probe="([^"]*)"', dom.stdout)
    assert found is not None, dom.stdout[:2000]
    probe = json.loads(html_lib.unescape(found.group(1)))
    height = probe["viewport"][1]
    assert probe["viewport"][0] == VIEWPORT[0] and 0 < height <= VIEWPORT[1], probe
    assert probe["scroll"] == 0 and probe["first_section"] == "headline", probe
    for part in ("headline", "banner", "table"):
        assert probe[part] is not None, (part, probe)
        assert 0 <= probe[part]["top"] < height, (part, probe)
    assert probe["banner"]["top"] < probe["headline"]["top"] + 60, probe  # the banner leads
    assert probe["chart"] is not None and probe["chart"]["top"] < height, probe
    assert probe["first_rows"] == [
        "SFT warm-up (shared start)",
        "opd (the student's own episodes)",
        "offline_kd (the teacher's episodes)",
        "teacher (the ceiling)",
    ], probe
    # each row says how often that policy recovered from the warm-up student's own errors
    assert probe["first_header"][-1] == "recovered from the warm-up's own errors", probe
    # the first chart is the arms' curves against the teacher's line, legend named
    for label in ("updates after the shared SFT warm-up", "opd", "offline_kd", "teacher"):
        assert label in probe["chart_text"], (label, probe["chart_text"][:500])


def test_the_console_check_catches_a_script_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><h2>x</h2><script>undefinedFunction();</script></body></html>",
        encoding="utf-8",
    )
    proc = _chromium(page, tmp_path / "profile", "--dump-dom")
    assert any(CONSOLE_PROBLEMS.search(line) for line in proc.stderr.splitlines()), proc.stderr[
        -2000:
    ]
