"""``benchmarks/gpu_check.py`` runs end to end at tiny shapes on the CPU, so it cannot rot.

The script is meant for one lent GPU; here it runs with ``--tiny`` in a subprocess with CUDA
hidden (``CUDA_VISIBLE_DEVICES=""``), and its JSON must hold every section, each ran or
skipped with a reason, with our greedy decode equal to ``model.generate()``'s and nothing
that could pass for a GPU figure. Without ``--tiny`` and without CUDA it must say so, exit 0
and write nothing; without torch it must say what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = (
    "build",
    "opd_resident",
    "opd_swap",
    "opd_nf4",
    "decode",
    "loss_memory",
    "gpu_tests",
)


def _run(*args: str, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess[str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(
        [*map(str, pythonpath), str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    output = tmp_path_factory.mktemp("gpu-check") / "gpu.json"
    proc = _run("--tiny", "--output", str(output), "--gpu-tests", "tests/unit/test_models_hf.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(output.read_text())


def test_every_section_ran_or_was_skipped_with_a_reason(tiny_report: dict[str, Any]) -> None:
    assert tiny_report["device"] == "cpu" and tiny_report["tiny"] is True
    assert tiny_report["complete"] is True
    sections = tiny_report["sections"]
    assert sorted(sections) == sorted(SECTIONS)
    for name, section in sections.items():
        assert section["status"] in ("ran", "skipped"), (name, section)
        if section["status"] == "skipped":
            assert section["reason"].strip(), name
    ran = {name for name, section in sections.items() if section["status"] == "ran"}
    assert ran == set(SECTIONS) - {"opd_nf4"}
    assert "CUDA" in sections["opd_nf4"]["reason"]


def test_the_opd_cycles_went_through_the_trainer_without_a_memory_figure(
    tiny_report: dict[str, Any],
) -> None:
    for name, strategy in (("opd_resident", "resident"), ("opd_swap", "swap")):
        section = tiny_report["sections"][name]
        assert section["memory_plan"]["strategy"] == strategy
        assert section["optimizer_steps"] == 1 and section["rollouts"] == 4
        assert section["rollout_generated_tokens"] > 0 and section["selected_positions"] > 0
        assert section["whole_run_memory"] == {"status": "not_run_no_cuda"}
        assert all(step == {"status": "not_run_no_cuda"} for step in section["step_memory"])


def test_our_greedy_decode_equals_generate_at_every_batch(tiny_report: dict[str, Any]) -> None:
    decode = tiny_report["sections"]["decode"]
    float32 = [row for row in decode["rows"] if row["precision"] == "float32"]
    assert [row["batch"] for row in float32] == [1, 16, 64]
    assert decode["greedy_ids_equal_float32"] is True
    for row in float32:
        assert row["ids_equal"] is True and row["rows_equal"] == row["batch"], row
        assert row["ours_tokens"] > 0 and row["ours_tokens_per_s"] > 0
    assert {row["precision"] for row in decode["rows"]} == {"bfloat16", "float32"}
    for role in ("student", "teacher"):
        probe = decode["prefill_vs_step"][role]
        assert probe["prefill_tokens"] == 14 and probe["prefill_ms"] > 0
        assert probe["cached_step_ms"] > 0


def test_loss_memory_compares_full_and_chunked_arms(tiny_report: dict[str, Any]) -> None:
    loss = tiny_report["sections"]["loss_memory"]
    arms = {(row["positions"], row["arm"]) for row in loss["arms"]}
    assert arms == {(n, a) for n in (64, 128) for a in ("full", "chunk16", "chunk64")}
    assert len(loss["ratios"]) == 4
    assert all(ratio["loss_relative_gap"] < 1e-4 for ratio in loss["ratios"])
    assert all("peak_allocated_gib" not in row for row in loss["arms"])  # no CPU "figure"


def test_the_gpu_marked_tests_were_collected_and_skipped(tiny_report: dict[str, Any]) -> None:
    tests = tiny_report["sections"]["gpu_tests"]
    assert tests["returncode"] == 0
    assert "skipped" in tests["summary"] and "passed" not in tests["summary"]


def test_without_cuda_it_says_so_and_writes_nothing(tmp_path: Path) -> None:
    output = tmp_path / "gpu.json"
    before = sorted((ROOT / "results").rglob("*"))
    proc = _run("--output", str(output))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no CUDA device\n"
    assert not output.exists()
    assert sorted((ROOT / "results").rglob("*")) == before


def test_without_torch_it_names_what_is_missing(tmp_path: Path) -> None:
    fake = tmp_path / "shadow" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch is not installed here')\n")
    output = tmp_path / "gpu.json"
    proc = _run("--tiny", "--output", str(output), pythonpath=[tmp_path / "shadow"])
    assert proc.returncode == 2
    assert "missing here: torch" in proc.stderr and proc.stdout == ""
    assert not output.exists()
