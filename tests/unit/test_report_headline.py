"""The report's headline: first section, success per stage (and per k), objective, banner."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_report import build_run, fake_benchmark

from helpers import make_runner, record_of
from miniverl.lab.report.report import write_report
from miniverl.utils.runs import RunPaths


def _report(run: Path) -> tuple[str, str]:
    html, md = write_report(run)
    return html.read_text(encoding="utf-8"), md.read_text(encoding="utf-8")


def _headline_html(html: str) -> str:
    start = html.index('<section id="headline"')
    return html[start : html.index("</section>", start)]


def _headline_md(md: str) -> str:
    return md.split("## Headline", 1)[1].split("\n## ", 1)[0]


def test_the_headline_is_the_first_section_of_both_renderings(tmp_path: Path) -> None:
    html, md = _report(build_run(tmp_path / "opd-run"))
    assert re.findall(r'<section id="([a-z_]+)"', html)[0] == "headline"
    assert re.findall(r"^## (.+)$", md, flags=re.M)[0] == "Headline"
    for block in (_headline_html(html), _headline_md(md)):
        assert "Objective: on_policy_distillation (run.mode opd)" in block
        for stage, solved, rate in (
            ("baseline", "0/4", "0.0%"),
            ("after SFT warm-up", "1/4", "25.0%"),
            ("final", "3/4", "75.0%"),
        ):
            assert re.search(rf"{stage}\W.*?{solved}.*?{rate}", block, flags=re.S), stage
    assert "<svg" in _headline_html(html)  # the per-stage chart is in the first screen
    assert 'id="smoke-test"' not in html and "SMOKE TEST" not in md


@pytest.mark.parametrize("name", ["demo-fast", "demo-fast-offline_kd"])
def test_a_demo_fast_run_opens_on_a_smoke_test_banner(tmp_path: Path, name: str) -> None:
    """Both runs of demo --fast (its opd run and the offline_kd run beside it)."""
    html, md = _report(build_run(tmp_path / name))
    head = _headline_html(html)
    assert head.index('id="smoke-test"') < head.index("<h2>Headline</h2>")
    assert "SMOKE TEST (miniverl demo --fast)" in head and "not a result" in head
    assert md.index("> **SMOKE TEST (miniverl demo --fast)") < md.index("## Headline")


def _contrast(arm: str, ref: str, endpoint: str, primary: bool) -> dict[str, Any]:
    return {
        "arm": arm, "reference": ref, "endpoint": endpoint, "primary": primary,
        "mean_difference": 0.25, "interval": [0.125, 0.375], "mde": 0.1, "distinguishable": True,
        "verdict": f"{arm} vs {ref} ({endpoint}): +25.0 pp", "notes": [],
    }  # fmt: skip


def test_a_benchmark_headline_shows_the_contrasts_with_their_intervals(tmp_path: Path) -> None:
    run = tmp_path / "bench"
    bench = fake_benchmark(run, [1, 2, 3])
    bench["contrasts"] = [
        _contrast("opd", "sft_only", "all", False),
        _contrast("opd", "sft_only", "k=3", True),
    ]
    bench["statistics_note"] = "3 seeds x 1 arm seed; 95% percentile intervals"
    RunPaths(run).benchmark_json.write_text(json.dumps(bench))
    html, md = _report(run)
    assert re.findall(r'<section id="([a-z_]+)"', html)[0] == "headline"
    for block in (_headline_html(html), _headline_md(md)):
        assert "opd − sft_only" in block
        assert block.index("k=3") < block.index("| all |" if "|" in block else ">all<")
        assert "[12.5, 37.5] pp" in block and "+25.0 pp" in block
        assert "3 seeds x 1 arm seed; 95% percentile intervals" in block
        assert "75.0%" in block  # opd's final success per arm


def _chain_eval_trajectories(path: Path) -> None:
    """Eval trajectories of calc_chain tasks with k = 1 and k = 2 (oracle: all solved)."""
    from miniverl.config.models import RolloutConfig
    from miniverl.environments.calc_chain import make_task
    from miniverl.environments.registry import make_environment

    env = make_environment("calc_chain")
    runner = make_runner(environment=env, config=RolloutConfig(max_turns=9, max_total_tokens=2048))
    lines = []
    for i, steps in enumerate([[("add", 3)], [("add", 3), ("multiply", 2)], [("subtract", 4)]]):
        task = make_task(f"chain-eval-{i}", "eval", 10 + i, steps)
        for tag in ("baseline", "final"):
            traj = runner.oracle_rollout(task)
            traj = traj.model_copy(
                update={"trajectory_id": f"{task.task_id}:{tag}", "metadata": {"eval_tag": tag}}
            )
            lines.append(json.dumps(record_of(traj)))
    path.write_text("\n".join(lines) + "\n")


def test_a_calc_chain_headline_shows_success_per_k(tmp_path: Path) -> None:
    run = build_run(tmp_path / "chain")
    paths = RunPaths(run)
    manifest = json.loads(paths.manifest.read_text())
    manifest["environment"]["name"] = "calc_chain"
    paths.manifest.write_text(json.dumps(manifest))
    _chain_eval_trajectories(paths.eval_trajectories)
    html, md = _report(run)
    block = _headline_md(md)
    assert "| k=1 | k=2 |" in block
    final = next(line for line in block.splitlines() if line.startswith("| final "))
    assert "100.0% (2/2)" in final and "100.0% (1/1)" in final
    after = next(line for line in block.splitlines() if line.startswith("| after SFT warm-up "))
    assert after.endswith("| — | — |")  # no eval trajectories of that stage
    assert "k=2" in _headline_html(html)


@pytest.mark.parametrize("labelled", [(0.0, 0.0), (0.5, 0.5), (0.0, 0.04)])
def test_baseline_and_warm_up_labels_never_overlap(labelled: tuple[float, float]) -> None:
    """Half a cycle apart left of cycle 0 is one pixel on a 400-cycle axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from miniverl.lab.report import plots

    fig = plots.success_per_cycle_figure(
        [(c, 0.5) for c in range(400)],
        [(-1.0, labelled[0], "baseline"), (-0.5, labelled[1], "warm-up"), (399.0, 0.9, "final")],
    )
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in fig.axes[0].texts}
    assert set(boxes) == {"baseline", "warm-up", "final"}
    names = sorted(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), (a, b, boxes[a], boxes[b])


def test_the_legend_of_the_success_curve_sits_off_the_data() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from miniverl.lab.report import plots

    fig = plots.success_per_cycle_figure(
        [(c, 0.5 + 0.4 * (c % 2)) for c in range(50)],
        [(-1.0, 0.1, "baseline"), (49.0, 0.9, "final")],
    )
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend is not None
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def _comparison(run: Path) -> dict[str, Any]:
    def arm(name: str, trains_on: str, final: int, curve: list[list[float]]) -> dict[str, Any]:
        return {
            "name": name,
            "run_dir": str(run) if name == "opd" else f"{run}-{name}",
            "trains_on": trains_on,
            "start": {"solved": 2, "tasks": 24, "success_rate": 2 / 24},
            "final": {"solved": final, "tasks": 24, "success_rate": final / 24},
            "curve": curve,
        }

    return {
        "arms": [
            arm(
                "opd", "the student's own episodes", 13, [[0, 2 / 24], [100, 0.25], [400, 13 / 24]]
            ),
            arm("offline_kd", "the teacher's episodes", 24, [[0, 2 / 24], [400, 1.0]]),
        ],
        "start_weights_sha256": "ab" * 32,
        "recovery": {
            "tasks": 24,
            "states": 10,
            "recovered": {"start": 0, "opd": 4, "offline_kd": 1, "teacher": 9},
            "teacher_solved": 23,
        },
        "teacher_success": 23 / 24,
        "sentence": "From the same SFT warm-up (2/24 held-out tasks solved), OPD ended behind.",
        "smoke_test": False,
    }


def test_a_demo_run_leads_with_its_arms_side_by_side(tmp_path: Path) -> None:
    """With ``comparison.json`` the headline opens on the plain sentence, then the arms'
    table (shared start, each arm, the teacher) and their curves; the objective's jargon is
    left to the objective section."""
    run = build_run(tmp_path / "opd-run")
    (run / "comparison.json").write_text(json.dumps(_comparison(run)), encoding="utf-8")
    html, md = _report(run)
    head, head_md = _headline_html(html), _headline_md(md)
    assert head_md.lstrip().startswith("From the same SFT warm-up (2/24 held-out tasks solved)")
    rows = re.findall(r"^\| (.+?) \| (\S+) \| (\S+) \| (\S+) \|$", head_md, flags=re.M)
    assert rows[:4] == [
        ("SFT warm-up (shared start)", "2/24", "8.3%", "0/10"),
        ("opd (the student's own episodes)", "13/24", "54.2%", "4/10"),
        ("offline_kd (the teacher's episodes)", "24/24", "100.0%", "1/10"),
        ("teacher (the ceiling)", "23/24", "95.8%", "9/10"),
    ]
    assert "recovered from the warm-up's own errors" in head_md
    assert "SHA-256 abababababababab…" in head_md
    assert "Objective:" not in head and "Objective:" not in head_md
    assert "on_policy_distillation" in md.split("## Headline", 1)[1].split("\n## ", 1)[1]
    first_svg = head[head.index("<svg") : head.index("</svg>")]
    for label in ("updates after the shared SFT warm-up", "opd", "offline_kd", "teacher"):
        assert label in first_svg, label
    assert head.count("<svg") == 1  # the stage bars are left out: the curves carry the stages
