"""Which checkpoint ``--resume`` loads, and what an explicit older resume sets aside.

The rules, all of them loud:

- ``--resume`` loads the *latest* checkpoint directory (``warmup`` < ``cycle-NNNN`` in
  cycle order < ``final``; the cycle comes from the verified marker, or from the name when
  the marker cannot be verified). If that directory is incomplete or tampered with, the
  resume fails with a :class:`~miniverl.errors.CheckpointError` that names the file and
  lists the complete checkpoints to choose from; it never falls back silently to an
  older one (which would rerun cycles, truncate the logs and then delete the damaged
  directory).
- ``--resume-from NAME`` loads exactly ``checkpoints/NAME`` (verified like any other).
  Newer checkpoint directories are then moved aside, not deleted, into
  ``checkpoints/.superseded-<UTC>/``, together with the log tails the resume truncates.
- Deleting checkpoints is left to the explicit ``checkpoint.keep`` setting
  (:mod:`miniverl.training.checkpoint_retention`); nothing here deletes anything.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from miniverl.errors import CheckpointError
from miniverl.training.checkpoint import read_marker

_CYCLE_NAME = re.compile(r"^cycle-(\d+)$")


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint directory: where it sits in the run's order and whether it verifies."""

    path: Path
    order: tuple[float, int]
    error: CheckpointError | None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def valid(self) -> bool:
        return self.error is None


def _order_from_name(name: str) -> tuple[float, int]:
    """(cycle, tie-break) from a directory name; unknown names sort last (latest)."""
    if name == "warmup":
        return (-1.0, 0)
    if name == "final":
        return (math.inf, 1)
    match = _CYCLE_NAME.match(name)
    return (float(int(match.group(1))), 0) if match else (math.inf, 2)


def scan_checkpoints(checkpoints_dir: str | os.PathLike[str]) -> list[CheckpointEntry]:
    """Every visible checkpoint directory, verified, oldest first (hidden ones are staging)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    entries = []
    for child in root.iterdir():
        if not child.is_dir() or child.name.startswith("."):
            continue
        order = _order_from_name(child.name)
        try:
            marker = read_marker(child)
        except CheckpointError as exc:
            entries.append(CheckpointEntry(child, order, exc))
            continue
        if child.name != "final" and isinstance(marker.get("cycle"), int):
            order = (float(marker["cycle"]), order[1])
        entries.append(CheckpointEntry(child, order, None))
    return sorted(entries, key=lambda e: (e.order, e.name))


def select_resume_checkpoint(
    checkpoints_dir: str | os.PathLike[str], name: str | None = None
) -> Path | None:
    """The checkpoint to resume: ``name`` when given, else the latest, which must verify.

    Returns ``None`` when there is no checkpoint directory at all. Raises
    :class:`CheckpointError` when ``name`` does not exist or does not verify, or when the
    latest checkpoint is incomplete or tampered with.
    """
    root = Path(checkpoints_dir)
    entries = scan_checkpoints(root)
    valid = [e.name for e in entries if e.valid]
    if name is not None:
        path = root / name
        if not path.is_dir() or name.startswith(".") or Path(name).name != name:
            raise CheckpointError(
                f"--resume-from {name}: no checkpoint directory {path}",
                hint=f"complete checkpoints here: {', '.join(valid) or 'none'}",
            )
        read_marker(path)
        return path
    if not entries:
        return None
    latest = entries[-1]
    if latest.error is not None:
        older = [n for n in valid if n != latest.name]
        raise CheckpointError(
            f"the latest checkpoint {latest.path} cannot be resumed: {latest.error.message}",
            hint=(
                f"nothing was loaded or deleted; to continue from an older checkpoint, choose it "
                f"explicitly with --resume-from NAME (complete: {', '.join(older)})"
                if older
                else "no complete checkpoint remains; start the run again in a new --output directory"
            ),
        )
    return latest.path


def newer_than(checkpoints_dir: str | os.PathLike[str], chosen: Path) -> list[Path]:
    """Checkpoint directories that sort after ``chosen`` (what an explicit older resume supersedes)."""
    entries = scan_checkpoints(checkpoints_dir)
    key = next((e.order for e in entries if e.path == chosen), None)
    if key is None:
        return []
    return [e.path for e in entries if e.order > key]


def supersede_newer(
    checkpoints_dir: str | os.PathLike[str], chosen: Path, log_sizes: dict[Path, int]
) -> dict[str, object] | None:
    """An explicit older resume: set newer checkpoints and the log tails it cuts aside.

    ``log_sizes`` maps each append-only log to the size recorded in ``chosen``. Returns what
    was moved (for the event log), or ``None`` when nothing newer exists and no log grows
    past its recorded size.
    """
    newer = newer_than(checkpoints_dir, chosen)
    cut = [log for log, size in log_sizes.items() if log.exists() and log.stat().st_size > size]
    if not newer and not cut:
        return None
    folder = set_aside(newer, checkpoints_dir)
    for log in cut:
        save_log_tail(log, log_sizes[log], folder)
    return {
        "folder": folder.name,
        "checkpoints": [p.name for p in newer],
        "log_tails": [log.name for log in cut],
    }


def set_aside(paths: list[Path], checkpoints_dir: str | os.PathLike[str]) -> Path:
    """Move ``paths`` into a new ``checkpoints/.superseded-<UTC>/`` (never delete); return it."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = Path(checkpoints_dir) / f".superseded-{stamp}"
    target.mkdir(parents=True, exist_ok=False)
    for path in paths:
        os.replace(path, target / path.name)
    return target


def save_log_tail(log: Path, size: int, folder: Path) -> None:
    """Copy the bytes of ``log`` beyond ``size`` into ``folder`` before a resume truncates them."""
    if not log.exists() or log.stat().st_size <= size:
        return
    with open(log, "rb") as handle:
        handle.seek(size)
        tail = handle.read()
    (folder / f"{log.name}.tail").write_bytes(tail)


__all__ = [
    "CheckpointEntry",
    "newer_than",
    "save_log_tail",
    "scan_checkpoints",
    "select_resume_checkpoint",
    "set_aside",
    "supersede_newer",
]
