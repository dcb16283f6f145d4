"""Each mode end to end on the toy backend, and the policy-version contract of OPD."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import tiny_config
from miniverl.cache.store import TeacherCache
from miniverl.errors import StaleCacheError
from miniverl.lab.run import start_run
from miniverl.training.recipe import OPDTrainer
from miniverl.training.sources import OnPolicySource
from miniverl.trajectory.io import read_trajectories

STEP_FIELDS = {
    "phase", "cycle", "step", "global_optimizer_step", "parameter_version", "policy_version",
    "rollout_policy_version", "loss", "divergence_loss", "sampled_token_nll", "grad_norm", "lr",
    "selected_positions", "trajectories_in_step", "teacher_entropy_mean", "loss_by_span_type",
    "seconds", "train_selected_tokens_per_second", "projection_chunk_size", "gpu",
}  # fmt: skip


def _records(path: Path, kind: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]


def _events(trainer: OPDTrainer) -> list[str]:
    return [e["event"] for e in _records(trainer.paths.events)]


def _run(tmp_path: Path, *overrides: str, name: str = "run") -> OPDTrainer:
    """A run as ``miniverl train`` starts it: with the teacher the lab fits for it."""
    trainer = start_run(tiny_config(*overrides), output_dir=tmp_path / name)
    trainer.train()
    return trainer


def test_opd_end_to_end(tmp_path: Path) -> None:
    trainer = _run(tmp_path)
    steps = _records(trainer.paths.metrics, "step")
    assert steps and all(set(s) >= STEP_FIELDS for s in steps)
    assert all(s["gpu"] == {"status": "not_run_no_cuda"} for s in steps)
    assert [s["phase"] for s in steps] == ["sft", "opd", "opd"]
    # one strict update per rollout version: each OPD step consumes the version it was sampled at
    for s in steps:
        assert s["parameter_version"] == s["global_optimizer_step"]
    opd = [s for s in steps if s["phase"] == "opd"]
    assert [s["rollout_policy_version"] for s in opd] == [1, 2]
    assert trainer.state.parameter_version == trainer.state.global_step == 3
    policy = [
        t
        for t in read_trajectories(trainer.paths.trajectories)
        if t.metadata.get("source") == "policy"
    ]
    assert sorted({t.policy_version for t in policy}) == [1, 2]
    cache = TeacherCache.open(trainer.paths.teacher_cache)
    cache.validate()
    assert cache.stats()["versions"] == {1: 2, 2: 2}
    names = _events(trainer)
    assert "toy_teacher_fitted" in names or "toy_teacher_reused" in names
    for expected in ("run_start", "sft_warmup_start", "sft_warmup_cycle", "rollouts_collected",
                     "token_analysis_written", "eval", "checkpoint_saved", "run_end"):  # fmt: skip
        assert expected in names
    summary = json.loads(trainer.paths.eval_json.read_text())
    assert set(summary["evaluations"]) == {"baseline", "after_warmup", "final"}
    assert summary["final"]["parameter_version"] == 3


def test_opd_reading_another_version_is_stale(tmp_path: Path) -> None:
    trainer = _run(tmp_path)
    cache = TeacherCache.open(trainer.paths.teacher_cache)
    key = next(iter(cache.keys()))
    stored = cache.record(key).policy_version
    with pytest.raises(StaleCacheError):
        cache.read(key, expect_policy_version=stored + 1)
    assert cache.read(key, expect_policy_version=stored).num_positions > 0


def test_opd_trainer_refuses_targets_of_another_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = OPDTrainer(tiny_config(), output_dir=tmp_path / "run", quiet=True)
    monkeypatch.setattr(
        OnPolicySource, "expected_version", lambda self, rollout_version: rollout_version + 1
    )
    with pytest.raises(StaleCacheError):
        trainer.train()
    assert trainer.state.parameter_version == 1, "no update may be committed from stale targets"


def test_sft_mode_uses_no_teacher(tmp_path: Path) -> None:
    trainer = _run(tmp_path, "run.mode=sft")
    assert trainer.teacher is None and trainer.cache is None
    steps = _records(trainer.paths.metrics, "step")
    assert [s["phase"] for s in steps] == ["sft", "sft"]
    assert all(s["divergence_loss"] == 0.0 and s["teacher_entropy_mean"] is None for s in steps)
    assert all(s["loss"] == pytest.approx(s["sampled_token_nll"]) for s in steps)
    assert not trainer.paths.teacher_cache.exists()
    assert all(
        t.metadata["source"] == "oracle" for t in read_trajectories(trainer.paths.trajectories)
    )


def test_offline_kd_reuses_one_frozen_cache(tmp_path: Path) -> None:
    trainer = _run(tmp_path, "run.mode=offline_kd", "train.cycles=3")
    names = _events(trainer)
    assert names.count("offline_kd_reuse") == 2
    cache = TeacherCache.open(trainer.paths.teacher_cache)
    versions = cache.stats()["versions"]
    assert versions == {trainer.source.pool_version: trainer.config.environment.train_tasks}
    assert len(cache) == trainer.config.environment.train_tasks
    steps = _records(trainer.paths.metrics, "step")
    kd = [s for s in steps if s["phase"] == "offline_kd"]
    assert len(kd) == 3 and {s["rollout_policy_version"] for s in kd} == {
        trainer.source.pool_version
    }
    assert [s["parameter_version"] for s in kd] == [2, 3, 4]


def test_replay_is_labelled_and_takes_several_updates_per_rollout_version(tmp_path: Path) -> None:
    trainer = _run(tmp_path, "train.opd_freshness=replay", "train.replay_passes=2")
    assert trainer.config.objective_label() == "online_distillation_with_replay"
    manifest = json.loads(trainer.paths.manifest.read_text())
    assert manifest["objective"]["label"] == "online_distillation_with_replay"
    opd = [s for s in _records(trainer.paths.metrics, "step") if s["phase"] == "opd"]
    assert [s["rollout_policy_version"] for s in opd] == [1, 1, 3, 3]
    assert [s["parameter_version"] for s in opd] == [2, 3, 4, 5]


def test_privileged_context_teacher_runs_end_to_end(tmp_path: Path) -> None:
    trainer = _run(tmp_path, "teacher.mode=privileged_context", "train.cycles=1")
    cache = TeacherCache.open(trainer.paths.teacher_cache)
    assert cache.provenance.teacher_mode == "privileged_context"
    cache.validate()


def test_a_cycle_with_nothing_selected_is_skipped_and_leaves_the_version(tmp_path: Path) -> None:
    trainer = _run(tmp_path, "selection.selector=tool_and_final", "train.sft_warmup_cycles=0", "train.cycles=1",
                   "rollout.max_new_tokens_per_turn=4", "eval.after_warmup=false")  # fmt: skip
    cycles = _records(trainer.paths.metrics, "cycle")
    if cycles[0]["selection"]["selected_positions"]:
        pytest.skip("the random-init student happened to emit a tool-call or final block")
    assert "cycle_skipped_no_selected_positions" in _events(trainer)
    assert cycles[0]["skipped"] is True
    assert trainer.state.parameter_version == 0 and not _records(trainer.paths.metrics, "step")
