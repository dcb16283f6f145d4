"""JSON Lines I/O for trajectories: no pickle, validated on read and on write.

``iter_trajectories`` re-validates every line as it streams and names ``<path>:<lineno>``
in every error, so a hand-edited or tampered file fails loudly instead of silently
training on tool output. Writes are atomic (``write_trajectories``) or whole-line
appends (``append_trajectories``), so a crash never leaves a half line that reads as
valid.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError

from miniverl.errors import SchemaValidationError
from miniverl.schemas.trajectory import TRAJECTORY_SCHEMA_VERSION, Trajectory
from miniverl.utils.io import append_jsonl, atomic_write_text
from miniverl.utils.safe_load import MAX_JSONL_LINE_BYTES, loads_json, require_regular_file


def _line(trajectory: Trajectory) -> str:
    return (
        json.dumps(trajectory.model_dump(mode="json"), ensure_ascii=False, separators=(", ", ": "))
        + "\n"
    )


def _validated(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    out = []
    for t in trajectories:
        if not isinstance(t, Trajectory):
            raise TypeError(f"expected Trajectory, got {type(t).__name__}")
        out.append(Trajectory.model_validate(t.model_dump()))
    return out


def write_trajectories(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> int:
    """Replace ``path`` atomically with one JSON line per trajectory. Returns the count."""
    items = _validated(trajectories)
    atomic_write_text(path, "".join(_line(t) for t in items))
    return len(items)


def append_trajectories(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> int:
    """Append complete lines in a single write (the trainer's per-cycle log)."""
    items = _validated(trajectories)
    append_jsonl(path, [t.model_dump(mode="json") for t in items])
    return len(items)


def format_validation_errors(prefix: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{prefix}: {loc}: {err['msg']}" if loc else f"{prefix}: {err['msg']}")
    return "; ".join(parts)


def parse_trajectory_line(line: str, *, where: str, vocab_size: int | None = None) -> Trajectory:
    """Parse and validate one JSONL record; ``where`` is ``<path>:<lineno>``.

    ``vocab_size``: the reading tokenizer's vocabulary; a token id at or beyond it is a
    schema error (it would index past the embedding table).
    """
    record = loads_json(
        line, where=where, error=SchemaValidationError, max_bytes=MAX_JSONL_LINE_BYTES
    )
    if not isinstance(record, dict):
        raise SchemaValidationError(f"{where} is not a JSON object")
    version = record.get("schema_version", TRAJECTORY_SCHEMA_VERSION)
    if version != TRAJECTORY_SCHEMA_VERSION:
        raise SchemaValidationError(
            f"{where} has trajectory schema_version {version}, this build reads version {TRAJECTORY_SCHEMA_VERSION}",
            hint="read it with the miniverl version that wrote it, or regenerate the file",
        )
    try:
        trajectory = Trajectory.model_validate(record)
    except ValidationError as exc:
        raise SchemaValidationError(format_validation_errors(where, exc)) from None
    if vocab_size is not None and trajectory.token_ids and max(trajectory.token_ids) >= vocab_size:
        raise SchemaValidationError(
            f"{where}: token id {max(trajectory.token_ids)} is outside the tokenizer vocabulary "
            f"(vocab_size {vocab_size})",
            hint="the file was written by another tokenizer or edited; regenerate it",
        )
    return trajectory


def iter_trajectories(
    path: str | os.PathLike[str], *, vocab_size: int | None = None
) -> Iterator[Trajectory]:
    """Stream validated trajectories; the first bad line raises SchemaValidationError.

    Only a regular file is read (a FIFO would block); ``vocab_size`` bounds token ids.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise SchemaValidationError(
            f"trajectory file not found: {path}",
            hint="run 'miniverl demo' or 'miniverl train <recipe>' first",
        )
    require_regular_file(path, error=SchemaValidationError)
    # Binary lines decoded one at a time: a text-mode reader decodes ahead in chunks, so
    # an invalid byte on line N would be reported while reading an earlier line.
    with open(path, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SchemaValidationError(f"{path}:{lineno} is not UTF-8 text: {exc}") from None
            if not line.strip():
                continue
            if len(raw) > MAX_JSONL_LINE_BYTES:
                raise SchemaValidationError(
                    f"{path}:{lineno} is {len(raw)} bytes, over the {MAX_JSONL_LINE_BYTES}-byte line limit"
                )
            yield parse_trajectory_line(line, where=f"{path}:{lineno}", vocab_size=vocab_size)


def read_trajectories(
    path: str | os.PathLike[str], *, vocab_size: int | None = None
) -> list[Trajectory]:
    return list(iter_trajectories(path, vocab_size=vocab_size))


def count_trajectories(path: str | os.PathLike[str]) -> int:
    """Non-empty lines; no validation; 0 for a missing file."""
    path = Path(path)
    if not path.is_file():
        return 0
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())
