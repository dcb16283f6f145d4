"""Memory strategies, the OOM retry, and layout-invariance of the update (docs/objectives.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_config
from miniverl.config.models import RunConfig
from miniverl.errors import ConfigError, GpuMemoryError
from miniverl.training import recipe, resolve
from miniverl.training.recipe import OPDTrainer


def _losses(trainer: OPDTrainer) -> list[float]:
    rows = [json.loads(line) for line in trainer.paths.metrics.read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("kind") == "step"]


def _weights(trainer: OPDTrainer) -> dict[str, torch.Tensor]:
    return load_file(str(trainer.paths.final_checkpoint / "adapter.safetensors"))


def _loss_step(trainer: OPDTrainer, samples, *, chunk: int, rows: int):  # type: ignore[no-untyped-def]
    """``trainer.loss_step`` at projection chunk ``chunk`` and trajectory batch ``rows``."""
    trainer.state.chunk_size, trainer.state.trajectory_batch_size = chunk, rows
    return trainer.loss_step(samples, teacher_targets=True)


def test_resident_and_swap_give_the_same_losses(tmp_path: Path) -> None:
    resident = OPDTrainer(
        tiny_config("memory.strategy=resident"), output_dir=tmp_path / "resident", quiet=True
    )
    swap = OPDTrainer(tiny_config("memory.strategy=swap"), output_dir=tmp_path / "swap", quiet=True)
    resident.train()
    swap.train()
    assert resident.resolved.memory_plan.strategy == "resident"
    assert swap.resolved.memory_plan.strategy == "swap"
    assert _losses(resident) == _losses(swap)
    a, b = _weights(resident), _weights(swap)
    assert all(torch.equal(a[k], b[k]) for k in a)
    manifest = json.loads(swap.paths.manifest.read_text())
    assert manifest["memory_plan"]["reason"].startswith("requested: swap")


def test_an_injected_oom_halves_the_chunk_and_keeps_the_gradient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config("loss.chunk_size=64")
    plain = OPDTrainer(config, output_dir=tmp_path / "plain", quiet=True)
    plain.train()

    original = recipe.chunked_selected_position_loss
    seen: list[int] = []

    def flaky(**kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["chunk_size"])
        if kwargs["chunk_size"] > 16:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return original(**kwargs)

    monkeypatch.setattr(recipe, "chunked_selected_position_loss", flaky)
    retried = OPDTrainer(config, output_dir=tmp_path / "retried", quiet=True)
    retried.train()
    assert seen[:3] == [64, 32, 16]
    events = [json.loads(line) for line in retried.paths.events.read_text().splitlines()]
    retries = [e for e in events if e["event"] == "oom_chunk_retry"]
    assert [(e["previous_chunk_size"], e["chunk_size"]) for e in retries[:2]] == [
        (64, 32),
        (32, 16),
    ]
    assert _losses(plain) == pytest.approx(_losses(retried), rel=1e-6)
    a, b = _weights(plain), _weights(retried)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    steps = [json.loads(line) for line in retried.paths.metrics.read_text().splitlines()]
    assert {s["projection_chunk_size"] for s in steps if s.get("kind") == "step"} == {16}


def test_exhausted_retries_raise_gpu_memory_error_naming_five_knobs() -> None:
    exc = torch.cuda.OutOfMemoryError("CUDA out of memory")
    halvings, chunk, rows = 0, 256, 1
    with pytest.raises(GpuMemoryError) as info:
        while True:
            halvings, chunk, rows = resolve.after_oom(
                exc, halvings=halvings, chunk_size=chunk, batch_rows=rows, step_chunk_size=256
            )
    assert "chunk size 32 with one trajectory per batch after 3 retries" in info.value.message
    assert len(resolve.OOM_KNOBS) == 5 and all(
        knob in info.value.hint for knob in resolve.OOM_KNOBS
    )


def test_oom_halves_the_chunk_then_the_batch_and_other_errors_pass_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exc = RuntimeError("CUDA error: out of memory")
    sizes = [(0, 160, 4)]
    while len(sizes) < 7:
        h, c, r = sizes[-1]
        sizes.append(
            resolve.after_oom(exc, halvings=h, chunk_size=c, batch_rows=r, step_chunk_size=160)
        )
    assert sizes == [
        (0, 160, 4),
        (1, 80, 4),
        (2, 40, 4),
        (3, 20, 4),
        (0, 160, 2),
        (1, 80, 2),
        (2, 40, 2),
    ]

    trainer = OPDTrainer(tiny_config(), output_dir=tmp_path / "run", quiet=True)
    trainer.setup()
    samples = [s for s in trainer.source.samples(0, trainer.next_tasks(2)).samples if s.trainable]

    def broken(**kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("not a memory problem")

    monkeypatch.setattr(recipe, "chunked_selected_position_loss", broken)
    with pytest.raises(ValueError, match="not a memory problem"):
        _loss_step(trainer, samples, chunk=64, rows=2)


def _hf_quantized(strategy: str) -> RunConfig:
    return RunConfig.from_mapping(
        {
            "models": {
                "backend": "hf",
                "student": {"model_id": "some/student", "quantization": "nf4"},
                "teacher": {"model_id": "some/teacher"},
            },
            "memory": {"strategy": strategy},
        }
    )


def test_auto_with_a_quantized_model_resolves_to_resident_with_the_documented_reason() -> None:
    plan = resolve.resolve_strategy(_hf_quantized("auto"), device="cuda")
    assert plan.strategy == "resident"
    assert (
        plan.reason
        == "auto -> resident: a quantized model cannot be moved off the accelerator, so swap is unavailable"
    )


def test_swap_with_a_quantized_model_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("memory.strategy: swap is unavailable with a quantized model")
    ):
        _hf_quantized("swap")


def test_auto_on_cuda_uses_free_memory_and_headroom() -> None:
    config = RunConfig.from_mapping(
        {"memory": {"strategy": "auto", "auto_swap_vram_headroom_gb": 2.0}}
    )
    roomy = resolve.resolve_strategy(config, device="cuda", model_bytes=4 << 30, free_gib=10.0)
    tight = resolve.resolve_strategy(config, device="cuda", model_bytes=4 << 30, free_gib=5.0)
    assert (roomy.strategy, tight.strategy) == ("resident", "swap")
    assert "headroom 2.0 GiB" in roomy.reason and "would not be kept" in tight.reason
    assert resolve.resolve_strategy(config, device="cpu").strategy == "resident"


@pytest.mark.parametrize("batch_rows", [1, 2, 3, 4])
def test_the_group_loss_does_not_depend_on_the_micro_batch_layout(
    tmp_path: Path, batch_rows: int
) -> None:
    config = tiny_config("train.rollouts_per_cycle=4", "environment.train_tasks=8")
    trainer = OPDTrainer(config, output_dir=tmp_path / "layout", quiet=True)
    trainer.setup()
    samples = [s for s in trainer.source.samples(0, trainer.next_tasks(4)).samples if s.trainable]
    assert len(samples) >= 3

    def group_loss(rows: int) -> tuple[float, list[torch.Tensor]]:
        result = _loss_step(trainer, samples, chunk=7, rows=rows)
        return result.loss, [p.grad.clone() for p in trainer.student.trainable_parameters()]

    reference_loss, reference_grads = group_loss(1)
    loss, grads = group_loss(min(batch_rows, len(samples)))
    assert loss == pytest.approx(reference_loss, rel=1e-5, abs=1e-8)
    for g, r in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)
