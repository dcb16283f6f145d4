"""Atomic file writes, whole-line appends and the durability contract of a run's logs.

Every artifact is written to a temporary sibling, fsynced and renamed into place, so a
crash never leaves a half-written file that later reads as valid. ``os.replace`` is atomic
on POSIX and Windows when source and target share a directory.

Append-only logs (``events.jsonl``, ``metrics.jsonl``, the trajectory logs) have two
levels of durability:

- every :func:`append_jsonl` reaches the operating system before it returns (written and
  flushed), so the records survive the death of the process (``kill -9``, an exception,
  an out-of-memory kill): only a power loss or a kernel crash can lose them;
- surviving a power loss as well takes an fsync. ``append_jsonl(..., sync=True)`` (the
  default, for a writer with no later durability point) fsyncs each append; a training
  run appends with ``sync=False`` and makes its logs durable together at explicit
  points with :class:`DurableLogs`: before a checkpoint records their lengths, at the
  end of every cycle and of the warm-up, and when the run ends (``training/recipe.py``).

A power loss between two durability points can therefore lose part of what a log gained
since the last one (possibly leaving a torn final line), never bytes it held at that point
and so never bytes a checkpoint on disk recorded, which is what ``--resume`` relies on when
it cuts the logs back to those lengths (``training/checkpoint.py``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from miniverl.errors import MiniverlError, RunDirectoryError, RunStorageError
from miniverl.utils.failpoints import failpoint
from miniverl.utils.safe_load import load_json_file


def _current_umask() -> int:
    """The process umask (mkstemp creates 0600 files; artifacts should get the usual mode)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: ``0o666`` less the umask (0644 under
    the usual umask 022). Artifacts hold no secrets, so the group and others may read them."""
    return 0o666 & ~_current_umask()


def directory_mode() -> int:
    """The mode ``mkdir`` gives a new directory: ``0o777`` less the umask (0755 under 022)."""
    return 0o777 & ~_current_umask()


def publish_modes(root: str | os.PathLike[str]) -> None:
    """Give ``root`` and everything under it the modes a plain ``mkdir`` / ``open`` would.

    A directory assembled under ``tempfile.mkdtemp`` is 0700, and safetensors (and so
    ``save_pretrained``) writes its files 0600 whatever the umask; renamed into place, an
    exported model, a converted model or a checkpoint would then be readable by its owner
    alone. Directories get :func:`directory_mode`, files :func:`file_mode`, and a file its
    writer made executable keeps the execute bits the umask allows.
    """
    root = Path(root)
    dirs, files = directory_mode(), file_mode()
    os.chmod(root, dirs)
    for path in root.rglob("*"):
        if path.is_symlink():
            continue
        if path.is_dir():
            os.chmod(path, dirs)
        else:
            executable = path.stat().st_mode & 0o100
            os.chmod(path, dirs if executable else files)


def is_disk_full(exc: BaseException) -> bool:
    """``ENOSPC``/``EDQUOT`` as an ``OSError``, or as a library's wrapped error text."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text


def storage_error(path: str | os.PathLike[str]) -> RunStorageError:
    """The :class:`RunStorageError` for a failed write of ``path``, with the free space."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free / (1 << 20):.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return RunStorageError(f"no space left on device while writing {path} ({free} on {probe})")


def checked_failpoint(name: str, path: str | os.PathLike[str]) -> None:
    """:func:`failpoint` whose injected ``ENOSPC`` surfaces as :class:`RunStorageError`."""
    try:
        failpoint(name)
    except OSError as exc:
        if is_disk_full(exc):
            raise storage_error(path) from exc
        raise


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` on success.

    On any exception the temporary file is removed and ``target`` is untouched; a full
    disk is raised as :class:`RunStorageError` naming ``target`` and the free space.
    Failpoints ``write:<name>:before_rename`` and ``write:<name>:after_rename`` bracket
    the rename.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        if is_disk_full(exc):
            raise storage_error(target) from exc
        raise
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, file_mode())  # after the writer: safetensors replaces the file, 0600
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        checked_failpoint(f"write:{target.name}:before_rename", target)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if is_disk_full(exc) and not isinstance(exc, MiniverlError):
            raise storage_error(target) from exc
        raise
    checked_failpoint(f"write:{target.name}:after_rename", target)


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


def read_json(
    path: str | os.PathLike[str],
    *,
    error: type[MiniverlError] = RunDirectoryError,
    expect: type | None = dict,
) -> Any:
    """A JSON artifact through :mod:`miniverl.utils.safe_load` (regular file, size and depth
    limits); every failure is ``error`` naming ``path``. ``expect``: required top-level type."""
    return load_json_file(path, error=error, expect=expect)


def append_jsonl(
    path: str | os.PathLike[str], records: list[dict[str, Any]], *, sync: bool = True
) -> None:
    """Append records as complete lines in one write, flushed to the operating system.

    ``sync`` also fsyncs the file before returning (durable against a power loss); a
    writer whose log a :class:`DurableLogs` makes durable later passes ``False`` and the
    append costs no disk flush.

    An interrupted append can only leave a cut-off final line, which is not valid JSON,
    so a reader (``trajectory.io``) rejects it instead of reading a partial record, and
    :func:`repair_jsonl_tail` cuts it away on resume. A full disk truncates the file back
    to its length before the append and raises :class:`RunStorageError`. Failpoints:
    ``append:<name>:before``, ``append:<name>:partial`` (half the bytes written, then
    death) and ``append:<name>:after``.
    """
    if not records:
        return
    payload = "".join(
        json.dumps(r, sort_keys=True, ensure_ascii=False, default=str) + "\n" for r in records
    ).encode("utf-8")
    path = Path(path)
    checked_failpoint(f"append:{path.name}:before", path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "ab")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        if is_disk_full(exc):
            raise storage_error(path) from exc
        raise
    with handle:
        start = handle.tell()

        def torn_write() -> None:
            handle.write(payload[: len(payload) // 2])
            handle.flush()

        try:
            failpoint(f"append:{path.name}:partial", before_exit=torn_write)
            handle.write(payload)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            with contextlib.suppress(OSError):
                handle.truncate(start)
            raise storage_error(path) from exc
    checked_failpoint(f"append:{path.name}:after", path)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the directory's entries (a created or renamed file) durable where the platform
    supports it (POSIX; elsewhere a directory cannot be opened and this does nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class DurableLogs:
    """A run's append-only logs, made durable together at explicit points.

    :meth:`sync` fsyncs every log that exists, then the directory of every log it flushed,
    so the name of a log created (or replaced by a new file) since the previous call
    survives a power loss too: ``stat`` cannot tell a replaced file from an appended one
    when the inode number is reused, so the directory is flushed whenever a log in it was.
    Logs written with ``append_jsonl(..., sync=False)`` between two calls have reached the
    operating system only. A log that does not exist yet is skipped, and so is one whose
    file, size, modification and change times are all as the previous call left them
    (nothing was written to it since, so there is nothing to flush).
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        self.paths = tuple(dict.fromkeys(Path(p) for p in paths))
        self._synced: dict[Path, tuple[int, ...]] = {}

    def sync(self) -> None:
        """fsync every changed log, then their directories; :class:`RunStorageError` when
        the device reports a full disk."""
        directories: dict[Path, None] = {}
        for path in self.paths:
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                self._synced.pop(path, None)
                continue
            seen = self._synced.get(path)
            if seen == _file_state(stat):
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    stat = os.fstat(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                if is_disk_full(exc):
                    raise storage_error(path) from exc
                raise
            directories[path.parent] = None
            self._synced[path] = _file_state(stat)
        for directory in directories:
            fsync_directory(directory)


def _file_state(stat: os.stat_result) -> tuple[int, ...]:
    """What changes whenever a file is written or truncated: device, inode, size, times."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def repair_jsonl_tail(path: str | os.PathLike[str]) -> int:
    """Cut a torn final line (no trailing newline) off an append-only log; bytes removed."""
    path = Path(path)
    if not path.is_file():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "r+b") as handle:
        back = min(size, 1 << 20)
        handle.seek(size - back)
        tail = handle.read(back)
        if tail.endswith(b"\n"):
            return 0
        cut = tail.rfind(b"\n")
        keep = size - back + cut + 1 if cut >= 0 else (0 if back == size else size)
        handle.truncate(keep)
    return size - keep
