"""Compute-matched training: charge each optimizer step to a budget cap, stop when it is spent.

The benchmark's compute-matched mode (``evaluation/budgets.py``) hands an arm a cap on one
resource at ``opd``'s spend. The trainer builds a :class:`CapMeter` before its cycle loop
and calls :meth:`CapMeter.after_cycle` after each cycle (its evaluation and checkpoint
included); the meter measures what the cycle spent, charges it to the cap split evenly
over the cycle's optimizer steps, and answers whether to stop. Stopping is clean: the loop
ends after a whole cycle, and the run then evaluates and checkpoints as a finished run.

The spend of each resource is measured the way ``measure_budget`` measures a whole run, so
the cap and the record agree:

- ``wall_seconds`` / ``cpu_seconds``: ``time.perf_counter`` / ``time.process_time`` since the
  meter started (the loop's start) or the last charge;
- ``student_generated_tokens``: ``rollouts.generated_tokens`` of the cycle records appended
  to ``metrics.jsonl``;
- ``teacher_scored_tokens``: full token length of each distinct trajectory appended to
  ``trajectories.jsonl`` except those the teacher never scores (:data:`UNSCORED_ID_PARTS`).

The cap may overshoot by at most one cycle's spend: a cycle is never cut in half. The cap
is duck-typed (:class:`ChargeableCap`), so this layer does not import the evaluation layer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

from miniverl.utils.logging import EventLog

UNSCORED_ID_PARTS = (":oracle:", ":eval-", ":seqkd:")
"""Trajectory-id parts of trajectories the teacher never scored: SFT oracle traces,
evaluation episodes, and seqkd's teacher samples (trained on as hard labels)."""


class ChargeableCap(Protocol):
    """What the meter needs of ``evaluation.budgets.BudgetCap``."""

    resource: str
    limit: float
    spent: float
    enforced: bool
    stopped_at: dict[str, Any] | None

    def charge(self, amount: float) -> None: ...

    @property
    def exhausted(self) -> bool: ...


def _new_jsonl(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to ``path`` since byte ``offset``, and the new offset."""
    if not path.exists():
        return [], offset
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


class CapMeter:
    """Measures each cycle's spend of ``cap.resource`` and charges it; see the module docstring."""

    def __init__(self, cap: ChargeableCap, *, metrics: Path, trajectories: Path) -> None:
        self.cap = cap
        self.paths = {"metrics": metrics, "trajectories": trajectories}
        self.offsets = {k: p.stat().st_size if p.exists() else 0 for k, p in self.paths.items()}
        self.scored: set[str] = set()
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        cap.enforced = True

    def _take(self, key: str) -> list[dict[str, Any]]:
        rows, self.offsets[key] = _new_jsonl(self.paths[key], self.offsets[key])
        return rows

    def spend(self) -> float:
        """What was spent since the last call, in the unit of ``cap.resource``."""
        resource = self.cap.resource
        if resource == "wall_seconds":
            now = time.perf_counter()
            amount, self.wall = now - self.wall, now
            return amount
        if resource == "cpu_seconds":
            now = time.process_time()
            amount, self.cpu = now - self.cpu, now
            return amount
        if resource == "student_generated_tokens":
            return float(
                sum(
                    int((r.get("rollouts") or {}).get("generated_tokens") or 0)
                    for r in self._take("metrics")
                    if r.get("kind") == "cycle"
                )
            )
        if resource == "teacher_scored_tokens":
            total = 0
            for record in self._take("trajectories"):
                tid = str(record.get("trajectory_id"))
                if tid in self.scored or any(part in tid for part in UNSCORED_ID_PARTS):
                    continue
                self.scored.add(tid)
                total += len(record.get("token_ids") or [])
            return float(total)
        raise ValueError(f"no meter for resource {resource!r}")

    def after_cycle(self, *, cycle: int, steps: int, global_step: int, events: EventLog) -> bool:
        """Charge the cycle (evenly over its ``steps`` optimizer steps); True when the cap is spent."""
        amount = self.spend()
        if steps > 0:
            for _ in range(steps):
                self.cap.charge(amount / steps)
        else:
            self.cap.spent += amount
        if not self.cap.exhausted:
            return False
        self.cap.stopped_at = {
            "cycle": cycle,
            "global_optimizer_step": global_step,
            "spent": self.cap.spent,
            "limit": self.cap.limit,
        }
        events.emit(
            "compute_cap_reached",
            echo=f"compute cap reached after cycle {cycle}: {self.cap.resource} "
            f"{self.cap.spent:.1f} of {self.cap.limit:.1f}; training stops here",
            resource=self.cap.resource,
            **self.cap.stopped_at,
        )
        return True


def make_cap_meter(cap: ChargeableCap | None, paths: Any) -> CapMeter | None:
    """A meter for ``cap`` over a run's ``RunPaths``; None without a cap."""
    if cap is None:
        return None
    return CapMeter(cap, metrics=paths.metrics, trajectories=paths.trajectories)


__all__ = ["UNSCORED_ID_PARTS", "CapMeter", "ChargeableCap", "make_cap_meter"]
