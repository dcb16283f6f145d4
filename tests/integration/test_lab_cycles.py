"""``miniverl.lab.cycles`` runs the recipe's loop body one cycle at a time for the benchmarks
that time or inspect cycles: it must leave the student exactly where ``OPDTrainer.train``
leaves it after the same warm-up cycle and the same OPD cycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from helpers import tiny_config
from miniverl.lab.cycles import run_cycle, warm_up
from miniverl.training.recipe import OPDTrainer

OVERRIDES = (
    "train.sft_warmup_cycles=1",
    "train.cycles=2",
    "eval.baseline=false",
    "eval.after_warmup=false",
)


def _weights(trainer: OPDTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.student.trainable_state_dict().items()}


class Snapshots:
    """A ``CycleStop`` that never stops: the student's weights after the warm-up (``begin``)
    and after every cycle."""

    def __init__(self) -> None:
        self.trainer: OPDTrainer | None = None
        self.taken: list[dict[str, torch.Tensor]] = []
        self.versions: list[int] = []

    def begin(self, paths: Any, events: Any) -> None:
        assert self.trainer is not None
        self.taken.append(_weights(self.trainer))

    def after_cycle(self, cycle: int, *, steps: int, global_step: int) -> bool:
        assert self.trainer is not None
        self.taken.append(_weights(self.trainer))
        self.versions.append(self.trainer.state.parameter_version)
        return False


def test_one_cycle_at_a_time_is_the_recipes_loop(tmp_path: Path) -> None:
    config = tiny_config(*OVERRIDES)
    snapshots = Snapshots()
    whole = OPDTrainer(
        config, output_dir=tmp_path / "whole", quiet=True, stop_after_cycle=snapshots
    )
    snapshots.trainer = whole
    whole.train()

    stepped = OPDTrainer(config, output_dir=tmp_path / "stepped", quiet=True)
    stepped.setup()
    warm_up(stepped, 1)
    mine = [_weights(stepped)]
    versions = []
    for cycle in range(2):
        run_cycle(stepped, cycle, warmup=False)
        mine.append(_weights(stepped))
        versions.append(stepped.state.parameter_version)

    assert versions == snapshots.versions and versions[-1] > versions[0] > 0
    assert len(mine) == len(snapshots.taken) == 3
    for got, want in zip(mine, snapshots.taken, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key
