"""The offline report on synthetic run directories (fast; no training, no torch).

Each directory is built from the record formats ``OPDTrainer`` writes, so the report is
checked against known numbers: an opd run with teacher data, an sft run without any, a
directory with nothing but metrics, and a benchmark directory.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from helpers import (
    REPORT_FORBIDDEN,
    REPORT_RUN_SECTIONS,
    oracle_trajectory,
    run_python,
    toy_tokenizer,
)
from miniverl.config.models import RunConfig
from miniverl.errors import RunDirectoryError
from miniverl.inspection.run_dir import load_run
from miniverl.lab.benchmark.stats import aggregate, significance_note
from miniverl.lab.report import plots
from miniverl.lab.report.report import write_report
from miniverl.lab.report.tables import SECTION_TITLES
from miniverl.trajectory.io import write_trajectories
from miniverl.utils.io import append_jsonl, write_json
from miniverl.utils.runs import RunPaths

RUN_SECTIONS = [SECTION_TITLES[k] for k in REPORT_RUN_SECTIONS]


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text of divergence labels in the token view."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.token_numbers: list[str] = []
        self.context_text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.stack.append(dict(attrs).get("class") or "")

    def handle_endtag(self, tag: str) -> None:
        if self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1] == "d":
            self.token_numbers.append(data)
        if self.stack and self.stack[-1] == "ctx":
            self.context_text.append(data)


def parse(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


def assert_self_contained(html: str) -> None:
    """No URL, external script, stylesheet, font or import: the file opens offline."""
    lowered = html.lower()
    for needle in REPORT_FORBIDDEN:
        assert needle not in lowered, needle
    elements = parse(html)
    tags = {tag for tag, _ in elements.tags}
    assert not tags & {"script", "link", "iframe", "img", "object", "embed", "base"}, tags
    for tag, attrs in elements.tags:
        assert "src" not in attrs, (tag, attrs)
        href = attrs.get("href")
        assert href is None or href.startswith("#"), (tag, href)


# ---------------------------------------------------------------------- synthetic run


def _eval(tag: str, solved: int, version: int, tasks: int = 4) -> dict[str, Any]:
    return {
        "kind": "eval", "tag": tag, "split": "eval", "tasks": tasks, "solved": solved, "success_rate": solved / tasks,
        "termination": {"final_answer": solved, "max_turns": tasks - solved} if solved < tasks else {"final_answer": tasks},
        "failure_categories": {"solved": solved, "wrong_answer": tasks - solved} if solved < tasks else {"solved": tasks},
        "mean_generated_tokens": 30.5, "generated_tokens": 122, "invalid_tool_calls": 0, "temperature": 0.0,
        "parameter_version": version, "global_optimizer_step": version,
    }  # fmt: skip


def _step(step: int, phase: str, cycle: int, loss: float, *, teacher: bool) -> dict[str, Any]:
    return {
        "kind": "step", "phase": phase, "cycle": cycle, "step": 0, "global_optimizer_step": step,
        "parameter_version": step, "policy_version": step, "rollout_policy_version": step - 1, "committed": True,
        "loss": loss, "divergence_loss": 0.0 if phase == "sft" else loss, "sampled_token_nll": loss + 0.5,
        "grad_norm": 1.25 + step, "lr": 0.003, "selected_positions": 40, "trajectories_in_step": 2,
        "teacher_entropy_mean": 0.4 + 0.01 * step if teacher and phase != "sft" else None,
        "high_entropy_fraction": 0.25 if teacher and phase != "sft" else None,
        "loss_by_span_type": {"assistant_tool_call": 0.75 * loss, "assistant_final": 0.25 * loss},
        "seconds": 0.125, "train_selected_tokens_per_second": 320.0, "projection_chunk_size": 1024,
        "gpu": {"status": "not_run_no_cuda"},
    }  # fmt: skip


def _cycle(cycle: int, mode: str, loss: float) -> dict[str, Any]:
    rollouts = {} if mode == "sft" else {
        "tasks": 2, "solved": 1, "success_rate": 0.5, "mean_generated_tokens": 40.0, "generated_tokens": 80,
        "invalid_tool_calls": 0, "termination": {"final_answer": 1, "parse_error_limit": 1}, "failure_categories": {"solved": 1},
    }  # fmt: skip
    selection = {
        "trajectories": 2, "trajectories_with_selection": 2, "model_tokens": 80, "critical_tokens": 60,
        "selected_positions": 60, "teacher_queried_position_ratio": 0.75,
        "selected_by_span_type": {"assistant_final": 10, "assistant_tool_call": 50},
    }  # fmt: skip
    return {"kind": "cycle", "cycle": cycle, "mode": mode, "parameter_version_before": cycle + 1, "rollouts": rollouts,
            "selection": selection, "skipped": False, "steps": 1, "parameter_version": cycle + 2, "loss": loss, "seconds": 1.5}  # fmt: skip


def build_run(root: Path, *, mode: str = "opd") -> Path:
    """A complete run directory with the artifact formats of ``OPDTrainer`` and known numbers."""
    teacher = mode != "sft"
    paths = RunPaths(root)
    root.mkdir(parents=True)
    traj = oracle_trajectory()
    traj = traj.model_copy(
        update={
            "trajectory_id": "calc-train-0:v2:s99",
            "metadata": {**traj.metadata, "source": "policy", "cycle": 1},
        }
    )
    write_trajectories(paths.trajectories, [oracle_trajectory(), traj])
    tokenizer = toy_tokenizer()
    rows = []
    for k, j in enumerate(p for p in traj.model_token_positions() if p > 0):
        rows.append({
            "trajectory_id": traj.trajectory_id, "cycle": 1, "measured": "after_update", "target_position": j,
            "prediction_position": j - 1, "token_id": traj.token_ids[j], "token_text": tokenizer.decode([traj.token_ids[j]]),
            "span_type": traj.span_at(j).span_type.value, "weight": 1.0,
            "divergence": 0.5 + 0.001 * k if teacher else None, "student_log_prob": -0.25,
            "teacher_entropy": 0.3 if teacher else None,
        })  # fmt: skip
    append_jsonl(paths.token_analysis, rows)
    phase = "sft" if mode == "sft" else mode
    metrics = [
        _eval("baseline", 0, 0),
        _step(1, "sft", -1, 2.3456789, teacher=teacher),
        _eval("after_warmup", 1, 1),
        _step(2, phase, 0, 1.23456789, teacher=teacher),
        _cycle(0, mode, 1.23456789),
        _step(3, phase, 1, 0.98765432, teacher=teacher),
        _cycle(1, mode, 0.98765432),
        _eval("final", 3, 3),
    ]
    if mode == "sft":
        metrics = [m for m in metrics if m.get("tag") != "after_warmup"]
    append_jsonl(paths.metrics, metrics)
    evaluations = {
        m["tag"]: {k: v for k, v in m.items() if k != "kind"}
        for m in metrics
        if m["kind"] == "eval"
    }
    config = RunConfig.from_mapping({"run": {"mode": mode, "name": root.name}})
    write_json(paths.eval_json, {
        "run_id": root.name, "mode": mode, "objective": config.objective_label(), "config_digest": config.digest(),
        "global_optimizer_step": 3, "parameter_version": 3, "evaluations": evaluations, "baseline": evaluations["baseline"],
        "after_warmup": evaluations.get("after_warmup"), "final": evaluations["final"], "toy_teacher": None, "seconds": 12.5,
    })  # fmt: skip
    paths.config_resolved.write_text(
        "# every 'auto' replaced by its decision\n" + config.to_yaml(), encoding="utf-8"
    )
    write_json(paths.manifest, {
        "miniverl_version": "0.3.0", "run_id": root.name, "created_at": "2026-01-01T00:00:00+00:00", "git_commit": None,
        "python": {"version": "3.11.7", "implementation": "CPython"}, "os": {"system": "Linux", "release": "6.1", "machine": "x86_64"},
        "gpu": {"status": "not_run_no_cuda", "count": 0}, "mode": mode, "seed": 1234, "deterministic": True,
        "config_digest": config.digest(),
        "environment": {"name": "calculator", "difficulty": "easy", "split_sizes": {"train": 8, "eval": 4, "test": 0}},
        "models": {"student": {"model_id": "toy-student", "revision": None, "quantization": "none", "precision": "float32"}},
        "tokenizer": {"fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size},
        "objective": {
            "label": config.objective_label(), "mode": mode, "divergence": "forward_kl" if teacher else "cross_entropy",
            "supervision_shape": "bucketed_topk_plus_tail" if teacher else "oracle_tokens", "selector": "all_model_tokens",
            "selection_ratio": 0.5, "top_k": 8 if teacher else None,
        },
        "memory_plan": {"strategy": "resident", "requested": "auto", "teacher_resident": teacher, "reason": "auto -> resident: device cpu has no accelerator memory to save"},
        "projection_chunk_size": 1024, "global_optimizer_step": 3, "parameter_version": 3,
        "measurement_status": {"gpu_memory": "not_run_no_cuda", "cache": "enabled" if teacher else "not_used"},
        "toy_teacher": None,
    })  # fmt: skip
    events = [
        {"event": "run_start", "mode": mode},
        {"event": "eval"},
        {"event": "rollouts_collected"},
        {"event": "token_analysis_written"},
        {"event": "run_end", "status": "completed"},
    ]
    append_jsonl(paths.events, events)
    return root


def fake_benchmark(root: Path, seeds: list[int]) -> dict[str, Any]:
    """A benchmark.json with known per-seed finals (opd beats sft_only by 0.25 on every seed)."""
    rows = []
    for seed in seeds:
        for arm, final in (("sft_only", 0.5), ("opd", 0.75)):
            rows.append({
                "arm": arm, "seed": seed, "run_dir": f"seed-{seed}/{arm}", "baseline_success": 0.25, "final_success": final,
                "generated_tokens": 0 if arm == "sft_only" else 160, "teacher_generated_tokens": 0, "selected_training_tokens": 120,
                "teacher_query_ratio": None if arm == "sft_only" else 0.75, "wall_seconds": 2.0, "optimizer_steps": 2,
            })  # fmt: skip
    arms = ["sft_only", "opd"]
    bench = {
        "schema": "miniverl.benchmark/1", "recipe": "toy_calculator.yaml", "base_config_digest": "ab" * 32, "seeds": seeds,
        "arms": {"sft_only": {"overrides": ["run.mode=sft"]}, "opd": {"overrides": ["run.mode=opd", "loss.divergence=forward_kl"]}},
        "arm_order": arms, "baseline_arm": "sft_only", "held_fixed": {"values": {"train.cycles": 2}},
        "cold_starts": [{"seed": s, "dir": f"seed-{s}/cold-start", "student_sha256": "cd" * 32, "baseline_success": 0.25, "after_warmup_success": 0.5, "wall_seconds": 3.0} for s in seeds],
        "rows": rows, "aggregates": aggregate(rows, arms, "sft_only"),
        "significance": {"seeds": len(seeds), "note": significance_note(len(seeds))}, "refuses_to_claim": ["no claim about the cold start"],
    }  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    write_json(RunPaths(root).benchmark_json, bench)
    return bench


@pytest.fixture(scope="module")
def opd_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    run = build_run(tmp_path_factory.mktemp("report") / "opd-run")
    html_path, md_path = write_report(run)
    return run, html_path.read_text(encoding="utf-8"), md_path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------- opd run


def test_writes_both_files_atomically(opd_report: tuple[Path, str, str]) -> None:
    run, html, md = opd_report
    paths = RunPaths(run)
    assert paths.report_html.is_file() and paths.summary_md.is_file()
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    assert html.startswith("<!DOCTYPE html>") and md.startswith("# miniverl report: opd-run")


def test_html_is_self_contained(opd_report: tuple[Path, str, str]) -> None:
    _, html, _ = opd_report
    assert_self_contained(html)
    assert html.count("<svg") >= 4
    assert "<style>" in html


def test_every_section_is_present_in_both_renderings(opd_report: tuple[Path, str, str]) -> None:
    _, html, md = opd_report
    for title in RUN_SECTIONS:
        assert f"<h2>{title}</h2>" in html, title
        assert f"## {title}" in md, title
    assert SECTION_TITLES["benchmark"] not in html


def test_numbers_match_the_artifacts(opd_report: tuple[Path, str, str]) -> None:
    _, html, md = opd_report
    for text in (html, md):
        assert "3/4" in text and "75.0%" in text and "25.0%" in text
        assert "1.2346" in text and "0.9877" in text and "2.3457" in text
        assert "3.000e-03" in text
        assert "teacher_queried_position_ratio" in text and "0.7500" in text
        assert "not measured (no GPU)" in text and "not_run_no_cuda" not in text
        assert "auto -&gt; resident" in text or "auto -> resident" in text
    assert re.search(r"<td>optimizer steps</td><td class=\"num\">3</td>", html)
    assert "| optimizer steps | 3 |" in md


def test_never_claims_teacher_compute_saved(opd_report: tuple[Path, str, str]) -> None:
    _, html, md = opd_report
    assert "compute saved" not in html.lower() and "compute saved" not in md.lower()


def test_token_view_numbers_only_policy_tokens(opd_report: tuple[Path, str, str]) -> None:
    run, html, _ = opd_report
    rows = [json.loads(line) for line in RunPaths(run).token_analysis.read_text().splitlines()]
    elements = parse(html)
    assert len(elements.token_numbers) == len(rows)
    assert elements.token_numbers[0] == f"{rows[0]['divergence']:.3f}"
    assert elements.context_text and all(
        not re.search(r"\d\.\d{3}", t) for t in elements.context_text
    )
    token_classes = [
        a.get("class")
        for t, a in elements.tags
        if t == "span" and (a.get("class") or "").startswith("tok ")
    ]
    assert token_classes and all(
        c.split()[1] in {"sp-assistant_tool_call", "sp-assistant_final", "sp-assistant_text"}
        for c in token_classes
    )


def test_summary_tables_carry_the_same_rows(opd_report: tuple[Path, str, str]) -> None:
    _, _, md = opd_report
    assert "| final | eval | 3/4 | 75.0% |" in md
    assert "| 3 | opd | 1 | 0.9877 | 0.9877 | 1.4877 | 4.2500 | 3.000e-03 | 40 | yes |" in md
    assert "| system | context |" in md and "never (context)" in md


def test_rewriting_is_deterministic(opd_report: tuple[Path, str, str]) -> None:
    run, html, md = opd_report
    html_path, md_path = write_report(run)
    assert md_path.read_text(encoding="utf-8") == md
    assert re.sub(r"f\d+-", "", html_path.read_text(encoding="utf-8")) == re.sub(r"f\d+-", "", html)


# ---------------------------------------------------------------------- degraded directories


def test_sft_run_without_teacher_data(tmp_path: Path) -> None:
    run = build_run(tmp_path / "sft-run", mode="sft")
    html_path, md_path = write_report(run)
    html, md = html_path.read_text(encoding="utf-8"), md_path.read_text(encoding="utf-8")
    assert_self_contained(html)
    assert "No teacher entropy recorded" in md
    assert "no teacher, so no divergence was recorded" in md
    assert parse(html).token_numbers == []
    assert "cross_entropy" in md and "75.0%" in md


def test_only_metrics_is_enough(tmp_path: Path) -> None:
    run = build_run(tmp_path / "full")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.jsonl").write_bytes(RunPaths(run).metrics.read_bytes())
    html_path, md_path = write_report(bare)
    md = md_path.read_text(encoding="utf-8")
    assert_self_contained(html_path.read_text(encoding="utf-8"))
    assert "manifest.json not found" in md and "75.0%" in md and "| source |" in md
    assert "there is no per-token view" in md


def test_truncated_last_line_is_ignored_and_corruption_raises(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    metrics = RunPaths(run).metrics
    with open(metrics, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "step", "loss"')
    assert len(load_run(run).steps) == 3
    metrics.write_text('{"kind": "eval"\n{"kind": "step"}\n', encoding="utf-8")
    with pytest.raises(RunDirectoryError, match=r"metrics\.jsonl:1"):
        load_run(run)


def test_not_a_run_directory(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError):
        write_report(tmp_path)
    with pytest.raises(RunDirectoryError):
        write_report(tmp_path / "missing")


def test_eval_tag_files_are_listed(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    payload = {k: v for k, v in _eval("reeval", 2, 3).items() if k != "kind"}
    write_json(RunPaths(run).eval_tag_json("reeval"), payload)
    write_json(RunPaths(run).eval_tag_json("final"), payload)
    _, md_path = write_report(run)
    md = md_path.read_text(encoding="utf-8")
    assert "| reeval | eval | 2/4 | 50.0% |" in md
    assert "| eval.final.json | eval | 2/4 | 50.0% |" in md
    assert "| final | eval | 3/4 | 75.0% |" in md


# ---------------------------------------------------------------------- benchmark directories


def test_benchmark_directory(tmp_path: Path) -> None:
    root = tmp_path / "bench"
    fake_benchmark(root, [1, 2, 3])
    html_path, md_path = write_report(root)
    html, md = html_path.read_text(encoding="utf-8"), md_path.read_text(encoding="utf-8")
    assert_self_contained(html)
    assert (
        f"<h2>{SECTION_TITLES['benchmark']}</h2>" in html
        and f"## {SECTION_TITLES['benchmark_setup']}" in md
    )
    assert SECTION_TITLES["identity"] not in md
    assert "| opd | 3 | 75.0% ± 0.0 | 25.0% | +25.0 pp | [25.0, 25.0] pp |" in md
    assert "95% percentile-bootstrap" in md
    assert html.count("<svg") == 1 and "difference to sft_only" in html


def test_benchmark_with_one_seed_claims_nothing(tmp_path: Path) -> None:
    root = tmp_path / "bench"
    fake_benchmark(root, [7])
    _, md_path = write_report(root)
    md = md_path.read_text(encoding="utf-8")
    assert "no statistical significance is claimed (1 seed)" in md
    assert "| opd | 1 | 75.0% | 25.0% | +25.0 pp | — |" in md


def test_training_run_with_benchmark_json_shows_both(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    fake_benchmark(run, [1])
    _, md_path = write_report(run)
    md = md_path.read_text(encoding="utf-8")
    assert f"## {SECTION_TITLES['identity']}" in md and f"## {SECTION_TITLES['benchmark']}" in md


# ---------------------------------------------------------------------- plots and torch-freedom


def test_inline_svg_is_sanitized_and_namespaced() -> None:
    steps = [
        {"phase": "sft", "global_optimizer_step": 1, "loss": 2.0},
        {"phase": "opd", "global_optimizer_step": 2, "loss": 1.0},
    ]
    first = plots.learning_curves(steps, [("loss", "loss")])
    second = plots.learning_curves(steps, [("loss", "loss")])
    for svg in (first, second):
        assert svg.startswith("<svg") and svg.endswith("</svg>")
        for needle in (*REPORT_FORBIDDEN, "<?xml", "DOCTYPE", "xmlns", "clip-path", "xlink:"):
            assert needle not in svg, needle
    ids = [set(re.findall(r'\bid="([^"]+)"', svg)) for svg in (first, second)]
    assert ids[0] and not ids[0] & ids[1]
    refs = set(re.findall(r'href="#([^"]+)"', first))
    assert refs <= ids[0]


_TORCH_FREE_CHILD = r"""
import json, sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
from typer.testing import CliRunner
import miniverl.cli.main as cli

result = CliRunner().invoke(cli.app, ["report", sys.argv[1]])
exported = CliRunner().invoke(cli.app, ["export", sys.argv[1], "--out", sys.argv[2]])
print(json.dumps({"exit_code": result.exit_code, "output": result.output, "export_exit_code": exported.exit_code,
                  "torch": "torch" in sys.modules,
                  "heavy": sorted(m for m in ("torch", "numpy", "safetensors", "transformers") if m in sys.modules and m != "numpy")}))
"""


def test_report_and_export_never_import_torch(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    fake_benchmark(run, [1, 2, 3])
    proc = run_python(
        _TORCH_FREE_CHILD, args=[str(run), str(tmp_path / "result.json")], with_tests=True
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["exit_code"] == 0 and out["export_exit_code"] == 0, out["output"]
    assert (tmp_path / "result.json").is_file()
    assert out["torch"] is False and out["heavy"] == []
    assert RunPaths(run).report_html.is_file()
