"""A trajectory batch that does not fit is split (after the chunk retries) and recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import tiny_config
from miniverl.training import recipe, resolve
from miniverl.training.recipe import OPDTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _losses(trainer: OPDTrainer) -> list[float]:
    rows = [json.loads(line) for line in trainer.paths.metrics.read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("kind") == "step"]


def test_an_oom_at_the_smallest_chunk_halves_the_trajectory_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config("train.rollouts_per_cycle=4", "train.cycles=1")
    plain = OPDTrainer(config, output_dir=tmp_path / "plain", quiet=True)
    plain.train()
    assert plain.resolved_config.train.trajectory_batch_size == 4

    monkeypatch.setattr(resolve, "OOM_RETRIES", 0)  # no chunk halving: the batch at once
    original = recipe.chunked_selected_position_loss
    rows_seen: list[int] = []

    def flaky(**kwargs):  # type: ignore[no-untyped-def]
        rows = split.state.trajectory_batch_size
        rows_seen.append(rows)
        if rows > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return original(**kwargs)

    monkeypatch.setattr(recipe, "chunked_selected_position_loss", flaky)
    split = OPDTrainer(config, output_dir=tmp_path / "split", quiet=True)
    split.train()
    assert rows_seen[:3] == [4, 2, 1] and set(rows_seen[3:]) == {1}
    events = [json.loads(line) for line in split.paths.events.read_text().splitlines()]
    splits = [e for e in events if e["event"] == "oom_batch_split"]
    assert [(e["batch_size"], e["split_into"]) for e in splits] == [(4, [2, 2]), (2, [1, 1])]
    assert _losses(plain) == pytest.approx(_losses(split), rel=1e-5)
    manifest = json.loads(split.paths.manifest.read_text())
    assert manifest["batching"]["trajectory_batch_planned"] == 4
    assert manifest["batching"]["trajectory_batch_size"] == 1
    assert manifest["batching"]["cpu_threads"] == split.resolved.cpu_threads
