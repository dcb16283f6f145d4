"""A training run with what its recipe's lab section asks for.

The core's trainer takes its teacher and its warm-up criterion as arguments; this is where
the lab supplies them for one run: the teacher :func:`~miniverl.lab.teachers.prepare.prepare_teacher`
makes (or finds beside a cold start, or in the directory of the run being resumed), and the warm-up criterion of ``lab.warmup_until``.
``miniverl train`` and ``miniverl demo`` start their runs here; the benchmark's cells compose
the same pieces (``lab/benchmark/cell_runner.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.lab.benchmark.warmup import warmup_criterion
from miniverl.lab.teachers.prepare import prepare_teacher
from miniverl.training.recipe import OPDTrainer


def start_run(
    config: RunConfig,
    *,
    cold_start: str | Path | None = None,
    quiet: bool = True,
    **trainer_options: Any,
) -> OPDTrainer:
    """A set-up ``OPDTrainer`` of ``config``: the lab's teacher (with its record, its weights
    kept in the run directory and its events in the run's log), the warm-up criterion, and
    ``cold_start`` as the run's initial weights. ``trainer_options`` are ``OPDTrainer``'s
    (``output_dir``, ``resume``, ``resume_from``, ``submitted_recipe``, ``verbose``, ...)."""
    resumed = trainer_options.get("resume") or trainer_options.get("resume_from") is not None
    run_dir = trainer_options.get("output_dir") or Path("runs") / config.run.name
    prepared = prepare_teacher(
        config, cold_start=cold_start, resumed_run=run_dir if resumed else None, quiet=quiet
    )
    trainer = OPDTrainer(
        config,
        quiet=quiet,
        teacher=prepared.teacher,
        teacher_record=prepared.record,
        initial_weights=cold_start,
        warmup_until=warmup_criterion(config),
        **trainer_options,
    )
    trainer.setup()
    prepared.keep(trainer.paths.root, trainer.events)
    return trainer


__all__ = ["start_run"]
