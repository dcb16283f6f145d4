"""Resume restores every RNG stream: checked where it matters, on a model with dropout.

The toy has no dropout, so on it a resume that forgot the RNG state still reproduces the
uninterrupted run. The tiny Hugging Face student with LoRA dropout 0.1 draws a dropout mask
at every training forward; only a resume that restores the torch (and Python/NumPy) RNG
streams reproduces the adapters bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import interrupt_cycle
from miniverl.config.models import RunConfig
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint
from miniverl.training.recipe import OPDTrainer

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
]


def _config(student: Path, teacher: Path) -> RunConfig:
    return RunConfig.from_mapping(
        {
            "run": {"name": "hf-dropout", "seed": 3},
            "models": {
                "backend": "hf",
                "device": "cpu",
                "student": {
                    "model_id": str(student),
                    "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.1},
                },
                "teacher": {"model_id": str(teacher), "lora": {"enabled": False}},
            },
            "environment": {"train_tasks": 4, "eval_tasks": 1},
            "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 8, "max_total_tokens": 200},
            "loss": {"top_k": 8},
            "eval": {"baseline": False, "after_warmup": False},
            "train": {"cycles": 2, "rollouts_per_cycle": 1, "sft_warmup_cycles": 1,
                      "checkpoint_every": 1, "lr": 0.01},
        }
    )  # fmt: skip


def test_resume_restores_every_rng_stream_bit_identical_lora_dropout_adapters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    student = build_tiny_hf_checkpoint(tmp_path / "student", hidden_size=32, seed=0)
    teacher = build_tiny_hf_checkpoint(tmp_path / "teacher", hidden_size=48, seed=0)
    config = _config(student, teacher)
    straight = OPDTrainer(config, output_dir=tmp_path / "straight", quiet=True)
    straight.train()

    with monkeypatch.context() as m:
        interrupt_cycle(m, 0, before_checkpoint=False)
        with pytest.raises(KeyboardInterrupt):
            OPDTrainer(config, output_dir=tmp_path / "resumed", quiet=True).train()
    # a fresh process would start from a different RNG state; make that explicit here
    torch.manual_seed(987654321)
    resumed = OPDTrainer(config, output_dir=tmp_path / "resumed", resume=True, quiet=True)
    resumed.train()

    a = load_file(str(straight.paths.final_checkpoint / "adapter.safetensors"))
    b = load_file(str(resumed.paths.final_checkpoint / "adapter.safetensors"))
    assert a.keys() == b.keys() and any("lora_" in k for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_resumed_run_keeps_the_probes_decisions_of_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode-step probe times the machine, so a resumed run on a busier or idler host
    could choose bf16 rollout weights where the start chose float32 (or the reverse) and
    sample other episodes. A resumed run plans from ``config.resolved.yaml`` instead: with
    every probe decision after the first run's start flipped, it is still bit-identical."""
    import miniverl.training.resolve as resolve

    real = resolve.resolve_rollout_dtype
    decided: list[str] = []

    def flipping(config: RunConfig, **kwargs: object) -> tuple[str, str]:
        chosen, why = real(config, **kwargs)  # type: ignore[arg-type]
        if config.models.rollout_dtype == "auto":  # a probe decision, not a recorded one
            decided.append(chosen)
            if len(decided) > 2:  # the straight run's and the first start's stand
                chosen = "bfloat16" if chosen == "model" else "model"
        return chosen, why

    monkeypatch.setattr(resolve, "resolve_rollout_dtype", flipping)
    test_resume_restores_every_rng_stream_bit_identical_lora_dropout_adapters(tmp_path, monkeypatch)
    assert len(decided) == 2  # the resumed run asked no probe
