"""``TeacherCache``: teacher targets on disk, with a policy-version contract (docs/design.md §3.6, §3.8).

The directory layout and key encoding are in :mod:`miniverl.cache.layout`, the committed
index and its journal in :mod:`miniverl.cache.index`, and the torch-free ``validate`` /
``prune`` / ``stats`` in :mod:`miniverl.cache.maintenance`. This module is the store:
open, write (stage), flush (commit), read.

Why it is shaped like this:

- **The cache is the only place targets change dtype.** A scorer hands over its targets
  in its compute dtype (``CacheableTargets.cache_tensors``); :meth:`TeacherCache.write`
  converts them once, to the provenance dtype, on the CPU. Rounding twice (say fp32 →
  bf16 → fp16) would store different values than rounding once.
- **On-policy is enforced here.** :meth:`TeacherCache.read` compares the entry's policy
  version with the caller's and raises :class:`StaleCacheError` on a difference, unless
  ``reuse_across_policy_versions`` (offline_kd only; config validation enforces that).
- **Commits cost what they add.** :meth:`TeacherCache.flush` only ever writes *new* shard
  files, each to a temporary name renamed into place, and then commits them by appending
  one checksummed line to ``index.journal``. :meth:`TeacherCache.compact` (called by
  :meth:`close` and :meth:`prune`) folds the journal into a new ``index.json``.
  ``journal=False`` keeps the old commit (rewrite ``index.json`` every flush) for
  benchmarks. Until a commit point the previous state describes only files that were
  never touched, so an interrupted flush leaves the previous cache valid; the new shards
  are orphans that :meth:`TeacherCache.prune` deletes. One writer per directory is
  assumed. Every step has a ``cache.*`` failpoint (:mod:`miniverl.utils.failpoints`) so
  tests can kill a writer between any two of them.
- **Inert data.** Shards are safetensors and the index is JSON; nothing on the load path can
  run code. Shard names must match ``^shard-\\d{5}\\.safetensors$`` and resolve to a regular
  file directly inside the directory, so an edited index cannot point outside it.
- **Torch-free import.** torch and safetensors are imported inside :meth:`write`,
  :meth:`flush` and :meth:`read` only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miniverl.cache import maintenance
from miniverl.cache.index import (
    apply_journal_record,
    delete_shards,
    entry_infos,
    journal_line,
    load_committed,
    next_shard_number,
    provenance_differences,
    read_span,
    shard_path,
    write_index,
)
from miniverl.cache.layout import (
    INDEX_NAME,
    JOURNAL_NAME,
    SHARD_METADATA,
    TENSOR_ORDER,
    TORCH_DTYPE_NAMES,
    fsync_directory,
    now_iso,
    tensor_name,
    validate_key,
)
from miniverl.cache.maintenance import ValidationReport
from miniverl.cache.safetensors_io import (
    TensorInfo,
    parse_safetensors_header,
    read_safetensors_header,
    tensor_infos,
)
from miniverl.cache.targets import CacheableTargets, CachedTargets, check_result_matches, to_storage
from miniverl.errors import CacheIntegrityError, ConfigError, OffPolicyError, StaleCacheError
from miniverl.schemas.cache import CacheEntryRecord, CacheIndex, CacheProvenance, CacheShardRecord
from miniverl.utils.failpoints import failpoint
from miniverl.utils.hashing import sha256_bytes
from miniverl.utils.io import atomic_path

if TYPE_CHECKING:
    import torch


@dataclass
class _Staged:
    record: CacheEntryRecord
    tensors: dict[str, torch.Tensor]


class TeacherCache:
    """Stage teacher targets, flush them to safetensors shards, read them back verified.

    - ``provenance``: required to create a cache; when the directory already holds one, it
      must match the stored provenance field for field (a :class:`CacheIntegrityError`
      names every differing field). ``None`` opens an existing cache as it is.
    - ``strict_policy_version``: :meth:`read` must be told the expected policy version and
      refuses any other (forced in ``opd``).
    - ``reuse_across_policy_versions``: accept entries of any policy version (``offline_kd``
      only; it overrides ``strict_policy_version``).
    - ``max_entries_per_shard``: entries per new shard file.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        provenance: CacheProvenance | None = None,
        *,
        strict_policy_version: bool = True,
        reuse_across_policy_versions: bool = False,
        max_entries_per_shard: int = 256,
        journal: bool = True,
    ) -> None:
        if max_entries_per_shard < 1:
            raise ConfigError(
                f"cache.max_entries_per_shard must be >= 1; got {max_entries_per_shard}"
            )
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise CacheIntegrityError(f"{self.directory} exists and is not a directory")
        self.strict_policy_version = strict_policy_version
        self.reuse_across_policy_versions = reuse_across_policy_versions
        self.max_entries_per_shard = max_entries_per_shard
        self.journal = journal
        loaded = load_committed(self.directory) if self.directory.is_dir() else None
        self._index, self._journal = (None, None) if loaded is None else loaded
        if self._index is None:
            if provenance is None:
                raise CacheIntegrityError(
                    f"no teacher cache at {self.directory} ({INDEX_NAME} is missing)",
                    hint="point at a directory written by a training run, or pass a provenance to create a cache",
                )
            self._provenance = provenance
        else:
            if provenance is not None:
                differences = provenance_differences(self._index.provenance, provenance)
                if differences:
                    raise CacheIntegrityError(
                        f"teacher cache {self.directory} was written with a different provenance: "
                        + "; ".join(differences),
                        hint="use a fresh cache directory for this teacher/loss, or delete the old cache",
                    )
            self._provenance = self._index.provenance
        self._staged: dict[str, _Staged] = {}
        self._shard_counter: int | None = None
        self._headers: dict[str, tuple[tuple[int, int], dict[str, TensorInfo]]] = {}

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        provenance: CacheProvenance | None = None,
        *,
        strict_policy_version: bool = True,
        reuse_across_policy_versions: bool = False,
        max_entries_per_shard: int = 256,
        journal: bool = True,
    ) -> TeacherCache:
        """Open an existing cache; :class:`CacheIntegrityError` when ``index.json`` is missing."""
        if not (Path(directory) / INDEX_NAME).exists():
            raise CacheIntegrityError(
                f"no teacher cache at {directory} ({INDEX_NAME} is missing)",
                hint="point at a directory written by a training run (e.g. <run>/teacher-cache)",
            )
        return cls(
            directory,
            provenance,
            strict_policy_version=strict_policy_version,
            reuse_across_policy_versions=reuse_across_policy_versions,
            max_entries_per_shard=max_entries_per_shard,
            journal=journal,
        )

    # -- introspection ----------------------------------------------------------------

    @property
    def provenance(self) -> CacheProvenance:
        return self._provenance

    @property
    def index(self) -> CacheIndex | None:
        """A copy of the committed index (``None`` before the first flush of a new cache)."""
        return None if self._index is None else self._index.model_copy(deep=True)

    def keys(self) -> list[str]:
        """Committed entry keys (staged entries become visible after :meth:`flush`)."""
        return [] if self._index is None else list(self._index.entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, key: object) -> bool:
        return self._index is not None and key in self._index.entries

    def __len__(self) -> int:
        return 0 if self._index is None else len(self._index.entries)

    @property
    def num_staged(self) -> int:
        return len(self._staged)

    def record(self, key: str) -> CacheEntryRecord:
        """A copy of the committed index record of ``key``."""
        if self._index is None or key not in self._index.entries:
            raise KeyError(f"no committed cache entry {key!r} in {self.directory}")
        return self._index.entries[key].model_copy()

    # -- writing ----------------------------------------------------------------------

    def write(
        self,
        key: str,
        targets: CacheableTargets | dict[str, torch.Tensor],
        *,
        trajectory_id: str | None = None,
        policy_version: int | None = None,
        alignment_digest: str | None = None,
        policy_fingerprint: str | None = None,
    ) -> CacheEntryRecord:
        """Stage one entry; nothing reaches disk until :meth:`flush`.

        ``targets`` is a score result (its ``trajectory_id``, ``policy_version`` and
        ``alignment_digest`` are used unless given, and must agree when given) or a dict of
        tensors named as in :data:`TENSOR_ORDER` (then all three keywords are required).
        ``policy_fingerprint`` (default: the result's, if it has one) is recorded with the
        entry so a reader can check which weights the targets were produced for.
        Tensors are checked against the provenance (shapes, K, ids below V) and converted
        to the stored dtypes on the CPU. Staging a key twice keeps the second; flushing a key
        the cache already holds replaces it. Returns the staged record (its ``shard`` and
        ``sha256`` are placeholders until the flush).
        """
        validate_key(key)
        prov = self._provenance
        if isinstance(targets, dict):
            tensors = targets
            if trajectory_id is None or policy_version is None or alignment_digest is None:
                raise ValueError(
                    "writing raw tensors needs trajectory_id, policy_version and alignment_digest"
                )
        else:
            check_result_matches(key, targets, prov, self.directory)
            tensors = targets.cache_tensors()
            for name, given, own in (
                ("trajectory_id", trajectory_id, targets.trajectory_id),
                ("policy_version", policy_version, targets.policy_version),
                ("alignment_digest", alignment_digest, targets.alignment_digest),
            ):
                if given is not None and given != own:
                    raise ValueError(f"{name}={given!r} disagrees with the score result's {own!r}")
            trajectory_id, policy_version, alignment_digest = (
                targets.trajectory_id,
                targets.policy_version,
                targets.alignment_digest,
            )
            own_fingerprint = getattr(targets, "policy_fingerprint", None)
            if policy_fingerprint is not None and own_fingerprint not in (None, policy_fingerprint):
                raise ValueError(
                    f"policy_fingerprint={policy_fingerprint!r} disagrees with the score result's {own_fingerprint!r}"
                )
            policy_fingerprint = policy_fingerprint or own_fingerprint
        stored = to_storage(key, tensors, prov)
        n, k = (int(d) for d in stored["topk_indices"].shape)
        entropy = stored.get("teacher_entropy")
        record = CacheEntryRecord(
            key=key,
            trajectory_id=trajectory_id,
            policy_version=policy_version,
            alignment_digest=alignment_digest,
            policy_fingerprint=policy_fingerprint,
            shard="shard-00000.safetensors",
            num_positions=n,
            top_k=k,
            tensors=[name for name in TENSOR_ORDER if name in stored],
            sha256="0" * 64,
            teacher_entropy_mean=float(entropy.double().mean())
            if entropy is not None and n
            else None,
        )
        self._staged.pop(key, None)
        self._staged[key] = _Staged(record, stored)
        return record

    def _claim_shard_number(self) -> int:
        """The next unused shard number; the directory is scanned once per writer, not per flush."""
        if self._shard_counter is None:
            self._shard_counter = next_shard_number(self.directory, self._index)
        number = self._shard_counter
        self._shard_counter += 1
        return number

    def flush(self) -> list[str]:
        """Write staged entries into new shards, then commit them; return the new shard names.

        Order: every new shard (temporary name, fsync, rename), then the commit point: one
        appended, fsynced ``index.journal`` line (or, with ``journal=False`` or for a cache
        that has no ``index.json`` yet, a whole new ``index.json`` renamed into place), then
        shards left without entries (all their entries replaced) are deleted. An exception
        anywhere before the commit point leaves the previous cache untouched and keeps the
        entries staged. The cost is proportional to the staged entries in journal mode.
        """
        if not self._staged:
            if self._index is None:
                self._commit_index(self._empty_index())
            return []
        from safetensors.torch import save

        staged = list(self._staged.values())
        shards: list[CacheShardRecord] = []
        entries: list[CacheEntryRecord] = []
        for start in range(0, len(staged), self.max_entries_per_shard):
            group = staged[start : start + self.max_entries_per_shard]
            name = f"shard-{self._claim_shard_number():05d}.safetensors"
            payload = {
                tensor_name(item.record.key, tname): tensor
                for item in group
                for tname, tensor in item.tensors.items()
            }
            data = save(payload, metadata=SHARD_METADATA)
            header, data_start = parse_safetensors_header(data, len(data), where=name)
            infos = tensor_infos(header, data_start)
            view = memoryview(data)
            for item in group:
                digest = hashlib.sha256()
                for tname in item.record.tensors:
                    info = infos[tensor_name(item.record.key, tname)]
                    digest.update(view[info.begin : info.end])
                entries.append(
                    item.record.model_copy(update={"shard": name, "sha256": digest.hexdigest()})
                )
            self.directory.mkdir(parents=True, exist_ok=True)
            with atomic_path(self._shard_path(name)) as tmp:
                tmp.write_bytes(data)
                failpoint("cache.shard_before_rename")
            failpoint("cache.shard_renamed")
            shards.append(
                CacheShardRecord(
                    name=name,
                    sha256=sha256_bytes(data),
                    size_bytes=len(data),
                    entries=[item.record.key for item in group],
                )
            )
        emptied = self._emptied_by(entries)
        record = {
            "base": "",
            "updated_at": now_iso(),
            "shards": [shard.model_dump(mode="json") for shard in shards],
            "entries": [entry.model_dump(mode="json") for entry in entries],
            "dropped_shards": sorted(emptied),
        }
        if self.journal and self._index is not None and self._journal is not None:
            self._append_journal(record)
        else:
            index = (
                self._index.model_copy(deep=True)
                if self._index is not None
                else self._empty_index()
            )
            apply_journal_record(index, record, self.directory / INDEX_NAME)
            self._commit_index(index)
        self._staged.clear()
        failpoint("cache.before_shard_delete")
        self._delete_shards(sorted(emptied))
        return [shard.name for shard in shards]

    def _emptied_by(self, entries: list[CacheEntryRecord]) -> set[str]:
        """Committed shards whose every entry ``entries`` replaces."""
        if self._index is None:
            return set()
        replaced: dict[str, int] = {}
        for entry in entries:
            previous = self._index.entries.get(entry.key)
            if previous is not None:
                replaced[previous.shard] = replaced.get(previous.shard, 0) + 1
        return {
            name
            for name, count in replaced.items()
            if count == len(self._index.shards[name].entries)
        }

    def _append_journal(self, record: dict[str, Any]) -> None:
        """The journal commit point: one fsynced line, then the in-memory index follows it."""
        assert self._index is not None and self._journal is not None
        record["base"] = self._journal.base
        line = journal_line(record)
        path = self.directory / JOURNAL_NAME
        failpoint("cache.journal_before_append")
        with open(path, "ab") as handle:
            if handle.tell() != self._journal.valid_bytes:
                handle.truncate(self._journal.valid_bytes)
            half = len(line) // 2
            handle.write(line[:half])
            handle.flush()
            failpoint("cache.journal_torn")
            handle.write(line[half:])
            handle.flush()
            os.fsync(handle.fileno())
            end = handle.tell()
        if self._journal.records == 0:
            fsync_directory(self.directory)
        failpoint("cache.journal_appended")
        apply_journal_record(self._index, record, path)
        self._journal.valid_bytes, self._journal.records = end, self._journal.records + 1

    def compact(self) -> None:
        """Fold the journal into a new ``index.json`` and delete it (a no-op without one)."""
        if self._index is not None and self._journal is not None and self._journal.records:
            self._commit_index(self._index)

    def close(self) -> None:
        """Compact; the cache stays usable (a later flush starts a new journal)."""
        self.compact()

    def _empty_index(self) -> CacheIndex:
        now = now_iso()
        return CacheIndex(created_at=now, updated_at=now, provenance=self._provenance)

    def _commit_index(self, index: CacheIndex) -> None:
        """Write ``index`` (:func:`~miniverl.cache.index.write_index`) and adopt it."""
        self._index, self._journal = write_index(self.directory, index)

    def _delete_shards(self, names: list[str]) -> None:
        delete_shards(self.directory, names)
        for name in names:
            self._headers.pop(name, None)

    # -- reading ----------------------------------------------------------------------

    def _shard_path(self, name: str) -> Path:
        return shard_path(self.directory, name)

    def _shard_tensors(self, name: str) -> dict[str, TensorInfo]:
        """Parsed tensor table of shard ``name``, re-parsed whenever the file changes."""
        path = self._shard_path(name)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise CacheIntegrityError(f"shard {name} is missing from {self.directory}") from None
        signature = (st.st_size, st.st_mtime_ns)
        cached = self._headers.get(name)
        if cached is not None and cached[0] == signature:
            return cached[1]
        header, data_start = read_safetensors_header(path)
        infos = tensor_infos(header, data_start)
        self._headers[name] = (signature, infos)
        return infos

    def read(
        self,
        key: str,
        *,
        expect_policy_version: int | None,
        expect_alignment_digest: str | None = None,
        expect_policy_fingerprint: str | None = None,
    ) -> CachedTargets:
        """Entry ``key`` as verified CPU tensors.

        Raises :class:`StaleCacheError` when the entry's policy version differs from
        ``expect_policy_version`` (unless ``reuse_across_policy_versions``), or its
        alignment digest from ``expect_alignment_digest`` when given; ``None`` as the
        expected version is refused in strict mode, so strictness cannot be skipped by
        omission. ``expect_policy_fingerprint``, when given, must equal the fingerprint
        recorded with the entry (:class:`OffPolicyError` otherwise). The entry's SHA-256 is
        recomputed on every read
        (:class:`CacheIntegrityError` on a mismatch); unknown keys raise ``KeyError``.
        """
        import torch

        record = self.record(key)
        if not self.reuse_across_policy_versions and self.strict_policy_version:
            if expect_policy_version is None:
                raise ValueError(
                    "strict_policy_version requires expect_policy_version for every read"
                )
            if record.policy_version != expect_policy_version:
                raise StaleCacheError(
                    f"cached teacher targets for {key!r} were produced under policy version "
                    f"{record.policy_version}, but policy version {expect_policy_version} was expected"
                )
        if (
            expect_alignment_digest is not None
            and record.alignment_digest != expect_alignment_digest
        ):
            raise StaleCacheError(
                f"cached teacher targets for {key!r} were produced for a different alignment "
                f"(digest {record.alignment_digest[:12]} vs {expect_alignment_digest[:12]})",
                hint="the selection or teacher render changed since the targets were cached; rescore them",
            )
        if (
            expect_policy_fingerprint is not None
            and record.policy_fingerprint != expect_policy_fingerprint
        ):
            raise OffPolicyError(
                f"cached teacher targets for {key!r} were produced for policy fingerprint "
                f"{record.policy_fingerprint}, but {expect_policy_fingerprint} was expected"
            )
        infos = entry_infos(self._provenance, record, self._shard_tensors(record.shard))
        digest = hashlib.sha256()
        raw: list[bytes] = []
        try:
            with open(self._shard_path(record.shard), "rb") as handle:
                for info in infos:
                    data = read_span(handle, info)
                    digest.update(data)
                    raw.append(data)
        except OSError as exc:
            raise CacheIntegrityError(f"shard {record.shard} cannot be read ({exc})") from None
        except CacheIntegrityError as exc:
            raise CacheIntegrityError(f"entry {key!r} in {record.shard}: {exc.message}") from None
        if digest.hexdigest() != record.sha256:
            raise CacheIntegrityError(
                f"entry {key!r} in {record.shard} failed its SHA-256 check (the tensor bytes changed since they were written)"
            )
        tensors = {}
        for info, data in zip(infos, raw, strict=True):
            dtype = getattr(torch, TORCH_DTYPE_NAMES[info.dtype])
            flat = (
                torch.frombuffer(bytearray(data), dtype=dtype)
                if data
                else torch.empty(0, dtype=dtype)
            )
            if flat.is_floating_point() and bool((flat.isnan() | flat.isposinf()).any()):
                raise CacheIntegrityError(
                    f"entry {key!r} in {record.shard}: tensor {info.name!r} holds NaN or +inf",
                    hint="delete the cache directory so the targets are rescored",
                )
            tensors[info.name.rsplit("/", 1)[1]] = flat.reshape(info.shape)
        return CachedTargets(record=record, provenance=self._provenance, tensors=tensors)

    # -- maintenance (torch-free, in miniverl.cache.maintenance) ----------------------

    def _require_index(self) -> CacheIndex:
        if self._index is None:
            raise CacheIntegrityError(
                f"no teacher cache at {self.directory} ({INDEX_NAME} is missing)"
            )
        return self._index

    def validate(self) -> ValidationReport:
        """:func:`miniverl.cache.maintenance.validate` of the committed index."""
        return maintenance.validate(self.directory, self._require_index())

    def prune(self, keep_versions: Iterable[int]) -> dict[str, Any]:
        """:func:`miniverl.cache.maintenance.prune`; staged entries must be flushed first."""
        if self._staged:
            raise ValueError(f"{len(self._staged)} staged entries; flush() before prune()")
        result = maintenance.prune(
            self.directory,
            keep_versions,
            index=self._require_index(),
            claim_shard_number=self._claim_shard_number,
        )
        loaded = load_committed(self.directory)
        assert loaded is not None
        self._index, self._journal = loaded
        self._headers.clear()
        return result

    def stats(self) -> dict[str, Any]:
        """:func:`miniverl.cache.maintenance.stats`, counting this writer's staged entries."""
        return maintenance.stats(
            self.directory, self._require_index(), staged_entries=len(self._staged)
        )


__all__ = ["TeacherCache"]
