"""The SFT warm-up before KD/OPD: oracle-trace cross-entropy until the policy emits valid calls.

A KD/OPD run starts from a student that cannot yet call the tool, so its rollouts would visit
states no teacher is useful on. The warm-up trains it on oracle traces first
(:class:`~miniverl.training.sources.OracleSource`, hard labels), either

- for a fixed number of cycles (``train.sft_warmup_cycles``), or
- by criterion (``train.sft_warmup_until``): after every ``check_every``-th cycle the
  student's greedy success on the validation (``eval``) split -- all of it, or only its tasks
  of chain length ``k`` -- is measured, and the warm-up stops after the first measured cycle
  that reaches ``threshold``, or after ``max_cycles`` when none does. The ``sft_warmup_end`` event records the measured value and
  which of the two stopped it.

Warm-up cycles are numbered ``-cap .. -1`` (negative: they precede KD/OPD cycle 0); a warm-up
stopped early by its criterion ends before ``-1``. The loop receives its collaborators (the
source, the trainer's task walk and optimizer step, the event log) explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.config.sections import TrainConfig, WarmupUntilConfig
from miniverl.environments.base import Task
from miniverl.errors import ConfigError
from miniverl.training.live import ProgressReporter
from miniverl.training.sources import OracleSource, Supervision, TrainingSample
from miniverl.utils.logging import EventLog
from miniverl.utils.seeding import derive_seed

VALIDATION_SPLIT = "eval"
"""The criterion is measured on the validation split, never on test."""


class Optimize(Protocol):
    """``optimize(samples, supervision, cycle=c)`` -> one step record per optimizer step
    (``PolicyUpdater.optimize``, training/trainer.py)."""

    def __call__(
        self, samples: Sequence[TrainingSample], supervision: Supervision, *, cycle: int
    ) -> list[dict[str, Any]]: ...


def warmup_cycles(train: TrainConfig) -> int:
    """Most warm-up cycles the recipe can run: the fixed count, or the criterion's cap."""
    until = train.sft_warmup_until
    return until.max_cycles if until is not None else train.sft_warmup_cycles


@dataclass(frozen=True)
class WarmupOutcome:
    """How a warm-up ended: ``stopped_by`` is ``cycles`` (fixed count), ``criterion`` or ``cap``."""

    cycles_run: int
    stopped_by: Literal["cycles", "criterion", "cap"]
    value: float | None = None


def criterion_tasks(
    config: RunConfig, splits: dict[str, list[Task]], until: WarmupUntilConfig
) -> list[Task]:
    """The validation tasks the criterion measures (``eval.max_tasks`` of the eval split, then by k)."""
    tasks = splits[VALIDATION_SPLIT][: config.eval.max_tasks]
    if until.metric == "success_at_k":
        tasks = [t for t in tasks if t.data.get("k") == until.k]
    if not tasks:
        raise ConfigError(
            f"train.sft_warmup_until: no validation task to measure {until.metric}"
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


def criterion_measure(
    config: RunConfig,
    splits: dict[str, list[Task]],
    until: WarmupUntilConfig,
    *,
    runner: RolloutRunner,
    student: Any,
    version: Callable[[], int],
    split: Any,
) -> Callable[[], float]:
    """``until``'s metric for the student's current weights: greedy, in eval mode, nothing written."""
    tasks = criterion_tasks(config, splits, until)

    def measure() -> float:
        student.set_train(False)
        return greedy_validation_success(
            runner,
            tasks,
            seed=config.run.seed,
            batch_size=config.eval.batch_size,
            policy_version=version(),
            split=split,
        )

    return measure


def run_sft_warmup(
    source: OracleSource,
    *,
    cycles: int,
    next_tasks: Callable[[int], list[Task]],
    optimize: Optimize,
    events: EventLog,
    progress: ProgressReporter,
    until: WarmupUntilConfig | None = None,
    measure: Callable[[], float] | None = None,
) -> WarmupOutcome:
    """Run up to ``cycles`` warm-up cycles; with ``until``, stop at the first reaching its threshold.

    ``measure()`` returns the criterion's value for the current weights (asked after every
    ``until.check_every``-th cycle and after the last, only with ``until``).
    """
    if until is not None and measure is None:
        raise ValueError("a warm-up by criterion needs measure()")
    start: dict[str, Any] = {"cycles": cycles}
    if until is not None:
        start["until"] = until.model_dump(mode="json")
    echo = (
        f"{cycles} cycles"
        if until is None
        else f"until {_describe(until)} (at most {cycles} cycles)"
    )
    events.emit("sft_warmup_start", echo=echo, **start)
    outcome = WarmupOutcome(cycles_run=cycles, stopped_by="cycles")
    with progress.task("SFT warm-up", cycles) as advance:
        for k in range(cycles):
            cycle = k - cycles
            batch = source.samples(cycle, next_tasks(source.tasks_per_cycle))
            records = optimize(batch.samples, source.supervision, cycle=cycle)
            fields: dict[str, Any] = {
                "cycle": cycle,
                "steps": len(records),
                "loss": records[-1]["loss"] if records else None,
            }
            checked = until is not None and ((k + 1) % until.check_every == 0 or k + 1 == cycles)
            if checked:
                assert measure is not None
                fields["validation_success"] = value = measure()
            events.emit("sft_warmup_cycle", **fields)
            advance()
            if until is None or not checked:
                continue
            if value >= until.threshold:
                outcome = WarmupOutcome(k + 1, "criterion", value)
                break
            if k + 1 == cycles:
                outcome = WarmupOutcome(cycles, "cap", value)
    if until is not None:
        reached = outcome.stopped_by == "criterion"
        events.emit(
            "sft_warmup_end",
            echo=f"{_describe(until)} {'reached' if reached else 'not reached'}: "
            f"{outcome.value:.3f} after {outcome.cycles_run} cycles",
            cycles=outcome.cycles_run,
            stopped_by=outcome.stopped_by,
            value=outcome.value,
            threshold=until.threshold,
            metric=until.metric,
            k=until.k,
            max_cycles=cycles,
        )
    return outcome


def _describe(until: WarmupUntilConfig) -> str:
    at = f" at k={until.k}" if until.metric == "success_at_k" else ""
    return f"validation success{at} >= {until.threshold}"


__all__ = [
    "VALIDATION_SPLIT",
    "WarmupOutcome",
    "criterion_measure",
    "criterion_tasks",
    "greedy_validation_success",
    "run_sft_warmup",
    "warmup_cycles",
]
