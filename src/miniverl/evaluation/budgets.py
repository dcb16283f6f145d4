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
:class:`BudgetCap`. The trainer honours the cap (``training/resolve.py``): it sets ``enforced``,
charges each cycle's spend over its optimizer steps with :meth:`BudgetCap.charge`, and
stops after the cycle in which :meth:`BudgetCap.exhausted` became True, recording
``stopped_at`` (cycle, global optimizer step, spend) and a ``compute_cap_reached`` event. The cell always records the cap, the spend and
whether the cap bound, so an arm that overran an unenforced cap is visible, not hidden.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from miniverl.training.resolve import UNSCORED_ID_PARTS

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
REFERENCE_ARM = "opd"


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


def measure_budget(
    run_dir: str | Path, *, wall_seconds: float, cpu_seconds: float, device: str
) -> dict[str, Any]:
    """Every :data:`BUDGET_FIELDS` value of one finished arm run, from its artifacts."""
    from miniverl.reporting.load import read_events, read_jsonl, read_metrics
    from miniverl.utils.runs import RunPaths

    paths = RunPaths(run_dir)
    metrics = read_metrics(paths.metrics)
    events = read_events(paths.events)
    steps = [r for r in metrics if r.get("kind") == "step"]
    cycles = [r for r in metrics if r.get("kind") == "cycle"]
    mode = next((e.get("mode") for e in events if e.get("event") == "run_start"), None)
    optimizer_steps = sum(int(c.get("steps") or 0) for c in cycles)
    scored = 0
    if mode != "sft" and paths.trajectories.exists():
        seen: set[str] = set()
        for record in read_jsonl(paths.trajectories):
            tid = str(record.get("trajectory_id"))
            if tid in seen or any(part in tid for part in UNSCORED_ID_PARTS):
                continue
            seen.add(tid)
            scored += len(record.get("token_ids") or [])
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
    "MATCHABLE",
    "REFERENCE_ARM",
    "BudgetCap",
    "Stopwatch",
    "cap_from_reference",
    "cap_outcome",
    "expected_cap",
    "measure_budget",
    "same_cap",
]
