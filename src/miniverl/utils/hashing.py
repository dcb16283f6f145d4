"""The one home of SHA-256 digests: of bytes, text, canonical JSON and files.

Digests are keys that outlive a run (teacher-cache journal checksums, alignment digests
recorded with cached targets, toy-teacher reuse directories, tokenizer fingerprints), so
the byte encodings here are frozen: changing :func:`canonical_json`'s output for a given
``compact``/``ensure_ascii`` choice would orphan every cache and reuse key on disk.
``tests/unit/test_hashing.py`` pins known values.

Two canonical-JSON spellings are in use, selected by ``compact``: ``separators=(",", ":")``
(alignment maps, tokenizer fingerprints, cache journal, adapter fits) and Python's default
``", "``/``": "`` (toy-teacher reuse digests); each keys files on disk, so neither changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

HASH_BLOCK = 1 << 20
"""Bytes read per step when hashing a file (memory stays O(1) in the file size)."""


def canonical_json(
    obj: Any,
    *,
    compact: bool = True,
    ensure_ascii: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """``obj`` as JSON with sorted keys; ``compact`` drops the spaces after ``,`` and ``:``."""
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(
        obj, sort_keys=True, separators=separators, ensure_ascii=ensure_ascii, default=default
    )


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """Hex SHA-256 of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_json(
    obj: Any,
    *,
    compact: bool = True,
    ensure_ascii: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """Hex SHA-256 of :func:`canonical_json` of ``obj`` (UTF-8)."""
    return sha256_text(
        canonical_json(obj, compact=compact, ensure_ascii=ensure_ascii, default=default)
    )


def sha256_file(
    path: str | os.PathLike[str],
    *,
    block_size: int = HASH_BLOCK,
    progress: Callable[[int], None] | None = None,
    limit: int | None = None,
) -> str:
    """Hex SHA-256 of a file, streamed ``block_size`` bytes at a time.

    ``progress`` is called with the bytes hashed so far after every block (for long
    verifications of multi-GiB weights). ``limit`` hashes only the first ``limit`` bytes
    (the prefix of an append-only log that a checkpoint vouches for).
    """
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as handle:
        while limit is None or done < limit:
            want = block_size if limit is None else min(block_size, limit - done)
            if not (block := handle.read(want)):
                break
            digest.update(block)
            done += len(block)
            if progress is not None:
                progress(done)
    return digest.hexdigest()


__all__ = [
    "HASH_BLOCK",
    "canonical_json",
    "sha256_bytes",
    "sha256_file",
    "sha256_json",
    "sha256_text",
]
