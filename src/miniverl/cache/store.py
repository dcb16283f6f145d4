"""``TeacherCache``: teacher targets on disk, with a policy-version contract (docs/design.md §3.6, §3.8).

Layout of a cache directory::

    index.json                  CacheIndex: provenance, one record per entry, one per shard
    shard-00000.safetensors     tensors "<encoded key>/<name>" of up to max_entries_per_shard entries
    shard-00001.safetensors     ...

Each entry is one trajectory's bucketed targets: ``topk_indices [N, K]`` (int32, int64 when
V ≥ 2**31), ``topk_log_probs [N, K]`` and ``tail_log_prob [N]`` in the cache dtype, and
``teacher_entropy [N]`` float32. The index records the SHA-256 of every entry's tensor bytes
(concatenated in the record's ``tensors`` order) and of every shard file.

Why it is shaped like this:

- **On-policy is enforced here.** :meth:`TeacherCache.read` compares the entry's policy
  version with the caller's and raises :class:`StaleCacheError` on a difference, unless
  ``reuse_across_policy_versions`` (offline_kd only; config validation enforces that).
- **Commits cost what they add.** :meth:`TeacherCache.flush` only ever writes *new* shard
  files, each to a temporary name renamed into place, and then commits them by appending
  one checksummed line to ``index.journal`` (the entries and shards it adds, and the index
  it extends, by SHA-256). Readers replay the journal over ``index.json`` and stop at the
  first line that is torn, fails its checksum or extends another index, so a flush costs
  the bytes of its own entries, not of the whole cache. :meth:`TeacherCache.compact`
  (called by :meth:`close` and :meth:`prune`) folds the journal into a new ``index.json``
  (temporary name, rename) and then deletes the journal; a crash between the two leaves a
  journal whose lines name the old index, which readers ignore. ``journal=False`` keeps the
  old commit (rewrite ``index.json`` every flush) for benchmarks. Until a commit point the
  previous state describes only files that were never touched, so an interrupted flush
  leaves the previous cache valid; the new shards are orphans that :meth:`TeacherCache.prune`
  deletes. One writer per directory is assumed. Every step has a ``cache.*`` failpoint
  (:mod:`miniverl.utils.failpoints`) so tests can kill a writer between any two of them.
- **Inert data.** Shards are safetensors and the index is JSON; nothing on the load path can
  run code. Shard names must match ``^shard-\\d{5}\\.safetensors$`` and resolve to a regular
  file directly inside the directory, so an edited index cannot point outside it.
- **Torch-free inspection.** torch and safetensors are imported inside :meth:`write`,
  :meth:`flush` and :meth:`read` only; :meth:`stats`, :meth:`validate` and :meth:`prune`
  work on raw bytes through :mod:`miniverl.cache.safetensors_io`, so ``miniverl cache``
  runs from a base install.

Key encoding: a key is the trajectory id, any printable string of 1 to 512 characters. In
a shard its tensors are named ``<encoded key>/<name>``, where the encoding replaces ``%``
with ``%25`` and then ``/`` with ``%2F``. The encoded key therefore contains no ``/``, the
tensor name splits unambiguously at its only ``/``, and :func:`decode_key` inverts it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from miniverl.cache.safetensors_io import (
    DTYPE_SIZES,
    RawTensor,
    TensorInfo,
    encode_safetensors,
    parse_safetensors_header,
    read_safetensors_header,
    tensor_infos,
)
from miniverl.errors import CacheIntegrityError, ConfigError, OffPolicyError, StaleCacheError
from miniverl.schemas.cache import (
    SHARD_NAME_PATTERN,
    CacheEntryRecord,
    CacheIndex,
    CacheProvenance,
    CacheShardRecord,
)
from miniverl.utils.failpoints import failpoint
from miniverl.utils.io import atomic_path, atomic_write_bytes, sha256_file, to_json_text
from miniverl.utils.safe_load import loads_json

if TYPE_CHECKING:
    import torch

    from miniverl.losses.numerics import DivergenceSpec
    from miniverl.losses.providers import BucketedTargetProvider

INDEX_NAME = "index.json"
JOURNAL_NAME = "index.journal"
MAX_JOURNAL_BYTES = 1 << 30
"""A journal this large is refused unread, like an oversized index."""
MAX_KEY_LENGTH = 512
MAX_INDEX_BYTES = 1 << 30
"""An index this large would describe millions of entries; anything bigger is rejected unread."""

TENSOR_ORDER: tuple[str, ...] = (
    "topk_indices",
    "topk_log_probs",
    "tail_log_prob",
    "teacher_entropy",
)
"""Every tensor an entry may hold, in hashing order; the first three are required."""
REQUIRED_TENSORS: tuple[str, ...] = TENSOR_ORDER[:3]

CACHE_DTYPE_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
"""Cache dtype (``CacheProvenance.dtype``) -> safetensors dtype of the stored log-probs."""

_TORCH_DTYPE_NAMES = {
    "I32": "int32",
    "I64": "int64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
}
"""Safetensors dtype -> name of the torch dtype (torch itself is imported lazily)."""

_SHARD_RE = re.compile(SHARD_NAME_PATTERN)
_SHARD_METADATA = {"format": "pt", "miniverl": "teacher-cache"}
_READ_BLOCK = 1 << 20


def index_dtype_code(vocab_size: int) -> str:
    """Safetensors dtype of ``topk_indices``: I32 while every id fits, I64 beyond."""
    return "I32" if vocab_size <= 2**31 - 1 else "I64"


def validate_key(key: str) -> str:
    """Return ``key`` if it is a usable cache key (printable, 1 to 512 characters)."""
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise ValueError(
            f"cache keys are strings of 1 to {MAX_KEY_LENGTH} characters; got {key!r:.80}"
        )
    if not key.isprintable():
        raise ValueError(f"cache key {key!r:.80} contains non-printable characters")
    return key


def encode_key(key: str) -> str:
    """``%`` -> ``%25``, then ``/`` -> ``%2F``: the key as it appears in tensor names."""
    return validate_key(key).replace("%", "%25").replace("/", "%2F")


def decode_key(encoded: str) -> str:
    """Inverse of :func:`encode_key`."""
    return encoded.replace("%2F", "/").replace("%25", "%")


def tensor_name(key: str, name: str) -> str:
    """Name of tensor ``name`` of entry ``key`` inside its shard."""
    return f"{encode_key(key)}/{name}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _fsync_directory(directory: Path) -> None:
    """Make completed renames durable where the platform supports it (POSIX)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def expected_layout(
    provenance: CacheProvenance, record: CacheEntryRecord
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``name -> (safetensors dtype, shape)`` that every tensor of ``record`` must have."""
    n, k = record.num_positions, record.top_k
    log_prob = CACHE_DTYPE_CODES[provenance.dtype]
    full = {
        "topk_indices": (index_dtype_code(provenance.vocab_size), (n, k)),
        "topk_log_probs": (log_prob, (n, k)),
        "tail_log_prob": (log_prob, (n,)),
        "teacher_entropy": ("F32", (n,)),
    }
    return {name: full[name] for name in record.tensors if name in full}


class CacheableTargets(Protocol):
    """What :meth:`TeacherCache.write` needs from a score result (``TeacherScoreResult``)."""

    trajectory_id: str
    policy_version: int
    alignment_digest: str

    def cache_tensors(self, dtype: str = "float32") -> dict[str, torch.Tensor]: ...


@dataclass(frozen=True)
class CachedTargets:
    """One entry read back: its record, the cache provenance and verified CPU tensors.

    ``tensors`` holds ``topk_indices [N, K]`` (int32 or int64), ``topk_log_probs [N, K]``
    and ``tail_log_prob [N]`` in the cache dtype and, when stored, ``teacher_entropy
    [N]`` float32, bit-identical to what was written.
    """

    record: CacheEntryRecord
    provenance: CacheProvenance
    tensors: dict[str, torch.Tensor]

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def trajectory_id(self) -> str:
        return self.record.trajectory_id

    @property
    def policy_version(self) -> int:
        return self.record.policy_version

    @property
    def alignment_digest(self) -> str:
        return self.record.alignment_digest

    @property
    def num_positions(self) -> int:
        return self.record.num_positions

    @property
    def top_k(self) -> int:
        return self.record.top_k

    @property
    def topk_indices(self) -> torch.Tensor:
        return self.tensors["topk_indices"]

    @property
    def topk_log_probs(self) -> torch.Tensor:
        return self.tensors["topk_log_probs"]

    @property
    def tail_log_prob(self) -> torch.Tensor:
        return self.tensors["tail_log_prob"]

    @property
    def teacher_entropy(self) -> torch.Tensor | None:
        """``[N]`` float32 nats; the bucket-entropy lower bound unless K = V."""
        return self.tensors.get("teacher_entropy")

    @property
    def entropy_is_lower_bound(self) -> bool:
        return self.record.top_k < self.provenance.vocab_size

    def provider(
        self, spec: DivergenceSpec, device: torch.device | str | None = None
    ) -> BucketedTargetProvider:
        """A :class:`BucketedTargetProvider` over these targets (indices as int64).

        The targets were computed at the provenance temperature, so a ``spec`` with another
        temperature would silently change the objective; it is refused.
        """
        from miniverl.losses.providers import BucketedTargetProvider

        if spec.temperature != self.provenance.temperature:
            raise ConfigError(
                f"cached targets were computed at temperature {self.provenance.temperature} but the "
                f"loss asks for {spec.temperature}",
                hint="rescore with the teacher, or set loss.temperature to the cache's temperature",
            )
        provider = BucketedTargetProvider(
            self.topk_indices.long(), self.topk_log_probs, self.tail_log_prob, spec
        )
        return provider if device is None else provider.to(device)


@dataclass(frozen=True)
class ValidationReport:
    """What :meth:`TeacherCache.validate` verified (it raises instead of reporting a problem)."""

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


@dataclass
class _Staged:
    record: CacheEntryRecord
    tensors: dict[str, torch.Tensor]


def _format_validation_error(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = " -> ".join(str(p) for p in error["loc"]) or "(root)"
        value = error.get("input")
        shown = f" (got {value!r:.80})" if isinstance(value, str | int | float) else ""
        parts.append(f"{loc}: {error['msg']}{shown}")
    more = f"; and {exc.error_count() - 5} more" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


@dataclass
class _JournalState:
    """What the next append needs: the index the journal extends and its valid prefix."""

    base: str
    valid_bytes: int = 0
    records: int = 0


def _load_index(directory: Path) -> CacheIndex | None:
    """The parsed, schema-checked and cross-checked index, or ``None`` when there is none."""
    loaded = _load_committed(directory)
    return None if loaded is None else loaded[0]


def _load_committed(directory: Path) -> tuple[CacheIndex, _JournalState] | None:
    """``index.json`` with every valid journal line replayed over it, and the journal state."""
    path = directory / INDEX_NAME
    if not path.exists():
        return None
    raw = _read_bounded(path, MAX_INDEX_BYTES, "an index")
    index = _parse_index(raw, path)
    state = _JournalState(base=hashlib.sha256(raw).hexdigest())
    journal = directory / JOURNAL_NAME
    if journal.exists() or journal.is_symlink():
        data = _read_bounded(journal, MAX_JOURNAL_BYTES, "a journal")
        for line_end, record in _journal_records(data, state.base, journal):
            _apply_journal_record(index, record, journal)
            state.valid_bytes, state.records = line_end, state.records + 1
        if state.records:
            _check_index_consistency(index, journal)
    return index, state


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    if path.is_symlink() or not path.is_file():
        raise CacheIntegrityError(f"{path} is not a regular file")
    size = path.stat().st_size
    if size > limit:
        raise CacheIntegrityError(f"{path} is {size} bytes, over the {limit}-byte limit for {what}")
    return path.read_bytes()


def _canonical(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _journal_line(record: dict[str, Any]) -> bytes:
    """One committed flush: ``{"record": ..., "sha256": sha256(canonical record)}`` + newline."""
    digest = hashlib.sha256(_canonical(record).encode("utf-8")).hexdigest()
    return (_canonical({"record": record, "sha256": digest}) + "\n").encode("utf-8")


def _journal_records(data: bytes, base: str, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
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
            line = json.loads(
                data[offset:end].decode("utf-8"), object_pairs_hook=_no_duplicate_keys
            )
            record = line["record"]
            intact = (
                isinstance(record, dict)
                and hashlib.sha256(_canonical(record).encode("utf-8")).hexdigest() == line["sha256"]
            )
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


def _apply_journal_record(index: CacheIndex, record: dict[str, Any], path: Path) -> None:
    """Add one flush's shards and entries to ``index`` (the same code commits and replays)."""
    try:
        shards = [CacheShardRecord.model_validate(s) for s in record["shards"]]
        entries = [CacheEntryRecord.model_validate(e) for e in record["entries"]]
        dropped = [str(name) for name in record["dropped_shards"]]
        updated_at = str(record["updated_at"])
    except (ValidationError, KeyError, TypeError) as exc:
        detail = _format_validation_error(exc) if isinstance(exc, ValidationError) else repr(exc)
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


def _parse_index(raw: bytes, path: Path) -> CacheIndex:
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
            f"{path} is not a valid cache index: {_format_validation_error(exc)}"
        ) from None
    _check_index_consistency(index, path)
    return index


def _check_index_consistency(index: CacheIndex, path: Path) -> None:
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


def _provenance_differences(stored: CacheProvenance, given: CacheProvenance) -> list[str]:
    a, b = stored.model_dump(), given.model_dump()
    return [
        f"{name} (cache has {a[name]!r}, expected {b[name]!r})" for name in a if a[name] != b[name]
    ]


def _read_span(handle: Any, info: TensorInfo) -> bytes:
    handle.seek(info.begin)
    data = handle.read(info.nbytes)
    if len(data) != info.nbytes:
        raise CacheIntegrityError(
            f"tensor {info.name!r} is truncated: read {len(data)} of {info.nbytes} bytes"
        )
    return data


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
        loaded = _load_committed(self.directory) if self.directory.is_dir() else None
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
                differences = _provenance_differences(self._index.provenance, provenance)
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
            self._check_result_matches(key, targets)
            tensors = targets.cache_tensors(prov.dtype)
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
        stored = self._normalize_tensors(key, tensors)
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

    def _check_result_matches(self, key: str, result: CacheableTargets) -> None:
        """Refuse a score result produced under settings other than the cache's provenance."""
        prov = self._provenance
        for name, expected in (
            ("temperature", prov.temperature),
            ("tokenizer_fingerprint", prov.tokenizer_fingerprint),
            ("vocab_size", prov.vocab_size),
            ("top_k", prov.top_k),
            ("teacher_model_id", prov.teacher_model_id),
        ):
            actual = getattr(result, name, None)
            if actual is not None and actual != expected:
                raise ConfigError(
                    f"teacher targets for {key!r} have {name} {actual!r} but the cache at "
                    f"{self.directory} records {expected!r}",
                    hint="score with the settings the cache was created with, or use a new cache directory",
                )

    def _normalize_tensors(
        self, key: str, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        import torch

        prov = self._provenance
        unknown = sorted(set(tensors) - set(TENSOR_ORDER))
        missing = [name for name in REQUIRED_TENSORS if name not in tensors]
        if unknown or missing:
            raise ValueError(f"entry {key!r}: unknown tensors {unknown}, missing {missing}")
        indices = tensors["topk_indices"]
        if indices.dim() != 2 or indices.shape[1] != prov.top_k:
            raise ValueError(
                f"entry {key!r}: topk_indices must be [N, {prov.top_k}]; got {tuple(indices.shape)}"
            )
        n = int(indices.shape[0])
        shapes = {"topk_log_probs": (n, prov.top_k), "tail_log_prob": (n,), "teacher_entropy": (n,)}
        for name, shape in shapes.items():
            if name in tensors and tuple(tensors[name].shape) != shape:
                raise ValueError(
                    f"entry {key!r}: {name} must be {list(shape)}; got {list(tensors[name].shape)}"
                )
        if indices.dtype.is_floating_point or indices.dtype == torch.bool:
            raise ValueError(f"entry {key!r}: topk_indices must be integers; got {indices.dtype}")
        if n and (int(indices.min()) < 0 or int(indices.max()) >= prov.vocab_size):
            raise ValueError(f"entry {key!r}: topk_indices must lie in [0, {prov.vocab_size})")
        log_dtype = getattr(torch, prov.dtype)
        wanted = {
            "topk_indices": torch.int32
            if index_dtype_code(prov.vocab_size) == "I32"
            else torch.int64,
            "topk_log_probs": log_dtype,
            "tail_log_prob": log_dtype,
            "teacher_entropy": torch.float32,
        }
        return {
            name: tensors[name].detach().to(device="cpu", dtype=wanted[name]).contiguous().clone()
            for name in TENSOR_ORDER
            if name in tensors
        }

    def _next_shard_number(self, index: CacheIndex | None) -> int:
        """One past every shard number in the index or on disk, so no file is ever reused."""
        numbers = [int(name[6:11]) for name in (index.shards if index else {})]
        if self.directory.is_dir():
            numbers += [
                int(p.name[6:11]) for p in self.directory.iterdir() if _SHARD_RE.fullmatch(p.name)
            ]
        return max(numbers, default=-1) + 1

    def _claim_shard_number(self) -> int:
        """The next unused shard number; the directory is scanned once per writer, not per flush."""
        if self._shard_counter is None:
            self._shard_counter = self._next_shard_number(self._index)
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
            data = save(payload, metadata=_SHARD_METADATA)
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
                    sha256=hashlib.sha256(data).hexdigest(),
                    size_bytes=len(data),
                    entries=[item.record.key for item in group],
                )
            )
        emptied = self._emptied_by(entries)
        record = {
            "base": "",
            "updated_at": _now(),
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
            _apply_journal_record(index, record, self.directory / INDEX_NAME)
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
        line = _journal_line(record)
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
            _fsync_directory(self.directory)
        failpoint("cache.journal_appended")
        _apply_journal_record(self._index, record, path)
        self._journal.valid_bytes, self._journal.records = end, self._journal.records + 1

    def compact(self) -> None:
        """Fold the journal into a new ``index.json`` and delete it (a no-op without one)."""
        if self._index is not None and self._journal is not None and self._journal.records:
            self._commit_index(self._index)

    def close(self) -> None:
        """Compact; the cache stays usable (a later flush starts a new journal)."""
        self.compact()

    def _empty_index(self) -> CacheIndex:
        now = _now()
        return CacheIndex(created_at=now, updated_at=now, provenance=self._provenance)

    def _commit_index(self, index: CacheIndex) -> None:
        """Validate, write atomically and adopt ``index``, then drop the folded-in journal.

        The rename of ``index.json`` is the commit point: from then on the journal's lines
        name an index that no longer exists, so a crash before its deletion is harmless.
        """
        checked = CacheIndex.model_validate(index.model_dump())
        _check_index_consistency(checked, self.directory / INDEX_NAME)
        self.directory.mkdir(parents=True, exist_ok=True)
        raw = to_json_text(checked.model_dump(mode="json")).encode("utf-8")
        with atomic_path(self.directory / INDEX_NAME) as tmp:
            tmp.write_bytes(raw)
            failpoint("cache.index_before_rename")
        failpoint("cache.index_renamed")
        with contextlib.suppress(FileNotFoundError):
            (self.directory / JOURNAL_NAME).unlink()
        _fsync_directory(self.directory)
        self._index = checked
        self._journal = _JournalState(base=hashlib.sha256(raw).hexdigest())

    def _delete_shards(self, names: Iterable[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                self._shard_path(name).unlink()
            self._headers.pop(name, None)

    # -- reading ----------------------------------------------------------------------

    def _shard_path(self, name: str) -> Path:
        """The path of shard ``name``, strictly a regular file directly inside the cache."""
        if not isinstance(name, str) or not _SHARD_RE.fullmatch(name):
            raise CacheIntegrityError(
                f"shard name {name!r:.80} is not of the form shard-NNNNN.safetensors"
            )
        path = self.directory / name
        if path.is_symlink():
            raise CacheIntegrityError(
                f"shard {name} is a symbolic link; shards must be regular files in {self.directory}"
            )
        if path.exists() and not path.is_file():
            raise CacheIntegrityError(
                f"shard {name} is not a regular file (a FIFO, device or directory is never read)"
            )
        if path.resolve().parent != self.directory.resolve():
            raise CacheIntegrityError(
                f"shard {name} resolves outside the cache directory {self.directory}"
            )
        return path

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

    def _entry_infos(
        self, record: CacheEntryRecord, infos: dict[str, TensorInfo]
    ) -> list[TensorInfo]:
        """The entry's tensors in hashing order, checked against the layout the index implies."""
        out = []
        for tname, (dtype, shape) in expected_layout(self._provenance, record).items():
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
        infos = self._entry_infos(record, self._shard_tensors(record.shard))
        digest = hashlib.sha256()
        raw: list[bytes] = []
        try:
            with open(self._shard_path(record.shard), "rb") as handle:
                for info in infos:
                    data = _read_span(handle, info)
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
            dtype = getattr(torch, _TORCH_DTYPE_NAMES[info.dtype])
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

    # -- maintenance (torch-free) -----------------------------------------------------

    def _require_index(self) -> CacheIndex:
        if self._index is None:
            raise CacheIntegrityError(
                f"no teacher cache at {self.directory} ({INDEX_NAME} is missing)"
            )
        return self._index

    def _unreferenced_files(self, index: CacheIndex) -> list[str]:
        """Shard files and temporaries the index does not reference (an interrupted write)."""
        if not self.directory.is_dir():
            return []
        out = []
        for path in sorted(self.directory.iterdir()):
            is_shard = _SHARD_RE.fullmatch(path.name) and path.name not in index.shards
            is_temp = path.name.startswith((".shard-", f".{INDEX_NAME}.")) and path.name.endswith(
                ".tmp"
            )
            if is_shard or is_temp:
                out.append(path.name)
        return out

    def validate(self) -> ValidationReport:
        """Recompute every shard's file SHA-256 and every entry's tensor SHA-256.

        Also checks each shard's size and safetensors structure and each entry's tensor
        dtypes and shapes. Every problem is collected, then one :class:`CacheIntegrityError`
        names each bad shard and entry. Files the index does not reference are reported in
        the returned :class:`ValidationReport`, not treated as errors.
        """
        index = self._require_index()
        problems: list[str] = []
        bytes_verified = 0
        for name, shard in sorted(index.shards.items()):
            try:
                path = self._shard_path(name)
                size = path.stat().st_size
            except FileNotFoundError:
                problems.append(
                    f"shard {name} is missing (entries {shard.entries[:3]} cannot be read)"
                )
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
                    problem = self._check_entry(index.entries[key], infos, handle)
                    if problem:
                        problems.append(problem)
        if problems:
            raise CacheIntegrityError(
                f"teacher cache {self.directory} failed validation ({len(problems)} problem(s)):\n  - "
                + "\n  - ".join(problems)
            )
        return ValidationReport(
            directory=str(self.directory),
            entries=len(index.entries),
            shards=len(index.shards),
            positions=sum(e.num_positions for e in index.entries.values()),
            bytes_verified=bytes_verified,
            orphan_files=self._unreferenced_files(index),
        )

    def _check_entry(
        self, record: CacheEntryRecord, infos: dict[str, TensorInfo], handle: Any
    ) -> str | None:
        try:
            entry_infos = self._entry_infos(record, infos)
            digest = hashlib.sha256()
            for info in entry_infos:
                handle.seek(info.begin)
                remaining = info.nbytes
                while remaining:
                    block = handle.read(min(remaining, _READ_BLOCK))
                    if not block:
                        return f"entry {record.key!r} in {record.shard} is truncated"
                    digest.update(block)
                    remaining -= len(block)
        except CacheIntegrityError as exc:
            return exc.message
        if digest.hexdigest() != record.sha256:
            return f"entry {record.key!r} in {record.shard} failed its tensor SHA-256 check"
        return None

    def prune(self, keep_versions: Iterable[int]) -> dict[str, Any]:
        """Keep only entries whose policy version is in ``keep_versions``; torch-free.

        Shards left without entries are deleted; shards that keep some entries but also
        hold removed or superseded tensors are compacted into new shards written by hand
        from the verified raw bytes (:func:`~miniverl.cache.safetensors_io.encode_safetensors`).
        The index is committed after the new shards and before any deletion, so a crash
        leaves either the old or the new cache valid. Unreferenced files left by an
        interrupted write are removed too. Staged entries must be flushed first.
        """
        if self._staged:
            raise ValueError(f"{len(self._staged)} staged entries; flush() before prune()")
        index = self._require_index()
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
                if live == shard.entries and live_names == set(self._shard_tensors(name)):
                    continue
            del new.shards[name]
            deleted.append(name)
            if not live:
                continue
            target = f"shard-{self._claim_shard_number():05d}.safetensors"
            data = self._compact(shard, [index.entries[k] for k in live])
            atomic_write_bytes(self._shard_path(target), data)
            compacted[name] = target
            new.shards[target] = CacheShardRecord(
                name=target,
                sha256=hashlib.sha256(data).hexdigest(),
                size_bytes=len(data),
                entries=live,
            )
            for key in live:
                new.entries[key] = new.entries[key].model_copy(update={"shard": target})
        if removed or deleted:
            new.updated_at = _now()
            self._commit_index(new)
        self._delete_shards(deleted)
        orphans = self._unreferenced_files(self._require_index())
        for orphan in orphans:
            with contextlib.suppress(FileNotFoundError):
                (self.directory / orphan).unlink()
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

    def _compact(self, shard: CacheShardRecord, records: list[CacheEntryRecord]) -> bytes:
        """Safetensors bytes holding only ``records``' tensors, copied from a verified shard."""
        path = self._shard_path(shard.name)
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != shard.sha256:
            raise CacheIntegrityError(
                f"shard {shard.name} failed its file SHA-256 check; refusing to compact corrupted data",
                hint=f"run 'miniverl cache validate {self.directory}' and rebuild the cache",
            )
        header, data_start = parse_safetensors_header(data, len(data), where=shard.name)
        infos = tensor_infos(header, data_start)
        tensors: list[RawTensor] = []
        for record in records:
            digest = hashlib.sha256()
            for info in self._entry_infos(record, infos):
                chunk = data[info.begin : info.end]
                digest.update(chunk)
                tensors.append(RawTensor(info.name, info.dtype, info.shape, chunk))
            if digest.hexdigest() != record.sha256:
                raise CacheIntegrityError(
                    f"entry {record.key!r} in {shard.name} failed its tensor SHA-256 check"
                )
        return encode_safetensors(tensors, _SHARD_METADATA)

    def stats(self) -> dict[str, Any]:
        """Counts and sizes from the index alone (no shard is opened); torch-free.

        ``bytes_per_position`` is tensor data per cached position; ``file_bytes_per_position``
        adds shard headers. ``full_logits_bf16_bytes_per_position`` (V × 2) and
        ``compression_ratio`` put them against storing bf16 full logits.
        """
        index = self._require_index()
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
            "directory": str(self.directory),
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
            "staged_entries": len(self._staged),
            "unreferenced_files": self._unreferenced_files(index),
        }


__all__ = [
    "CACHE_DTYPE_CODES",
    "INDEX_NAME",
    "MAX_KEY_LENGTH",
    "TENSOR_ORDER",
    "CacheableTargets",
    "CachedTargets",
    "TeacherCache",
    "ValidationReport",
    "decode_key",
    "encode_key",
    "expected_layout",
    "index_dtype_code",
    "read_safetensors_header",
    "tensor_name",
    "validate_key",
]
