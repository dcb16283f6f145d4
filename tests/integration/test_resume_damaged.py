"""A damaged latest checkpoint is an error, never a silent fallback; nothing is deleted.

Before: ``--resume`` skipped a tampered ``cycle-*`` checkpoint, resumed from ``warmup``,
truncated the logs, reran from cycle 0 and deleted the tampered directory.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import TINY_RUN_OVERRIDES, tiny_config
from miniverl.cli.main import app
from miniverl.errors import CheckpointError
from miniverl.training.checkpoint import read_marker
from miniverl.training.recipe import OPDTrainer

OVERRIDES = ("train.cycles=2",)


@pytest.fixture
def interrupted(tmp_path: Path) -> Path:
    """A run with checkpoints warmup and cycle-0001, as if stopped before ``final``."""
    run = tmp_path / "run"
    OPDTrainer(tiny_config(*OVERRIDES), output_dir=run, quiet=True).train()
    shutil.rmtree(run / "checkpoints" / "final")
    return run


def _tree(run: Path) -> dict[str, int]:
    return {
        str(p.relative_to(run)): p.stat().st_size
        for p in sorted(run.rglob("*"))
        if p.is_file() and "events.jsonl" not in p.name
    }


def _resume(run: Path, resume_from: str | None = None) -> OPDTrainer:
    return OPDTrainer(
        tiny_config(*OVERRIDES), output_dir=run, resume=True, resume_from=resume_from, quiet=True
    )


@pytest.mark.parametrize("damage", ["tampered", "incomplete"])
def test_a_damaged_latest_checkpoint_is_an_error_naming_the_file(
    interrupted: Path, damage: str
) -> None:
    latest = interrupted / "checkpoints" / "cycle-0001"
    if damage == "tampered":
        with open(latest / "adapter.safetensors", "ab") as handle:
            handle.write(b"\0")
        expected = re.escape(f"checkpoint file {latest / 'adapter.safetensors'} does not match")
    else:
        (latest / "checkpoint.json").unlink()
        expected = re.escape(f"{latest} has no checkpoint.json")
    before = _tree(interrupted)
    with pytest.raises(CheckpointError, match=expected) as info:
        _resume(interrupted).train()
    assert "--resume-from NAME" in info.value.hint and "warmup" in info.value.hint
    assert "nothing was loaded or deleted" in info.value.hint
    assert _tree(interrupted) == before, "a refused resume must not delete or truncate anything"


def test_resume_from_an_older_checkpoint_moves_newer_ones_aside_and_keeps_log_tails(
    interrupted: Path,
) -> None:
    latest = interrupted / "checkpoints" / "cycle-0001"
    with open(latest / "adapter.safetensors", "ab") as handle:
        handle.write(b"\0")
    tampered_bytes = (latest / "adapter.safetensors").read_bytes()
    metrics_before = (interrupted / "metrics.jsonl").read_bytes()
    _resume(interrupted, resume_from="warmup").train()
    read_marker(interrupted / "checkpoints" / "final")
    aside = list((interrupted / "checkpoints").glob(".superseded-*"))
    assert len(aside) == 1
    assert (aside[0] / "cycle-0001" / "adapter.safetensors").read_bytes() == tampered_bytes
    tail = (aside[0] / "metrics.jsonl.tail").read_bytes()
    assert metrics_before.endswith(tail) and tail, "the truncated log tail is kept, byte for byte"


def test_resume_from_names_a_missing_checkpoint_clearly(interrupted: Path) -> None:
    recipe = interrupted.parent / "tiny.yaml"
    data = yaml.safe_load(yaml.safe_dump(TINY_RUN_OVERRIDES))
    data["train"]["cycles"] = 2
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = CliRunner().invoke(
        app,
        ["train", str(recipe), "--output", str(interrupted), "--resume-from", "cycle-0007",
         "--quiet", "--no-report"],
    )  # fmt: skip
    assert result.exit_code != 0
    assert "--resume-from cycle-0007: no checkpoint directory" in result.output
    assert "warmup" in result.output and "cycle-0001" in result.output
