"""``miniverl benchmark`` end to end on the toy backend: 2 arms × 1 seed from one cold start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import TOY_CALCULATOR
from miniverl.cli.main import app
from miniverl.lab.report.tables import SECTION_TITLES
from miniverl.utils.hashing import sha256_file
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.slow

SMALL = (
    "environment.train_tasks=8",
    "environment.eval_tasks=2",
    "train.cycles=1",
    "train.rollouts_per_cycle=2",
    "train.sft_warmup_cycles=1",
    "models.toy_fit.max_steps=20",
    "models.toy_fit.check_every=10",
    "rollout.max_turns=2",
    "rollout.max_new_tokens_per_turn=16",
    "rollout.max_total_tokens=256",
    "eval.teacher_gate_threshold=0",
)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("bench")
    recipe = root / "toy_calculator.yaml"
    recipe.write_bytes(TOY_CALCULATOR.read_bytes())
    out = root / "out"
    result = CliRunner().invoke(
        app,
        [
            "benchmark",
            str(recipe),
            *SMALL,
            "--arms",
            "sft_only,opd",
            "--seeds",
            "3",
            "--output",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    return out, result.output


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in RunPaths(run_dir).events.read_text().splitlines()]


def test_refuses_to_claim_significance(bench: tuple[Path, str]) -> None:
    out, output = bench
    assert "no statistical significance is claimed (1 seed)" in output
    data = json.loads(RunPaths(out).benchmark_json.read_text())
    assert data["significance"]["note"] == "no statistical significance is claimed (1 seed)"
    assert data["significance"]["intervals_reported"] is False
    assert data["aggregates"]["opd"]["difference_to_baseline"]["interval"] is None
    assert "no statistical significance is claimed (1 seed)" in RunPaths(out).summary_md.read_text()


def test_arms_share_byte_identical_cold_start_weights(bench: tuple[Path, str]) -> None:
    out, _ = bench
    seed_dir = out / "seed-3"
    cold = RunPaths(seed_dir).cold_start
    marker = json.loads((cold / "cold_start.json").read_text())
    file_sha = sha256_file(cold / "student.safetensors")
    assert marker["student_sha256"] == file_sha
    for arm in ("sft_only", "opd"):
        loaded = [e for e in _events(seed_dir / arm) if e["event"] == "benchmark_cold_start_loaded"]
        assert len(loaded) == 1 and loaded[0]["student_sha256"] == file_sha, arm
        events = [e["event"] for e in _events(seed_dir / arm)]
        assert "toy_teacher_fitted" not in events and "sft_warmup_start" not in events
    data = json.loads(RunPaths(out).benchmark_json.read_text())
    assert {r["cold_start_student_sha256"] for r in data["rows"]} == {file_sha}
    assert data["cold_starts"][0]["student_sha256"] == file_sha


def test_records_arms_rows_and_what_was_held_fixed(bench: tuple[Path, str]) -> None:
    out, output = bench
    data = json.loads(RunPaths(out).benchmark_json.read_text())
    assert data["arm_order"] == ["sft_only", "opd"] and data["seeds"] == [3]
    assert data["arms"]["sft_only"]["overrides"] == ["run.mode=sft"]
    assert data["arms"]["opd"]["overrides"] == ["run.mode=opd", "loss.divergence=forward_kl"]
    assert data["base_overrides"] == list(SMALL) and data["recipe"] == "toy_calculator.yaml"
    held = data["held_fixed"]["values"]
    assert (
        held["train.cycles"] == 1
        and held["train.rollouts_per_cycle"] == 2
        and held["optimizer_steps"] == 1
    )
    assert held["environment"]["eval_tasks"] == 2 and held["rollout.max_total_tokens"] == 256
    rows = {r["arm"]: r for r in data["rows"]}
    for arm, row in rows.items():
        summary = json.loads(RunPaths(out / row["run_dir"]).eval_json.read_text())
        assert row["final_success"] == summary["final"]["success_rate"]
        assert row["baseline_success"] == data["cold_starts"][0]["after_warmup_success"], arm
        assert row["optimizer_steps"] == 1 and row["wall_seconds"] > 0
        steps = [
            json.loads(x) for x in RunPaths(out / row["run_dir"]).metrics.read_text().splitlines()
        ]
        assert row["selected_training_tokens"] == sum(
            s["selected_positions"] for s in steps if s["kind"] == "step"
        )
    assert (
        rows["sft_only"]["teacher_query_ratio"] is None
        and rows["sft_only"]["generated_tokens"] == 0
    )
    assert rows["opd"]["generated_tokens"] > 0 and 0 < rows["opd"]["teacher_query_ratio"] <= 1
    for column in ("sft_only", "opd", "final success", "teacher query ratio"):
        assert column in output


def test_writes_a_comparison_report(bench: tuple[Path, str]) -> None:
    out, _ = bench
    html = RunPaths(out).report_html.read_text(encoding="utf-8")
    assert f"<h2>{SECTION_TITLES['benchmark']}</h2>" in html and "<svg" in html
    assert "http" not in html and "url(" not in html
