"""The update mechanics the trainer composes: group gradients, the lr schedule, the commit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import oracle_trajectories, tiny_config
from miniverl.config.models import RunConfig
from miniverl.errors import GpuMemoryError
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend, ToyModelConfig
from miniverl.training.optim import Schedule, build_optimizer, scheduled_lr
from miniverl.training.recipe import GroupGradients, OPDTrainer, apply_update
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


def test_the_trainer_bumps_its_versions_only_for_a_committed_update(tmp_path: Path) -> None:
    trainer = OPDTrainer(tiny_config(), output_dir=tmp_path / "run", quiet=True)
    trainer.setup(write_artifacts=False)
    params = trainer.student.trainable_parameters()
    start = (
        trainer.state.global_step,
        trainer.state.parameter_version,
        trainer.state.policy_fingerprint,
    )

    for p in params:
        p.grad = torch.full_like(p, float("inf"))
    skipped = trainer.updater.commit()
    assert not skipped.committed
    assert (
        trainer.state.global_step,
        trainer.state.parameter_version,
        trainer.state.policy_fingerprint,
    ) == start

    for p in params:
        p.grad = torch.full_like(p, 0.01)
    committed = trainer.updater.commit()
    assert committed.committed
    assert (trainer.state.global_step, trainer.state.parameter_version) == (
        start[0] + 1,
        start[1] + 1,
    )
    assert trainer.state.policy_fingerprint != start[2]


# ---------------------------------------------------------------- group gradients


@pytest.fixture(scope="module")
def samples():  # type: ignore[no-untyped-def]
    rows = [hard_label_sample(t) for t in oracle_trajectories(3, difficulty="medium", seed=3)]
    assert len({r.trajectory.length for r in rows}) > 1, "lengths must differ to pad"
    return rows


def _gradients(events: EventLog, *, retries: int = 3) -> GroupGradients:
    student = ToyBackend(SMALL, ToyTokenizer(), model_id="toy-student", seed=4)
    student.set_train(False)
    optimizer = build_optimizer(student.trainable_parameters(), _train())
    return GroupGradients(
        student=student,
        optimizer=optimizer,
        pad_token_id=ToyTokenizer().pad_token_id,
        nll_weight=0.0,
        min_chunk_size=2,
        oom_retries=retries,
        events=events,
    )


def _grads(g: GroupGradients) -> list[torch.Tensor]:
    return [p.grad.clone() for p in g.student.trainable_parameters()]


def test_the_group_gradient_is_the_mean_over_trajectories_whatever_the_batching(
    samples,  # type: ignore[no-untyped-def]
) -> None:
    g = _gradients(EventLog(None))
    one = g.compute(samples, chunk_size=4, batch_rows=1, teacher_targets=False)
    one_grads = _grads(g)
    singles = []
    for s in samples:
        singles.append(g.compute([s], chunk_size=64, batch_rows=1, teacher_targets=False))
    whole = g.compute(samples, chunk_size=64, batch_rows=3, teacher_targets=False)
    assert whole.loss == pytest.approx(sum(r.loss for r in singles) / 3, rel=1e-6)
    assert whole.loss == pytest.approx(one.loss, rel=1e-6)
    assert whole.positions == sum(s.num_positions for s in samples)
    for a, b in zip(_grads(g), one_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    fields = whole.step_fields()
    assert fields["selected_positions"] == whole.positions
    assert fields["teacher_entropy_mean"] is None and fields["high_entropy_fraction"] is None


def test_out_of_memory_halves_the_chunk_then_the_batch(
    samples,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = EventLog(None)
    g = _gradients(events, retries=1)
    original = GroupGradients.compute
    calls: list[tuple[int, int]] = []

    def flaky(self: GroupGradients, group, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((kwargs["chunk_size"], kwargs["batch_rows"]))
        if kwargs["batch_rows"] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return original(self, group, **kwargs)

    monkeypatch.setattr(GroupGradients, "compute", flaky)
    result, chunk, rows = g.fitting_memory(
        samples, chunk_size=8, batch_rows=2, teacher_targets=False
    )
    assert calls == [(8, 2), (4, 2), (8, 1)] and (chunk, rows) == (8, 1)
    assert result.positions == sum(s.num_positions for s in samples)
    assert [e["event"] for e in events.events] == ["oom_chunk_retry", "oom_batch_split"]


def test_out_of_memory_with_one_row_at_the_smallest_chunk_is_a_clear_error(
    samples,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def oom(self: GroupGradients, group, **kwargs):  # type: ignore[no-untyped-def]
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(GroupGradients, "compute", oom)
    with pytest.raises(GpuMemoryError, match="projection chunk size 2"):
        _gradients(EventLog(None)).fitting_memory(
            samples, chunk_size=4, batch_rows=2, teacher_targets=False
        )
