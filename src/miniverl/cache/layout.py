"""What a teacher-cache directory holds, and how entries are named in it (torch-free).

Layout of a cache directory::

    index.json                  CacheIndex: provenance, one record per entry, one per shard
    index.journal               one checksummed line per flush since index.json was written
    shard-00000.safetensors     tensors "<encoded key>/<name>" of up to max_entries_per_shard entries
    shard-00001.safetensors     ...

Each entry is one trajectory's bucketed targets: ``topk_indices [N, K]`` (int32, int64 when
V ≥ 2**31), ``topk_log_probs [N, K]`` and ``tail_log_prob [N]`` in the cache dtype, and
``teacher_entropy [N]`` float32. The index records the SHA-256 of every entry's tensor bytes
(concatenated in the record's ``tensors`` order) and of every shard file.

Key encoding: a key is the trajectory id, any printable string of 1 to 512 characters. In
a shard its tensors are named ``<encoded key>/<name>``, where the encoding replaces ``%``
with ``%25`` and then ``/`` with ``%2F``. The encoded key therefore contains no ``/``, the
tensor name splits unambiguously at its only ``/``, and :func:`decode_key` inverts it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from miniverl.schemas.cache import SHARD_NAME_PATTERN, CacheEntryRecord, CacheProvenance
from miniverl.utils.io import fsync_directory

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

TORCH_DTYPE_NAMES = {
    "I32": "int32",
    "I64": "int64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
}
"""Safetensors dtype -> name of the torch dtype (torch itself is imported lazily)."""

SHARD_RE = re.compile(SHARD_NAME_PATTERN)
SHARD_METADATA = {"format": "pt", "miniverl": "teacher-cache"}
READ_BLOCK = 1 << 20


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


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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


__all__ = [
    "CACHE_DTYPE_CODES",
    "INDEX_NAME",
    "JOURNAL_NAME",
    "MAX_INDEX_BYTES",
    "MAX_JOURNAL_BYTES",
    "MAX_KEY_LENGTH",
    "READ_BLOCK",
    "REQUIRED_TENSORS",
    "SHARD_METADATA",
    "SHARD_RE",
    "TENSOR_ORDER",
    "TORCH_DTYPE_NAMES",
    "decode_key",
    "encode_key",
    "expected_layout",
    "fsync_directory",
    "index_dtype_code",
    "now_iso",
    "tensor_name",
    "validate_key",
]
