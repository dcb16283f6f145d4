"""Atomic file writes and hashing.

Every artifact is written to a temporary sibling and renamed into place, so a crash
never leaves a half-written file that later reads as valid. ``os.replace`` is atomic on
POSIX and Windows when source and target share a directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HASH_BLOCK = 1 << 20


def _current_umask() -> int:
    """The process umask (mkstemp creates 0600 files; artifacts should get the usual mode)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` on success.

    On any exception the temporary file is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_current_umask())
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(target: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


def to_json_text(payload: Any) -> str:
    """Canonical JSON used for every artifact: sorted keys, two-space indent, UTF-8."""
    return json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"


def write_json(target: str | os.PathLike[str], payload: Any) -> None:
    atomic_write_text(target, to_json_text(payload))


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def append_jsonl(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> None:
    """Append records as complete lines in one write.

    An interrupted append can only leave a cut-off final line, which is not valid JSON,
    so a reader (``trajectory.io``) rejects it instead of reading a partial record.
    """
    if not records:
        return
    payload = "".join(
        json.dumps(r, sort_keys=True, ensure_ascii=False, default=str) + "\n" for r in records
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
