"""Recovery of a run that died before its first checkpoint (README "Reliability" section).

Everything a run writes before its first checkpoint (the toy-teacher fit, the baseline
evaluation, the SFT warm-up) is a deterministic function of the recipe, so the way to
recover it is to recompute it: ``--resume`` on such a directory deletes the artifacts the
dead run left and starts again from the beginning. Only miniverl's own artifact names are
deleted, ``events.jsonl`` is kept (it records the crash), and a directory whose recipe
differs from the one passed now is refused rather than wiped.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError, ConfigError, RunDirectoryError
from miniverl.training.checkpoint_select import select_resume_checkpoint
from miniverl.utils.io import repair_jsonl_tail
from miniverl.utils.logging import EventLog
from miniverl.utils.runlock import LOCK_NAME
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import load_yaml_file

TOY_TEACHER_FILE = "toy-teacher.safetensors"
_STAGING = re.compile(r"\.[A-Za-z0-9][A-Za-z0-9_.-]*\.[A-Za-z0-9_]{8}")
"""``checkpoints/.<name>.<mkdtemp suffix>``: a checkpoint being assembled (checkpoint.py)."""


def restart_artifacts(paths: RunPaths) -> list[Path]:
    """Files and directories a run writes before (or beside) its first checkpoint."""
    fixed = [
        paths.config_submitted,
        paths.config_validated,
        paths.config_original,
        paths.config_resolved,
        paths.manifest,
        paths.environment,
        paths.metrics,
        paths.trajectories,
        paths.eval_trajectories,
        paths.token_analysis,
        paths.teacher_cache,
        paths.checkpoints,
        paths.eval_json,
        paths.report_html,
        paths.summary_md,
        paths.root / TOY_TEACHER_FILE,
    ]
    temporaries = (
        [p for p in paths.root.glob(".*.tmp") if p.name != LOCK_NAME] if paths.root.is_dir() else []
    )
    return [p for p in fixed + temporaries if p.exists() or p.is_symlink()]


def has_run_traces(paths: RunPaths) -> bool:
    """Whether ``paths.root`` holds anything a miniverl run writes."""
    return bool(restart_artifacts(paths)) or paths.events.exists()


def prepare_clean_restart(paths: RunPaths, config: RunConfig) -> list[str]:
    """Delete a checkpoint-less run's artifacts so it can start again; names removed.

    Refuses when a visible checkpoint directory exists (it would be a damaged checkpoint,
    never silently discarded) or when the directory's validated recipe differs.
    """
    if paths.checkpoints.is_dir():
        visible = sorted(c for c in paths.checkpoints.iterdir() if not c.name.startswith("."))
        if visible:
            raise CheckpointError(
                f"{visible[0]} has no valid checkpoint.json, so there is nothing to resume from",
                hint=f"delete {visible[0]} to restart the run from the beginning",
            )
    if paths.config_validated.exists():
        try:
            previous = RunConfig.from_mapping(
                load_yaml_file(paths.config_validated, error=RunDirectoryError),
                source=str(paths.config_validated),
            )
        except ConfigError as exc:
            raise RunDirectoryError(
                f"{paths.config_validated} is not a valid recipe: {exc.message}"
            ) from None
        if previous.digest() != config.digest():
            raise CheckpointError(
                f"{paths.root} was started with a different recipe ({paths.config_validated})",
                hint="resume with exactly the recipe and overrides of the original run",
            )
    removed = []
    for artifact in restart_artifacts(paths):
        if artifact.is_dir() and not artifact.is_symlink():
            shutil.rmtree(artifact)
        else:
            artifact.unlink()
        removed.append(artifact.name)
    return removed


def remove_stale_temporaries(paths: RunPaths, cache_dir: Path | None = None) -> list[str]:
    """Undo what a write killed half-way leaves behind; the names removed or restored.

    - ``.<name>.<random>.tmp`` files beside run artifacts and in the cache (a write that
      never reached its rename: the artifact itself is untouched);
    - ``checkpoints/.<name>.<random>/`` staging directories (a checkpoint never renamed
      into place);
    - ``checkpoints/.<name>.old``: the previous checkpoint retired while its replacement
      was being renamed in. If the replacement is there the old one is deleted, otherwise
      it is renamed back, so a crash between the two renames loses nothing.
    """
    touched: list[str] = []
    for directory in (paths.root, cache_dir or paths.teacher_cache):
        if directory.is_dir():
            for tmp in directory.glob(".*.tmp"):
                if tmp.is_file():
                    tmp.unlink()
                    touched.append(tmp.name)
    if paths.checkpoints.is_dir():
        for child in sorted(paths.checkpoints.iterdir()):
            if not child.is_dir() or not (
                _STAGING.fullmatch(child.name) or child.name.endswith(".old")
            ):
                continue  # live checkpoints and --resume-from's .superseded-* are kept
            if child.name.endswith(".old"):
                live = paths.checkpoints / child.name[1:-4]
                if not live.exists():
                    child.rename(live)
                    touched.append(f"{child.name} -> {live.name}")
                    continue
            shutil.rmtree(child)
            touched.append(child.name)
    return touched


def prepare_resume(
    paths: RunPaths, config: RunConfig, *, resume_from: str | None, events: EventLog
) -> bool:
    """Tidy a directory for ``--resume``; ``False`` when it must restart from the beginning.

    The dead run's torn ``events.jsonl`` tail is repaired and its temporaries removed. With
    no complete checkpoint (and no ``--resume-from``) but traces of a run, that run is
    recomputed from scratch (:func:`prepare_clean_restart`); with neither, resuming is an error.
    """
    traces = has_run_traces(paths)  # before temporaries are cleaned up
    repair_jsonl_tail(paths.events)
    remove_stale_temporaries(paths, Path(config.cache.dir) if config.cache.dir else None)
    if resume_from is not None or select_resume_checkpoint(paths.checkpoints):
        return True
    if not traces:
        raise CheckpointError(
            f"no complete checkpoint under {paths.checkpoints} and no run to resume in {paths.root}",
            hint="start it without --resume",
        )
    removed = prepare_clean_restart(paths, config)
    events.emit(
        "restarted",
        echo="no checkpoint yet: restarting the run from the beginning",
        removed=removed,
    )
    return False


__all__ = [
    "has_run_traces",
    "prepare_clean_restart",
    "prepare_resume",
    "remove_stale_temporaries",
    "restart_artifacts",
]
