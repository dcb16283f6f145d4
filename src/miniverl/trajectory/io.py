"""JSON Lines I/O for trajectories: no pickle, validated on read and on write.

``iter_trajectories`` re-validates every line as it streams and names ``<path>:<lineno>``
in every error, so a hand-edited or tampered file fails loudly instead of silently
training on tool output. Writes are atomic (``write_trajectories``) or whole-line
appends (``append_trajectories``), so a crash never leaves a half line that reads as
valid.

A trace written many times over (the SFT warm-up logs every task's oracle trace each time
the task is drawn) is stored once: appending through a :class:`SharedTraces` writes the
first copy in full, tagged ``"trace_digest"`` (SHA-256 of the record without its
per-call fields, :data:`PER_CALL_FIELDS`), and every later copy as a reference line
``{"same_as": <digest>, "trajectory_id", "policy_version", "task_id", "environment",
"schema_version"}``. The reader keeps the tagged records it has passed, checks each tag
against its record, resolves a reference only to an *earlier* line, and validates the
resolved record like any other, so every reader of this module returns the same
trajectories either way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from miniverl.errors import SchemaValidationError
from miniverl.schemas.trajectory import TRAJECTORY_SCHEMA_VERSION, Trajectory
from miniverl.utils.hashing import canonical_json, sha256_text
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


PER_CALL_FIELDS = ("trajectory_id", "policy_version")
"""Fields two copies of one trace may differ in; a reference line carries its own."""
DIGEST_KEY = "trace_digest"
REFERENCE_KEY = "same_as"
REFERENCE_FIELDS = frozenset(
    {REFERENCE_KEY, "schema_version", "task_id", "environment", *PER_CALL_FIELDS}
)
_DIGEST_MARK = f'"{DIGEST_KEY}": "'.encode()


def _trace_body(record: dict[str, Any]) -> str:
    """Canonical JSON of a trajectory record without its :data:`PER_CALL_FIELDS` and tag."""
    return canonical_json(
        {k: v for k, v in record.items() if k not in PER_CALL_FIELDS and k != DIGEST_KEY},
        ensure_ascii=False,
    )


def trace_digest(record: dict[str, Any]) -> str:
    """SHA-256 of a trajectory record without its :data:`PER_CALL_FIELDS` (and digest tag)."""
    return sha256_text(_trace_body(record))


class SharedTraces:
    """Which traces one trajectories file already holds in full, for reference lines.

    The set is read from the file on first use (a resumed run refers to the traces its
    first life wrote, so its log equals an uninterrupted run's) and read again whenever
    the file is shorter than after this writer's last append (a resume cut it back).
    Only digest-tagged lines (those written through a ``SharedTraces``) are referred to,
    and a trace appended here only once its full line is on disk.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._digests: set[str] | None = None
        self._size = 0

    def _current(self) -> set[str]:
        size = self.path.stat().st_size if self.path.is_file() else 0
        if self._digests is None or size < self._size:
            self._digests = self._scan()
        self._size = size
        return self._digests

    def _scan(self) -> set[str]:
        found: set[str] = set()
        if not self.path.is_file():
            return found
        with open(self.path, "rb") as handle:
            for raw in handle:
                if _DIGEST_MARK not in raw:
                    continue
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get(DIGEST_KEY), str):
                    found.add(record[DIGEST_KEY])
        return found

    def append(self, trajectories: list[Trajectory], *, sync: bool = True) -> None:
        """Append ``trajectories`` in one write: each known trace as a reference line.

        ``sync``: fsync before returning (``utils.io.append_jsonl``)."""
        known = self._current()
        new: set[str] = set()
        lines = []
        for t in trajectories:
            record = t.model_dump(mode="json")
            digest = trace_digest(record)
            if digest in known or digest in new:
                lines.append(
                    {k: v for k, v in record.items() if k in REFERENCE_FIELDS}
                    | {REFERENCE_KEY: digest}
                )
            else:
                new.add(digest)
                lines.append({**record, DIGEST_KEY: digest})
        append_jsonl(self.path, lines, sync=sync)
        known |= new
        self._size = self.path.stat().st_size


def append_trajectories(
    path: str | os.PathLike[str],
    trajectories: Iterable[Trajectory],
    *,
    shared: SharedTraces | None = None,
    sync: bool = True,
) -> int:
    """Append complete lines in a single write (the trainer's per-cycle log).

    With ``shared`` (for ``path``), a trace the file already holds in full is written as a
    reference line instead of a second copy. ``sync``: fsync before returning; the trainer
    passes ``False`` and fsyncs its logs at its durability points (``utils.io.DurableLogs``).
    """
    items = _validated(trajectories)
    if shared is None:
        append_jsonl(path, [t.model_dump(mode="json") for t in items], sync=sync)
    else:
        if Path(path) != shared.path:
            raise ValueError(f"shared traces of {shared.path}, not of {path}")
        shared.append(items, sync=sync)
    return len(items)


def format_validation_errors(prefix: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{prefix}: {loc}: {err['msg']}" if loc else f"{prefix}: {err['msg']}")
    return "; ".join(parts)


def _resolve_shared(
    record: dict[str, Any], *, where: str, traces: dict[str, str]
) -> dict[str, Any]:
    """The full record of a digest-tagged or reference line.

    ``traces`` maps the digest of every tagged line read so far to its canonical JSON
    (:func:`_trace_body`); a reference is parsed from that text afresh, so no two returned
    trajectories share a nested object.
    """
    if REFERENCE_KEY in record:
        extra = set(record) - REFERENCE_FIELDS
        if extra:
            raise SchemaValidationError(
                f"{where}: a reference line ({REFERENCE_KEY!r}) has unexpected keys {sorted(extra)}"
            )
        digest = record[REFERENCE_KEY]
        body = traces.get(digest) if isinstance(digest, str) else None
        if body is None:
            raise SchemaValidationError(
                f"{where}: refers to trace {str(digest)[:16]!r}, which no earlier line of this file holds",
                hint="the file was cut, reordered or edited; regenerate it",
            )
        base: dict[str, Any] = json.loads(body)
        for key in ("task_id", "environment", "schema_version"):
            if key in record and record[key] != base.get(key, record[key]):
                raise SchemaValidationError(
                    f"{where}: {key} {record[key]!r} differs from the referred trace's {base.get(key)!r}"
                )
        return {**base, **{k: record[k] for k in PER_CALL_FIELDS if k in record}}
    if DIGEST_KEY in record:
        digest = record.pop(DIGEST_KEY)
        body = _trace_body(record)
        if digest != sha256_text(body):
            raise SchemaValidationError(
                f"{where}: {DIGEST_KEY} does not match the record (edited after it was written)",
                hint="regenerate the file",
            )
        traces[digest] = body
    return record


def parse_trajectory_line(
    line: str,
    *,
    where: str,
    vocab_size: int | None = None,
    traces: dict[str, str] | None = None,
) -> Trajectory:
    """Parse and validate one JSONL record; ``where`` is ``<path>:<lineno>``.

    ``vocab_size``: the reading tokenizer's vocabulary; a token id at or beyond it is a
    schema error (it would index past the embedding table). ``traces``: the digest-tagged
    records of the earlier lines of the same file (filled in here); without it a reference
    line has nothing to refer to and is an error.
    """
    record = loads_json(
        line, where=where, error=SchemaValidationError, max_bytes=MAX_JSONL_LINE_BYTES
    )
    if not isinstance(record, dict):
        raise SchemaValidationError(f"{where} is not a JSON object")
    record = _resolve_shared(record, where=where, traces={} if traces is None else traces)
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
    traces: dict[str, str] = {}
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
            yield parse_trajectory_line(
                line, where=f"{path}:{lineno}", vocab_size=vocab_size, traces=traces
            )


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
