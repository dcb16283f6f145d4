"""Per-arm compute accounting, and the cap of the benchmark's compute-matched mode.

Arms are matched on optimizer steps by construction; what they spend to take those steps
is not matched and is measured instead (:func:`measure_budget`):

- ``optimizer_steps``: optimizer updates of the arm phase (the cold start is shared, not counted);
- ``trained_tokens``: selected target positions that entered a loss, summed over steps;
- ``student_generated_tokens``: tokens the student sampled in training rollouts (eval excluded);
- ``teacher_generated_tokens``: tokens the teacher sampled for the arm (offline_kd's pool,
  seqkd's and gkd_mix's fresh teacher samples);
- ``teacher_scored_tokens``: positions the teacher ran a forward pass over: the full length
  of every distinct trajectory the arm trained on with teacher targets (0 for oracle SFT
  and seqkd; kd_oracle's oracle traces count);
- ``cpu_seconds``: process CPU time (all threads) of the arm phase, ``time.process_time``;
- ``gpu_seconds``: wall seconds of the arm phase when it ran on CUDA (the device was held
  for that long), else None: a held-device measure, not kernel time.

**Compute-matched mode** gives every arm the budget ``opd`` spent on the same seed and arm
seed, in one resource (:data:`MATCHABLE`). The harness runs ``opd`` first in each
(seed, arm seed), reads its spend with :func:`measure_budget`, and hands every other arm a
:class:`BudgetCap`. The arm's run honours it through :class:`CapMeter`, the trainer's
``stop_after_cycle`` (``OPDTrainer``'s :class:`~miniverl.training.recipe.CycleStop`): it sets
``enforced``, measures what each cycle spent (wall or CPU seconds, student-generated tokens
from the cycle records, teacher-scored tokens from the trajectory log minus
:data:`UNSCORED_ID_PARTS`), charges it evenly over the cycle's optimizer steps with
:meth:`BudgetCap.charge`, and stops the run after the cycle in which
:meth:`BudgetCap.exhausted` became True, recording ``stopped_at`` (cycle, global optimizer
step, spend) and a ``compute_cap_reached`` event; the cap may overshoot by at most one
cycle, never cutting one in half. The cell always records the cap, the spend and whether
the cap bound, so an arm that overran an unenforced cap is visible, not hidden.

**Cells in pieces.** An arm cell stopped part-way (the machine went down, the session
ended) continues from its run's latest checkpoint when the benchmark is run again; each
process that worked on it is a piece. :class:`PieceLedger` writes, after every checkpoint,
what the cell had spent up to it (``cell-cost.json`` in the run directory). The cell's
``cpu_seconds`` and ``wall_seconds`` are then the spend of every earlier piece up to the
checkpoint the next one resumed from, plus all of the last piece: the cost of the work that
reached the final weights, not of cycles a stop threw away and the next piece ran again.
A compute-matched arm has no ledger (its cap is charged in one process) and restarts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from miniverl.config.modes import MODES, arm_role
from miniverl.utils.io import write_json
from miniverl.utils.logging import EventLog
from miniverl.utils.runs import RunPaths

BUDGET_FIELDS = (
    "optimizer_steps",
    "trained_tokens",
    "student_generated_tokens",
    "teacher_generated_tokens",
    "teacher_scored_tokens",
    "cpu_seconds",
    "gpu_seconds",
    "wall_seconds",
)
MATCHABLE = ("wall_seconds", "cpu_seconds", "teacher_scored_tokens", "student_generated_tokens")
"""Resources a compute-matched benchmark may hold equal to opd's spend."""
REFERENCE_ARM = arm_role("compute_reference")
"""The arm whose spend a compute-matched benchmark gives every other arm (``config/modes.py``)."""

UNSCORED_ID_PARTS = (":oracle:", ":eval-", ":seqkd:")
"""Trajectory-id parts of trajectories the teacher never scored: SFT oracle traces,
evaluation episodes, and seqkd's teacher samples (trained on as hard labels)."""


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
    """Measures each cycle's spend of ``cap.resource`` and charges it; see the module docstring.

    A run's ``stop_after_cycle``: :meth:`begin` starts the clocks and the log offsets just
    before the run's first cycle, :meth:`after_cycle` charges each cycle.
    """

    def __init__(self, cap: BudgetCap) -> None:
        self.cap = cap
        self.paths: dict[str, Path] = {}
        self.offsets: dict[str, int] = {}
        self.scored: set[str] = set()
        self.events: EventLog | None = None
        self.wall = self.cpu = 0.0

    def begin(self, paths: RunPaths, events: EventLog) -> None:
        self.paths = {"metrics": paths.metrics, "trajectories": paths.trajectories}
        self.offsets = {k: p.stat().st_size if p.exists() else 0 for k, p in self.paths.items()}
        self.events = events
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        self.cap.enforced = True

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

    def after_cycle(self, cycle: int, *, steps: int, global_step: int) -> bool:
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
        assert self.events is not None, "begin() runs before the first cycle"
        self.events.emit(
            "compute_cap_reached",
            echo=f"compute cap reached after cycle {cycle}: {self.cap.resource} "
            f"{self.cap.spent:.1f} of {self.cap.limit:.1f}; training stops here",
            resource=self.cap.resource,
            **self.cap.stopped_at,
        )
        return True


@dataclass
class BudgetCap:
    """A limit on one resource for one arm phase, and what was charged against it."""

    resource: str
    limit: float
    reference_arm: str = REFERENCE_ARM
    spent: float = 0.0
    steps_charged: int = 0
    enforced: bool = False
    notes: list[str] = field(default_factory=list)
    stopped_at: dict[str, Any] | None = None
    """Set by the trainer when the cap stopped training: cycle, global optimizer step, spend."""

    def __post_init__(self) -> None:
        if self.resource not in MATCHABLE:
            raise ValueError(
                f"cannot match on {self.resource!r}; choose from {', '.join(MATCHABLE)}"
            )
        if not self.limit > 0:
            raise ValueError(f"a compute cap must be positive, got {self.limit!r}")

    def charge(self, amount: float) -> None:
        """Add one optimizer step's spend (in the unit of ``resource``)."""
        if amount < 0:
            raise ValueError("spend cannot be negative")
        self.spent += float(amount)
        self.steps_charged += 1

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exhausted": self.exhausted}


def cap_from_reference(reference_budget: Mapping[str, Any], resource: str) -> BudgetCap:
    """The cap for the other arms of one (seed, arm seed): opd's measured spend of ``resource``."""
    value = reference_budget.get(resource)
    if value is None or not float(value) > 0:
        raise ValueError(f"the reference arm recorded no positive {resource} ({value!r})")
    return BudgetCap(resource=resource, limit=float(value))


def expected_cap(
    arm: str, reference: Mapping[str, Any] | None, compute_matched: str | None
) -> BudgetCap | None:
    """The cap an arm cell runs under (``cell_runner``), or None: step-matched, the
    reference arm itself, or no reference cell to match."""
    if not compute_matched or arm == REFERENCE_ARM or reference is None:
        return None
    return cap_from_reference(reference["budget"], compute_matched)


def same_cap(payload: Mapping[str, Any], cap: BudgetCap | None) -> bool:
    """Whether a stored arm cell's ``compute_cap`` is ``cap`` (resource and limit; both none)."""
    recorded = payload.get("compute_cap")
    if not recorded or cap is None:
        return not recorded and cap is None
    return (str(recorded["resource"]), float(recorded["limit"])) == (cap.resource, cap.limit)


def cap_outcome(cap: BudgetCap | None, budget: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the record says about a cap: limit, measured spend, ratio, and whether it bound."""
    if cap is None:
        return None
    measured = budget.get(cap.resource)
    ratio = None if measured is None else float(measured) / cap.limit
    return {
        **cap.to_dict(),
        "measured": measured,
        "ratio_to_reference": ratio,
        "bound": bool(cap.enforced and cap.exhausted),
        "overran_unenforced": bool(not cap.enforced and ratio is not None and ratio > 1.0),
    }


@dataclass
class Stopwatch:
    """Wall and process-CPU seconds of one arm phase."""

    wall0: float = field(default_factory=time.perf_counter)
    cpu0: float = field(default_factory=time.process_time)

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0


CELL_COST_FILE = "cell-cost.json"
CELL_COST_SCHEMA = "miniverl.cell_cost/1"


@dataclass(frozen=True)
class Spend:
    """Seconds an arm cell has spent, and how many processes (pieces) spent them."""

    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    pieces: int = 0


class PieceLedger:
    """An arm run's committed spend at each of its checkpoints (module docstring, "Cells in pieces").

    The run's ``stop_after_cycle``: after every cycle whose checkpoint exists it records
    ``prior`` plus this piece's :class:`Stopwatch` under the checkpoint's name and rewrites
    ``cell-cost.json`` (temporary file, then rename); it never stops the run. ``key`` names
    what a resume must match (the arm's config digest and its cold start's student SHA-256).
    """

    def __init__(
        self, run_dir: str | Path, *, key: Mapping[str, Any], prior: Spend, watch: Stopwatch
    ) -> None:
        self.path = Path(run_dir) / CELL_COST_FILE
        self.key = dict(key)
        self.prior = prior
        self.watch = watch
        self.checkpoints: dict[str, dict[str, Any]] = {}
        if prior.pieces:
            self.checkpoints = dict((read_ledger(self.path, self.key) or {}).get("checkpoints", {}))
        self.paths: RunPaths | None = None

    def total(self) -> Spend:
        """Everything committed before this piece plus all of this piece so far."""
        wall, cpu = self.watch.read()
        return Spend(
            self.prior.wall_seconds + wall, self.prior.cpu_seconds + cpu, self.prior.pieces + 1
        )

    def begin(self, paths: RunPaths, events: EventLog) -> None:
        self.paths = paths

    def after_cycle(self, cycle: int, *, steps: int, global_step: int) -> bool:
        name = f"cycle-{cycle:04d}"
        if self.paths is not None and self.paths.checkpoint(name).is_dir():
            now = self.total()
            self.checkpoints[name] = {"cycle": cycle, **asdict(now)}
            write_json(
                self.path,
                {"schema": CELL_COST_SCHEMA, **self.key, "checkpoints": self.checkpoints},
            )
        return False


def read_ledger(path: str | Path, key: Mapping[str, Any]) -> dict[str, Any] | None:
    """``cell-cost.json`` when it parses and was written for ``key``; else None."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("schema") != CELL_COST_SCHEMA:
        return None
    if any(data.get(k) != v for k, v in key.items()):
        return None
    return data if isinstance(data.get("checkpoints"), dict) else None


def spend_at(ledger: Mapping[str, Any], checkpoint: str) -> Spend | None:
    """The spend committed at ``checkpoint`` (``final``: at the last cycle's); None if it is not
    recorded or its entry does not read as one (the cell then starts over)."""
    entries = ledger.get("checkpoints") or {}
    try:
        entry = entries.get(checkpoint)
        if entry is None and checkpoint == "final" and entries:
            entry = max(entries.values(), key=lambda e: int(e["cycle"]))
        if entry is None:
            return None
        return Spend(
            float(entry["wall_seconds"]), float(entry["cpu_seconds"]), int(entry["pieces"])
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def measure_budget(
    run_dir: str | Path, *, wall_seconds: float, cpu_seconds: float, device: str
) -> dict[str, Any]:
    """Every :data:`BUDGET_FIELDS` value of one finished arm run, from its artifacts."""
    from miniverl.inspection.run_dir import read_events, read_metrics
    from miniverl.trajectory.io import iter_trajectories
    from miniverl.utils.runs import RunPaths

    paths = RunPaths(run_dir)
    metrics = read_metrics(paths.metrics)
    events = read_events(paths.events)
    steps = [r for r in metrics if r.get("kind") == "step"]
    cycles = [r for r in metrics if r.get("kind") == "cycle"]
    mode = next((e.get("mode") for e in events if e.get("event") == "run_start"), None)
    optimizer_steps = sum(int(c.get("steps") or 0) for c in cycles)
    scored = 0
    if mode in MODES and MODES[mode].teacher_targets and paths.trajectories.exists():
        seen: set[str] = set()
        for trajectory in iter_trajectories(paths.trajectories):
            tid = trajectory.trajectory_id
            if tid in seen or any(part in tid for part in UNSCORED_ID_PARTS):
                continue
            seen.add(tid)
            scored += len(trajectory.token_ids)
    return {
        "optimizer_steps": optimizer_steps,
        "trained_tokens": sum(int(s.get("selected_positions") or 0) for s in steps),
        "student_generated_tokens": sum(
            int((c.get("rollouts") or {}).get("generated_tokens") or 0) for c in cycles
        ),
        "teacher_generated_tokens": sum(
            int(e.get("generated_tokens") or 0)
            for e in events
            if e.get("event") == "rollouts_collected"
            and (e.get("offline_kd_pool") or e.get("teacher_sampled"))
        ),
        "teacher_scored_tokens": scored,
        "cpu_seconds": round(cpu_seconds, 3),
        "gpu_seconds": round(wall_seconds, 3) if str(device).startswith("cuda") else None,
        "wall_seconds": round(wall_seconds, 3),
    }


__all__ = [
    "BUDGET_FIELDS",
    "CELL_COST_FILE",
    "MATCHABLE",
    "REFERENCE_ARM",
    "BudgetCap",
    "PieceLedger",
    "Spend",
    "Stopwatch",
    "cap_from_reference",
    "cap_outcome",
    "expected_cap",
    "measure_budget",
    "read_ledger",
    "same_cap",
    "spend_at",
]
