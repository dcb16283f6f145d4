"""The resolved config of a finished run: what ``miniverl eval --run`` and export rebuild from.

Above :mod:`miniverl.config.models`: it turns a run directory's ``config.resolved.yaml``
into a :class:`~miniverl.config.models.RunConfig`, and reports a missing or edited file as
a :class:`~miniverl.errors.RunDirectoryError` (the run, not the recipe, is at fault).
"""

from __future__ import annotations

from pathlib import Path

from miniverl.config.models import RunConfig
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import load_yaml_file


def load_resolved_config(run_dir: str | Path) -> RunConfig:
    """``config.resolved.yaml`` of a run: what ``miniverl eval --run`` and export rebuild from.

    Every ``auto`` in it was decided when the run started
    (:mod:`miniverl.training.resolve`), so nothing resolves differently now.
    """
    paths = RunPaths(run_dir)
    if not paths.config_resolved.exists() and not paths.config_resolved.is_symlink():
        raise RunDirectoryError(
            f"{paths.config_resolved} not found",
            hint="point --run at a directory written by 'miniverl train'",
        )
    data = load_yaml_file(paths.config_resolved, error=RunDirectoryError)
    if not isinstance(data, dict):
        raise RunDirectoryError(f"{paths.config_resolved} is not a mapping of config sections")
    try:
        return RunConfig.from_mapping(data, source=str(paths.config_resolved))
    except ConfigError as exc:
        raise RunDirectoryError(exc.message, hint="the file was edited; re-run training") from None


__all__ = ["load_resolved_config"]
