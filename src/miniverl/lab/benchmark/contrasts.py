"""Contrasts between arms from the benchmark's cells, and the protocol's stop-or-go checks.

**Tables.** Every arm cell records its final greedy outcome per held-out task
(``tasks: [{task_id, k, solved}]``). For a contrast ``A - B`` on an endpoint (all tasks, or
the tasks of one chain length k), each seed contributes one row: per task, the mean over
that seed's arm seeds of A's outcome minus the same for B. Arm seeds share the seed's
cold start, so they are not independent units and are averaged inside the seed, as
:mod:`miniverl.lab.benchmark.stats` expects; the headline t-interval is over the seed means, and the
secondary two-level bootstrap resamples seeds, and
tasks within each drawn seed. Tasks are paired by ``task_id`` (the splits come from
``environment.split_seed``, so every cell sees the same tasks).

**Order.** The pre-registered primary contrasts (:data:`PRIMARY_CONTRASTS`) come first
whenever both of their arms ran; then every other arm against a reference
(:func:`contrast_pairs`). Primary endpoints are greedy success at k = 3 and k = 5
(:data:`miniverl.lab.benchmark.endpoints.PRIMARY_KS`); "all" pools every k. The primary
family (primary contrasts at primary endpoints) is Holm-corrected (:func:`holm_family`).

**Stop-or-go checks** (:func:`stop_or_go`), recorded in ``benchmark.json``: the teacher
gate passed (the value comes from the cold-start record, written by the gate), oracle SFT
is not at ceiling at k = 3 (otherwise it cannot show a difference), and at least 30% of
the student's greedy episodes at k = 3 contain an error at the start of the arms
(otherwise there is nothing for on-policy training to correct).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from miniverl.lab.benchmark.endpoints import PRIMARY_KS
from miniverl.lab.benchmark.stats import (
    ALPHA,
    MIN_VALUES_FOR_INTERVAL,
    POWER,
    compare_arms,
    holm_adjusted,
    p_text,
)

PRIMARY_CONTRASTS: tuple[tuple[str, str], ...] = (
    ("opd", "offline_kd"),
    ("opd_reverse_kl", "offline_kd_reverse_kl"),
)
"""Pre-registered: on-policy vs off-policy with the same divergence. Printed first."""
SECONDARY_REFERENCES = ("offline_kd", "seqkd", "sft_oracle", "sft_only")
"""The reference for every non-primary arm: the first of these that ran."""
ORACLE_SFT_ARMS = ("sft_oracle", "sft_only")
CEILING = 0.95
"""Oracle SFT at or above this success at k = 3 is 'at ceiling'."""
MIN_ERROR_RATE = 0.30
"""At least this share of the student's k = 3 greedy episodes must contain an error."""
CHECK_K = 3


RECOVERY = "recovery"
"""The endpoint "recovery": per seed, the arm's flagged recovery rate (the share of its greedy
held-out episodes with a flagged tool error that end solved, ``lab/benchmark/endpoints.py``),
averaged over arm seeds. It is one value per seed, not a per-task outcome, so its contrast is
the seed-paired difference of rates: the t-interval over seeds is the reading, and the
bootstrap's task level is trivial."""

FIXED_RECOVERY = "fixed_recovery"
"""The endpoint "fixed_recovery": per seed and per fixed state (the cold start's own first
deviation in each of its deviated episodes, ``lab/benchmark/fixed_states.py``), whether the
arm's final student, continuing from it, ends solved; averaged over arm seeds. Every arm of
a seed answers the same states, so they pair like tasks."""

Endpoint = int | str | None
"""A chain length k, :data:`RECOVERY`, :data:`FIXED_RECOVERY`, or None for success over
every task."""


def endpoint_label(k: Endpoint) -> str:
    if k is None:
        return "all"
    return k if isinstance(k, str) else f"k={k}"


def outcome_table(
    cells: Sequence[Mapping[str, Any]], arm: str, k: Endpoint = None
) -> dict[str, dict[str, float]]:
    """Seed -> task_id -> mean solved over the arm seeds of that seed (only tasks of length
    ``k``); for :data:`RECOVERY`, seed -> ``{"recovery": mean flagged recovery rate}``; for
    :data:`FIXED_RECOVERY`, seed -> fixed state's trajectory id -> mean solved."""
    if k == RECOVERY:
        rates: dict[str, list[float]] = {}
        for cell in cells:
            rate = (cell.get("endpoints") or {}).get("flagged_recovery_rate")
            if cell.get("arm") == arm and rate is not None:
                rates.setdefault(str(cell["seed"]), []).append(float(rate))
        return {seed: {RECOVERY: statistics.fmean(v)} for seed, v in rates.items()}
    sums: dict[str, dict[str, list[float]]] = {}
    for cell in cells:
        if cell.get("arm") == arm:
            for unit, solved in _paired_units(cell, k):
                sums.setdefault(str(cell["seed"]), {}).setdefault(unit, []).append(solved)
    return {
        seed: {unit: statistics.fmean(v) for unit, v in units.items()}
        for seed, units in sums.items()
    }


def _paired_units(cell: Mapping[str, Any], k: Endpoint) -> list[tuple[str, float]]:
    """``(unit id, solved)`` of one cell on endpoint ``k``: its fixed states for
    :data:`FIXED_RECOVERY`, else its held-out tasks (of chain length ``k`` when given)."""
    if k == FIXED_RECOVERY:
        states = (cell.get("fixed_state_recovery") or {}).get("outcomes") or []
        return [(str(s["trajectory_id"]), float(s["solved"])) for s in states]
    return [
        (str(t["task_id"]), float(t["solved"]))
        for t in cell.get("tasks") or []
        if k is None or int(t["k"]) == k
    ]


def contrast_pairs(
    arms: Sequence[str], primary_pairs: Sequence[Sequence[str]] | None = None
) -> list[tuple[str, str, bool]]:
    """``(arm, reference, primary)``: the primary contrasts that can run, then the rest.

    ``primary_pairs`` (a pre-registered protocol's ``primary_contrasts``) replaces
    :data:`PRIMARY_CONTRASTS`; every other arm is compared with the first
    :data:`SECONDARY_REFERENCES` arm that ran.
    """
    present = set(arms)
    chosen = PRIMARY_CONTRASTS if primary_pairs is None else [tuple(p) for p in primary_pairs]
    pairs = [(a, b, True) for a, b in chosen if a in present and b in present]
    used = {a for a, _, _ in pairs}
    reference = next((r for r in SECONDARY_REFERENCES if r in present), arms[0] if arms else None)
    for arm in arms:
        if arm in used or arm == reference or reference is None:
            continue
        pairs.append((arm, reference, False))
    return pairs


def contrast(
    cells: Sequence[Mapping[str, Any]],
    arm: str,
    reference: str,
    k: Endpoint,
    *,
    resamples: int,
    bootstrap_seed: int,
) -> dict[str, Any]:
    """One contrast on one endpoint, via :func:`miniverl.lab.benchmark.stats.compare_arms`."""
    a, b = outcome_table(cells, arm, k), outcome_table(cells, reference, k)
    seeds = sorted(set(a) & set(b), key=str)
    arm_rows: dict[str, list[float]] = {}
    ref_rows: dict[str, list[float]] = {}
    for seed in seeds:
        shared = sorted(set(a[seed]) & set(b[seed]))
        if shared:
            arm_rows[seed] = [a[seed][t] for t in shared]
            ref_rows[seed] = [b[seed][t] for t in shared]
    base = {"arm": arm, "reference": reference, "endpoint": endpoint_label(k)}
    if not arm_rows:
        return {
            **base,
            "verdict": f"{arm} vs {reference} ({endpoint_label(k)}): no paired outcomes; nothing is claimed.",
            "distinguishable": False,
            "interval": None,
            "p_value": None,
            "bootstrap_interval": None,
            "mde": None,
            "seeds": [],
            "notes": ["no seed has outcomes of both arms on this endpoint"],
        }
    result = compare_arms(
        arm, reference, arm_rows, ref_rows, resamples=resamples, seed=bootstrap_seed
    ).to_dict()
    if result.get("sd_seed_differences") == 0.0:
        result["notes"].append(
            "every seed gave the same difference (sd 0): the MDE of 0 only says the seeds agreed, not that any effect would be detected"
        )
    result["verdict"] = result["verdict"].replace(
        f"{arm} vs {reference}:", f"{arm} vs {reference} ({endpoint_label(k)}):", 1
    )
    return {**result, **base}


def all_contrasts(
    cells: Sequence[Mapping[str, Any]],
    arms: Sequence[str],
    *,
    resamples: int,
    bootstrap_seed: int,
    ks: Sequence[Endpoint] = (*PRIMARY_KS, None),
    primary_endpoints: Sequence[Endpoint] = PRIMARY_KS,
    primary_pairs: Sequence[Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Every contrast of :func:`contrast_pairs` on every endpoint of ``primary_endpoints``
    and then of ``ks``, the primary pairs first.

    The primary family is every primary contrast on every endpoint of ``primary_endpoints``
    (a pre-registered protocol's endpoints, which ``ks`` need not hold: they are always
    computed); only its rows are ``primary``, and they carry ``p_holm``, Holm's adjusted p over
    the family (:func:`holm_family`). A primary pair on any other endpoint is secondary.
    """
    family = [endpoint_label(k) for k in primary_endpoints]
    endpoints = list(dict.fromkeys([*primary_endpoints, *ks]))
    out = []
    for arm, reference, primary in contrast_pairs(arms, primary_pairs):
        for k in endpoints:
            row = contrast(
                cells, arm, reference, k, resamples=resamples, bootstrap_seed=bootstrap_seed
            )
            out.append({**row, "primary": primary and endpoint_label(k) in family})
    return holm_family(out, family)


COLD_START_POLICY = "cold_start"
"""The reference name of the cold start itself in :func:`against_the_cold_start`'s rows."""


def against_the_cold_start(
    cold_starts: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    arms: Sequence[str],
    *,
    resamples: int,
    bootstrap_seed: int,
) -> list[dict[str, Any]]:
    """Each arm minus the cold start on :data:`FIXED_RECOVERY`: the cold start's own greedy
    continuation from the same states (``fixed_states.cold_start`` of its cell) is the
    reference. Secondary rows, outside the Holm family; the negative control's reading (an
    arm whose teacher carries no task information should not recover more than the cold
    start). Empty when no cold start stored fixed states."""
    reference = [
        {
            "arm": COLD_START_POLICY,
            "seed": cold["seed"],
            "tasks": [],
            "fixed_state_recovery": cold["fixed_states"]["cold_start"],
        }
        for cold in cold_starts
        if cold.get("fixed_states")
    ]
    if not reference:
        return []
    return [
        {
            **contrast(
                [*rows, *reference],
                arm,
                COLD_START_POLICY,
                FIXED_RECOVERY,
                resamples=resamples,
                bootstrap_seed=bootstrap_seed,
            ),
            "primary": False,
            "holm_family": False,
            "p_holm": None,
        }
        for arm in arms
    ]


def holm_family(rows: list[dict[str, Any]], endpoints: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` with ``holm_family`` (member of the primary family: a primary contrast on one
    of ``endpoints``) and ``p_holm`` (Holm-adjusted p over the members with a p-value; None
    elsewhere); a member's verdict gains the adjusted p."""
    members = [
        i
        for i, r in enumerate(rows)
        if r.get("primary") and r["endpoint"] in endpoints and r.get("p_value") is not None
    ]
    adjusted = holm_adjusted([rows[i]["p_value"] for i in members])
    out = [
        {**r, "holm_family": bool(r.get("primary")) and r["endpoint"] in endpoints, "p_holm": None}
        for r in rows
    ]
    for i, p in zip(members, adjusted, strict=True):
        out[i]["p_holm"] = p
        out[i]["verdict"] = out[i]["verdict"].rstrip(".") + (
            f"; Holm-adjusted p = {p_text(p)} over the {len(members)} primary tests."
        )
    return out


def statistics_note(n_seeds: int, arm_seeds: int) -> str:
    """The sentence benchmark.json records about what the intervals mean."""
    head = (
        f"{n_seeds} seed{'s' * (n_seeds != 1)} x {arm_seeds} arm seed{'s' * (arm_seeds != 1)}; "
        "arm seeds are averaged per task inside their seed (they share its cold start)"
    )
    if n_seeds < MIN_VALUES_FOR_INTERVAL:
        return (
            f"{head}; no interval is quoted (an interval needs at least {MIN_VALUES_FOR_INTERVAL} seeds), "
            "so no arm difference is claimed."
        )
    return (
        f"{head}; headline: 95% Student t-intervals over the seed means (df = seeds - 1) with two-sided "
        "t-test p-values, Holm-adjusted over the primary family (primary contrasts at the primary endpoints); "
        "secondary: 95% percentile intervals from a two-level bootstrap (seeds, then tasks within each seed); "
        f"MDE at two-sided alpha {ALPHA:g} and power {POWER:g} from t quantiles and the observed sd of the seed differences."
    )


# ---------------------------------------------------------------------- stop-or-go


def _check(
    name: str, passed: bool | None, value: Any, threshold: Any, detail: str
) -> dict[str, Any]:
    status = "not_measured" if passed is None else "go" if passed else "stop"
    return {
        "check": name,
        "status": status,
        "passed": passed,
        "value": value,
        "threshold": threshold,
        "detail": detail,
    }


def teacher_gate_check(cold_starts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Passed when every seed's cold start recorded a passing gate (``teacher_gate.passed``)."""
    gates = [c.get("teacher_gate") for c in cold_starts]
    if not gates or any(g is None for g in gates):
        return _check(
            "teacher_gate_passed",
            None,
            None,
            None,
            "the cold start recorded no teacher gate (teacher_gate: {value, threshold, passed})",
        )
    skipped = [g for g in gates if g.get("skipped")]
    if skipped:
        return _check(
            "teacher_gate_passed",
            None,
            None,
            skipped[0].get("threshold"),
            f"the teacher gate was skipped: {skipped[0].get('reason')}",
        )
    values = [g.get("value") for g in gates]
    passed = all(bool(g.get("passed")) for g in gates)
    return _check(
        "teacher_gate_passed",
        passed,
        values,
        gates[0].get("threshold"),
        "teacher top-1 accuracy on the correct next action at student-visited states, per seed",
    )


def ceiling_check(
    cells: Sequence[Mapping[str, Any]],
    arms: Sequence[str],
    *,
    k: int = CHECK_K,
    ceiling: float = CEILING,
) -> dict[str, Any]:
    """Oracle SFT's mean final greedy success at ``k`` must stay below ``ceiling``."""
    arm = next((a for a in ORACLE_SFT_ARMS if a in arms), None)
    outcomes = [
        float(t["solved"])
        for c in cells
        if arm is not None and c.get("arm") == arm
        for t in c.get("tasks") or []
        if int(t["k"]) == k
    ]
    if not outcomes:
        return _check(
            "oracle_sft_not_at_ceiling",
            None,
            None,
            ceiling,
            f"no oracle-SFT arm ({' or '.join(ORACLE_SFT_ARMS)}) outcomes at k={k}",
        )
    value = statistics.fmean(outcomes)
    return _check(
        "oracle_sft_not_at_ceiling",
        value < ceiling,
        value,
        ceiling,
        f"{arm} final greedy success at k={k} over {len(outcomes)} episodes (all seeds and arm seeds)",
    )


def error_rate_check(
    cold_starts: Sequence[Mapping[str, Any]], *, k: int = CHECK_K, minimum: float = MIN_ERROR_RATE
) -> dict[str, Any]:
    """The share of the cold start's greedy k-episodes with an error must reach ``minimum``."""
    erred = episodes = 0
    for cold in cold_starts:
        summary = cold.get("start_endpoints") or {}
        n = int((summary.get("episodes_by_k") or {}).get(str(k)) or 0)
        rate = (summary.get("error_rate_by_k") or {}).get(str(k))
        if n and rate is not None:
            episodes += n
            erred += round(rate * n)
    if not episodes:
        return _check(
            "student_errors_at_start",
            None,
            None,
            minimum,
            f"the cold start recorded no greedy episodes at k={k} (calc_chain endpoints)",
        )
    value = erred / episodes
    return _check(
        "student_errors_at_start",
        value >= minimum,
        value,
        minimum,
        f"{erred}/{episodes} cold-start greedy episodes at k={k} contain an error (all seeds)",
    )


def stop_or_go(
    cold_starts: Sequence[Mapping[str, Any]],
    cells: Sequence[Mapping[str, Any]],
    arms: Sequence[str],
) -> dict[str, Any]:
    """The three checks and an overall status: stop if any failed, go if all passed, else incomplete."""
    checks = [
        teacher_gate_check(cold_starts),
        ceiling_check(cells, arms),
        error_rate_check(cold_starts),
    ]
    statuses = {c["status"] for c in checks}
    overall = "stop" if "stop" in statuses else "go" if statuses == {"go"} else "incomplete"
    return {"status": overall, "checks": checks}


__all__ = [
    "CEILING",
    "COLD_START_POLICY",
    "FIXED_RECOVERY",
    "MIN_ERROR_RATE",
    "PRIMARY_CONTRASTS",
    "RECOVERY",
    "against_the_cold_start",
    "all_contrasts",
    "ceiling_check",
    "contrast",
    "contrast_pairs",
    "error_rate_check",
    "holm_family",
    "outcome_table",
    "statistics_note",
    "stop_or_go",
    "teacher_gate_check",
]
