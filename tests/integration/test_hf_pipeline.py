"""The whole OPD cycle on the Hugging Face backend, on the CPU, with tiny local checkpoints.

Student and teacher are random tiny Qwen3 models saved with ``save_pretrained`` and loaded
through the same ``from_pretrained`` path a real checkpoint uses; they share one tokenizer
trained locally with ``tokenizers``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from miniverl.cache.store import TeacherCache
from miniverl.config.models import RunConfig
from miniverl.errors import TokenizerMismatchError
from miniverl.models.factory import build_tokenizer
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint
from miniverl.training.recipe import OPDTrainer

pytest.importorskip("transformers")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "student": build_tiny_hf_checkpoint(root / "student", hidden_size=64, seed=0),
        "teacher": build_tiny_hf_checkpoint(root / "teacher", hidden_size=96, num_layers=3, seed=0),
        "other": build_tiny_hf_checkpoint(root / "other", hidden_size=64, seed=5),
    }


def _config(student: Path, teacher: Path, *extra: str) -> RunConfig:
    base = {
        "run": {"name": "hf-tiny", "seed": 3},
        "models": {
            "backend": "hf",
            "device": "cpu",
            "student": {"model_id": str(student), "lora": {"enabled": True, "r": 4, "alpha": 8}},
            "teacher": {"model_id": str(teacher), "lora": {"enabled": False}},
        },
        "environment": {"train_tasks": 4, "eval_tasks": 2},
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 12, "max_total_tokens": 300},
        "loss": {"top_k": 8},
        "train": {"cycles": 2, "rollouts_per_cycle": 2, "sft_warmup_cycles": 1},
    }
    return RunConfig.from_mapping(base).with_overrides(extra)


def test_opd_runs_end_to_end_on_the_hf_backend(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    trainer = OPDTrainer(
        _config(checkpoints["student"], checkpoints["teacher"]),
        output_dir=tmp_path / "run",
        quiet=True,
    )
    summary = trainer.train()
    assert summary["global_optimizer_step"] == 3 == trainer.state.parameter_version
    TeacherCache.open(trainer.paths.teacher_cache).validate()
    adapter = load_file(str(trainer.paths.final_checkpoint / "adapter.safetensors"))
    assert adapter and all("lora_" in name for name in adapter), (
        "only adapter weights are checkpointed"
    )
    manifest = json.loads(trainer.paths.manifest.read_text())
    assert manifest["models"]["student"]["capabilities"]["lora"] is True
    assert manifest["models"]["teacher"]["capabilities"]["backend"] == "hf"
    resolved = json.dumps(trainer.resolved_config.to_dict())
    assert '"top_k": 8' in resolved and '"device": "cpu"' in resolved


def test_a_teacher_with_another_tokenizer_is_refused(checkpoints: dict[str, Path]) -> None:
    config = _config(checkpoints["student"], checkpoints["other"])
    with pytest.raises(TokenizerMismatchError, match="supports same-tokenizer distillation only"):
        build_tokenizer(config)


def test_same_tokenizer_different_model_is_accepted(checkpoints: dict[str, Path]) -> None:
    tokenizer = build_tokenizer(_config(checkpoints["student"], checkpoints["teacher"]))
    assert tokenizer.vocab_size >= 300
