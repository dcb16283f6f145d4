"""``PolicyUpdater``: optimize and commit -- the only code that changes the student's weights.

One cycle's trainable samples are cut into optimizer groups of ``train.group_size()`` rows;
each group is one gradient (``training/gradients.py``, with out-of-memory halving) and one
commit (``training/optim.py``: clip, scheduled lr, step). A committed update advances the
shared :class:`~miniverl.training.run_state.RunState`: ``global_step``, ``parameter_version``
and the policy fingerprint. Strict on-policy supervision checks every group's rollouts
against that fingerprint *before* the gradient (``training/onpolicy.py``), so a sample from
an older policy can never be trained on as if it were on-policy. One ``StepRecord`` per group
goes to ``metrics.jsonl``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from miniverl.config.models import RunConfig
from miniverl.models.base import CausalLMBackend
from miniverl.schemas.records import StepRecord
from miniverl.training.gradients import GroupGradients, GroupResult
from miniverl.training.live import LiveSinks, step_scalars
from miniverl.training.onpolicy import check_on_policy
from miniverl.training.optim import Schedule, UpdateOutcome, apply_update, scheduled_lr
from miniverl.training.run_state import RunState
from miniverl.training.samples import Supervision, TrainingSample
from miniverl.training.temperatures import temperature_fields
from miniverl.utils import gpu
from miniverl.utils.logging import EventLog, MetricsLog


class PolicyUpdater:
    """Turns supervised samples into committed updates of ``student``; shares ``state``."""

    def __init__(
        self,
        *,
        config: RunConfig,
        student: CausalLMBackend,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        state: RunState,
        pad_token_id: int,
        device: str,
        events: EventLog,
        metrics: MetricsLog,
    ) -> None:
        self.config = config
        self.student = student
        self.optimizer = optimizer
        self.schedule = schedule
        self.state = state
        self.device = device
        self.events = events
        self.metrics = metrics
        self.live: LiveSinks | None = None
        self.gradients = GroupGradients(
            student=student,
            optimizer=optimizer,
            pad_token_id=pad_token_id,
            nll_weight=config.loss.sampled_token_nll_weight,
            min_chunk_size=config.memory.min_chunk_size,
            oom_retries=config.memory.oom_retries,
            events=events,
        )

    @contextmanager
    def warmup(self) -> Iterator[None]:
        """The SFT warm-up's updates: warm-up learning rate; the main schedule starts after it."""
        self.state.in_warmup = True
        try:
            yield
        finally:
            self.state.in_warmup = False
        self.state.main_start_step = self.state.global_step

    def optimize(
        self, samples: Sequence[TrainingSample], supervision: Supervision, *, cycle: int
    ) -> list[dict[str, Any]]:
        """``supervision.passes`` passes over the trainable rows; one step record per group."""
        rows = [s for s in samples if s.trainable]
        group = self.config.train.group_size()
        records = []
        self.student.set_train(True)
        for _ in range(supervision.passes):
            for start in range(0, len(rows), group):
                members = rows[start : start + group]
                if supervision.strict_on_policy:
                    self.state.refresh_fingerprint(self.student)
                    check_on_policy(members, self.state.policy_fingerprint)
                records.append(self._step(members, supervision, cycle, step=len(records)))
        self.student.set_train(False)
        return records

    def _step(
        self, members: Sequence[TrainingSample], supervision: Supervision, cycle: int, *, step: int
    ) -> dict[str, Any]:
        state = self.state
        t0 = time.perf_counter()
        gpu.reset_peak(self.device if self.device.startswith("cuda") else None)
        result, state.chunk_size, state.trajectory_batch_size = self.gradients.fitting_memory(
            members,
            chunk_size=state.chunk_size,
            batch_rows=state.trajectory_batch_size,
            teacher_targets=supervision.teacher_targets,
        )
        update = self.commit()
        record = self._record(members, supervision, cycle, step, result, update, t0)
        self.metrics.write(record)
        if self.live is not None:
            self.live.scalars(state.global_step, step_scalars(record))
        return record

    def commit(self) -> UpdateOutcome:
        """Clip, set the scheduled lr, step; a committed update is a new policy version."""
        state = self.state
        lr = scheduled_lr(
            self.schedule,
            self.config.train,
            global_step=state.global_step,
            main_start_step=state.main_start_step,
            in_warmup=state.in_warmup,
        )
        update = apply_update(
            self.optimizer,
            self.student.trainable_parameters(),
            lr=lr,
            max_grad_norm=self.config.train.max_grad_norm,
            events=self.events,
            global_step=state.global_step,
        )
        if update.committed:
            state.global_step += 1
            state.parameter_version += 1
            state.refresh_fingerprint(self.student)
        return update

    def _record(
        self,
        members: Sequence[TrainingSample],
        supervision: Supervision,
        cycle: int,
        step: int,
        result: GroupResult,
        update: UpdateOutcome,
        started: float,
    ) -> dict[str, Any]:
        state = self.state
        seconds = time.perf_counter() - started
        return StepRecord.build(
            phase=supervision.phase,
            cycle=cycle,
            step=step,
            global_optimizer_step=state.global_step,
            parameter_version=state.parameter_version,
            policy_version=state.parameter_version,
            rollout_policy_version=members[0].rollout_policy_version,
            policy_fingerprint=state.policy_fingerprint,
            rollout_policy_fingerprint=members[0].rollout_fingerprint,
            committed=update.committed,
            grad_norm=update.grad_norm,
            lr=update.lr,
            trajectories_in_step=len(members),
            **result.step_fields(),
            **temperature_fields(self.config, supervision.phase),
            seconds=round(seconds, 4),
            train_selected_tokens_per_second=round(result.positions / seconds, 2)
            if seconds > 0
            else None,
            projection_chunk_size=state.chunk_size,
            gpu=gpu.snapshot(self.device),
        ).to_json()


__all__ = ["PolicyUpdater"]
