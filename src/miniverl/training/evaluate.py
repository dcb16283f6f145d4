"""``miniverl eval --run DIR``: re-evaluate a run exactly as it was resolved.

The trainer is rebuilt from ``config.resolved.yaml`` (not the recipe), so an ``auto``
decision cannot resolve differently now than it did for the run being evaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError, ConfigError, RunDirectoryError
from miniverl.training.checkpoint import load_checkpoint
from miniverl.training.trainer import OPDTrainer, load_resolved_config
from miniverl.utils.io import write_json
from miniverl.utils.runs import RunPaths


def evaluate_run(
    run_dir: str | Path,
    *,
    tag: str,
    checkpoint: str = "final",
    split: str | None = None,
    quiet: bool = True,
) -> dict[str, Any]:
    paths = RunPaths(run_dir)
    target = paths.eval_tag_json(tag)
    config = load_resolved_config(run_dir)
    if not paths.config_validated.is_file():
        raise RunDirectoryError(f"{paths.config_validated} not found")
    validated = RunConfig.from_mapping(
        yaml.safe_load(paths.config_validated.read_text(encoding="utf-8")),
        source=str(paths.config_validated),
    )
    chosen = split or config.eval.split
    if chosen not in ("eval", "test"):
        raise ConfigError(f"--split must be eval or test, got {chosen!r}")
    size = getattr(config.environment, f"{chosen}_tasks")
    if size == 0:
        raise ConfigError(
            f"the {chosen!r} split of {paths.root} is empty (environment.{chosen}_tasks: 0), so there is nothing to evaluate",
            hint=f"evaluate another split, or train a run with environment.{chosen}_tasks > 0",
        )
    loaded = load_checkpoint(paths.checkpoint(checkpoint))
    if loaded.state["config_digest"] != validated.digest():
        raise CheckpointError(
            f"checkpoint {checkpoint} does not belong to {paths.config_validated} (config digest differs)",
            hint="the run directory was edited; re-run training",
        )
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
