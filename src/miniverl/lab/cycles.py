"""One cycle of the recipe at a time, for the studies that time or inspect cycles one by one.

``OPDTrainer.train`` runs every cycle of a run under its lock. A benchmark that times one SFT
cycle against one OPD cycle (``benchmarks/cycle_floor.py``) or measures the student after a
few warm-up cycles (``benchmarks/smollm2_chain_headroom.py``) needs the loop body alone:
:func:`run_cycle` is that body, composed from the recipe's public pieces (the source's
``samples``, :meth:`~miniverl.training.recipe.OPDTrainer.loss_step`,
:func:`~miniverl.training.recipe.apply_update`), with the same optimizer groups, strict
on-policy check, learning rate and version bookkeeping. It writes no step or cycle records
and runs no evaluation or checkpoint. ``tests/integration/test_lab_cycles.py`` checks that
it leaves the student's weights exactly where ``train()`` leaves them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from miniverl.training.optim import scheduled_lr
from miniverl.training.recipe import GroupResult, OPDTrainer, UpdateOutcome, apply_update
from miniverl.training.sources import TrainingSample, check_on_policy

OnGroups = Callable[[Sequence[TrainingSample]], None]


def step(
    trainer: OPDTrainer,
    group: Sequence[TrainingSample],
    *,
    warmup: bool,
    teacher_targets: bool,
) -> tuple[GroupResult, UpdateOutcome]:
    """One optimizer group of a set-up ``trainer``: ``loss_step`` (loss and backward), then
    :func:`~miniverl.training.recipe.apply_update` (clip, ``optimizer.step()``) at the
    learning rate of the current step (the warm-up's with ``warmup``). The caller keeps the
    counters: what a committed update means for its run is its own bookkeeping."""
    state, cfg = trainer.state, trainer.config
    result = trainer.loss_step(group, teacher_targets=teacher_targets)
    lr = scheduled_lr(
        trainer.schedule,
        cfg.train,
        global_step=state.global_step,
        main_start_step=state.main_start_step,
        in_warmup=warmup,
    )
    update = apply_update(
        trainer.optimizer,
        trainer.student.trainable_parameters(),
        lr=lr,
        max_grad_norm=cfg.train.max_grad_norm,
        events=trainer.events,
        global_step=state.global_step,
    )
    return result, update


def run_cycle(
    trainer: OPDTrainer,
    cycle: int,
    *,
    warmup: bool,
    before_update: OnGroups | None = None,
    after_update: OnGroups | None = None,
) -> None:
    """Cycle ``cycle`` of a set-up ``trainer``: a warm-up cycle (oracle traces, hard labels, the
    warm-up learning rate) or one of the mode's cycles; the logs fsynced once at its end.

    ``before_update`` / ``after_update`` see the cycle's trainable samples around its updates
    (a benchmark's timer).
    """
    state, cfg = trainer.state, trainer.config
    source = trainer.warmup_source if warmup else trainer.source
    supervision = source.supervision
    batch = source.samples(cycle, trainer.next_tasks(source.tasks_per_cycle))
    rows = [s for s in batch.samples if s.trainable]
    if before_update is not None:
        before_update(rows)
    size = cfg.train.group_size()
    trainer.student.set_train(True)
    for _ in range(supervision.passes):
        for start in range(0, len(rows), size):
            group = rows[start : start + size]
            if supervision.strict_on_policy:
                state.refresh_fingerprint(trainer.student)
                check_on_policy(group, state.policy_fingerprint)
            _, update = step(
                trainer, group, warmup=warmup, teacher_targets=supervision.teacher_targets
            )
            if update.committed:
                state.global_step += 1
                state.parameter_version += 1
                state.refresh_fingerprint(trainer.student)
    trainer.student.set_train(False)
    if after_update is not None:
        after_update(rows)
    if not warmup:
        if batch.rollout_version is not None:
            state.rollout_version = batch.rollout_version
        source.finish_cycle(cycle)
    trainer.sync_logs()


def warm_up(trainer: OPDTrainer, cycles: int) -> None:
    """``cycles`` SFT warm-up cycles (numbered ``-cycles .. -1``, as ``train()`` numbers them);
    the mode's cycles then start from the step they end at."""
    trainer.state.in_warmup = True
    for k in range(cycles):
        run_cycle(trainer, k - cycles, warmup=True)
    trainer.state.in_warmup = False
    trainer.state.main_start_step = trainer.state.global_step


def fit_fixed_batch(
    trainer: OPDTrainer, samples: Sequence[TrainingSample], passes: int
) -> list[float]:
    """``passes`` passes of the recipe's optimizer groups over the same ``samples``
    (:func:`step` at the mode's learning rate, teacher targets on); each group's loss
    (nats/token). Why: the diagnostics that ask whether the student can fit one batch of its
    own states (``benchmarks/opd_target_ablation.py``, ``benchmarks/recovery_overfit.py``);
    off-policy after the first step by construction, so never an arm."""
    size = trainer.config.train.group_size()
    losses: list[float] = []
    trainer.student.set_train(True)
    for _ in range(passes):
        for start in range(0, len(samples), size):
            group = list(samples[start : start + size])
            result, update = step(trainer, group, warmup=False, teacher_targets=True)
            trainer.state.global_step += int(update.committed)
            losses.append(result.loss)
    trainer.student.set_train(False)
    return losses


__all__ = ["fit_fixed_batch", "run_cycle", "step", "warm_up"]
