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
from miniverl.training import recipe as trainer_module
from miniverl.training.recipe import OPDTrainer
from miniverl.training.sources import OnPolicySource
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
    original = trainer_module.build_source

    def build(mode, **kwargs):  # type: ignore[no-untyped-def]
        source = original(mode, **kwargs)
        source.runner = kwargs["teacher_runner"]()
        return source

    monkeypatch.setattr(trainer_module, "build_source", build)


@pytest.mark.parametrize("overrides", list(PATHS.values()), ids=list(PATHS))
def test_opd_rollouts_sampled_by_another_model_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...]
) -> None:
    _roll_out_with_the_teacher(monkeypatch)
    trainer = OPDTrainer(tiny_config(*overrides), output_dir=tmp_path / "run", quiet=True)
    with pytest.raises(OffPolicyError, match="was sampled by weights with policy fingerprint"):
        trainer.train()
    assert isinstance(OffPolicyError("x"), StaleCacheError)
    assert trainer.state.parameter_version == 1, "only the SFT warm-up step may have been committed"


def test_opd_rollouts_of_weights_changed_since_sampling_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same counter, different weights: the counter check cannot see this, the fingerprint does."""
    original = OnPolicySource.samples

    def build_then_nudge(self: OnPolicySource, *args, **kwargs):  # type: ignore[no-untyped-def]
        samples = original(self, *args, **kwargs)
        with torch.no_grad():
            self.student.trainable_parameters()[0].view(-1)[0] += 1e-3
        return samples

    monkeypatch.setattr(OnPolicySource, "samples", build_then_nudge)
    trainer = OPDTrainer(
        tiny_config("cache.enabled=false"), output_dir=tmp_path / "run", quiet=True
    )
    with pytest.raises(OffPolicyError, match="the student about to be updated has fingerprint"):
        trainer.train()


@pytest.fixture(scope="module")
def opd_run(tmp_path_factory: pytest.TempPathFactory) -> OPDTrainer:
    """One strict OPD run, sampling at 0.5 and matching at 1.0 (as both shipped recipes do)."""
    trainer = OPDTrainer(
        tiny_config("rollout.temperature=0.5"),
        output_dir=tmp_path_factory.mktemp("opd") / "run",
        quiet=True,
    )
    trainer.train()
    return trainer


def test_opd_rollouts_come_from_the_current_student(opd_run: OPDTrainer) -> None:
    """Positive side: fingerprints are of the real weights and agree across records."""
    trainer = opd_run
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


def test_trainer_checks_the_alignment_digest_on_every_cache_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Targets cached for another alignment (selection or render) are refused on read."""
    original = TeacherCache.write

    def write_for_another_alignment(self, key, targets, **kwargs):  # type: ignore[no-untyped-def]
        tensors = targets.cache_tensors()
        return original(
            self, key, tensors, trajectory_id=targets.trajectory_id,
            policy_version=targets.policy_version, alignment_digest="f" * 64,
            policy_fingerprint=targets.policy_fingerprint,
        )  # fmt: skip

    monkeypatch.setattr(TeacherCache, "write", write_for_another_alignment)
    trainer = OPDTrainer(tiny_config(), output_dir=tmp_path / "run", quiet=True)
    with pytest.raises(StaleCacheError, match="were produced for a different alignment"):
        trainer.train()


def test_entropy_lower_bound_flag_reaches_metrics_token_analysis_and_report(
    opd_run: OPDTrainer,
) -> None:
    from miniverl.lab.report.report import write_report

    steps = _records(opd_run.paths.metrics, "step")
    assert [s["teacher_entropy_is_lower_bound"] for s in steps if s["phase"] == "opd"] == [
        True,
        True,
    ]
    assert all(s["teacher_entropy_is_lower_bound"] is None for s in steps if s["phase"] == "sft")
    tokens = [json.loads(line) for line in opd_run.paths.token_analysis.read_text().splitlines()]
    assert tokens and all(r["teacher_entropy_is_lower_bound"] is True for r in tokens)
    html, _md = write_report(opd_run.paths.root)
    text = Path(html).read_text(encoding="utf-8")
    assert "teacher entropy mean (lower bound)" in text
    assert "a lower bound on the teacher&#39;s full-vocabulary entropy" in text or (
        "a lower bound on the teacher's full-vocabulary entropy" in text
    )


def test_sampling_and_loss_temperatures_are_recorded_and_a_mismatch_is_explained(
    opd_run: OPDTrainer,
) -> None:
    from miniverl.training.sources import temperature_mismatch

    manifest = json.loads(opd_run.paths.manifest.read_text())
    assert manifest["objective"]["sampling_temperature"] == 0.5
    assert manifest["objective"]["loss_temperature"] == 1.0
    steps = _records(opd_run.paths.metrics, "step")
    for s in steps:
        expected = (None, None) if s["phase"] == "sft" else (0.5, 1.0)
        assert (s["sampling_temperature"], s["loss_temperature"]) == expected
    cycles = _records(opd_run.paths.metrics, "cycle")
    assert cycles and all(c["sampling_temperature"] == 0.5 for c in cycles)
    events = [json.loads(line) for line in opd_run.paths.events.read_text().splitlines()]
    warning = [e for e in events if e["event"] == "temperature_mismatch"]
    assert len(warning) == 1 and warning[0]["level"] == "warning"
    assert "samples its rollouts at rollout.temperature 0.5" in warning[0]["explanation"]
    assert "at loss.temperature 1:" in warning[0]["explanation"]
    assert "set loss.temperature=0.5" in warning[0]["explanation"]
    assert temperature_mismatch(tiny_config("rollout.temperature=1.0")) is None
    assert temperature_mismatch(tiny_config("run.mode=offline_kd")) is None
