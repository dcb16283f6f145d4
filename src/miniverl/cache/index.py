"""The committed state of a teacher cache: ``index.json`` plus its journal (torch-free).

Commits cost what they add: a flush appends one checksummed line to ``index.journal``
(the entries and shards it adds, and the index it extends, by SHA-256) instead of
rewriting ``index.json``. :func:`load_committed` replays the journal over ``index.json``
and stops at a torn final line; a journal whose first line names another index was left
by an interrupted compaction and is ignored; any other bad line is corruption. The same
:func:`apply_journal_record` commits and replays, so a replayed cache equals the one the
writer held. :func:`write_index` is the other commit point (temporary name, rename, then
the folded-in journal is deleted).

Also here: the directory rules both the store and :mod:`miniverl.cache.maintenance` obey
(shard names resolve to regular files directly inside the directory; shard numbers are
never reused) and the per-entry layout check against the index.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from miniverl.cache.layout import (
    INDEX_NAME,
    JOURNAL_NAME,
    MAX_INDEX_BYTES,
    MAX_JOURNAL_BYTES,
    REQUIRED_TENSORS,
    SHARD_RE,
    TENSOR_ORDER,
    expected_layout,
    fsync_directory,
    tensor_name,
)
from miniverl.cache.safetensors_io import TensorInfo
from miniverl.errors import CacheIntegrityError
from miniverl.schemas.cache import (
    CacheEntryRecord,
    CacheIndex,
    CacheProvenance,
    CacheShardRecord,
)
from miniverl.utils.failpoints import failpoint
from miniverl.utils.hashing import canonical_json, sha256_bytes, sha256_text
from miniverl.utils.io import atomic_path, to_json_text
from miniverl.utils.safe_load import loads_json


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = " -> ".join(str(p) for p in error["loc"]) or "(root)"
        value = error.get("input")
        shown = f" (got {value!r:.80})" if isinstance(value, str | int | float) else ""
        parts.append(f"{loc}: {error['msg']}{shown}")
    more = f"; and {exc.error_count() - 5} more" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


@dataclass
class JournalState:
    """What the next append needs: the index the journal extends and its valid prefix."""

    base: str
    valid_bytes: int = 0
    records: int = 0


def load_index(directory: Path) -> CacheIndex | None:
    """The parsed, schema-checked and cross-checked index, or ``None`` when there is none."""
    loaded = load_committed(directory)
    return None if loaded is None else loaded[0]


def load_committed(directory: Path) -> tuple[CacheIndex, JournalState] | None:
    """``index.json`` with every valid journal line replayed over it, and the journal state."""
    path = directory / INDEX_NAME
    if not path.exists():
        return None
    raw = read_bounded(path, MAX_INDEX_BYTES, "an index")
    index = parse_index(raw, path)
    state = JournalState(base=sha256_bytes(raw))
    journal = directory / JOURNAL_NAME
    if journal.exists() or journal.is_symlink():
        data = read_bounded(journal, MAX_JOURNAL_BYTES, "a journal")
        for line_end, record in journal_records(data, state.base, journal):
            apply_journal_record(index, record, journal)
            state.valid_bytes, state.records = line_end, state.records + 1
        if state.records:
            check_index_consistency(index, journal)
    return index, state


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    if path.is_symlink() or not path.is_file():
        raise CacheIntegrityError(f"{path} is not a regular file")
    size = path.stat().st_size
    if size > limit:
        raise CacheIntegrityError(f"{path} is {size} bytes, over the {limit}-byte limit for {what}")
    return path.read_bytes()


def _canonical(payload: Any) -> str:
    return canonical_json(payload, ensure_ascii=False)


def journal_line(record: dict[str, Any]) -> bytes:
    """One committed flush: ``{"record": ..., "sha256": sha256(canonical record)}`` + newline."""
    digest = sha256_text(_canonical(record))
    return (_canonical({"record": record, "sha256": digest}) + "\n").encode("utf-8")


def journal_records(data: bytes, base: str, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(end offset, record)`` of each committed line.

    A line is committed once its final newline is on disk (it is written last), so a
    final fragment without one is a torn append and is ignored. A journal whose first line
    extends another index was left behind by an interrupted :meth:`TeacherCache.compact`
    and is ignored whole. Anything else (a complete line that does not parse, fails its
    checksum or switches base) is corruption, and raises :class:`CacheIntegrityError`.
    """
    offset = line_number = 0
    while True:
        end = data.find(b"\n", offset)
        if end < 0:
            return
        line_number += 1
        try:
            line = json.loads(data[offset:end].decode("utf-8"), object_pairs_hook=no_duplicate_keys)
            record = line["record"]
            intact = isinstance(record, dict) and sha256_text(_canonical(record)) == line["sha256"]
        except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
            intact = False
        if not intact:
            raise CacheIntegrityError(
                f"{path}: line {line_number} is corrupted (not JSON or failed its checksum)",
                hint="restore the cache from a copy or delete it; the trainer rebuilds targets",
            )
        if record.get("base") != base:
            if line_number == 1:
                return
            raise CacheIntegrityError(
                f"{path}: line {line_number} extends a different index.json than line 1"
            )
        offset = end + 1
        yield offset, record


def apply_journal_record(index: CacheIndex, record: dict[str, Any], path: Path) -> None:
    """Add one flush's shards and entries to ``index`` (the same code commits and replays)."""
    try:
        shards = [CacheShardRecord.model_validate(s) for s in record["shards"]]
        entries = [CacheEntryRecord.model_validate(e) for e in record["entries"]]
        dropped = [str(name) for name in record["dropped_shards"]]
        updated_at = str(record["updated_at"])
    except (ValidationError, KeyError, TypeError) as exc:
        detail = format_validation_error(exc) if isinstance(exc, ValidationError) else repr(exc)
        raise CacheIntegrityError(
            f"{path}: a committed journal line is invalid: {detail}"
        ) from None
    new_shards = {shard.name for shard in shards}
    for entry in entries:
        if entry.shard not in new_shards:
            raise CacheIntegrityError(
                f"{path}: journal entry {entry.key!r} points at {entry.shard!r}, not a shard it adds"
            )
        previous = index.entries.get(entry.key)
        if previous is not None and previous.shard in index.shards:
            owner = index.shards[previous.shard].entries
            if entry.key in owner:
                owner.remove(entry.key)
        index.entries[entry.key] = entry
    for shard in shards:
        if shard.name in index.shards:
            raise CacheIntegrityError(f"{path}: journal re-adds existing shard {shard.name!r}")
        index.shards[shard.name] = shard
    for name in dropped:
        if index.shards.get(name) is not None and index.shards[name].entries:
            raise CacheIntegrityError(f"{path}: journal drops non-empty shard {name!r}")
        index.shards.pop(name, None)
    index.updated_at = updated_at


def parse_index(raw: bytes, path: Path) -> CacheIndex:
    try:
        payload = loads_json(
            raw, where=INDEX_NAME, error=CacheIntegrityError, max_bytes=MAX_INDEX_BYTES
        )
    except CacheIntegrityError as exc:
        raise CacheIntegrityError(f"{path} is not valid UTF-8 JSON ({exc.message})") from None
    try:
        index = CacheIndex.model_validate(payload)
    except ValidationError as exc:
        raise CacheIntegrityError(
            f"{path} is not a valid cache index: {format_validation_error(exc)}"
        ) from None
    check_index_consistency(index, path)
    return index


def check_index_consistency(index: CacheIndex, path: Path) -> None:
    """Cross-record rules the schema cannot express on one record at a time."""
    owner: dict[str, str] = {}
    for name, shard in index.shards.items():
        for key in shard.entries:
            if key in owner:
                raise CacheIntegrityError(
                    f"{path}: entry {key!r} is listed by shards {owner[key]!r} and {name!r}"
                )
            owner[key] = name
    for key, entry in index.entries.items():
        if owner.get(key) != entry.shard:
            raise CacheIntegrityError(
                f"{path}: entry {key!r} points at {entry.shard!r}, which does not list it"
            )
        if entry.top_k != index.provenance.top_k:
            raise CacheIntegrityError(
                f"{path}: entry {key!r} has top_k {entry.top_k}, the cache provenance {index.provenance.top_k}"
            )
        names = entry.tensors
        if (
            len(set(names)) != len(names)
            or not set(REQUIRED_TENSORS) <= set(names)
            or not set(names) <= set(TENSOR_ORDER)
        ):
            raise CacheIntegrityError(
                f"{path}: entry {key!r} lists tensors {names}; expected {list(REQUIRED_TENSORS)} "
                "plus optionally teacher_entropy"
            )


def provenance_differences(stored: CacheProvenance, given: CacheProvenance) -> list[str]:
    a, b = stored.model_dump(), given.model_dump()
    return [
        f"{name} (cache has {a[name]!r}, expected {b[name]!r})" for name in a if a[name] != b[name]
    ]


def read_span(handle: Any, info: TensorInfo) -> bytes:
    handle.seek(info.begin)
    data = handle.read(info.nbytes)
    if len(data) != info.nbytes:
        raise CacheIntegrityError(
            f"tensor {info.name!r} is truncated: read {len(data)} of {info.nbytes} bytes"
        )
    return data


def missing_cache_error(directory: Path | str) -> CacheIntegrityError:
    return CacheIntegrityError(
        f"no teacher cache at {directory} ({INDEX_NAME} is missing)",
        hint="point at a directory written by a training run (e.g. <run>/teacher-cache)",
    )


def shard_path(directory: Path, name: str) -> Path:
    """The path of shard ``name``, strictly a regular file directly inside ``directory``."""
    if not isinstance(name, str) or not SHARD_RE.fullmatch(name):
        raise CacheIntegrityError(
            f"shard name {name!r:.80} is not of the form shard-NNNNN.safetensors"
        )
    path = directory / name
    if path.is_symlink():
        raise CacheIntegrityError(
            f"shard {name} is a symbolic link; shards must be regular files in {directory}"
        )
    if path.exists() and not path.is_file():
        raise CacheIntegrityError(
            f"shard {name} is not a regular file (a FIFO, device or directory is never read)"
        )
    if path.resolve().parent != directory.resolve():
        raise CacheIntegrityError(f"shard {name} resolves outside the cache directory {directory}")
    return path


def entry_infos(
    provenance: CacheProvenance, record: CacheEntryRecord, infos: dict[str, TensorInfo]
) -> list[TensorInfo]:
    """The entry's tensors in hashing order, checked against the layout the index implies."""
    out = []
    for tname, (dtype, shape) in expected_layout(provenance, record).items():
        info = infos.get(tensor_name(record.key, tname))
        if info is None:
            raise CacheIntegrityError(
                f"entry {record.key!r}: tensor {tname!r} is missing from {record.shard}"
            )
        if info.dtype != dtype or info.shape != shape:
            raise CacheIntegrityError(
                f"entry {record.key!r}: tensor {tname!r} in {record.shard} is {info.dtype}{list(info.shape)}, "
                f"expected {dtype}{list(shape)}"
            )
        out.append(info)
    return out


def next_shard_number(directory: Path, index: CacheIndex | None) -> int:
    """One past every shard number in the index or on disk, so no file is ever reused."""
    numbers = [int(name[6:11]) for name in (index.shards if index else {})]
    if directory.is_dir():
        numbers += [int(p.name[6:11]) for p in directory.iterdir() if SHARD_RE.fullmatch(p.name)]
    return max(numbers, default=-1) + 1


def unreferenced_files(directory: Path, index: CacheIndex) -> list[str]:
    """Shard files and temporaries the index does not reference (an interrupted write)."""
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.iterdir()):
        is_shard = SHARD_RE.fullmatch(path.name) and path.name not in index.shards
        is_temp = path.name.startswith((".shard-", f".{INDEX_NAME}.")) and path.name.endswith(
            ".tmp"
        )
        if is_shard or is_temp:
            out.append(path.name)
    return out


def write_index(directory: Path, index: CacheIndex) -> tuple[CacheIndex, JournalState]:
    """Validate and atomically write ``index``, then drop the folded-in journal.

    The rename of ``index.json`` is the commit point: from then on the journal's lines
    name an index that no longer exists, so a crash before its deletion is harmless.
    Returns the validated index and the state of the (now empty) journal that extends it.
    """
    checked = CacheIndex.model_validate(index.model_dump())
    check_index_consistency(checked, directory / INDEX_NAME)
    directory.mkdir(parents=True, exist_ok=True)
    raw = to_json_text(checked.model_dump(mode="json")).encode("utf-8")
    with atomic_path(directory / INDEX_NAME) as tmp:
        tmp.write_bytes(raw)
        failpoint("cache.index_before_rename")
    failpoint("cache.index_renamed")
    with contextlib.suppress(FileNotFoundError):
        (directory / JOURNAL_NAME).unlink()
    fsync_directory(directory)
    return checked, JournalState(base=sha256_bytes(raw))


def delete_shards(directory: Path, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            shard_path(directory, name).unlink()


__all__ = [
    "JournalState",
    "apply_journal_record",
    "check_index_consistency",
    "delete_shards",
    "entry_infos",
    "journal_line",
    "load_committed",
    "load_index",
    "missing_cache_error",
    "next_shard_number",
    "provenance_differences",
    "read_span",
    "shard_path",
    "unreferenced_files",
    "write_index",
]
