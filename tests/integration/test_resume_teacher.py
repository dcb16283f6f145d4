"""A resumed run distils from the teacher it started with.

The lab fits the toy teacher before a run and keeps it in the run directory; a resume loads
that file (verified against the record the manifest keeps) instead of fitting again, and the
core refuses a resume given a teacher whose weights are not the ones its checkpoint records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import interrupt_cycle, tiny_config
from miniverl.errors import CheckpointError
from miniverl.lab.run import start_run
from miniverl.lab.teachers.toy_fit import TOY_TEACHER_FILE
from miniverl.models.factory import build_teacher, build_tokenizer
from miniverl.training.recipe import OPDTrainer


def _events(run: Path) -> list[str]:
    lines = (run / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["event"] for line in lines]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy run with its fitted teacher, stopped after cycle 0's checkpoint."""
    run = tmp_path_factory.mktemp("resume-teacher") / "run"
    config = tiny_config("train.cycles=2", "train.checkpoint_every=1")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("MINIVERL_CACHE_DIR", str(run.parent / "cache"))
        interrupt_cycle(m, 0, before_checkpoint=False)
        with pytest.raises(KeyboardInterrupt):
            start_run(config, output_dir=run).train()
    return run


def test_a_resume_distils_from_the_runs_own_teacher_file(
    interrupted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINIVERL_CACHE_DIR", str(tmp_path / "empty-cache"))  # nothing to reuse
    fitted = _events(interrupted).count("toy_teacher_fitted")
    trainer = start_run(
        tiny_config("train.cycles=2", "train.checkpoint_every=1"),
        output_dir=interrupted,
        resume=True,
    )
    kept = load_file(str(interrupted / TOY_TEACHER_FILE))
    live = trainer.teacher.full_state_dict()
    assert kept.keys() == live.keys() and all(torch.equal(kept[k], live[k]) for k in kept)
    trainer.train()
    assert _events(interrupted).count("toy_teacher_fitted") == fitted == 1, "never refitted"
    manifest = json.loads((interrupted / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["teacher"]["weights_sha256"] == trainer.teacher_record["weights_sha256"]


def test_a_resume_given_another_teacher_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tiny_config("train.cycles=2", "train.checkpoint_every=1")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("MINIVERL_CACHE_DIR", str(tmp_path / "cache"))
        interrupt_cycle(m, 0, before_checkpoint=False)
        with pytest.raises(KeyboardInterrupt):
            start_run(config, output_dir=run).train()
    other = build_teacher(config, build_tokenizer(config), "cpu")
    resumed = OPDTrainer(
        config,
        output_dir=run,
        resume=True,
        quiet=True,
        teacher=other,
        teacher_record={"weights_sha256": "0" * 64},
    )
    with pytest.raises(CheckpointError, match=r"is not the one .* started with"):
        resumed.train()
