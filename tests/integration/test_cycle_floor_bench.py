"""``benchmarks/cycle_floor.py`` runs end to end in its ``--tiny`` mode, and its FLOP formula
matches what torch's own flop counter sees in a toy forward, so the floors it prints rest on
the right arithmetic. Nothing here is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import load_benchmark_script
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend
from miniverl.models.toy_config import TOY_STUDENT, TOY_TEACHER

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "cycle_floor.py"


def _script():
    return load_benchmark_script("cycle_floor")


def _run_tiny(tmp_path: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``cycle_floor.py --tiny [flags]`` in a subprocess on this checkout's ``src``, one thread."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    args = [*flags, "--tiny", "--cache-dir", str(tmp_path / "c"), "--json", str(out)]
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("config", [TOY_STUDENT, TOY_TEACHER], ids=["student", "teacher"])
def test_block_and_head_flops_equal_torch_flop_counter(config) -> None:
    floor = _script()
    backend = ToyBackend(config, ToyTokenizer(), model_id="toy", seed=0)
    tokens, head_rows = 37, 5
    ids = torch.arange(tokens).remainder(config.vocab_size)[None]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        hidden, _ = backend.module(ids)
        backend.module.project(hidden[0, :head_rows])
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(n for op, n in counts.items() if "mm" in str(op) and "bmm" not in str(op))
    shape = floor.shape_of(backend)
    expected = floor.forward_flops(shape, tokens, head_rows) - 4 * shape["L"] * shape["h"] * (
        tokens * (tokens - 1) // 2
    )
    assert matmuls == expected


@pytest.mark.slow
def test_tiny_run_reports_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    result = _run_tiny(tmp_path, out)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text(encoding="utf-8"))["toy"]
    for name in ("rollouts", "scoring", "update"):
        phase = report["opd"]["phases"][name]
        assert phase["flops"] > 0 and phase["achieved_s"] > 0
        assert phase["best_rate"] == max(phase["rates"].values())
        assert phase["floor_s"] == pytest.approx(phase["flops"] / phase["best_rate"])
        assert phase["ratio"] == pytest.approx(phase["achieved_s"] / phase["floor_s"])
        assert name in result.stdout
    assert report["sft"]["update"]["ratio"] > 0
    assert "SFT cycle" in result.stdout
    decode = report["opd"]["decode"]
    assert decode["steps_per_cycle"] >= 1 and decode["seconds_per_step"] > 0
    assert decode["seconds_per_cycle"] == pytest.approx(
        decode["steps_per_cycle"] * decode["seconds_per_step"]
    )
    assert decode["ops_per_step"] >= 15 + 2  # the 2-layer student's 15 matmuls and 2 attentions
    assert decode["dispatch_floor_per_step_s"] == pytest.approx(
        decode["ops_per_step"] * decode["small_op_s"]
    )
    assert "rollout decode steps" in result.stdout


@pytest.mark.slow
def test_real_cycle_tiny_phases_add_up_and_the_ratio_is_printed(tmp_path: Path) -> None:
    """``--real-cycle --tiny`` runs the SmolLM2 cycle-cost code on the toy recipe: every OPD
    cycle is rollouts + scoring + update + a non-negative rest, and OPD ÷ SFT is printed."""
    out = tmp_path / "cycle.json"
    result = _run_tiny(tmp_path, out, "--real-cycle")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text(encoding="utf-8"))["real_cycle"]
    assert report["opd_cycles"] and report["sft_cycles"]
    for cycle in report["opd_cycles"]:
        parts = [cycle[name] for name in ("rollouts", "scoring", "update")]
        assert all(p > 0 for p in parts), cycle
        assert cycle["other"] >= 0, cycle
        assert sum(parts) + cycle["other"] == pytest.approx(cycle["cycle"])
        assert cycle["other"] < 0.5 * cycle["cycle"], "the three phases miss most of the cycle"
    for cycle in report["sft_cycles"]:
        assert cycle["oracle traces"] >= 0 and cycle["update"] > 0
        assert cycle["oracle traces"] + cycle["update"] == pytest.approx(cycle["cycle"])
    ratio = report["opd"]["cycle_s"] / report["sft"]["cycle_s"]
    assert report["opd_over_sft"] == pytest.approx(ratio)
    assert f"OPD cycle / SFT cycle = {ratio:.2f}x" in result.stdout
    for name in ("rollouts", "scoring", "update", "other", "SFT cycle"):
        assert name in result.stdout
    decode = report["decode"]
    assert decode["sampled_ids_per_cycle"] > 0 and decode["weight_bytes"] > 0
    assert decode["fraction"] == pytest.approx(
        decode["tokens_per_s"] / decode["bandwidth_limit_tokens_per_s"]
    )
    assert "bandwidth limit" in result.stdout


def test_frozen_weights_update_flops_equal_torch_flop_counter() -> None:
    """Only the first norm trains (as with LoRA, no base matrix gets a weight gradient): the
    update's matmuls are forward plus input gradients, ``update_flops(..., passes=2)``."""
    floor = _script()
    backend = ToyBackend(TOY_STUDENT, ToyTokenizer(), model_id="toy", seed=0)
    for name, param in backend.module.named_parameters():
        param.requires_grad_(name == "layers.0.attn_norm.weight")
    assert any(p.requires_grad for p in backend.module.parameters())
    tokens, head_rows = 37, 5
    ids = torch.arange(tokens).remainder(TOY_STUDENT.vocab_size)[None]
    with FlopCounterMode(display=False) as counter:
        hidden, _ = backend.module(ids)
        backend.module.project(hidden[0, :head_rows]).square().sum().backward()
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(n for op, n in counts.items() if "mm" in str(op) and "bmm" not in str(op))
    shape = floor.shape_of(backend)
    attention = 4 * shape["L"] * shape["h"] * (tokens * (tokens - 1) // 2)
    assert matmuls == floor.update_flops(shape, tokens, head_rows, 2) - 3 * attention


def test_a_lora_student_updates_in_two_matmul_passes() -> None:
    from miniverl.config.models import RunConfig
    from miniverl.config.presets import demo_config

    floor = _script()
    recipe = RunConfig.from_yaml(ROOT / "recipes" / "smollm2_calc_chain.yaml")
    assert floor.update_passes(recipe) == 2
    full = recipe.with_overrides(
        [
            "models.runtime=dual_model",
            "models.student.lora.enabled=false",
            "lab.teacher_fit.enabled=false",
        ]
    )
    assert floor.update_passes(full) == 3
    assert floor.update_passes(demo_config()) == 3


def test_the_timed_cycle_fsyncs_its_logs_as_a_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fsync inside a timed phase (a run defers them), one per log at the cycle's end."""
    import argparse

    from miniverl.agent.loop import RolloutRunner
    from miniverl.lab.cycles import run_cycle, warm_up
    from miniverl.training.recipe import OPDTrainer

    floor = _script()
    monkeypatch.setenv("MINIVERL_CACHE_DIR", str(tmp_path / "c"))
    trainer = floor.toy_trainer(tmp_path, argparse.Namespace(tiny=True, cache_dir=None))
    warm_up(trainer, 1)
    where: list[str] = []
    phase = ["cycle"]
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        where.append(phase[0])
        real_fsync(fd)

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            phase[0] = name
            try:
                return fn(*args, **kwargs)
            finally:
                phase[0] = "cycle"

        return wrapper

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(
        RolloutRunner, "rollout_batch", timed("rollouts", RolloutRunner.rollout_batch)
    )
    monkeypatch.setattr(OPDTrainer, "loss_step", timed("update", OPDTrainer.loss_step))
    run_cycle(trainer, 0, warmup=False)
    assert "update" not in where and "rollouts" not in where, where
    assert where.count("cycle") >= 2  # events and metrics at the cycle's end
