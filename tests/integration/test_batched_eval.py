"""Held-out evaluation and training rollouts in batches equal the one-at-a-time path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import tiny_config
from miniverl.training.recipe import OPDTrainer
from miniverl.training.sources import OnPolicySource
from miniverl.trajectory.io import read_trajectories

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trainer(tmp_path: Path, name: str, *overrides: str) -> OPDTrainer:
    trainer = OPDTrainer(
        tiny_config("run.mode=sft", "environment.eval_tasks=10", *overrides),
        output_dir=tmp_path / name,
        quiet=True,
        progress=False,
    )
    trainer.setup()
    module = trainer.student.module  # type: ignore[attr-defined]
    module.double()
    with torch.no_grad():
        for pname, param in module.named_parameters():
            if "norm" not in pname:
                param.mul_(6.0)  # outputs depend on context, so a batching bug shows
    return trainer


def test_batched_evaluation_equals_unbatched(tmp_path: Path) -> None:
    dumps = {}
    for size in (1, 4, 32):
        trainer = _trainer(tmp_path, f"eval-{size}", f"eval.batch_size={size}")
        result = trainer.evaluate("probe", temperature=0.7)
        dumps[size] = (
            result["solved"],
            [t.model_dump(mode="json") for t in read_trajectories(trainer.paths.eval_trajectories)],
        )
    assert len(dumps[1][1]) == 10
    assert dumps[4] == dumps[1] and dumps[32] == dumps[1]


def _student_collector(trainer: OPDTrainer) -> OnPolicySource:
    """The opd source's rollout collection on an sft trainer (no teacher is needed to sample)."""
    return OnPolicySource(
        runner=trainer.runner,
        student=trainer.student,
        targets=None,  # type: ignore[arg-type]
        config=trainer.config,
        version=lambda: trainer.state.parameter_version,
        step=lambda: trainer.state.global_step,
        fingerprint=lambda: trainer.state.policy_fingerprint,
        events=trainer.events,
        progress=trainer.progress,
        trajectory_log=trainer.paths.trajectories,
    )


def test_batched_training_rollouts_equal_sequential(tmp_path: Path) -> None:
    collected = {}
    for size in ("1", "null"):
        trainer = _trainer(
            tmp_path, f"roll-{size}", f"rollout.batch_size={size}", "rollout.temperature=1.0"
        )
        tasks = trainer.next_tasks(6)
        collected[size] = [
            t.model_dump(mode="json") for t in _student_collector(trainer).collect(tasks, cycle=0)
        ]
    assert collected["1"] == collected["null"]
    assert len({tuple(t["token_ids"]) for t in collected["1"]}) > 1
