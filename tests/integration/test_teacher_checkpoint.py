"""``models.teacher.checkpoint``: a teacher that is another run's trained student.

Checked by values: after ``setup()`` the teacher's every tensor equals the checkpoint's, it is
frozen, its shape is the one the checkpoint records (whatever ``models.teacher.model_id``
says), no toy teacher is fitted, and the manifest names the weights by SHA-256. A run
directory, a checkpoint directory and a cold start resolve to verified weights; a tampered
file, a record that disagrees with its tensors and contradictory keys are refused with their
messages.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import export_cold_start, tiny_config
from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError, ConfigError
from miniverl.lab.config import with_lab
from miniverl.lab.run import start_run
from miniverl.training.recipe import OPDTrainer
from miniverl.training.teacher_checkpoint import resolve_teacher_weights


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy-student trained in sft mode: the teacher of the runs below."""
    root = tmp_path_factory.mktemp("teacher") / "run"
    OPDTrainer(tiny_config("run.mode=sft", "train.cycles=3"), output_dir=root, quiet=True).train()
    return root


def _student_run(tmp_path: Path, teacher: Path, *extra: str) -> OPDTrainer:
    """A run distilling from ``teacher``; ``models.teacher.model_id`` stays the default
    ``toy-teacher`` preset, which the checkpoint's own record (``toy-student``) overrules."""
    config = tiny_config("run.mode=opd", f"models.teacher.checkpoint={teacher}", *extra)
    return start_run(config, output_dir=tmp_path / "student")


def test_the_teacher_is_the_checkpoints_student_frozen_and_recorded(
    teacher_run: Path, tmp_path: Path
) -> None:
    trainer = _student_run(tmp_path, teacher_run)
    assert trainer.teacher.capabilities.model_id == "toy-student"
    trainer.train()
    weights = load_file(str(teacher_run / "checkpoints" / "final" / "adapter.safetensors"))
    live = trainer.teacher.full_state_dict()
    assert set(live) == set(weights)
    assert all(torch.equal(live[k], weights[k]) for k in weights)
    assert not any(p.requires_grad for p in trainer.teacher.trainable_parameters())
    manifest = json.loads(trainer.paths.manifest.read_text())
    _, digest = resolve_teacher_weights(teacher_run)
    assert manifest["teacher_checkpoint"]["sha256"] == digest
    assert manifest["teacher"] is None
    assert not (trainer.paths.root / "toy-teacher.safetensors").exists()  # nothing fitted


def test_run_checkpoint_and_cold_start_directories_resolve_to_verified_weights(
    teacher_run: Path, tmp_path: Path
) -> None:
    final = teacher_run / "checkpoints" / "final"
    assert resolve_teacher_weights(teacher_run) == resolve_teacher_weights(final)
    trainer = OPDTrainer(tiny_config("run.mode=opd"), output_dir=tmp_path / "cold", quiet=True)
    trainer.train()
    cold = export_cold_start(trainer, tmp_path / "cold-start")
    weights, _ = resolve_teacher_weights(cold)
    assert weights.name == "student.safetensors"
    tampered = tmp_path / "copy"
    tampered.mkdir()
    for f in final.iterdir():
        (tampered / f.name).write_bytes(f.read_bytes())
    data = bytearray((tampered / "adapter.safetensors").read_bytes())
    data[-1] ^= 1
    (tampered / "adapter.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the SHA-256 its directory records"):
        resolve_teacher_weights(tampered)
    with pytest.raises(CheckpointError, match="holds no trained student to use as the teacher"):
        resolve_teacher_weights(tmp_path)


def test_a_record_that_disagrees_with_its_tensors_is_refused(
    teacher_run: Path, tmp_path: Path
) -> None:
    """The checkpoint's config says another toy preset than its tensors have."""
    copy = tmp_path / "copy"
    shutil.copytree(teacher_run, copy)
    recorded = copy / "config.validated.yaml"
    data = yaml.safe_load(recorded.read_text())
    data["models"]["student"]["model_id"] = "toy-teacher"
    recorded.write_text(yaml.safe_dump(data))
    config = tiny_config("run.mode=opd", f"models.teacher.checkpoint={copy}")
    with pytest.raises(CheckpointError, match=r"is not a whole toy model of models\.teacher"):
        OPDTrainer(config, output_dir=tmp_path / "bad", quiet=True).setup()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("lab.oracle_teacher.smoothing=0.01", "models.teacher.checkpoint and lab.oracle_teacher both replace the teacher model: set one"),
        ("models.toy_fit.dagger.enabled=true", "models.teacher.checkpoint loads a trained teacher; lab.toy_fit.dagger.enabled would fit another: set it to false"),
    ],
)  # fmt: skip
def test_contradictory_keys_are_refused(extra: str, message: str) -> None:
    """Lab keys written at either place; the lab validates them with the core's keys."""
    with pytest.raises(ConfigError) as info:
        with_lab(tiny_config("models.teacher.checkpoint=runs/x", extra))
    assert message in str(info.value)
    with pytest.raises(ConfigError, match=r"models\.student\.checkpoint: not a setting"):
        tiny_config("models.student.checkpoint=runs/x")


def test_the_key_leaves_every_existing_digest_alone() -> None:
    config = tiny_config()
    assert "checkpoint" not in json.dumps(config.to_dict()["models"])
    assert RunConfig.from_mapping(config.to_dict()).digest() == config.digest()
