"""The arms of the SmolLM2 study through ``miniverl benchmark``'s path, on a tiny random
hf checkpoint shaped by ``recipes/smollm2_calc_chain.yaml`` (one cycle each).

The real-model cycle is ``test_smollm2_real.py::test_one_cycle_of_the_calc_chain_recipe``;
this one runs every arm of ``results/smollm2_calc_chain/`` (DAgger adapter fit, held-out
state gate of the adapter, ``eval.teacher_gate_required``) in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from miniverl.config.models import RunConfig
from miniverl.errors import TeacherGateError
from miniverl.lab.benchmark.harness import run_benchmark
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smollm2_calc_chain.yaml"
ARMS = ["sft_oracle", "seqkd", "offline_kd", "opd", "gkd_mix", "opd_privileged"]


def _config(tmp: Path, *extra: str, recipe: Path = RECIPE) -> RunConfig:
    model = build_tiny_hf_checkpoint(tmp / "tiny", arch="llama", seed=2)
    return RunConfig.from_yaml(
        recipe,
        [
            f"models.student.model_id={model}",
            f"models.teacher.model_id={model}",
            f"models.teacher_fit.cache_dir={tmp / 'adapters'}",
            "models.student.lora.r=2",
            "models.teacher.lora.r=2",
            "models.teacher_fit.steps=1",
            "models.teacher_fit.batch_size=1",
            "models.teacher_fit.extra_tasks=0",
            "models.teacher_fit.probe_tasks=0",
            "models.teacher_fit.dagger.tasks=2",
            "environment.train_tasks=4",
            "environment.eval_tasks=3",
            "environment.test_tasks=3",
            "rollout.max_new_tokens_per_turn=4",
            "train.sft_warmup_until.max_cycles=1",
            "train.sft_warmup_until.check_every=1",
            "train.cycles=1",
            "train.rollouts_per_cycle=2",
            "train.trajectory_batch_size=2",
            "eval.teacher_gate_tasks=2",
            "eval.baseline=false",
            "eval.after_warmup=false",
            *extra,
        ],
    )


def test_every_arm_runs_on_an_ungated_hf_teacher_and_says_so(tmp_path: Path) -> None:
    config = _config(tmp_path, "eval.teacher_gate_required=false")
    result: dict[str, Any] = run_benchmark(
        config, arms=ARMS, seeds=[1], output_dir=tmp_path / "bench", quiet=True
    )
    assert [r["arm"] for r in result["rows"]] == ARMS
    gate = result["cold_starts"][0]["teacher_gate"]
    assert gate["passed"] is False and gate["required"] is False  # a random teacher fails
    assert set(gate["states"]["thresholds"]) == {
        "on_path_agreement",
        "off_path_agreement",
        "recovery_rate",
    }
    scored = {r["arm"]: r["budget"]["teacher_scored_tokens"] for r in result["rows"]}
    assert scored["sft_oracle"] == 0 and all(
        scored[a] > 0 for a in ("offline_kd", "opd", "gkd_mix")
    )
    runs = tmp_path / "bench" / "seed-1"
    modes = {
        arm: json.loads((runs / arm / "teacher-cache" / "index.json").read_text())["provenance"][
            "teacher_mode"
        ]
        for arm in ("opd", "opd_privileged")
    }
    assert modes == {"opd": "standard", "opd_privileged": "privileged_context"}
    # the DAgger adapter is fitted on the warmed-up student and kept with the cold start
    cold = json.loads((runs / "cold-start" / "cold_start.json").read_text())
    fit = cold["teacher_adapter"]
    assert fit["dagger_episodes"] == 2 and fit["dagger_states"] > 0
    assert (
        fit["cost"]["examples"]
        == fit["oracle_traces"] + fit["corrective_traces"] + fit["dagger_states"]
    )


def test_a_failed_hf_gate_refuses_the_arms_by_default(tmp_path: Path) -> None:
    with pytest.raises(TeacherGateError, match="teacher gate failed for seed 1"):
        run_benchmark(
            _config(tmp_path), arms=ARMS, seeds=[1], output_dir=tmp_path / "bench", quiet=True
        )
    assert not (tmp_path / "bench" / "cells" / "s1-a0-opd.json").exists()


def test_a_wrong_init_from_fails_before_the_cold_start_warms_up(tmp_path: Path) -> None:
    """The DAgger fit runs after the warm-up; its starting adapter is checked before it."""
    from miniverl.errors import CheckpointError

    missing = tmp_path / "no-teacher"
    with pytest.raises(CheckpointError, match=r"^lab\.teacher_fit\.init_from: ") as info:
        run_benchmark(
            _config(tmp_path, f"models.teacher_fit.init_from={missing}"),
            arms=["opd"],
            seeds=[1],
            output_dir=tmp_path / "bench",
            quiet=True,
        )
    assert str(missing) in info.value.hint
    assert not list((tmp_path / "bench").rglob("events.jsonl"))
    assert not list((tmp_path / "bench").rglob("s1-a0-*.json"))


CHECKED = Path(__file__).resolve().parents[2] / "recipes" / "smollm2_calc_chain_checked.yaml"
CONTROL_ARMS = ["opd", "offline_kd", "sft_corrective", "opd_self"]


def test_the_positive_controls_arms_run_on_the_checked_recipe_with_a_fitted_adapter(
    tmp_path: Path,
) -> None:
    """The arms of the SmolLM2 positive control (``recipes/smollm2_calc_chain_checked.yaml``,
    teacher fitted per seed on its DAgger states): ``opd_self`` is taught by the frozen cold
    start on the shared backbone, not by the fitted adapter; ``sft_corrective`` trains on
    corrective traces the tool flagged."""
    from miniverl.trajectory.io import read_trajectories
    from miniverl.utils.hashing import sha256_file
    from miniverl.utils.runs import RunPaths

    config = _config(
        tmp_path,
        "eval.teacher_gate_required=false",
        "models.teacher.checkpoint=null",
        "models.teacher_fit.enabled=true",
        "models.teacher_fit.dagger.enabled=true",
        "rollout.max_new_tokens_per_turn=48",  # a corrective trace's calls are written whole
        "eval.fixed_state_recovery=true",
        recipe=CHECKED,
    )
    result: dict[str, Any] = run_benchmark(
        config, arms=CONTROL_ARMS, seeds=[1], output_dir=tmp_path / "bench", quiet=True
    )
    assert [r["arm"] for r in result["rows"]] == CONTROL_ARMS
    runs = tmp_path / "bench" / "seed-1"
    cold = RunPaths(runs).cold_start
    fitted = json.loads((cold / "cold_start.json").read_text())["teacher_adapter"]
    assert fitted["corrective_traces"] > 0 and fitted["dagger_states"] > 0
    manifest = json.loads(RunPaths(runs / "opd_self").manifest.read_text())
    assert manifest["teacher_checkpoint"]["sha256"] == sha256_file(cold / "student.safetensors")
    opd = json.loads(RunPaths(runs / "opd").manifest.read_text())["teacher_checkpoint"]
    assert (
        opd["sha256"]
        == sha256_file(cold / "teacher-adapter.safetensors")
        == fitted["adapter_sha256"]
    )
    assert opd["sha256"] != manifest["teacher_checkpoint"]["sha256"]
    corrective = [
        t
        for t in read_trajectories(RunPaths(runs / "sft_corrective").trajectories)
        if t.metadata.get("source") == "noisy_oracle"
    ]
    # every arm answers the cold start's own stored deviations, the same states in one order
    fixed = result["cold_starts"][0]["fixed_states"]
    stored = [t.trajectory_id for t in read_trajectories(cold / "fixed-states.jsonl")]
    assert fixed["states"] == len(stored) > 0 and fixed["sha256"] == sha256_file(
        cold / "fixed-states.jsonl"
    )
    assert fixed["episodes"] == fixed["tasks"] == 3 and fixed["split"] == "eval"
    assert fixed["cost"]["cpu_seconds"] > 0
    for row in [{"fixed_state_recovery": fixed["cold_start"]}, *result["rows"]]:
        outcomes = row["fixed_state_recovery"]["outcomes"]
        assert [o["trajectory_id"] for o in outcomes] == stored
    assert all(r["fixed_state_recovery"]["cost"]["cpu_seconds"] > 0 for r in result["rows"])
    fixed_rows = [c for c in result["contrasts"] if c["endpoint"] == "fixed_recovery"]
    assert fixed_rows and all(c["seeds"] == ["1"] for c in fixed_rows)
    against_cold = [c["arm"] for c in fixed_rows if c["reference"] == "cold_start"]
    assert against_cold == CONTROL_ARMS
    assert result["fixed_state_recovery"] == [
        {
            "seed": 1,
            "split": "eval",
            "states": len(stored),
            "cold_start": fixed["cold_start"]["recovered"],
            "arms": {r["arm"]: [r["fixed_state_recovery"]["recovered"]] for r in result["rows"]},
        }
    ]
    report = (tmp_path / "bench" / "report.html").read_text(encoding="utf-8")
    assert "Recovery at fixed states: of the cold start" in report
    assert corrective and all(
        t.turns[t.metadata["corrupted_turn"]].tool_result is None
        or not t.turns[t.metadata["corrupted_turn"]].tool_result.ok
        for t in corrective
    )
