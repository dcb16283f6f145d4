"""The one YAML loader and the one JSON/JSONL loader for every untrusted input.

Recipes, run-directory files, trajectories, the cache index and tool-call bodies all come
through here, so one set of limits protects every boundary:

- only regular files are opened (a FIFO or a device would block ``open`` or ``read``
  forever), and a file is read only up to its byte limit;
- YAML is read with PyYAML's *safe* constructors (no object construction), with a limit
  on aliases and on the node count after alias expansion (a "billion laughs" document is
  refused before it is built), a nesting-depth limit, and duplicate mapping keys refused;
- JSON has a nesting-depth limit checked *before* parsing, so ``RecursionError`` cannot
  escape, and a size limit; duplicate object keys are refused where asked.

Every failure is raised as the caller's :class:`~miniverl.errors.MiniverlError` subclass
with the file (or ``where``) named in the message, so a recipe error is a ``ConfigError``,
a trajectory error a ``SchemaValidationError``, and so on. Standard library and PyYAML only.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from miniverl.errors import MiniverlError, RunDirectoryError

MAX_YAML_BYTES = 1 << 20
"""Largest YAML document (1 MiB): recipes and resolved configs are a few KiB."""
MAX_JSON_BYTES = 64 << 20
"""Largest JSON document or JSONL file read whole (64 MiB)."""
MAX_JSONL_LINE_BYTES = 16 << 20
"""Largest single JSONL record (16 MiB): one trajectory line is far smaller."""
MAX_DEPTH = 64
"""Deepest nesting of mappings/sequences (YAML) or objects/arrays (JSON)."""
MAX_YAML_ALIASES = 100
"""Most ``*alias`` references in one YAML document."""
MAX_YAML_NODES = 100_000
"""Most nodes in one YAML document after expanding every alias."""

ErrorType = type[MiniverlError]


# -- files ------------------------------------------------------------------------------


def read_regular_bytes(
    path: str | os.PathLike[str], *, limit: int, error: ErrorType = RunDirectoryError
) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes.

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` on the open descriptor, so a FIFO
    is refused instead of blocking, and a file swapped after the check cannot slip through.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise error(f"{path} not found") from None
    except OSError as exc:
        raise error(f"{path} cannot be opened: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(
                f"{path} is not a regular file (a FIFO, device or directory is never read)",
                hint="replace it with the regular file it should be",
            )
        if info.st_size > limit:
            raise error(
                f"{path} is {info.st_size} bytes, over the {limit}-byte limit for this file",
                hint="the file is corrupt or not what it claims to be; regenerate it",
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{path} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{path} grew past the {limit}-byte limit while being read")
    return data


def require_regular_file(path: str | os.PathLike[str], *, error: ErrorType) -> Path:
    """``path`` if it is a regular file (not a FIFO, device, directory or dangling link)."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path} not found") from None
    except OSError as exc:
        raise error(f"{path} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path} is not a regular file (a FIFO, device or directory is never read)")
    return path


def _decode(data: bytes, where: str, error: ErrorType) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where} is not UTF-8 text: {exc}") from None


# -- JSON -------------------------------------------------------------------------------


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of ``text``, ignoring brackets inside strings."""
    depth = deepest = 0
    for ch in _BRACKETS.findall(_JSON_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def loads_json(
    text: str | bytes,
    *,
    where: str,
    error: ErrorType = RunDirectoryError,
    max_depth: int = MAX_DEPTH,
    max_bytes: int = MAX_JSON_BYTES,
    reject_duplicates: bool = True,
) -> Any:
    """Parse one JSON document with size and depth limits; every failure is ``error``."""
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise error(f"{where} is {len(text)} bytes, over the {max_bytes}-byte limit")
        text = _decode(text, where, error)
    elif len(text) > max_bytes:
        raise error(f"{where} is {len(text)} characters, over the {max_bytes} limit")
    if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:
        raise error(f"{where} is nested deeper than {max_depth} levels")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates if reject_duplicates else None)
    except json.JSONDecodeError as exc:
        raise error(f"{where} is not valid JSON: {exc}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise error(f"{where} is not acceptable JSON: {type(exc).__name__}: {exc}") from None


def load_json_file(
    path: str | os.PathLike[str],
    *,
    error: ErrorType = RunDirectoryError,
    expect: type | None = None,
    max_bytes: int = MAX_JSON_BYTES,
) -> Any:
    """Read and parse a JSON file; ``expect=dict`` also requires a top-level object."""
    data = read_regular_bytes(path, limit=max_bytes, error=error)
    value = loads_json(data, where=str(path), error=error, max_bytes=max_bytes)
    if expect is not None and not isinstance(value, expect):
        raise error(
            f"{path} holds a JSON {type(value).__name__}, expected a JSON "
            f"{'object' if expect is dict else expect.__name__}"
        )
    return value


def iter_jsonl(
    path: str | os.PathLike[str],
    *,
    error: ErrorType = RunDirectoryError,
    allow_partial_tail: bool = False,
    max_bytes: int = MAX_JSON_BYTES,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(lineno, record)`` for every non-blank line; each record must be a JSON object.

    ``allow_partial_tail``: a last line without its newline is an interrupted append and
    is skipped (it is truncated away on resume) instead of being an error.
    """
    data = read_regular_bytes(path, limit=max_bytes, error=error)
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        if lineno == len(lines) and allow_partial_tail:
            try:
                record = loads_json(raw, where=where, error=error, max_bytes=MAX_JSONL_LINE_BYTES)
            except MiniverlError:
                return
        else:
            record = loads_json(raw, where=where, error=error, max_bytes=MAX_JSONL_LINE_BYTES)
        if not isinstance(record, dict):
            raise error(f"{where} is a JSON {type(record).__name__}, expected a JSON object")
        yield lineno, record


# -- YAML -------------------------------------------------------------------------------


class _LimitedSafeLoader(yaml.SafeLoader):
    """SafeLoader that bounds depth, aliases and expanded size, and refuses duplicate keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _Limit(f"more than {MAX_YAML_ALIASES} YAML aliases")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Limit(f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # type: ignore[override]
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                except TypeError:
                    continue
                if duplicate:
                    raise _Limit(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Limit(Exception):
    """A limit of :class:`_LimitedSafeLoader` was hit (converted to the caller's error)."""


def _expanded_size(node: Any, memo: dict[int, int], active: set[int], limit: int) -> int:
    """Nodes in ``node`` with every alias expanded, memoized per shared node.

    A node reached again while it is being expanded is a recursive alias: refused.
    """
    key = id(node)
    if key in active:
        raise _Limit("holds a recursive alias")
    if key in memo:
        return memo[key]
    active.add(key)
    total = 1
    children: list[Any] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    for child in children:
        total += _expanded_size(child, memo, active, limit)
        if total > limit:
            break
    active.discard(key)
    memo[key] = total
    return total


def loads_yaml(text: str, *, where: str, error: ErrorType) -> Any:
    """Parse one YAML document under every limit above; ``None`` for an empty document."""
    if len(text) > MAX_YAML_BYTES:
        raise error(f"{where} is {len(text)} characters, over the {MAX_YAML_BYTES} limit")
    loader: _LimitedSafeLoader | None = None
    try:
        loader = _LimitedSafeLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, set(), MAX_YAML_NODES) > MAX_YAML_NODES:
            raise _Limit(f"expands to more than {MAX_YAML_NODES} nodes (alias bomb?)")
        return loader.construct_document(node)
    except _Limit as exc:
        raise error(f"{where} is refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{where} is not valid YAML: {exc}") from None
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
        raise error(f"{where} is not acceptable YAML: {type(exc).__name__}: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_file(path: str | os.PathLike[str], *, error: ErrorType = RunDirectoryError) -> Any:
    """Read a YAML file (regular, at most :data:`MAX_YAML_BYTES`, UTF-8) and parse it safely."""
    data = read_regular_bytes(path, limit=MAX_YAML_BYTES, error=error)
    return loads_yaml(_decode(data, str(path), error), where=str(path), error=error)


__all__ = [
    "MAX_DEPTH",
    "MAX_JSONL_LINE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_YAML_ALIASES",
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "iter_jsonl",
    "json_depth",
    "load_json_file",
    "load_yaml_file",
    "loads_json",
    "loads_yaml",
    "read_regular_bytes",
    "require_regular_file",
]
