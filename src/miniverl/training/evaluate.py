"""``miniverl eval --run DIR``: re-evaluate a run exactly as it was resolved.

The trainer is rebuilt from ``config.resolved.yaml`` (not the recipe), so an ``auto``
decision cannot resolve differently now than it did for the run being evaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError, ConfigError, RunDirectoryError
from miniverl.training.checkpoint import load_checkpoint
from miniverl.training.trainer import OPDTrainer, load_resolved_config
from miniverl.utils.io import write_json
from miniverl.utils.runlock import run_lock
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import load_yaml_file

EVAL_SPLITS = ("eval", "test")


def evaluate_run(
    run_dir: str | Path,
    *,
    tag: str,
    checkpoint: str = "final",
    split: str | None = None,
    quiet: bool = True,
) -> dict[str, Any]:
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
        return _evaluate_checkpoint(paths, config, loaded, tag, checkpoint, split, quiet)


def _evaluate_checkpoint(
    paths: RunPaths,
    config: RunConfig,
    loaded: Any,
    tag: str,
    checkpoint: str,
    split: str | None,
    quiet: bool,
) -> dict[str, Any]:
    target = paths.eval_tag_json(tag)
    trainer = OPDTrainer(config, output_dir=paths.root, quiet=quiet, progress=False, resolved=True)
    trainer.setup(write_artifacts=False, with_teacher=False)
    trainer.student.load_trainable_state_dict(
        {k: v.to(trainer.student.device) for k, v in loaded.trainable.items()}
    )
    trainer.parameter_version = int(loaded.state["parameter_version"])
    trainer.global_step = int(loaded.state["global_step"])
    trainer.events.path = None
    trainer.metrics.path = None
    result = trainer.evaluate(tag, temperature=config.eval.temperature, split=split, write=False)
    payload = {**result, "checkpoint": checkpoint, "config_resolved": paths.config_resolved.name}
    write_json(target, payload)
    return {**payload, "path": str(target)}
