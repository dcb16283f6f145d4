"""``RunState``: the counters a training run advances, in one object (like HF's ``TrainerState``).

The trainer (``training/recipe.py``) and its sample source read the same counters: the
source stamps rollouts with ``parameter_version`` and checks them against
``policy_fingerprint``; the trainer advances both on every committed update. Keeping them in
one mutable object shared by reference -- rather than attributes of the trainer -- lets those
collaborators receive exactly this and never the trainer. A checkpoint stores the persistent
part as :class:`~miniverl.training.checkpoint.ResumeCounters` and :meth:`RunState.restore` puts it
back.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from miniverl.models.base import CausalLMBackend
from miniverl.models.fingerprint import backend_fingerprint
from miniverl.training.checkpoint import ResumeCounters

T = TypeVar("T")

TASK_ORDER_SALT = 0x5EED
"""XOR-ed into ``run.seed`` for the training split's shuffled order (a fixed constant: the
order, and so every run's data, depends on it)."""


@dataclass
class RunState:
    """Where a run is. Units: optimizer steps and policy versions count committed updates.

    ``cycle`` is the cycle being run (-1 before the first; warm-up cycles are negative),
    ``start_cycle`` the first cycle this process runs (after a resume, ``state.cycle + 1``).
    ``chunk_size`` and ``trajectory_batch_size`` start at the resolved plan and only shrink,
    when an out-of-memory retry halves them (``training/recipe.py``).
    ``main_start_step`` is the step the KD/OPD phase began at (the lr schedule counts from it).
    ``finished`` is set when a resume finds the final checkpoint: only summaries remain.
    """

    global_step: int = 0
    parameter_version: int = 0
    policy_fingerprint: str | None = None
    rollout_version: int | None = None
    task_cursor: int = 0
    cycle: int = -1
    start_cycle: int = 0
    main_start_step: int = 0
    in_warmup: bool = False
    finished: bool = False
    chunk_size: int = 0
    trajectory_batch_size: int = 0
    eval_results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def refresh_fingerprint(self, student: CausalLMBackend) -> None:
        """After every commit or weight load: the fingerprint strict OPD checks rollouts against."""
        self.policy_fingerprint = backend_fingerprint(student)

    def next_tasks(self, train: Sequence[T], order: Sequence[int], count: int) -> list[T]:
        """Walk the shuffled training order from the checkpointed cursor (wrapping)."""
        picked = []
        for _ in range(count):
            picked.append(train[order[self.task_cursor % len(order)]])
            self.task_cursor += 1
        return picked

    def counters(self, cycle: int) -> ResumeCounters:
        """What a checkpoint taken after ``cycle`` stores."""
        return ResumeCounters(
            cycle=cycle,
            global_step=self.global_step,
            parameter_version=self.parameter_version,
            rollout_policy_version=self.rollout_version,
            task_cursor=self.task_cursor,
            chunk_size=self.chunk_size,
            main_start_step=self.main_start_step,
            eval_results=self.eval_results,
        )

    def restore(self, counters: ResumeCounters) -> None:
        """Resume: continue at the cycle after the checkpoint's."""
        self.global_step = counters.global_step
        self.parameter_version = counters.parameter_version
        self.rollout_version = counters.rollout_policy_version
        self.task_cursor = counters.task_cursor
        self.chunk_size = counters.chunk_size
        self.main_start_step = counters.main_start_step
        self.eval_results = counters.eval_results
        self.start_cycle = counters.cycle + 1
        self.cycle = counters.cycle  # eval records after a resume name the right cycle


def shuffled_order(size: int, seed: int) -> list[int]:
    """The training split's visiting order: a permutation of ``range(size)`` fixed by the seed."""
    order = list(range(size))
    random.Random(seed ^ TASK_ORDER_SALT).shuffle(order)
    return order


__all__ = ["TASK_ORDER_SALT", "RunState", "shuffled_order"]
