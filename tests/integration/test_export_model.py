"""``miniverl export-model``: the exported student loads in peft / transformers / safetensors
and computes the same logits as miniverl's own (in-memory, just trained) student."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from helpers import tiny_config
from miniverl.cli.main import app
from miniverl.config.models import RunConfig
from miniverl.export.model import load_exported_toy
from miniverl.training.recipe import OPDTrainer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def _export(run: Path, out: Path, *extra: str) -> object:
    result = CliRunner().invoke(app, ["export-model", str(run), "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return result


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------- toy backend


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> OPDTrainer:
    config = tiny_config(
        "models.student.lora.enabled=true", "models.student.lora.r=4", "train.sft_lr=0.05"
    )
    trainer = OPDTrainer(config, output_dir=tmp_path_factory.mktemp("toy") / "run", quiet=True)
    trainer.train()
    return trainer


def _toy_logits(decoder: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden, _ = decoder(ids)
        return decoder.project(hidden)


def test_toy_export_reproduces_the_students_logits(toy_run: OPDTrainer, tmp_path: Path) -> None:
    _export(toy_run.paths.root, tmp_path / "toy")
    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == [
        "config.json",
        "miniverl_export.json",
        "model.safetensors",
    ]
    decoder, meta = load_exported_toy(tmp_path / "toy")
    assert meta["config"]["lora_rank"] == 4
    assert meta["tokenizer_fingerprint"] == toy_run.tokenizer.fingerprint
    ids = _ids(decoder.config.vocab_size)
    expected = _toy_logits(toy_run.student.module, ids)
    assert torch.equal(_toy_logits(decoder, ids), expected)


def test_exported_files_are_readable_by_group_and_others(
    toy_run: OPDTrainer, tmp_path: Path
) -> None:
    """The directory is assembled in a 0700 ``mkdtemp`` and renamed into place; under umask
    022 the export must come out 0755 with 0644 files, like any file its user writes."""
    old = os.umask(0o022)
    try:
        _export(toy_run.paths.root, tmp_path / "shared")
    finally:
        os.umask(old)
    out = tmp_path / "shared"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == dict.fromkeys(
        ["config.json", "miniverl_export.json", "model.safetensors"], 0o644
    )


def test_toy_merge_folds_the_adapters(toy_run: OPDTrainer, tmp_path: Path) -> None:
    _export(toy_run.paths.root, tmp_path / "merged", "--merge")
    decoder, meta = load_exported_toy(tmp_path / "merged")
    assert meta["config"]["lora_rank"] == 0
    assert not [n for n, _ in decoder.named_parameters() if "lora" in n]
    ids = _ids(decoder.config.vocab_size)
    expected = _toy_logits(toy_run.student.module, ids)
    torch.testing.assert_close(_toy_logits(decoder, ids), expected, atol=1e-5, rtol=1e-5)
    # The adapters moved the model, so dropping them instead of folding them would show.
    base = {k: v for k, v in toy_run.student.full_state_dict().items() if "lora" not in k}
    decoder.load_state_dict(base, strict=False)
    assert (_toy_logits(decoder, ids) - expected).abs().max() > 1e-3


def test_export_refuses_to_overwrite_and_leaves_nothing(
    toy_run: OPDTrainer, tmp_path: Path
) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    result = CliRunner().invoke(
        app, ["export-model", str(toy_run.paths.root), "--out", str(target)]
    )
    assert result.exit_code == 1 and f"{target} already exists and is not empty" in result.stderr
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    result = CliRunner().invoke(
        app,
        [
            "export-model",
            str(toy_run.paths.root),
            "--out",
            str(tmp_path / "x"),
            "--checkpoint",
            "nope",
        ],
    )
    assert result.exit_code == 1 and not (tmp_path / "x").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".x.")]


# ----------------------------------------------------------------------------- hf backend

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[OPDTrainer, Path]:
    from miniverl.models.tiny_hf import build_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("hf")
    student = build_tiny_hf_checkpoint(root / "student", hidden_size=64, seed=0)
    teacher = build_tiny_hf_checkpoint(root / "teacher", hidden_size=96, num_layers=3, seed=0)
    config = RunConfig.from_mapping(
        {
            "run": {"name": "hf-export", "seed": 3},
            "models": {
                "backend": "hf",
                "device": "cpu",
                "student": {
                    "model_id": str(student),
                    "lora": {"enabled": True, "r": 4, "alpha": 8},
                },
                "teacher": {"model_id": str(teacher), "lora": {"enabled": False}},
            },
            "environment": {"train_tasks": 4, "eval_tasks": 1},
            "eval": {"baseline": False, "after_warmup": False},
            "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 8, "max_total_tokens": 200},
            "loss": {"top_k": 8},
            "train": {"cycles": 1, "rollouts_per_cycle": 2, "sft_warmup_cycles": 2, "sft_lr": 0.05},
        }
    )
    trainer = OPDTrainer(config, output_dir=root / "run", quiet=True)
    trainer.train()
    return trainer, student


def _hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft's load
def test_hf_adapter_loads_in_peft_with_equal_logits(
    hf_run: tuple[OPDTrainer, Path], tmp_path: Path
) -> None:
    trainer, base_dir = hf_run
    out = tmp_path / "adapter"
    _export(trainer.paths.root, out)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        base_dir
    )
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    ids = _ids(base.config.vocab_size)
    base_logits = _hf_logits(base, ids)
    loaded = peft.PeftModel.from_pretrained(base, out)
    expected = _hf_logits(trainer.student.model, ids)
    torch.testing.assert_close(_hf_logits(loaded, ids), expected, atol=1e-5, rtol=1e-5)
    assert (base_logits - expected).abs().max() > 1e-3, "the trained adapter must move the logits"


def test_hf_merged_loads_in_transformers_with_equal_logits(
    hf_run: tuple[OPDTrainer, Path], tmp_path: Path
) -> None:
    trainer, _ = hf_run
    out = tmp_path / "merged"
    result = _export(trainer.paths.root, out, "--merge")
    assert "exported hf_merged" in result.stdout
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" in names and "tokenizer.json" in names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pkl"))]
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not any("lora" in n for n, _ in model.named_parameters())
    ids = _ids(model.config.vocab_size)
    expected = _hf_logits(trainer.student.model, ids)
    torch.testing.assert_close(_hf_logits(model, ids), expected, atol=1e-4, rtol=1e-4)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.encode("<tool_call>", add_special_tokens=False) == trainer.tokenizer.encode(
        "<tool_call>"
    )
