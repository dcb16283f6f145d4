"""Held-out evaluation: one rollout function for the trainer and ``miniverl eval --run DIR``.

:func:`evaluate_policy` rolls out a split greedily (by default) with the episode seeds of
docs/design.md §5 and summarizes it; the trainer records the result, and
:func:`evaluate_run` re-evaluates a checkpoint of a finished run with only what that needs
(tokenizer, environment and splits, the student, a rollout runner). The models are rebuilt
from ``config.resolved.yaml`` (not the recipe) and resolved again by
:func:`~miniverl.training.resolve.resolve_run`, on which every ``auto`` is already a
decision, so nothing can resolve differently now than it did for the run being evaluated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.loading import load_resolved_config
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.errors import CheckpointError, ConfigError, RunDirectoryError
from miniverl.models.factory import build_tokenizer
from miniverl.models.runtime import build_runtime
from miniverl.schemas.records import EvalRecord
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.assembly import apply_host_plan
from miniverl.training.checkpoint import LoadedCheckpoint, load_checkpoint
from miniverl.training.live import ProgressReporter
from miniverl.training.resolve import HostCapabilities, resolve_device, resolve_run
from miniverl.training.sources import oom_splitter, summarize_rollouts
from miniverl.trajectory.io import append_trajectories
from miniverl.utils.io import write_json
from miniverl.utils.lazy import import_torch
from miniverl.utils.logging import EventLog, MetricsLog, make_console
from miniverl.utils.runlock import run_lock
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import load_yaml_file
from miniverl.utils.seeding import derive_seed, seed_everything

EVAL_SPLITS = ("eval", "test")


def eval_trajectory_id(task_id: str, tag: str, parameter_version: int) -> str:
    """The id of an evaluation episode: its task, the evaluation's tag and the weights' version."""
    return f"{task_id}:eval-{tag}:v{parameter_version}"


def relabel_evaluation(
    result: Mapping[str, Any], trajectories: Sequence[Trajectory], tag: str
) -> tuple[dict[str, Any], list[Trajectory]]:
    """An evaluation recorded again under ``tag``: the same summary and episodes, renamed.

    Why: episode ``i`` of an evaluation is seeded by its index alone, so two evaluations of
    the same weights on the same tasks at the same temperature roll out the same episodes; a
    run whose last update came before an earlier evaluation (a cold start: the warm-up, then
    no cycle) records that one again as ``final`` instead of rolling the split out twice.
    """
    relabelled = [
        traj.model_copy(
            update={
                "trajectory_id": eval_trajectory_id(
                    traj.task_id, tag, int(result["parameter_version"])
                ),
                "metadata": {**traj.metadata, "eval_tag": tag},
            }
        )
        for traj in trajectories
    ]
    return {**result, "tag": tag}, relabelled


def evaluate_policy(
    runner: RolloutRunner,
    tasks: Sequence[Task],
    *,
    tag: str,
    split: str,
    seed: int,
    temperature: float,
    batch_size: int,
    parameter_version: int,
    global_step: int,
    progress: ProgressReporter,
    on_oom: Callable[..., Any] | None = None,
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Roll out ``tasks`` with ``runner``'s policy; ``(summary, trajectories)``.

    Episode ``i`` uses seed ``derive_seed(seed, "eval", i)`` whatever the batch size, so a
    re-evaluation reproduces the run's own. ``on_oom`` splits a decode round that does not
    fit (see :func:`~miniverl.training.sources.oom_splitter`).
    """
    runner.backend.set_train(False)
    trajectories: list[Trajectory] = []
    with progress.task(f"eval {tag}", len(tasks)) as advance:
        for start in range(0, len(tasks), batch_size):
            requests = [
                EpisodeRequest(
                    task,
                    derive_seed(seed, "eval", i),
                    trajectory_id=eval_trajectory_id(task.task_id, tag, parameter_version),
                    extra_metadata={"eval_tag": tag},
                )
                for i, task in enumerate(tasks[start : start + batch_size], start=start)
            ]
            batch = runner.rollout_batch(
                requests,
                batch_size=batch_size,
                policy_version=parameter_version,
                temperature=temperature,
                split=on_oom,
            )
            trajectories.extend(batch)
            for _ in batch:
                advance()
    result = summarize_rollouts(trajectories)
    result.update(
        tag=tag,
        split=split,
        temperature=temperature,
        parameter_version=parameter_version,
        global_optimizer_step=global_step,
    )
    return result, trajectories


def record_evaluation(
    result: dict[str, Any],
    trajectories: Sequence[Trajectory],
    *,
    cycle: int,
    global_step: int,
    trajectory_log: Path | None,
    events: EventLog,
    metrics: MetricsLog,
    live: Any | None,
) -> None:
    """Where a run's evaluation goes: its trajectories (unless ``trajectory_log`` is None), the
    ``eval`` event, an ``EvalRecord`` in ``metrics.jsonl`` and the live success-rate scalar.

    The trajectories are fsynced when ``metrics`` fsyncs its records (``MetricsLog.sync``):
    inside a training run neither is, and the trainer's next durability point makes both
    durable together."""
    if trajectory_log is not None:
        append_trajectories(trajectory_log, trajectories, sync=metrics.sync)
    events.emit(
        "eval", echo=f"{result['tag']}: {result['solved']}/{result['tasks']} solved", **result
    )
    metrics.write(EvalRecord.build(cycle=cycle, **result).to_json())
    if live is not None:
        live.scalars(global_step, {f"eval/{result['split']}_success_rate": result["success_rate"]})


def eval_summary(
    config: RunConfig,
    *,
    run_id: str,
    global_step: int,
    parameter_version: int,
    evaluations: Mapping[str, dict[str, Any]],
    teacher: dict[str, Any] | None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """The ``eval.json`` of a run: every evaluation by tag, with the headline ones named."""
    summary: dict[str, Any] = {
        "run_id": run_id,
        "mode": config.run.mode,
        "objective": config.objective_label(),
        "config_digest": config.digest(),
        "global_optimizer_step": global_step,
        "parameter_version": parameter_version,
        "evaluations": dict(evaluations),
        "baseline": evaluations.get("baseline"),
        "after_warmup": evaluations.get("after_warmup"),
        "final": evaluations.get("final", {}),
        "teacher": teacher,
    }
    if seconds is not None:
        summary["seconds"] = round(seconds, 2)
    return summary


def evaluate_run(
    run_dir: str | Path,
    *,
    tag: str,
    checkpoint: str = "final",
    split: str | None = None,
    quiet: bool = True,
) -> dict[str, Any]:
    """Re-evaluate ``checkpoints/<checkpoint>`` of a run into ``eval.<tag>.json``."""
    paths = RunPaths(run_dir)
    paths.eval_tag_json(tag)  # refuses an unsafe tag before anything is read
    checkpoint_dir = paths.checkpoint(checkpoint)
    if split is not None and split not in EVAL_SPLITS:
        raise ConfigError(
            f"--split {split!r} is not a held-out split; use one of {', '.join(EVAL_SPLITS)}",
            hint="the train split is never evaluated as held-out",
        )
    if not paths.root.is_dir():
        raise RunDirectoryError(f"{paths.root} is not a run directory")
    config = load_resolved_config(run_dir)
    if not paths.config_validated.exists():
        raise RunDirectoryError(f"{paths.config_validated} not found")
    data = load_yaml_file(paths.config_validated, error=RunDirectoryError)
    try:
        validated = RunConfig.from_mapping(data, source=str(paths.config_validated))
    except ConfigError as exc:
        raise RunDirectoryError(exc.message, hint="the file was edited; re-run training") from None
    chosen = split or config.eval.split
    if chosen not in ("eval", "test"):
        raise ConfigError(f"--split must be eval or test, got {chosen!r}")
    size = getattr(config.environment, f"{chosen}_tasks")
    if size == 0:
        raise ConfigError(
            f"the {chosen!r} split of {paths.root} is empty (environment.{chosen}_tasks: 0), so there is nothing to evaluate",
            hint=f"evaluate another split, or train a run with environment.{chosen}_tasks > 0",
        )
    loaded = load_checkpoint(checkpoint_dir)
    if loaded.state["config_digest"] != validated.digest():
        raise CheckpointError(
            f"checkpoint {checkpoint} does not belong to {paths.config_validated} (config digest differs)",
            hint="the run directory was edited; re-run training",
        )
    with run_lock(paths.root):
        return _evaluate_checkpoint(paths, config, loaded, tag, checkpoint, chosen, quiet)


def _evaluate_checkpoint(
    paths: RunPaths,
    config: RunConfig,
    loaded: LoadedCheckpoint,
    tag: str,
    checkpoint: str,
    split: str,
    quiet: bool,
) -> dict[str, Any]:
    """Student, runner and held-out tasks only: no teacher, scorer, cache or optimizer."""
    torch = import_torch("miniverl eval")
    target = paths.eval_tag_json(tag)
    seed_everything(config.run.seed)
    device = resolve_device(config, cuda_available=bool(torch.cuda.is_available()))
    tokenizer = build_tokenizer(config)
    environment = make_environment(config.environment.name, **config.environment.params)
    splits = build_splits(environment, config.environment)
    student = build_runtime(config, tokenizer, device, with_teacher=False).student
    resolved = resolve_run(
        config,
        device=device,
        host=HostCapabilities.probe(device),
        student=student.capabilities,
        teacher=None,
    )
    apply_host_plan(resolved, student)
    student.load_trainable_state_dict(
        {k: v.to(student.device) for k, v in loaded.trainable.items()}
    )
    console = make_console(quiet)
    events = EventLog(None, console)
    result, _ = evaluate_policy(
        RolloutRunner(student, environment, config.rollout),
        splits[split][: config.eval.max_tasks],
        tag=tag,
        split=split,
        seed=config.run.seed,
        temperature=config.eval.temperature,
        batch_size=config.eval.batch_size,
        parameter_version=int(loaded.state["parameter_version"]),
        global_step=int(loaded.state["global_step"]),
        progress=ProgressReporter(console, False),
        on_oom=oom_splitter(events, "eval rollout"),
    )
    payload = {**result, "checkpoint": checkpoint, "config_resolved": paths.config_resolved.name}
    write_json(target, payload)
    return {**payload, "path": str(target)}


__all__ = ["EVAL_SPLITS", "eval_summary", "evaluate_policy", "evaluate_run"]
