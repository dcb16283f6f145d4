"""``cold_start_identity``: one model directory is one model however the recipe spells it, a
converted GGUF is named by its digest, and what benchmark arms vary stays out of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import tiny_config
from miniverl.config.models import RunConfig
from miniverl.training.cold_start import cold_start_identity


def _hf(model_id: str, **extra: object) -> RunConfig:
    return RunConfig.from_mapping(
        {
            "models": {
                "backend": "hf",
                "student": {"model_id": model_id},
                "teacher": {"model_id": model_id},
            },
            **extra,
        }
    )


def test_a_relative_and_an_absolute_path_are_one_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    relative = cold_start_identity(_hf("models/m"))
    assert relative == cold_start_identity(_hf(str(tmp_path / "models" / "m")))
    assert relative["student_model"] == {"model_dir": str((tmp_path / "models" / "m").resolve())}
    (tmp_path / "other").mkdir()
    assert cold_start_identity(_hf("other"))["student_model"] != relative["student_model"]
    assert cold_start_identity(_hf("org/hub-model"))["student_model"] == {
        "model_id": "org/hub-model"
    }


def test_a_converted_model_is_named_by_its_gguf_digest(tmp_path: Path) -> None:
    (tmp_path / "miniverl_source.json").write_text(
        json.dumps({"gguf_sha256": "ab" * 32, "model": "smollm2-135m-instruct"})
    )
    identity = cold_start_identity(_hf(str(tmp_path)))
    assert identity["student_model"] == {"gguf_sha256": "ab" * 32, "model": "smollm2-135m-instruct"}


def test_what_benchmark_arms_vary_is_not_part_of_it() -> None:
    base = cold_start_identity(tiny_config())
    varied = tiny_config(
        "run.mode=sft",
        "run.seed=9",
        "train.lr=0.01",
        "train.cycles=3",
        "loss.divergence=reverse_kl",
    )
    assert cold_start_identity(varied) == base
    assert cold_start_identity(tiny_config("models.student.lora.r=4")) != base
