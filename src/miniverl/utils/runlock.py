"""One writer per run directory: an advisory ``fcntl.flock`` on ``<run>/.miniverl.lock``.

``train``, ``demo``, ``benchmark`` and ``eval`` hold the lock for their whole life, and ``cache prune``
for its own (:func:`maintenance_lock`, when the cache lies inside a run). A second
writer fails at once with :class:`~miniverl.errors.RunDirectoryError` naming the holder's
PID (written into the lock file). The kernel drops a ``flock`` when its process dies, however
it dies, so a lock file left by a dead process is simply taken over: there is no stale-lock
timeout to tune and no PID guessing. Advisory: it stops miniverl processes, not ``rm``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from miniverl.errors import RunDirectoryError

LOCK_NAME = ".miniverl.lock"

_held: dict[str, int] = {}
"""Lock files this process holds, with their nesting depth (the lock is re-entrant here)."""


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode("ascii", errors="replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def run_lock(root: str | os.PathLike[str], *, command: str = "miniverl") -> Iterator[Path]:
    """Hold the run directory's write lock for the ``with`` body; yields the lock path."""
    import fcntl

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME
    key = os.path.realpath(path)
    if key in _held:  # this process already holds it (e.g. the CLI around the trainer)
        _held[key] += 1
        try:
            yield path
        finally:
            _held[key] -= 1
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        raise RunDirectoryError(f"cannot open the run lock {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirectoryError(
                f"{root} is in use by another miniverl process (PID {_holder(fd)} holds {path})",
                hint="wait for that process to finish, or stop it; two writers would corrupt the run",
            ) from None
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        _held[key] = 1
        try:
            yield path
        finally:
            del _held[key]
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def owning_run(path: str | os.PathLike[str]) -> Path | None:
    """The run directory ``path`` lies directly inside (``<run>/teacher-cache``), or None.

    A directory counts as a run when it holds the lock file or a ``manifest.json``: the lock
    file exists from a writer's first moment, before the manifest is written. A maintenance
    command that writes under ``path`` takes this run's lock, so it cannot run beside a
    live ``train``.
    """
    parent = Path(path).absolute().parent
    if (parent / LOCK_NAME).exists() or (parent / "manifest.json").is_file():
        return parent
    return None


@contextlib.contextmanager
def maintenance_lock(path: str | os.PathLike[str]) -> Iterator[Path | None]:
    """Hold the lock of the run that owns ``path`` (nothing when no run owns it)."""
    root = owning_run(path)
    if root is None:
        yield None
        return
    with run_lock(root) as lock:
        yield lock


__all__ = ["LOCK_NAME", "maintenance_lock", "owning_run", "run_lock"]
