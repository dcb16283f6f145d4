"""Resume equivalence, config-digest refusal and the checkpoint completion marker."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import interrupt_cycle, tiny_config
from miniverl.errors import CheckpointError
from miniverl.training.checkpoint import find_latest_checkpoint, load_checkpoint, read_marker
from miniverl.training.recipe import OPDTrainer

VOLATILE = {"seconds", "train_selected_tokens_per_second", "gpu", "time", "monotonic_s"}


def _stable(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, cycle: int) -> None:
    """The work of ``cycle`` happens, but its checkpoint never does."""
    interrupt_cycle(monkeypatch, cycle, before_checkpoint=True)


@pytest.mark.parametrize(
    "overrides",
    [
        (),
        ("train.sft_warmup_cycles=0", "train.checkpoint_every=1"),
        ("run.mode=offline_kd",),
        ("teacher.mode=privileged_context", "memory.strategy=swap"),
    ],
    ids=["opd", "opd-no-warmup", "offline_kd", "privileged-swap"],
)
def test_resume_reaches_the_uninterrupted_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...]
) -> None:
    config = tiny_config("train.cycles=3", *overrides)
    straight = OPDTrainer(config, output_dir=tmp_path / "straight", quiet=True)
    straight.train()

    with monkeypatch.context() as m:
        _interrupt_at(m, 2)
        interrupted = OPDTrainer(config, output_dir=tmp_path / "resumed", quiet=True)
        with pytest.raises(KeyboardInterrupt):
            interrupted.train()
    assert find_latest_checkpoint(tmp_path / "resumed" / "checkpoints").name == "cycle-0001"

    resumed = OPDTrainer(config, output_dir=tmp_path / "resumed", resume=True, quiet=True)
    resumed.train()

    a = load_file(str(straight.paths.final_checkpoint / "adapter.safetensors"))
    b = load_file(str(resumed.paths.final_checkpoint / "adapter.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert _stable(straight.paths.metrics) == _stable(resumed.paths.metrics)
    assert _stable(straight.paths.trajectories) == _stable(resumed.paths.trajectories)
    assert _stable(straight.paths.token_analysis) == _stable(resumed.paths.token_analysis)
    summary_a = json.loads(straight.paths.eval_json.read_text())
    summary_b = json.loads(resumed.paths.eval_json.read_text())
    for key in ("evaluations", "parameter_version", "global_optimizer_step"):
        assert summary_a[key] == summary_b[key]

    events = [json.loads(line)["event"] for line in resumed.paths.events.read_text().splitlines()]
    after = events[events.index("resumed") :]
    assert "checkpoint_loaded" in events
    assert "toy_teacher_fitted" not in after and "sft_warmup_start" not in after
    assert sum(1 for e in after if e == "eval") == 1, (
        "only the final evaluation runs after a resume"
    )


def test_resume_refuses_a_changed_config(tmp_path: Path) -> None:
    OPDTrainer(tiny_config("train.cycles=1"), output_dir=tmp_path / "run", quiet=True).train()
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "final")
    changed = OPDTrainer(
        tiny_config("train.cycles=1", "train.lr=0.01"),
        output_dir=tmp_path / "run",
        resume=True,
        quiet=True,
    )
    with pytest.raises(CheckpointError, match="different config"):
        changed.train()


def test_resume_of_a_finished_run_is_refused(tmp_path: Path) -> None:
    OPDTrainer(tiny_config("train.cycles=1"), output_dir=tmp_path / "run", quiet=True).train()
    with pytest.raises(CheckpointError, match="already finished"):
        OPDTrainer(
            tiny_config("train.cycles=1"), output_dir=tmp_path / "run", resume=True, quiet=True
        ).train()


def test_a_checkpoint_without_its_marker_is_never_loaded(tmp_path: Path) -> None:
    trainer = OPDTrainer(tiny_config("train.cycles=2"), output_dir=tmp_path / "run", quiet=True)
    trainer.train()
    checkpoints = trainer.paths.checkpoints
    shutil.rmtree(checkpoints / "final")
    latest = find_latest_checkpoint(checkpoints)
    assert latest is not None and latest.name == "cycle-0001"
    (latest / "checkpoint.json").unlink()
    with pytest.raises(CheckpointError, match=re.escape("no checkpoint.json")):
        load_checkpoint(latest)
    assert find_latest_checkpoint(checkpoints).name == "warmup"


def test_a_tampered_checkpoint_file_is_refused(tmp_path: Path) -> None:
    trainer = OPDTrainer(tiny_config("train.cycles=1"), output_dir=tmp_path / "run", quiet=True)
    trainer.train()
    final = trainer.paths.final_checkpoint
    read_marker(final)
    state = json.loads((final / "state.json").read_text())
    state["global_step"] += 1
    (final / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        load_checkpoint(final)


def test_a_new_run_refuses_to_overwrite_an_existing_one(tmp_path: Path) -> None:
    from miniverl.errors import RunDirectoryError

    OPDTrainer(tiny_config("train.cycles=1"), output_dir=tmp_path / "run", quiet=True).train()
    with pytest.raises(RunDirectoryError, match="already holds a run"):
        OPDTrainer(tiny_config("train.cycles=1"), output_dir=tmp_path / "run", quiet=True).train()


def test_resume_without_any_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        OPDTrainer(tiny_config(), output_dir=tmp_path / "empty", resume=True, quiet=True).train()
