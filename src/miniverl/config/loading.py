"""Reading a recipe: safe YAML, dotted ``key=value`` overrides, error formatting, and
the resolved config of a finished run.

Everything but :func:`load_resolved_config` works on plain mappings, before and around
validation, so it depends on no section model; :class:`~miniverl.config.recipe.RunConfig`
calls it from ``from_yaml``/``from_mapping``/``with_overrides``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from miniverl.config.limits import BOUND_HINT
from miniverl.errors import ConfigError, RunDirectoryError
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import load_yaml_file, loads_yaml

if TYPE_CHECKING:
    from miniverl.config.recipe import RunConfig


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a recipe through :func:`miniverl.utils.safe_load.load_yaml_file`.

    Safe constructors only, a size, depth and alias-expansion limit, duplicate keys
    refused, and only a regular file is opened.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            f"recipe not found: {path}",
            hint="pass the path of a YAML recipe, e.g. recipes/toy_demo.yaml",
        )
    data = load_yaml_file(path, error=ConfigError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}"
        )
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.cycles=4"`` -> (["train", "cycles"], 4). Values are parsed as YAML scalars."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"override {item!r} is not of the form section.key=value",
            hint="e.g. train.cycles=4 loss.divergence=reverse_kl",
        )
    parts = key.split(".")
    if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts):
        raise ConfigError(f"override key {key!r} must be dotted identifiers, e.g. loss.top_k")
    value = loads_yaml(raw, where=f"override {item!r}", error=ConfigError) if raw.strip() else ""
    return parts, value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a deep copy of ``data`` with dotted overrides applied.

    Unknown keys are not rejected here: validation rejects them with their key path,
    exactly as it would in the file.
    """
    result = _deep_copy(data)
    for item in overrides:
        parts, value = parse_override(item)
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[: depth + 1])} is not a section"
                )
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem, each with its dotted key path."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (Extra inputs are not permitted)"
        if err["type"] in ("less_than_equal", "less_than"):
            msg = f"{msg} ({BOUND_HINT})"
        if loc == "<root>":
            lines.extend(f"  - {part}" for part in msg.split("\n"))
        else:
            lines.append(f"  - {loc}: {msg}")
    return "\n".join([f"{source}: {len(lines)} configuration error(s)", *lines])


def load_resolved_config(run_dir: str | Path) -> RunConfig:
    """``config.resolved.yaml`` of a run: what ``miniverl eval --run`` and export rebuild from.

    Every ``auto`` in it was decided when the run started
    (:mod:`miniverl.training.resolve`), so nothing resolves differently now.
    """
    from miniverl.config.recipe import RunConfig  # recipe imports this module

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


__all__ = [
    "apply_overrides",
    "format_validation_error",
    "load_resolved_config",
    "load_yaml_mapping",
    "parse_override",
]
