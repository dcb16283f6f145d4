"""A resume checks every log against what its checkpoint vouched for, before touching disk.

A checkpoint records each append-only log's byte length and the SHA-256 of that prefix
(``training/checkpoint.py::verify_logs``). A log cut short inside the recorded length (appending
would tear a line), a log edited inside it (a resume would exit 0 and ``report`` break later) and
a ``state.json`` whose ``cycle`` the recipe could not have written are each a ``CheckpointError``
naming the file and the field, and the run directory is left byte for byte as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import tiny_config
from miniverl.errors import CheckpointError
from miniverl.training.checkpoint import MARKER_FILE
from miniverl.training.recipe import OPDTrainer
from miniverl.utils.hashing import sha256_file

OVERRIDES = ("train.cycles=2",)


@pytest.fixture(scope="module")
def interrupted_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("resume-logs") / "run"
    OPDTrainer(tiny_config(*OVERRIDES), output_dir=run, quiet=True).train()
    shutil.rmtree(run / "checkpoints" / "final")
    return run


@pytest.fixture
def interrupted(interrupted_once: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(interrupted_once, run)
    return run


def _latest_state(run: Path) -> dict:
    return json.loads((run / "checkpoints" / "cycle-0001" / "state.json").read_text())


def _tree(run: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def _cut_metrics(run: Path) -> str:
    recorded = _latest_state(run)["jsonl_sizes"]["metrics"]
    path = run / "metrics.jsonl"
    with open(path, "r+b") as handle:
        handle.truncate(recorded - 10)
    return f"shorter than the {recorded} bytes that checkpoint cycle-0001 recorded (field 'jsonl_sizes.metrics')"


def _edit_trajectories(run: Path) -> str:
    path = run / "trajectories.jsonl"
    data = bytearray(path.read_bytes())
    at = data.index(b'"token_ids": [') + len(b'"token_ids": [')
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    path.write_bytes(bytes(data))
    return "do not match the SHA-256 that checkpoint cycle-0001 recorded (field 'jsonl_digests.trajectories')"


def _huge_cycle(run: Path) -> str:
    directory = run / "checkpoints" / "cycle-0001"
    state = _latest_state(run)
    state["cycle"] = 5
    (directory / "state.json").write_text(json.dumps(state))
    marker = json.loads((directory / MARKER_FILE).read_text())
    marker["files"] = {name: sha256_file(directory / name) for name in marker["files"]}
    (directory / MARKER_FILE).write_text(json.dumps(marker))
    return "state.json: field 'cycle': 5 is outside [-1, 1] for train.cycles 2"


CASES: list[tuple[str, Callable[[Path], str]]] = [
    ("metrics-cut-inside-recorded-length", _cut_metrics),
    ("trajectories-edited-inside-recorded-length", _edit_trajectories),
    ("state-cycle-beyond-the-recipe", _huge_cycle),
]


@pytest.mark.parametrize("damage", [pytest.param(f, id=i) for i, f in CASES])
def test_a_damaged_log_or_state_refuses_the_resume_and_changes_nothing(
    interrupted: Path, damage: Callable[[Path], str]
) -> None:
    fragment = damage(interrupted)
    before = _tree(interrupted)
    with pytest.raises(CheckpointError) as caught:
        OPDTrainer(tiny_config(*OVERRIDES), output_dir=interrupted, resume=True, quiet=True).train()
    assert fragment in str(caught.value)
    assert caught.value.hint
    after = _tree(interrupted)
    after.pop("events.jsonl", None)
    before.pop("events.jsonl", None)
    assert after == before


def test_a_log_that_only_grew_after_the_checkpoint_resumes(interrupted: Path) -> None:
    """The normal kill: records written after the checkpoint are cut and written again."""
    with open(interrupted / "metrics.jsonl", "ab") as handle:
        handle.write(b'{"kind": "step", "torn')
    OPDTrainer(tiny_config(*OVERRIDES), output_dir=interrupted, resume=True, quiet=True).train()
    assert (interrupted / "eval.json").exists()
    for line in (interrupted / "metrics.jsonl").read_text().splitlines():
        json.loads(line)
