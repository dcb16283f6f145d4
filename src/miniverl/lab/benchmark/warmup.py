"""Cold start by criterion: warm up until the student is good enough, not for a fixed count.

A KD/OPD run starts from a student that cannot yet call the tool, so its rollouts would visit
states no teacher is useful on; the run's SFT warm-up on oracle traces fixes that. How long
is enough is the lab's question (``lab.warmup_until``): after every ``check_every``-th
warm-up cycle the student's greedy success on the validation (``eval``) split -- all of it,
or only its tasks of chain length ``k`` -- is measured, and the warm-up stops after the first
measured cycle that reaches ``threshold``, or after ``max_cycles`` when none does.

:class:`WarmupCriterion` is that condition as the run's ``warmup_until``
(``OPDTrainer``'s :class:`~miniverl.training.recipe.WarmupUntil`): the run keeps its loop,
its events (``sft_warmup_start`` / ``sft_warmup_cycle`` / ``sft_warmup_end``, which record
the measured value and what stopped it) and its updates; this module only measures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task
from miniverl.errors import ConfigError
from miniverl.lab.config import WarmupUntilConfig, lab_of
from miniverl.training.sources import oom_splitter
from miniverl.utils.logging import EventLog
from miniverl.utils.seeding import derive_seed

VALIDATION_SPLIT = "eval"
"""The criterion is measured on the validation split, never on test."""


def criterion_tasks(
    config: RunConfig, splits: Mapping[str, Sequence[Task]], until: WarmupUntilConfig
) -> list[Task]:
    """The validation tasks the criterion measures (``eval.max_tasks`` of the eval split, then by k)."""
    tasks = list(splits[VALIDATION_SPLIT][: config.eval.max_tasks])
    if until.metric == "success_at_k":
        tasks = [t for t in tasks if t.data.get("k") == until.k]
    if not tasks:
        raise ConfigError(
            f"lab.warmup_until: no validation task to measure {until.metric}"
            + (f" at k={until.k}" if until.metric == "success_at_k" else ""),
            hint="success_at_k needs an environment whose tasks carry k (calc_chain) with that k "
            "among the eval split's chain lengths; or raise environment.eval_tasks / eval.max_tasks",
        )
    return tasks


def greedy_validation_success(
    runner: RolloutRunner,
    tasks: Sequence[Task],
    *,
    seed: int,
    batch_size: int,
    policy_version: int,
    split: Any,
) -> float:
    """Fraction of ``tasks`` the policy behind ``runner`` solves greedily (nothing is written)."""
    requests = [
        EpisodeRequest(task, derive_seed(seed, "warmup-until", i)) for i, task in enumerate(tasks)
    ]
    trajectories = runner.rollout_batch(
        requests,
        batch_size=batch_size,
        policy_version=policy_version,
        temperature=0.0,
        split=split,
    )
    return sum(int(t.solved) for t in trajectories) / len(tasks)


class WarmupCriterion:
    """``lab.warmup_until`` as a run's ``warmup_until``: measured after every
    ``check_every``-th warm-up cycle and after the last, reached at ``threshold``."""

    def __init__(self, config: RunConfig, until: WarmupUntilConfig) -> None:
        self.config = config
        self.until = until
        self.max_cycles = until.max_cycles

    def settings(self) -> dict[str, Any]:
        return self.until.model_dump(mode="json")

    def describe(self) -> str:
        until = self.until
        at = f" at k={until.k}" if until.metric == "success_at_k" else ""
        return f"validation success{at} >= {until.threshold}"

    def check(
        self,
        k: int,
        *,
        last: bool,
        runner: RolloutRunner,
        splits: Mapping[str, Sequence[Task]],
        version: int,
        events: EventLog,
    ) -> tuple[float, bool] | None:
        """Greedy, in eval mode, nothing written; ``None`` between checks."""
        if (k + 1) % self.until.check_every != 0 and not last:
            return None
        runner.backend.set_train(False)
        value = greedy_validation_success(
            runner,
            criterion_tasks(self.config, splits, self.until),
            seed=self.config.run.seed,
            batch_size=self.config.eval.batch_size,
            policy_version=version,
            split=oom_splitter(events, "warm-up criterion rollout"),
        )
        return value, value >= self.until.threshold


def warmup_criterion(config: RunConfig) -> WarmupCriterion | None:
    """The run's ``warmup_until`` for ``config``'s ``lab.warmup_until`` (``None`` without one)."""
    until = lab_of(config).warmup_until
    return None if until is None else WarmupCriterion(config, until)


__all__ = [
    "VALIDATION_SPLIT",
    "WarmupCriterion",
    "criterion_tasks",
    "greedy_validation_success",
    "warmup_criterion",
]
