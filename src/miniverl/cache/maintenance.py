"""Validate, prune and summarise a teacher cache from raw bytes, without torch.

``miniverl cache stats|validate|prune`` (:mod:`miniverl.cli.cache_cmd`) call these
functions directly, so they work from a base install and on caches received from
elsewhere; :class:`~miniverl.cache.store.TeacherCache` delegates its ``validate``,
``prune`` and ``stats`` here. Everything reads ``index.json`` and its journal through
:mod:`miniverl.cache.index` and the shards through
:mod:`miniverl.cache.safetensors_io`; no module imported here imports torch or
safetensors (``tests/unit/test_cache_cli.py`` hides both and runs every command).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl.cache.index import (
    delete_shards,
    entry_infos,
    load_index,
    missing_cache_error,
    next_shard_number,
    shard_path,
    unreferenced_files,
    write_index,
)
from miniverl.cache.layout import (
    READ_BLOCK,
    SHARD_METADATA,
    expected_layout,
    index_dtype_code,
    now_iso,
    tensor_name,
)
from miniverl.cache.safetensors_io import (
    DTYPE_SIZES,
    RawTensor,
    TensorInfo,
    encode_safetensors,
    parse_safetensors_header,
    read_safetensors_header,
    tensor_infos,
)
from miniverl.errors import CacheIntegrityError
from miniverl.schemas.cache import CacheEntryRecord, CacheIndex, CacheShardRecord
from miniverl.utils.hashing import sha256_bytes, sha256_file
from miniverl.utils.io import atomic_write_bytes


def open_index(directory: str | Path) -> CacheIndex:
    """The committed index of the cache at ``directory`` (journal replayed), or a clean error."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise CacheIntegrityError(f"{path} exists and is not a directory")
    index = load_index(path) if path.is_dir() else None
    if index is None:
        raise missing_cache_error(directory)
    return index


@dataclass(frozen=True)
class ValidationReport:
    """What :func:`validate` verified (it raises instead of reporting a problem)."""

    directory: str
    entries: int
    shards: int
    positions: int
    bytes_verified: int
    orphan_files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        line = (
            f"cache {self.directory} is valid: {self.entries} entries, {self.positions} positions, "
            f"{self.shards} shards, {self.bytes_verified} bytes checked against per-shard and "
            "per-entry SHA-256"
        )
        if self.orphan_files:
            line += f"; {len(self.orphan_files)} unreferenced file(s) left by an interrupted write (prune removes them)"
        return line


def validate(directory: str | Path, index: CacheIndex | None = None) -> ValidationReport:
    """Recompute every shard's file SHA-256 and every entry's tensor SHA-256.

    Also checks each shard's size and safetensors structure and each entry's tensor
    dtypes and shapes. Every problem is collected, then one :class:`CacheIntegrityError`
    names each bad shard and entry. Files the index does not reference are reported in
    the returned :class:`ValidationReport`, not treated as errors. ``index`` defaults to
    the committed one on disk.
    """
    directory = Path(directory)
    index = open_index(directory) if index is None else index
    problems: list[str] = []
    bytes_verified = 0
    for name, shard in sorted(index.shards.items()):
        try:
            path = shard_path(directory, name)
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"shard {name} is missing (entries {shard.entries[:3]} cannot be read)")
            continue
        except CacheIntegrityError as exc:
            problems.append(exc.message)
            continue
        if size != shard.size_bytes:
            problems.append(
                f"shard {name} is {size} bytes but the index records {shard.size_bytes} (truncated or appended to)"
            )
        actual = sha256_file(path)
        if actual != shard.sha256:
            problems.append(
                f"shard {name} failed its file SHA-256 check (index {shard.sha256[:12]}, file {actual[:12]})"
            )
        bytes_verified += size
        try:
            header, data_start = read_safetensors_header(path)
        except CacheIntegrityError as exc:
            problems.append(f"shard {name} is malformed: {exc.message}")
            continue
        infos = tensor_infos(header, data_start)
        with open(path, "rb") as handle:
            for key in shard.entries:
                problem = _check_entry(index, index.entries[key], infos, handle)
                if problem:
                    problems.append(problem)
    if problems:
        raise CacheIntegrityError(
            f"teacher cache {directory} failed validation ({len(problems)} problem(s)):\n  - "
            + "\n  - ".join(problems)
        )
    return ValidationReport(
        directory=str(directory),
        entries=len(index.entries),
        shards=len(index.shards),
        positions=sum(e.num_positions for e in index.entries.values()),
        bytes_verified=bytes_verified,
        orphan_files=unreferenced_files(directory, index),
    )


def _check_entry(
    index: CacheIndex, record: CacheEntryRecord, infos: dict[str, TensorInfo], handle: Any
) -> str | None:
    try:
        digest = hashlib.sha256()
        for info in entry_infos(index.provenance, record, infos):
            handle.seek(info.begin)
            remaining = info.nbytes
            while remaining:
                block = handle.read(min(remaining, READ_BLOCK))
                if not block:
                    return f"entry {record.key!r} in {record.shard} is truncated"
                digest.update(block)
                remaining -= len(block)
    except CacheIntegrityError as exc:
        return exc.message
    if digest.hexdigest() != record.sha256:
        return f"entry {record.key!r} in {record.shard} failed its tensor SHA-256 check"
    return None


def prune(
    directory: str | Path,
    keep_versions: Iterable[int],
    *,
    index: CacheIndex | None = None,
    claim_shard_number: Callable[[], int] | None = None,
) -> dict[str, Any]:
    """Keep only entries whose policy version is in ``keep_versions``.

    Shards left without entries are deleted; shards that keep some entries but also
    hold removed or superseded tensors are compacted into new shards written by hand
    from the verified raw bytes (:func:`~miniverl.cache.safetensors_io.encode_safetensors`).
    The index is committed after the new shards and before any deletion, so a crash
    leaves either the old or the new cache valid. Unreferenced files left by an
    interrupted write are removed too. ``claim_shard_number`` hands out new shard numbers
    (a live :class:`~miniverl.cache.store.TeacherCache` passes its own counter); by
    default numbers continue past every shard in the index or on disk.
    """
    directory = Path(directory)
    index = open_index(directory) if index is None else index
    if claim_shard_number is None:
        counter = iter(range(next_shard_number(directory, index), 100_000))
        claim_shard_number = counter.__next__
    keep = {int(v) for v in keep_versions}
    new = index.model_copy(deep=True)
    removed = [k for k, e in index.entries.items() if e.policy_version not in keep]
    for key in removed:
        del new.entries[key]
    bytes_before = sum(s.size_bytes for s in index.shards.values())
    deleted: list[str] = []
    compacted: dict[str, str] = {}
    for name, shard in sorted(index.shards.items()):
        live = [k for k in shard.entries if k in new.entries]
        if live:
            live_names = {tensor_name(k, t) for k in live for t in index.entries[k].tensors}
            if live == shard.entries and live_names == set(_shard_tensor_infos(directory, name)):
                continue
        del new.shards[name]
        deleted.append(name)
        if not live:
            continue
        target = f"shard-{claim_shard_number():05d}.safetensors"
        data = _compact_shard(directory, index, shard, [index.entries[k] for k in live])
        atomic_write_bytes(shard_path(directory, target), data)
        compacted[name] = target
        new.shards[target] = CacheShardRecord(
            name=target, sha256=sha256_bytes(data), size_bytes=len(data), entries=live
        )
        for key in live:
            new.entries[key] = new.entries[key].model_copy(update={"shard": target})
    committed = index
    if removed or deleted:
        new.updated_at = now_iso()
        committed = write_index(directory, new)[0]
    delete_shards(directory, deleted)
    orphans = unreferenced_files(directory, committed)
    for orphan in orphans:
        with contextlib.suppress(FileNotFoundError):
            (directory / orphan).unlink()
    versions: dict[int, int] = {}
    for entry in new.entries.values():
        versions[entry.policy_version] = versions.get(entry.policy_version, 0) + 1
    return {
        "kept_entries": len(new.entries),
        "removed_entries": len(removed),
        "kept_versions": dict(sorted(versions.items())),
        "deleted_shards": [n for n in deleted if n not in compacted],
        "compacted_shards": compacted,
        "removed_unreferenced_files": orphans,
        "bytes_before": bytes_before,
        "bytes_after": sum(s.size_bytes for s in new.shards.values()),
    }


def _shard_tensor_infos(directory: Path, name: str) -> dict[str, TensorInfo]:
    path = shard_path(directory, name)
    if not path.exists():
        raise CacheIntegrityError(f"shard {name} is missing from {directory}")
    header, data_start = read_safetensors_header(path)
    return tensor_infos(header, data_start)


def _compact_shard(
    directory: Path, index: CacheIndex, shard: CacheShardRecord, records: list[CacheEntryRecord]
) -> bytes:
    """Safetensors bytes holding only ``records``' tensors, copied from a verified shard."""
    data = shard_path(directory, shard.name).read_bytes()
    if sha256_bytes(data) != shard.sha256:
        raise CacheIntegrityError(
            f"shard {shard.name} failed its file SHA-256 check; refusing to compact corrupted data",
            hint=f"run 'miniverl cache validate {directory}' and rebuild the cache",
        )
    header, data_start = parse_safetensors_header(data, len(data), where=shard.name)
    infos = tensor_infos(header, data_start)
    tensors: list[RawTensor] = []
    for record in records:
        digest = hashlib.sha256()
        for info in entry_infos(index.provenance, record, infos):
            chunk = data[info.begin : info.end]
            digest.update(chunk)
            tensors.append(RawTensor(info.name, info.dtype, info.shape, chunk))
        if digest.hexdigest() != record.sha256:
            raise CacheIntegrityError(
                f"entry {record.key!r} in {shard.name} failed its tensor SHA-256 check"
            )
    return encode_safetensors(tensors, SHARD_METADATA)


def stats(
    directory: str | Path, index: CacheIndex | None = None, *, staged_entries: int = 0
) -> dict[str, Any]:
    """Counts and sizes from the index alone (no shard is opened).

    ``bytes_per_position`` is tensor data per cached position; ``file_bytes_per_position``
    adds shard headers. ``full_logits_bf16_bytes_per_position`` (V × 2) and
    ``compression_ratio`` put them against storing bf16 full logits.
    """
    directory = Path(directory)
    index = open_index(directory) if index is None else index
    prov = index.provenance
    positions = sum(e.num_positions for e in index.entries.values())
    tensor_bytes = 0
    versions: dict[int, int] = {}
    for entry in index.entries.values():
        for dtype, shape in expected_layout(prov, entry).values():
            tensor_bytes += math.prod(shape) * DTYPE_SIZES[dtype]
        versions[entry.policy_version] = versions.get(entry.policy_version, 0) + 1
    shard_bytes = sum(s.size_bytes for s in index.shards.values())
    per_position = tensor_bytes / positions if positions else None
    full = prov.vocab_size * 2
    return {
        "directory": str(directory),
        "teacher_model_id": prov.teacher_model_id,
        "teacher_revision": prov.teacher_revision,
        "tokenizer_fingerprint": prov.tokenizer_fingerprint,
        "teacher_mode": prov.teacher_mode,
        "loss_mode": prov.loss_mode,
        "temperature": prov.temperature,
        "vocab_size": prov.vocab_size,
        "top_k": prov.top_k,
        "dtype": prov.dtype,
        "index_dtype": index_dtype_code(prov.vocab_size),
        "entries": len(index.entries),
        "positions": positions,
        "shards": len(index.shards),
        "versions": dict(sorted(versions.items())),
        "tensor_bytes": tensor_bytes,
        "total_bytes": shard_bytes,
        "bytes_per_position": per_position,
        "file_bytes_per_position": shard_bytes / positions if positions else None,
        "full_logits_bf16_bytes_per_position": full,
        "compression_ratio": full / per_position if per_position else None,
        "staged_entries": staged_entries,
        "unreferenced_files": unreferenced_files(directory, index),
    }


__all__ = ["ValidationReport", "open_index", "prune", "stats", "validate"]
