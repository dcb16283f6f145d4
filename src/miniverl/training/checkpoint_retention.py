"""Which cycle checkpoints stay on disk (``checkpoint.keep``).

Only ``cycle-NNNN`` directories are candidates: ``warmup`` and ``final`` are always kept,
and so is anything that is not a complete checkpoint's sibling name (hidden staging
directories belong to :func:`miniverl.training.checkpoint.save_checkpoint`).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_CYCLE_RE = re.compile(r"^cycle-(\d+)$")


def prune_cycle_checkpoints(checkpoints_dir: Path, *, keep: int | None) -> list[str]:
    """Delete all but the ``keep`` newest ``cycle-*`` checkpoints; return the deleted names.

    ``keep=None`` keeps every checkpoint. Newest means highest cycle number, so the
    checkpoint a resume would pick is never the one removed.
    """
    if keep is None or not checkpoints_dir.is_dir():
        return []
    cycles = sorted(
        (int(m.group(1)), child)
        for child in checkpoints_dir.iterdir()
        if child.is_dir() and (m := _CYCLE_RE.match(child.name))
    )
    doomed = cycles[: max(0, len(cycles) - keep)]
    for _, child in doomed:
        shutil.rmtree(child, ignore_errors=True)
    return [child.name for _, child in doomed]


__all__ = ["prune_cycle_checkpoints"]
