"""The pre-registered protocol of a test-split benchmark, frozen by its SHA-256.

Why: a result on the test split is a confirmatory claim only when what it would be judged
by (primary endpoints and contrasts, thresholds, seeds, arms, the learning-rate grid) was
fixed before the test split was evaluated. ``miniverl benchmark ... eval.split=test
--protocol FILE`` therefore reads ``FILE`` (YAML or JSON, safe loaders only), checks that
it matches the run it is given for (same seeds and arms, primary contrasts among the
harness's primary pairs, endpoints the harness computes), and *freezes* it before any cell
runs: its bytes are copied into the benchmark directory as ``protocol<suffix>`` and
``protocol.json`` records their SHA-256 (each written to a temp file, then renamed; the
record is written last, so it only ever names a complete copy). A rerun of the same directory must present the same bytes (or none: the
frozen copy is used); a changed file is refused with :class:`~miniverl.errors.ProtocolError`.

Without a frozen protocol a test-split benchmark may only *recompute* from stored cells;
the first cell it would have to run is refused (:func:`refuse_unprotocolled_cell`), so
nothing touches the test split. The protocol's endpoints define the Holm family
(``lab/benchmark/contrasts.py``); benchmark.json records the protocol block.

A protocol file::

    endpoints: [k=3, k=5]           # primary: "all", "recovery", "fixed_recovery" or "k=<n>"
    primary_contrasts: [[opd, offline_kd], [opd_reverse_kl, offline_kd_reverse_kl]]
    seeds: [1, 2, 3, 4, 5]
    arms: [offline_kd, opd, offline_kd_reverse_kl, opd_reverse_kl]
    thresholds: {alpha: 0.05, power: 0.8, teacher_gate: 0.95}
    lr_grid: {grid: [0.0003, 0.001, 0.003], split: eval}
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from miniverl.errors import ProtocolError
from miniverl.utils.hashing import sha256_bytes
from miniverl.utils.io import atomic_write_bytes, write_json
from miniverl.utils.logging import utc_now
from miniverl.utils.safe_load import load_json_file, loads_json, loads_yaml, read_regular_bytes

PROTOCOL_RECORD = "protocol.json"
"""The benchmark directory's record of the frozen protocol (sha256, file name, content)."""
REQUIRED_KEYS = ("endpoints", "primary_contrasts", "seeds", "arms", "thresholds", "lr_grid")
_ENDPOINT = re.compile(r"^(all|recovery|fixed_recovery|k=[1-9]\d*)$")
MAX_PROTOCOL_BYTES = 1 << 20


def _parse(data: bytes, where: str) -> dict[str, Any]:
    """The protocol mapping of a file's bytes (JSON for a ``.json`` name, else YAML)."""
    value: Any
    if where.endswith(".json"):
        value = loads_json(data, where=where, error=ProtocolError)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{where} is not UTF-8 text: {exc}") from None
        value = loads_yaml(text, where=where, error=ProtocolError)
    if not isinstance(value, dict):
        raise ProtocolError(
            f"{where} does not hold a mapping",
            hint=f"a protocol file is a mapping with the keys {', '.join(REQUIRED_KEYS)}",
        )
    return value


def validate_protocol(
    content: Mapping[str, Any],
    *,
    where: str,
    seeds: Sequence[int],
    arms: Sequence[str],
) -> list[str]:
    """Every problem of ``content`` against the run (empty when it fits); the endpoints'
    labels are returned through :func:`primary_endpoints`. ``primary_contrasts`` are the
    pairs the benchmark then tests as its Holm family (each ``[arm, reference]`` two
    different arms of the run)."""
    problems = [f"missing key {key!r}" for key in REQUIRED_KEYS if key not in content]
    unknown = sorted(set(content) - set(REQUIRED_KEYS))
    problems += [f"unknown key {key!r}" for key in unknown]
    endpoints = content.get("endpoints")
    if "endpoints" in content and (
        not isinstance(endpoints, list)
        or not endpoints
        or not all(isinstance(e, str) and _ENDPOINT.match(e) for e in endpoints)
    ):
        problems.append(
            f"endpoints must be a non-empty list of 'all', 'recovery', 'fixed_recovery' or 'k=<n>', got {endpoints!r}"
        )
    recorded_seeds = content.get("seeds")
    if "seeds" in content and (
        not isinstance(recorded_seeds, list)
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in recorded_seeds)
        or not set(map(int, seeds)) <= set(recorded_seeds)
    ):
        problems.append(
            f"seeds {recorded_seeds!r} do not hold every seed of this run {list(seeds)!r} "
            "(a run may be a piece of the protocol's seeds, never run another)"
        )
    recorded_arms = content.get("arms")
    if "arms" in content and (
        not isinstance(recorded_arms, list) or sorted(map(str, recorded_arms)) != sorted(arms)
    ):
        problems.append(f"arms {recorded_arms!r} are not this run's arms {list(arms)!r}")
    contrasts = content.get("primary_contrasts")
    if "primary_contrasts" in content:
        pairs = (
            [tuple(c) for c in contrasts if isinstance(c, list) and len(c) == 2]
            if isinstance(contrasts, list)
            else []
        )
        if not isinstance(contrasts, list) or len(pairs) != len(contrasts) or not pairs:
            problems.append(
                f"primary_contrasts must be a non-empty list of [arm, reference], got {contrasts!r}"
            )
        else:
            bad = [list(p) for p in pairs if p[0] == p[1] or not set(p) <= set(arms)]
            if bad or len(set(pairs)) != len(pairs):
                problems.append(
                    f"primary_contrasts {contrasts!r} must be distinct pairs of two different "
                    f"arms of this run ({list(arms)!r})"
                )
    thresholds = content.get("thresholds")
    if "thresholds" in content and (
        not isinstance(thresholds, dict)
        or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in thresholds.values()
        )
    ):
        problems.append(f"thresholds must map names to numbers, got {thresholds!r}")
    return [f"{where}: {p}" for p in problems]


def missing_seeds(frozen: Mapping[str, Any] | None, seeds: Sequence[int]) -> list[int]:
    """The frozen protocol's seeds this run does not hold: a run of part of them is a piece
    (its cells merge into one directory by copying); only the run over all of them is the
    pre-registered analysis."""
    if frozen is None:
        return []
    return sorted(set(frozen["content"].get("seeds") or []) - set(map(int, seeds)))


def primary_endpoints(content: Mapping[str, Any]) -> list[int | str | None]:
    """The protocol's endpoints as ``ks`` (None for ``all``, ``"recovery"`` and
    ``"fixed_recovery"`` as themselves), for the Holm family."""
    return [
        None if e == "all" else e if e in ("recovery", "fixed_recovery") else int(e[2:])
        for e in content["endpoints"]
    ]


def freeze_protocol(
    root: Path,
    protocol_file: str | Path | None,
    *,
    seeds: Sequence[int],
    arms: Sequence[str],
) -> dict[str, Any] | None:
    """The frozen protocol block of benchmark directory ``root`` (None when there is none).

    With ``protocol_file``: validated against the run, then frozen when ``root`` holds no
    protocol yet, or compared by SHA-256 with the frozen one (a difference raises
    :class:`ProtocolError`). Without it: the frozen record, if any.
    """
    record_path = root / PROTOCOL_RECORD
    frozen = (
        load_json_file(record_path, error=ProtocolError, expect=dict)
        if record_path.exists()
        else None
    )
    if protocol_file is None:
        if frozen is None:
            return None
        data = read_regular_bytes(
            root / frozen["stored_as"], limit=MAX_PROTOCOL_BYTES, error=ProtocolError
        )
        if sha256_bytes(data) != frozen["sha256"]:
            raise ProtocolError(
                f"{root / frozen['stored_as']} no longer has the SHA-256 recorded in {record_path}",
                hint="the stored protocol copy was edited; restore it (the results were judged by the recorded one)",
            )
        return frozen
    path = Path(protocol_file)
    data = read_regular_bytes(path, limit=MAX_PROTOCOL_BYTES, error=ProtocolError)
    digest = sha256_bytes(data)
    if frozen is not None:
        if frozen["sha256"] != digest:
            raise ProtocolError(
                f"{path} (sha256 {digest[:16]}…) is not the protocol frozen in {root} "
                f"(sha256 {frozen['sha256'][:16]}…, frozen {frozen['frozen_at']})",
                hint="a pre-registered protocol cannot change once test cells ran: restore the frozen file, "
                "or start a new --output directory with the new protocol",
            )
        return frozen
    content = _parse(data, str(path))
    problems = validate_protocol(content, where=str(path), seeds=seeds, arms=arms)
    if problems:
        raise ProtocolError(
            "the protocol file does not fit this benchmark:\n  " + "\n  ".join(problems),
            hint="fix the protocol before the test split is touched (nothing ran)",
        )
    root.mkdir(parents=True, exist_ok=True)
    stored_as = "protocol" + (".json" if path.suffix == ".json" else ".yaml")
    atomic_write_bytes(root / stored_as, data)
    record = {
        "file": path.name,
        "stored_as": stored_as,
        "sha256": digest,
        "frozen_at": utc_now(),
        "content": content,
    }
    write_json(record_path, record)
    return record


def refuse_unprotocolled_cell(cell_name: str) -> None:
    """Raised before the first test-split cell that would run without a frozen protocol."""
    raise ProtocolError(
        f"benchmark cell {cell_name} would evaluate on the test split, but no protocol file is frozen for this directory",
        hint="write protocol.yaml (endpoints, primary_contrasts, seeds, arms, thresholds, lr_grid) and rerun with "
        "--protocol protocol.yaml; stored cells are recomputed without one, new test cells are not run",
    )


__all__ = [
    "PROTOCOL_RECORD",
    "REQUIRED_KEYS",
    "freeze_protocol",
    "missing_seeds",
    "primary_endpoints",
    "refuse_unprotocolled_cell",
    "validate_protocol",
]
