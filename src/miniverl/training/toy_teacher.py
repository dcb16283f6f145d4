"""The toy teacher: fit it on oracle traces until it solves its tasks, save it, reuse it.

Toy backend only (an HF teacher is pretrained; its optional adapter is
``training/teacher_adapter.py``). The teacher starts as a freshly initialised
:class:`~miniverl.models.toy.ToyBackend` and becomes competent here:

1. fitting examples: one trace per task of the training split plus ``models.toy_fit.extra_tasks``
   more, a ``noise_fraction`` of them noise-injected (``training/noisy_traces.py``);
2. :func:`fit_toy_model`: cross-entropy on those traces (``models/fitting.py``, the student's
   own loss code), stopping once greedy success on a probe sample reaches
   ``models.toy_fit.target_success``;
3. the frozen weights go to ``<run>/toy-teacher.safetensors`` (hashed in every checkpoint) and,
   with ``models.toy_fit.reuse``, to the digest-keyed cache of ``training/teacher_reuse.py``, so
   the next run with identical inputs loads them instead of refitting.

Every function receives its collaborators (backend, runner, config, paths, event log)
explicitly; none sees the trainer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.config.sections import ToyFitConfig
from miniverl.environments.base import Task, ToolEnvironment, sample_extra_tasks
from miniverl.errors import CheckpointError, ConfigError, TrajectoryError
from miniverl.models.base import CausalLMBackend
from miniverl.models.fitting import cross_entropy_fit_step, draw_rows
from miniverl.training import teacher_reuse as reuse
from miniverl.training.checkpoint import save_tensors
from miniverl.training.noisy_traces import FitTrace, toy_fit_traces
from miniverl.training.progress import ProgressReporter
from miniverl.utils.hashing import sha256_file
from miniverl.utils.logging import EventLog
from miniverl.utils.seeding import capture_rng_state, derive_seed, restore_rng_state

TOY_TEACHER_FILE = "toy-teacher.safetensors"
"""The fitted teacher's weights inside a run directory and a benchmark cold start."""


# ------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class ToyFitReport:
    """What :func:`fit_toy_model` did."""

    steps_run: int
    loss_history: list[float] = field(repr=False)
    final_loss: float
    stopped_early: bool
    seconds: float


def fit_toy_model(
    backend: Any,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
    chunk_size: int = 64,
    stop_when: Callable[[int], bool] | None = None,
    check_every: int = 50,
    on_step: Callable[[int, float], None] | None = None,
) -> ToyFitReport:
    """Train every decoder parameter of a ``ToyBackend`` on ``(token_ids, target_positions)``.

    Target ``j`` is the supervised token, predicted from position ``j - 1``; each example
    weighs the same whatever its length (weights sum to one per row). Batches walk a
    seeded shuffle of the examples epoch by epoch. The loss is the project's
    ``chunked_selected_position_loss`` in pure cross-entropy form (``provider=None``), so
    the teacher is fitted by the same code path that later trains the student.
    ``stop_when(step)`` is asked every ``check_every`` steps; ``True`` ends the fit early.
    ``on_step(step, loss)`` is told about every step (a progress bar listens).
    Parameters frozen for LoRA are unfrozen for the fit and frozen again afterwards.
    """
    if steps < 0 or batch_size < 1 or check_every < 1 or chunk_size < 1:
        raise ConfigError(
            "fit_toy_model needs steps >= 0 and batch_size, check_every, chunk_size >= 1"
        )
    rows = [_checked_example(ids, targets, k) for k, (ids, targets) in enumerate(examples)]
    if not rows:
        raise ConfigError(
            "fit_toy_model needs at least one example",
            hint="pass oracle traces of the training tasks",
        )

    module = backend.module
    params = list(module.parameters())
    frozen = [p for p in params if not p.requires_grad]
    was_training = module.training
    for p in frozen:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    history: list[float] = []
    stopped = False
    started = time.perf_counter()
    backend.set_train(True)
    try:
        for step in range(1, steps + 1):
            picked = draw_rows(rows, batch_size, order, rng)
            history.append(
                cross_entropy_fit_step(backend, picked, params, optimizer, chunk_size=chunk_size)
            )
            if on_step is not None:
                on_step(step, history[-1])
            if stop_when is not None and step % check_every == 0 and stop_when(step):
                stopped = True
                break
    finally:
        for p in frozen:
            p.requires_grad_(False)
            p.grad = None
        backend.set_train(was_training)
    return ToyFitReport(
        steps_run=len(history),
        loss_history=history,
        final_loss=history[-1] if history else float("nan"),
        stopped_early=stopped,
        seconds=time.perf_counter() - started,
    )


def _checked_example(
    ids: Sequence[int], targets: Sequence[int], k: int
) -> tuple[list[int], list[int]]:
    ids, targets = [int(i) for i in ids], [int(j) for j in targets]
    if not targets:
        raise TrajectoryError(f"fit example {k} has no target positions")
    for j in targets:
        if j == 0:
            raise TrajectoryError("position 0 can never be a training target")
        if not 0 < j < len(ids):
            raise TrajectoryError(
                f"fit example {k}: target position {j} is outside [0, {len(ids)})"
            )
    return ids, targets


# ------------------------------------------------------------------------------- the teacher


def greedy_success(
    runner: RolloutRunner, tasks: Sequence[Task], *, seed: int, batch_size: int, split: Any
) -> float:
    """Fraction of ``tasks`` solved by greedy rollouts (probe seeds derived from ``seed``)."""
    if not tasks:
        return 0.0
    requests = [EpisodeRequest(task, derive_seed(seed, "probe", i)) for i, task in enumerate(tasks)]
    trajectories = runner.rollout_batch(
        requests, batch_size=batch_size, temperature=0.0, split=split
    )
    return sum(int(t.solved) for t in trajectories) / len(tasks)


def freeze(teacher: CausalLMBackend) -> None:
    """No gradients and eval mode: from here on the teacher only scores."""
    for p in teacher.trainable_parameters():
        p.requires_grad_(False)
    teacher.set_train(False)


def save_teacher(teacher: CausalLMBackend, path: Path) -> str:
    """Every teacher parameter to ``path`` (safetensors); the file's SHA-256."""
    return save_tensors(teacher.full_state_dict(), path)


def fit_traces(
    oracle_runner: RolloutRunner, pool: Sequence[Task], fit: ToyFitConfig, seed: int
) -> list[FitTrace]:
    """The teacher's fitting traces of ``pool`` as ``models.toy_fit`` asks (noise fraction,
    corruption kinds, follow-on calls), seeded by the run seed."""
    return toy_fit_traces(
        oracle_runner,
        pool,
        noise_fraction=fit.noise_fraction,
        seed=derive_seed(seed, "toy-teacher-noise"),
        kinds=dict(fit.noise_kinds),
        max_follow=fit.noise_max_follow,
    )


def load_teacher(teacher: CausalLMBackend, path: Path, weights_sha256: str | None) -> None:
    """Load ``path`` into ``teacher`` after checking it against ``weights_sha256``."""
    if not path.is_file() or sha256_file(path) != weights_sha256:
        raise CheckpointError(
            f"{path} is missing or does not match its SHA-256 in the checkpoint",
            hint="start a new run",
        )
    teacher.load_full_state_dict(load_file(str(path)))


def prepare_toy_teacher(
    teacher: CausalLMBackend,
    *,
    config: RunConfig,
    environment: ToolEnvironment,
    splits: Mapping[str, list[Task]],
    oracle_runner: RolloutRunner,
    chunk_size: int,
    device: str,
    run_dir: Path,
    events: EventLog,
    progress: ProgressReporter,
    split: Any,
    publish: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Fit the toy teacher (or load an identical earlier fit) and save it into ``run_dir``.

    ``oracle_runner`` plays the fitting traces (any runner over ``environment``); ``split``
    is the out-of-memory splitter for probe rollouts. ``publish(report)`` is called once the
    weights are in ``run_dir``, before the ``toy_teacher_fitted``/``toy_teacher_reused``
    event, so the caller can record the report (the manifest) first. The global RNG state is
    the same afterwards as before a fit, so a run's later draws do not depend on how long
    the fit took. Returns the report.
    """
    fit = config.models.toy_fit
    seed = config.run.seed
    train = splits["train"]
    extra = sample_extra_tasks(
        environment,
        fit.extra_tasks,
        derive_seed(config.environment.split_seed, "toy-teacher-pool"),
        config.environment.difficulty,
        exclude=[t for tasks in splits.values() for t in tasks],
    )
    pool = train + extra
    examples = [trace.example for trace in fit_traces(oracle_runner, pool, fit, seed)]
    runner = RolloutRunner(teacher, environment, config.rollout)
    probe = random.Random(derive_seed(seed, "toy-teacher-probe")).sample(
        pool, min(len(pool), fit.probe_tasks)
    )
    eval_tasks = splits[config.eval.split][: config.eval.max_tasks]

    def success(tasks: Sequence[Task]) -> float:
        return greedy_success(
            runner, tasks, seed=seed, batch_size=config.eval.batch_size, split=split
        )

    inputs = reuse.toy_teacher_digest_inputs(
        teacher,
        examples=examples,
        probe=probe,
        train=train,
        eval_tasks=eval_tasks,
        fit=fit.model_dump(mode="json", exclude={"reuse"}),
        rollout=config.rollout.model_dump(mode="json"),
        chunk_size=chunk_size,
        seed=seed,
        device=device,
    )
    digest = reuse.teacher_digest(inputs)
    cached = reuse.load_cached_teacher(digest) if fit.reuse else None
    if cached is not None:
        teacher.load_full_state_dict(cached[0])
        freeze(teacher)
        report = {
            **cached[1],
            "reused": True,
            "cache_digest": digest,
            "weights_sha256": save_teacher(teacher, run_dir / TOY_TEACHER_FILE),
        }
        publish(report)
        events.emit(
            "toy_teacher_reused",
            echo=f"cached fit {digest[:12]} from {reuse.cache_root()} (saved {cached[1].get('seconds', 0):.0f}s of fitting)",
            **report,
        )
        return report
    checks: list[dict[str, float]] = []
    rng_before = capture_rng_state()

    with progress.task("fitting toy teacher", max(1, fit.max_steps)) as advance:
        last = {"probe": None}

        def solved_enough(step: int) -> bool:
            rate = success(probe)
            checks.append({"step": step, "probe_success": rate})
            last["probe"] = rate
            return rate >= fit.target_success

        def on_step(step: int, loss: float) -> None:
            probe_text = "" if last["probe"] is None else f" | probe accuracy {last['probe']:.0%}"
            advance(stats=f"step {step} | loss {loss:.3f}{probe_text}")

        fitted_run = fit_toy_model(
            teacher,
            examples,
            steps=fit.max_steps,
            lr=fit.lr,
            batch_size=fit.batch_size,
            seed=derive_seed(seed, "toy-teacher-fit"),
            chunk_size=max(1, chunk_size),
            stop_when=solved_enough,
            check_every=fit.check_every,
            on_step=on_step,
        )
    freeze(teacher)
    train_success = success(train)
    eval_success = success(eval_tasks)
    restore_rng_state(rng_before)
    weights_sha256 = save_teacher(teacher, run_dir / TOY_TEACHER_FILE)
    fitted = {
        "steps": fitted_run.steps_run,
        "final_loss": fitted_run.final_loss,
        "stopped_early": fitted_run.stopped_early,
        "seconds": round(fitted_run.seconds, 2),
        "fit_tasks": len(pool),
        "extra_tasks": len(extra),
        "train_success": train_success,
        "heldout_success": eval_success,
        "checks": checks,
    }
    if fit.reuse:
        reuse.store_teacher(digest, teacher.full_state_dict(), fitted, inputs)
    report = {**fitted, "reused": False, "cache_digest": digest, "weights_sha256": weights_sha256}
    publish(report)
    events.emit(
        "toy_teacher_fitted",
        echo=f"{fitted_run.steps_run} steps, greedy success train {train_success:.2f} / held-out {eval_success:.2f}",
        **report,
    )
    return report


__all__ = [
    "TOY_TEACHER_FILE",
    "ToyFitReport",
    "fit_toy_model",
    "fit_traces",
    "freeze",
    "greedy_success",
    "load_teacher",
    "prepare_toy_teacher",
    "save_teacher",
]
