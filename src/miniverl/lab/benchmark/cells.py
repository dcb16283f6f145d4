"""The benchmark as a grid of resumable cells: one (seed, arm seed, arm) arm phase each.

A long protocol (several seeds x arm seeds x nine arms) has to survive being stopped. Each
finished cell is written as ONE JSON file, ``cells/s<seed>-a<arm seed>-<arm>.json`` under
the benchmark directory, atomically (temporary file, then rename: ``utils.io.write_json``),
and carries the SHA-256 of its own canonical payload. On a rerun a cell whose file
exists, parses, names the same cell and plan, and matches its digest is reused without
running anything; any other file (torn, edited, from another plan) is discarded with a
recorded reason and the cell is run again from scratch, so a partial cell is never
trusted. The shared cold start of a seed is a cell of its own (arm ``cold-start``,
arm seed 0) that the arm cells of the seed depend on.

``run_cells`` is the loop and knows nothing about training: it takes the ordered plan
and a ``run_cell(cell, done)`` callable (``done`` holds the payloads already finished in
this run, e.g. the cold start and, in compute-matched mode, opd's spend), so tests drive it
with a fake runner and the harness with the trainer. The failpoint
``benchmark:cell_saved`` fires after every saved cell (``MINIVERL_FAILPOINT=
benchmark:cell_saved@2`` kills the process right after the second), which is how the
resume test stops a benchmark at an exact cell.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniverl.utils.failpoints import failpoint
from miniverl.utils.hashing import sha256_bytes
from miniverl.utils.io import to_json_text, write_json
from miniverl.utils.seeding import derive_seed

CELL_SCHEMA = "miniverl.benchmark_cell/1"
COLD_START = "cold-start"
CELLS_DIR = "cells"


@dataclass(frozen=True, order=True)
class Cell:
    """One arm phase: the cold start of ``seed`` (``arm == "cold-start"``) or an arm at an arm seed."""

    seed: int
    arm_seed: int
    arm: str

    @property
    def name(self) -> str:
        return f"s{self.seed}-a{self.arm_seed}-{self.arm}"

    @property
    def is_cold_start(self) -> bool:
        return self.arm == COLD_START

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "arm_seed": self.arm_seed, "arm": self.arm}


def arm_phase_seed(seed: int, arm_seed: int) -> int:
    """``run.seed`` of an arm phase: the cold start's seed for arm seed 0, else one derived from both.

    Splits come from ``environment.split_seed``, not ``run.seed``, so every arm seed of a
    cold start is evaluated on the same tasks (the pairing a contrast needs), while data
    order and sampling change.
    """
    return seed if arm_seed == 0 else derive_seed(seed, "arm-seed", arm_seed)


def plan_cells(
    seeds: Sequence[int], arm_seeds: int, arms: Sequence[str], *, first: str | None = None
) -> list[Cell]:
    """Per seed: its cold start, then for each arm seed every arm (``first`` moved to the front)."""
    if arm_seeds < 1:
        raise ValueError("arm_seeds must be >= 1")
    order = list(arms)
    if first is not None and first in order:
        order.remove(first)
        order.insert(0, first)
    cells: list[Cell] = []
    for seed in seeds:
        cells.append(Cell(int(seed), 0, COLD_START))
        cells.extend(Cell(int(seed), a, arm) for a in range(arm_seeds) for arm in order)
    return cells


def _digest(payload: Mapping[str, Any]) -> str:
    return sha256_bytes(to_json_text(payload).encode("utf-8"))


class CellStore:
    """Finished cells under ``<root>/cells``; see the module docstring for what counts as finished."""

    def __init__(self, root: str | Path, plan_digest: str) -> None:
        self.dir = Path(root) / CELLS_DIR
        self.plan_digest = plan_digest
        self.discarded: list[dict[str, str]] = []

    def path(self, cell: Cell) -> Path:
        return self.dir / f"{cell.name}.json"

    def load(self, cell: Cell) -> dict[str, Any] | None:
        """The cell's payload if a complete, matching record exists; else None (and the file is removed)."""
        path = self.path(cell)
        if not path.exists():
            return None
        reason = None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            record, reason = None, f"unreadable ({type(exc).__name__})"
        if record is not None:
            if not isinstance(record, dict) or record.get("schema") != CELL_SCHEMA:
                reason = "not a benchmark cell record"
            elif record.get("cell") != cell.to_dict():
                reason = "names another cell"
            elif record.get("plan_digest") != self.plan_digest:
                reason = "written for another benchmark plan (recipe, overrides or arms changed)"
            elif not isinstance(record.get("payload"), dict) or _digest(
                record["payload"]
            ) != record.get("payload_sha256"):
                reason = "payload does not match its SHA-256 (torn or edited)"
        if reason is not None:
            self.discarded.append({"cell": cell.name, "reason": reason})
            path.unlink()
            return None
        return record["payload"]

    def save(self, cell: Cell, payload: Mapping[str, Any]) -> None:
        """Write the cell atomically (temporary file, then rename)."""
        body = json.loads(to_json_text(payload))
        write_json(
            self.path(cell),
            {
                "schema": CELL_SCHEMA,
                "cell": cell.to_dict(),
                "plan_digest": self.plan_digest,
                "payload_sha256": _digest(body),
                "payload": body,
            },
        )


RunCell = Callable[[Cell, Mapping[Cell, Mapping[str, Any]]], Mapping[str, Any]]


def run_cells(
    plan: Iterable[Cell],
    store: CellStore,
    run_cell: RunCell,
    *,
    on_cell: Callable[[Cell, bool], None] | None = None,
    still_valid: Callable[[Cell, Mapping[str, Any], Mapping[Cell, Mapping[str, Any]]], str | None]
    | None = None,
) -> tuple[dict[Cell, dict[str, Any]], list[Cell]]:
    """Run every cell of ``plan`` not already in ``store``; return all payloads and the reused cells.

    ``on_cell(cell, reused)`` is called before each cell (for progress lines).
    ``still_valid(cell, payload, done)`` may veto a stored payload against the cells before
    it (e.g. an arm cell recorded for other cold-start weights); it returns the reason or None.
    """
    done: dict[Cell, dict[str, Any]] = {}
    reused: list[Cell] = []
    store.dir.mkdir(parents=True, exist_ok=True)
    for cell in plan:
        payload = store.load(cell)
        if payload is not None and still_valid is not None:
            reason = still_valid(cell, payload, done)
            if reason is not None:
                store.discarded.append({"cell": cell.name, "reason": reason})
                store.path(cell).unlink()
                payload = None
        if on_cell is not None:
            on_cell(cell, payload is not None)
        if payload is not None:
            reused.append(cell)
        else:
            payload = json.loads(to_json_text(dict(run_cell(cell, done))))
            store.save(cell, payload)
            failpoint("benchmark:cell_saved")
        done[cell] = payload
    return done, reused


__all__ = [
    "CELLS_DIR",
    "CELL_SCHEMA",
    "COLD_START",
    "Cell",
    "CellStore",
    "arm_phase_seed",
    "plan_cells",
    "run_cells",
]
