"""What ``train`` and ``demo`` keep about how they were invoked, and reuse.

``command.json`` in the run directory stores the recipe path and the dotted overrides a
run was started with, so ``miniverl train <recipe> --output DIR --resume`` needs no
retyping: the stored overrides are applied again (and the config digest check of the
checkpoint still refuses a resume whose config differs).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from miniverl.errors import RunDirectoryError
from miniverl.utils.io import read_json, write_json
from miniverl.utils.runs import RunPaths

COMMAND_FILE = "command.json"


def save_command(
    run_dir: Path, *, command: str, recipe: str | None, overrides: Sequence[str]
) -> None:
    write_json(
        run_dir / COMMAND_FILE,
        {"command": command, "recipe": recipe, "overrides": list(overrides)},
    )


def stored_overrides(run_dir: Path) -> list[str] | None:
    """The overrides a run was started with, or ``None`` when it stored none (older runs)."""
    path = run_dir / COMMAND_FILE
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDirectoryError(f"{path} is not valid JSON: {exc}") from None
    overrides = data.get("overrides") if isinstance(data, dict) else None
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise RunDirectoryError(f"{path}: 'overrides' must be a list of strings")
    return overrides


def resume_command(run_dir: Path, recipe: Path | None) -> str:
    """The exact command that resumes ``run_dir`` (overrides come from ``command.json``).

    A demo has no recipe file of its own; its validated config is an exact stand-in
    (same digest), so the demo's resume goes through ``config.validated.yaml``.
    """
    source = recipe if recipe is not None else RunPaths(run_dir).config_validated
    return shlex.join(["miniverl", "train", str(source), "--output", str(run_dir), "--resume"])


__all__ = ["resume_command", "save_command", "stored_overrides"]
