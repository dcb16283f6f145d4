"""``miniverl demo --fast`` produces every artifact of docs/design.md §5 with valid contents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miniverl.cache.store import TeacherCache
from miniverl.config.presets import demo_cold_start_path, demo_teacher_path
from miniverl.schemas.trajectory import MODEL_GENERATED_SPAN_TYPES
from miniverl.training.checkpoint import read_marker
from miniverl.trajectory.io import read_trajectories
from miniverl.utils.hashing import sha256_file
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.slow

MANIFEST_FIELDS = {
    "miniverl_version", "run_id", "created_at", "git_commit", "python", "os", "packages", "gpu", "mode",
    "seed", "deterministic", "environment", "models", "tokenizer", "objective", "memory_plan",
    "global_optimizer_step", "parameter_version", "rollout_policy_version", "measurement_status", "role_graph",
}  # fmt: skip


def test_every_artifact_exists(demo_fast_run: Path) -> None:
    paths = RunPaths(demo_fast_run)
    for path in (
        paths.config_submitted, paths.config_validated, paths.config_original, paths.config_resolved,
        paths.manifest, paths.environment, paths.metrics, paths.events, paths.trajectories,
        paths.eval_trajectories, paths.token_analysis, paths.teacher_cache / "index.json",
        paths.final_checkpoint / "adapter.safetensors", paths.final_checkpoint / "optimizer.safetensors",
        paths.final_checkpoint / "state.json", paths.final_checkpoint / "checkpoint.json",
        paths.eval_json, paths.report_html, paths.summary_md,
    ):  # fmt: skip
        assert path.is_file() and path.stat().st_size > 0, path
    assert list(paths.teacher_cache.glob("shard-*.safetensors"))


def test_contents_validate(demo_fast_run: Path) -> None:
    paths = RunPaths(demo_fast_run)
    trajectories = read_trajectories(paths.trajectories)
    # the warm-up is the packaged cold start, so the opd run holds its own rollouts only
    assert {t.metadata["source"] for t in trajectories} == {"policy"}
    assert read_trajectories(paths.eval_trajectories)
    TeacherCache.open(paths.teacher_cache).validate()
    marker = read_marker(paths.final_checkpoint)
    manifest = json.loads(paths.manifest.read_text())
    assert set(manifest) >= MANIFEST_FIELDS
    assert marker["config_digest"] == manifest["config_digest"]
    assert manifest["measurement_status"]["gpu_memory"] == "not_run_no_cuda"
    assert manifest["memory_plan"]["reason"]
    assert manifest["teacher_checkpoint"]["sha256"] == sha256_file(demo_teacher_path())
    env = json.loads(paths.environment.read_text())
    text = json.dumps(env)
    assert str(Path.home()) not in text and "hostname" not in text


def test_token_analysis_only_covers_tokens_the_policy_emitted(demo_fast_run: Path) -> None:
    paths = RunPaths(demo_fast_run)
    by_id = {t.trajectory_id: t for t in read_trajectories(paths.trajectories)}
    rows = [json.loads(line) for line in paths.token_analysis.read_text().splitlines()]
    assert rows
    for row in rows:
        traj = by_id[row["trajectory_id"]]
        j = row["target_position"]
        assert row["prediction_position"] == j - 1
        assert (
            traj.model_generated_mask[j] and traj.span_at(j).span_type in MODEL_GENERATED_SPAN_TYPES
        )
        assert traj.token_ids[j] == row["token_id"]


def test_events_tell_the_run_in_order(demo_fast_run: Path) -> None:
    events = [
        json.loads(line)["event"]
        for line in RunPaths(demo_fast_run).events.read_text().splitlines()
    ]
    order = [
        "run_start",
        "benchmark_cold_start_loaded",
        "rollouts_collected",
        "token_analysis_written",
        "run_end",
    ]
    positions = [events.index(e) for e in order]
    assert positions == sorted(positions)
    assert events[-1] == "run_end"


def test_the_comparison_continues_every_policy_from_the_warm_ups_stored_errors(
    demo_fast_run: Path,
) -> None:
    """comparison.json's recovery counts rest on the deviated episodes stored with the packaged
    cold start, those of the run's held-out tasks (``--fast`` evaluates 4 of them), with a
    count for the start, both arms and the teacher, none above the states."""
    comparison = json.loads(RunPaths(demo_fast_run).comparison_json.read_text())
    recovery = comparison["recovery"]
    held_out = {t.task_id for t in read_trajectories(RunPaths(demo_fast_run).eval_trajectories)}
    stored = read_trajectories(demo_cold_start_path() / "fixed-states.jsonl")
    assert len(stored) == 29
    assert recovery["states"] == len([t for t in stored if t.task_id in held_out])
    assert set(recovery["recovered"]) == {"start", "opd", "offline_kd", "teacher"}
    assert all(0 <= n <= recovery["states"] for n in recovery["recovered"].values())
    assert comparison["teacher_success"] == recovery["teacher_solved"] / recovery["tasks"]
    assert recovery["tasks"] == comparison["arms"][0]["final"]["tasks"]
