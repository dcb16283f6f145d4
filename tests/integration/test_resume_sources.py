"""Resume restores the sample source's state, from new and from pre-source checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from helpers import interrupt_cycle, tiny_config
from miniverl.training.checkpoint import MARKER_FILE, STATE_FILE
from miniverl.training.recipe import OPDTrainer
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import write_json

VOLATILE = {"seconds", "train_selected_tokens_per_second", "gpu", "time", "monotonic_s"}


def _stable(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def _as_pre_source_checkpoint(checkpoint: Path) -> None:
    """Rewrite ``state.json`` the way checkpoints were written before sample sources."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    state["offline_kd"] = state.pop("source")
    write_json(checkpoint / STATE_FILE, state)
    marker = json.loads((checkpoint / MARKER_FILE).read_text())
    marker["files"][STATE_FILE] = sha256_file(checkpoint / STATE_FILE)
    write_json(checkpoint / MARKER_FILE, marker)


def _interrupt_after_cycle_1(monkeypatch: pytest.MonkeyPatch, config: Any, run: Path) -> None:
    """Train ``config`` into ``run`` and kill it (KeyboardInterrupt) right after cycle 1's work,
    before that cycle's checkpoint."""
    with monkeypatch.context() as m:
        interrupt_cycle(m, 1, before_checkpoint=True)
        with pytest.raises(KeyboardInterrupt):
            OPDTrainer(config, output_dir=run, quiet=True).train()


@pytest.mark.parametrize("old_format", [False, True], ids=["source-key", "offline_kd-key"])
def test_offline_kd_resume_continues_the_pool_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_format: bool
) -> None:
    config = tiny_config("run.mode=offline_kd", "train.cycles=3", "train.checkpoint_every=1")
    straight = OPDTrainer(config, output_dir=tmp_path / "straight", quiet=True)
    straight.train()

    _interrupt_after_cycle_1(monkeypatch, config, tmp_path / "resumed")
    checkpoint = tmp_path / "resumed" / "checkpoints" / "cycle-0000"
    state = json.loads((checkpoint / STATE_FILE).read_text())
    assert state["source"]["cursor"] == config.train.rollouts_per_cycle
    if old_format:
        _as_pre_source_checkpoint(checkpoint)
    resumed = OPDTrainer(
        config, output_dir=tmp_path / "resumed", resume_from="cycle-0000", quiet=True
    )
    resumed.train()
    assert resumed.source.state_dict() == straight.source.state_dict()
    a = load_file(str(straight.paths.final_checkpoint / "adapter.safetensors"))
    b = load_file(str(resumed.paths.final_checkpoint / "adapter.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _stable(straight.paths.metrics) == _stable(resumed.paths.metrics)


@pytest.mark.parametrize("mode", ["seqkd", "kd_oracle", "gkd_mix"])
def test_new_arm_sources_resume_bit_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Stateless sources: a cycle's samples follow from (run seed, cycle, task cursor, step)."""
    config = tiny_config(f"run.mode={mode}", "train.cycles=3", "train.rollouts_per_cycle=4")
    straight = OPDTrainer(config, output_dir=tmp_path / "straight", quiet=True)
    straight.train()
    _interrupt_after_cycle_1(monkeypatch, config, tmp_path / "resumed")
    resumed = OPDTrainer(
        config, output_dir=tmp_path / "resumed", resume_from="cycle-0000", quiet=True
    )
    resumed.train()
    a = load_file(str(straight.paths.final_checkpoint / "adapter.safetensors"))
    b = load_file(str(resumed.paths.final_checkpoint / "adapter.safetensors"))
    assert a and all(torch.equal(a[k], b[k]) for k in a)
    assert _stable(straight.paths.metrics) == _stable(resumed.paths.metrics)
