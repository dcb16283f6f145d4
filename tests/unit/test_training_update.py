"""The update mechanics the trainer composes: group gradients, the lr schedule, the commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import oracle_trajectories, tiny_config
from miniverl.config.models import RunConfig
from miniverl.errors import GpuMemoryError
from miniverl.models.toy import ToyModelConfig
from miniverl.training import recipe
from miniverl.training.optim import Schedule, build_optimizer, scheduled_lr
from miniverl.training.recipe import GroupResult, OPDTrainer, apply_update
from miniverl.training.sources import hard_label_sample
from miniverl.utils.logging import EventLog

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ToyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _train(**fields: object):  # type: ignore[no-untyped-def]
    return RunConfig.from_mapping({"train": fields}).train


# ---------------------------------------------------------------- learning rate


def test_the_lr_counts_from_the_main_phase_start_and_the_warmup_is_constant() -> None:
    schedule = Schedule(peak_lr=1.0, kind="linear", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    train = _train(lr=1.0, sft_lr=0.25)

    def lr(step: int, *, warmup: bool = False) -> float:
        return scheduled_lr(schedule, train, global_step=step, main_start_step=10, in_warmup=warmup)

    assert lr(3, warmup=True) == 0.25
    assert scheduled_lr(
        schedule, _train(lr=0.5), global_step=3, main_start_step=0, in_warmup=True
    ) == 0.5  # fmt: skip
    # Schedule step = global_step - main_start_step: ramp (0.5, 1.0), then linear decay to 0.1.
    assert [lr(s) for s in (10, 11, 12)] == [0.5, 1.0, 1.0]
    assert lr(14) == pytest.approx(0.55)
    assert lr(16) == pytest.approx(0.1) and lr(40) == pytest.approx(0.1)


# ---------------------------------------------------------------- commit


def _linear_with_grad(grad: float) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = build_optimizer(list(layer.parameters()), _train(lr=0.1, weight_decay=0.0))
    for p in layer.parameters():
        p.grad = torch.full_like(p, grad)
    return layer, optimizer


def test_a_nonfinite_gradient_is_dropped_and_the_weights_stay(tmp_path: Path) -> None:
    layer, optimizer = _linear_with_grad(float("nan"))
    before = [p.detach().clone() for p in layer.parameters()]
    events = EventLog(tmp_path / "events.jsonl")
    out = apply_update(
        optimizer, list(layer.parameters()), lr=0.1, max_grad_norm=1.0, events=events, global_step=7
    )
    assert not out.committed and out.lr == 0.1
    for p, b in zip(layer.parameters(), before, strict=True):
        assert torch.equal(p, b) and p.grad is None
    assert [(e["event"], e["global_optimizer_step"]) for e in events.events] == [
        ("update_skipped_nonfinite", 7)
    ]


def test_a_finite_gradient_steps_at_the_given_lr_and_reports_the_unclipped_norm(
    tmp_path: Path,
) -> None:
    layer, optimizer = _linear_with_grad(2.0)
    before = [p.detach().clone() for p in layer.parameters()]
    out = apply_update(
        optimizer,
        list(layer.parameters()),
        lr=0.05,
        max_grad_norm=1.0,
        events=EventLog(None),
        global_step=0,
    )
    assert out.committed and out.grad_norm == pytest.approx(2.0 * 8**0.5)
    assert optimizer.param_groups[0]["lr"] == 0.05
    for p, b in zip(layer.parameters(), before, strict=True):
        # AdamW's first step moves every weight by lr against the gradient's sign.
        torch.testing.assert_close(p.detach(), b - 0.05)
        assert p.grad is None


def test_the_trainer_bumps_its_versions_only_for_a_committed_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first update of the run gets a non-finite gradient: it is skipped and leaves the
    step, the parameter version and the fingerprint as they were; the next one commits."""
    original = recipe.apply_update
    calls: list[int] = []

    def first_skipped(optimizer, params, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            for p in params:
                p.grad = torch.full_like(p, float("inf"))
        return original(optimizer, params, **kwargs)

    monkeypatch.setattr(recipe, "apply_update", first_skipped)
    trainer = OPDTrainer(
        tiny_config("train.sft_warmup_cycles=0", "train.cycles=2"),
        output_dir=tmp_path / "run",
        quiet=True,
    )
    trainer.train()
    records = [json.loads(line) for line in trainer.paths.metrics.read_text().splitlines()]
    steps = [r for r in records if r.get("kind") == "step"]
    cycles = [r for r in records if r.get("kind") == "cycle"]
    assert [s["committed"] for s in steps] == [False, True]
    assert [(s["global_optimizer_step"], s["parameter_version"]) for s in steps] == [(0, 0), (1, 1)]
    assert steps[0]["policy_fingerprint"] == cycles[0]["policy_fingerprint_before"]
    assert steps[1]["policy_fingerprint"] != steps[0]["policy_fingerprint"]


# ---------------------------------------------------------------- the loss step


@pytest.fixture(scope="module")
def samples():  # type: ignore[no-untyped-def]
    rows = [hard_label_sample(t) for t in oracle_trajectories(3, difficulty="medium", seed=3)]
    assert len({r.trajectory.length for r in rows}) > 1, "lengths must differ to pad"
    return rows


@pytest.fixture
def trainer(tmp_path: Path) -> OPDTrainer:
    trainer = OPDTrainer(tiny_config("run.mode=sft"), output_dir=tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.student.set_train(False)
    return trainer


def _step(trainer: OPDTrainer, samples, *, chunk: int, rows: int) -> GroupResult:  # type: ignore[no-untyped-def]
    trainer.state.chunk_size, trainer.state.trajectory_batch_size = chunk, rows
    return trainer.loss_step(samples, teacher_targets=False)


def _grads(trainer: OPDTrainer) -> list[torch.Tensor]:
    return [p.grad.clone() for p in trainer.student.trainable_parameters()]


def test_the_group_gradient_is_the_mean_over_trajectories_whatever_the_batching(
    trainer: OPDTrainer,
    samples,  # type: ignore[no-untyped-def]
) -> None:
    one = _step(trainer, samples, chunk=16, rows=1)
    one_grads = _grads(trainer)
    singles = [_step(trainer, [s], chunk=64, rows=1) for s in samples]
    whole = _step(trainer, samples, chunk=64, rows=3)
    assert whole.loss == pytest.approx(sum(r.loss for r in singles) / 3, rel=1e-6)
    assert whole.loss == pytest.approx(one.loss, rel=1e-6)
    assert whole.positions == sum(s.num_positions for s in samples)
    for a, b in zip(_grads(trainer), one_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    fields = whole.step_fields()
    assert fields["selected_positions"] == whole.positions
    assert fields["teacher_entropy_mean"] is None and fields["high_entropy_fraction"] is None


def test_out_of_memory_halves_the_chunk_then_the_batch(
    trainer: OPDTrainer,
    samples,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = recipe.chunked_selected_position_loss
    calls: list[tuple[int, float]] = []

    def flaky(**kwargs):  # type: ignore[no-untyped-def]
        calls.append((kwargs["chunk_size"], kwargs["weight_normalizer"]))
        if kwargs["weight_normalizer"] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return original(**kwargs)

    monkeypatch.setattr(recipe, "chunked_selected_position_loss", flaky)
    result = _step(trainer, samples, chunk=64, rows=2)
    assert calls[:5] == [(64, 2), (32, 2), (16, 2), (64, 1), (64, 1)]
    assert (trainer.state.chunk_size, trainer.state.trajectory_batch_size) == (64, 1)
    assert result.positions == sum(s.num_positions for s in samples)
    events = [json.loads(line)["event"] for line in trainer.paths.events.read_text().splitlines()]
    assert [e for e in events if e.startswith("oom_")] == [
        "oom_chunk_retry",
        "oom_chunk_retry",
        "oom_batch_split",
    ]


def test_out_of_memory_with_one_row_at_the_smallest_chunk_is_a_clear_error(
    trainer: OPDTrainer,
    samples,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def oom(**kwargs):  # type: ignore[no-untyped-def]
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(recipe, "chunked_selected_position_loss", oom)
    with pytest.raises(GpuMemoryError, match="projection chunk size 16 with one trajectory"):
        _step(trainer, samples, chunk=32, rows=2)
