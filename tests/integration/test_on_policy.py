"""Strict OPD is checked on the weights, not on a counter: the policy fingerprint.

Every rollout records the fingerprint of the weights that sampled it; the update refuses
a rollout whose fingerprint differs from the student's current weights, on every
supervision path (cache on/off, teacher resident/swapped, bucketed/exact targets).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_config
from miniverl.cache.store import TeacherCache
from miniverl.errors import OffPolicyError, StaleCacheError
from miniverl.models.fingerprint import backend_fingerprint, tensor_fingerprint
from miniverl.training.trainer import OPDTrainer
from miniverl.trajectory.io import read_trajectories

PATHS = {
    "bucketed-cache-resident": (),
    "bucketed-cache-swap": ("memory.strategy=swap",),
    "bucketed-no-cache": ("cache.enabled=false",),
    "exact-resident": ("loss.mode=exact_full_vocab", "loss.top_k=null", "memory.strategy=resident"),
    "exact-swap": ("loss.mode=exact_full_vocab", "loss.top_k=null", "memory.strategy=swap"),
}


def _records(path: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == kind]


def _roll_out_with_the_teacher(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-line bug of the review: the collection step samples from the teacher."""
    original = OPDTrainer._collect

    def collect(self: OPDTrainer, tasks, cycle):  # type: ignore[no-untyped-def]
        student_runner = self.runner
        self.runner = self._teacher_runner()
        try:
            return original(self, tasks, cycle)
        finally:
            self.runner = student_runner

    monkeypatch.setattr(OPDTrainer, "_collect", collect)


@pytest.mark.parametrize("overrides", list(PATHS.values()), ids=list(PATHS))
def test_opd_rollouts_sampled_by_another_model_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...]
) -> None:
    _roll_out_with_the_teacher(monkeypatch)
    trainer = OPDTrainer(tiny_config(*overrides), output_dir=tmp_path / "run", quiet=True)
    with pytest.raises(OffPolicyError, match="was sampled by weights with policy fingerprint"):
        trainer.train()
    assert isinstance(OffPolicyError("x"), StaleCacheError)
    assert trainer.parameter_version == 1, "only the SFT warm-up step may have been committed"


def test_opd_rollouts_of_weights_changed_since_sampling_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same counter, different weights: the counter check cannot see this, the fingerprint does."""
    original = OPDTrainer._build_samples

    def build_then_nudge(self: OPDTrainer, *args, **kwargs):  # type: ignore[no-untyped-def]
        samples = original(self, *args, **kwargs)
        with torch.no_grad():
            self.student.trainable_parameters()[0].view(-1)[0] += 1e-3
        return samples

    monkeypatch.setattr(OPDTrainer, "_build_samples", build_then_nudge)
    trainer = OPDTrainer(
        tiny_config("cache.enabled=false"), output_dir=tmp_path / "run", quiet=True
    )
    with pytest.raises(OffPolicyError, match="the student about to be updated has fingerprint"):
        trainer.train()


def test_opd_rollouts_come_from_the_current_student(tmp_path: Path) -> None:
    """Positive side: fingerprints are of the real weights and agree across records."""
    trainer = OPDTrainer(tiny_config(), output_dir=tmp_path / "run", quiet=True)
    trainer.train()
    steps = _records(trainer.paths.metrics, "step")
    opd = [s for s in steps if s["phase"] == "opd"]
    policy = [
        t for t in read_trajectories(trainer.paths.trajectories) if t.metadata["source"] == "policy"
    ]
    # each OPD step consumed rollouts of the weights committed by the step before it
    for before, step in itertools.pairwise(steps):
        if step["phase"] == "opd":
            assert step["rollout_policy_fingerprint"] == before["policy_fingerprint"]
    by_version = {t.policy_version: t.metadata["policy_fingerprint"] for t in policy}
    assert {s["rollout_policy_version"]: s["rollout_policy_fingerprint"] for s in opd} == by_version
    assert len(set(by_version.values())) == len(by_version) == 2
    cache = TeacherCache.open(trainer.paths.teacher_cache)
    for key in cache:
        record = cache.record(key)
        assert record.policy_fingerprint == by_version[record.policy_version]
    # the last recorded fingerprint is the digest of the weights actually saved
    final = load_file(str(trainer.paths.final_checkpoint / "adapter.safetensors"))
    names = [n for n, p in trainer.student.module.named_parameters() if p.requires_grad]
    assert tensor_fingerprint(final[n] for n in names) == steps[-1]["policy_fingerprint"]
    assert backend_fingerprint(trainer.student) == steps[-1]["policy_fingerprint"]
    assert backend_fingerprint(trainer.teacher) != steps[-1]["policy_fingerprint"]
