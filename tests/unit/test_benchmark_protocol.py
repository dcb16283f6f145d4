"""The pre-registered protocol (lab/benchmark/protocol.py) of a test-split benchmark.

Driven through ``run_benchmark`` with the fake cells of ``test_benchmark_cells``: no
test-split cell runs without a frozen protocol, the protocol is frozen (bytes and SHA-256 in
the output directory) before the first cell, a changed file is refused, a protocol that does
not fit the run is refused with every problem and leaves nothing behind, the stored cells of
an older directory are still recomputed, and the protocol's endpoints define the Holm family.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from test_benchmark_cells import ARMS, fake_payload

from helpers import tiny_config
from miniverl.errors import ProtocolError
from miniverl.lab.benchmark.harness import run_benchmark

PROTOCOL = """\
endpoints: [k=3, k=5]
primary_contrasts: [[opd, offline_kd]]
seeds: [1, 2, 3]
arms: [sft_only, offline_kd, opd]
thresholds: {alpha: 0.05, power: 0.8, teacher_gate: 0.95}
lr_grid: {grid: [0.001], split: eval}
"""


def _write(path: Path, text: str = PROTOCOL) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _run(out: Path, protocol: Path | None, calls: list[str], split: str = "test") -> Any:
    def run_cell(cell: Any, done: Any) -> dict[str, Any]:
        calls.append(cell.name)
        if protocol is not None:
            assert (out / "protocol.json").exists(), "a cell ran before the protocol was frozen"
        return fake_payload(cell, done)

    return run_benchmark(
        tiny_config().with_overrides([f"eval.split={split}", "environment.test_tasks=4"]),
        arms=ARMS,
        seeds=[1, 2, 3],
        output_dir=out,
        resamples=200,
        run_cell=run_cell,
        protocol=protocol,
    )


def test_no_test_split_cell_runs_without_a_protocol(tmp_path: Path) -> None:
    calls: list[str] = []
    out = tmp_path / "bench"
    with pytest.raises(ProtocolError, match="would evaluate on the test split") as info:
        _run(out, None, calls)
    assert calls == [] and not (out / "benchmark.json").exists()
    assert "--protocol" in (info.value.hint or "")


def test_the_protocol_is_frozen_before_any_cell_and_stored_with_the_results(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    out, protocol = tmp_path / "bench", _write(tmp_path / "protocol.yaml")
    result = _run(out, protocol, calls)
    assert calls  # every cell ran, each after the freeze (asserted inside run_cell)
    sha = hashlib.sha256(protocol.read_bytes()).hexdigest()
    record = json.loads((out / "protocol.json").read_text())
    assert (record["sha256"], record["stored_as"]) == (sha, "protocol.yaml")
    assert (out / "protocol.yaml").read_bytes() == protocol.read_bytes()
    assert result["protocol"]["required"] is True
    assert result["protocol"]["frozen"]["sha256"] == sha and sha in result["protocol"]["note"]
    stored = json.loads((out / "benchmark.json").read_text())
    assert stored["protocol"]["frozen"]["content"]["endpoints"] == ["k=3", "k=5"]


def test_a_changed_protocol_is_refused_and_the_frozen_one_is_reused(tmp_path: Path) -> None:
    out, protocol = tmp_path / "bench", _write(tmp_path / "protocol.yaml")
    _run(out, protocol, [])
    _write(protocol, PROTOCOL.replace("alpha: 0.05", "alpha: 0.1"))
    calls: list[str] = []
    with pytest.raises(ProtocolError, match="is not the protocol frozen in") as info:
        _run(out, protocol, calls)
    assert calls == [] and "new --output directory" in (info.value.hint or "")
    again = _run(out, None, calls)  # no file given: the frozen copy stands
    assert calls == [] and again["protocol"]["frozen"]["content"]["thresholds"]["alpha"] == 0.05
    (out / "protocol.yaml").write_text(PROTOCOL.replace("k=5", "k=4"), encoding="utf-8")
    with pytest.raises(ProtocolError, match="no longer has the SHA-256"):
        _run(out, None, calls)


def test_a_protocol_that_does_not_fit_the_run_is_refused_with_every_problem(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bench"
    bad = _write(
        tmp_path / "protocol.yaml",
        PROTOCOL.replace("seeds: [1, 2, 3]", "seeds: [1, 2]")
        .replace("[[opd, offline_kd]]", "[[opd, kd_oracle]]")
        .replace("lr_grid: {grid: [0.001], split: eval}\n", "")
        .replace("k=5", "k5"),
    )
    calls: list[str] = []
    with pytest.raises(ProtocolError) as info:
        _run(out, bad, calls)
    message = str(info.value)
    for problem in ("missing key 'lr_grid'", "seeds [1, 2]", "primary_contrasts", "endpoints"):
        assert problem in message, problem
    assert calls == [] and not (out / "protocol.json").exists()
    assert not (out / "protocol.yaml").exists()
    with pytest.raises(ProtocolError, match="does not hold a mapping"):
        _run(out, _write(tmp_path / "list.yaml", "- 1\n"), calls)


def test_stored_cells_are_recomputed_without_a_protocol_and_say_so(tmp_path: Path) -> None:
    out, protocol = tmp_path / "bench", _write(tmp_path / "protocol.yaml")
    first = _run(out, protocol, [])
    (out / "protocol.json").unlink()
    (out / "protocol.yaml").unlink()
    calls: list[str] = []
    again = _run(out, None, calls)
    assert calls == [] and again["contrasts"] == first["contrasts"]
    assert again["protocol"]["frozen"] is None
    assert "not pre-registered" in again["protocol"]["note"]


def test_the_eval_split_needs_no_protocol(tmp_path: Path) -> None:
    calls: list[str] = []
    result = _run(tmp_path / "bench", None, calls, split="eval")
    assert calls and result["protocol"] == {
        "required": False,
        "frozen": None,
        "missing_seeds": [],
        "note": "no protocol file was frozen for this directory",
    }


def test_the_protocols_endpoints_are_the_holm_family(tmp_path: Path) -> None:
    protocol = _write(tmp_path / "p.json", json.dumps({**_as_mapping(), "endpoints": ["all"]}))
    result = _run(tmp_path / "bench", protocol, [])
    family = [(c["arm"], c["endpoint"]) for c in result["contrasts"] if c["holm_family"]]
    assert family == [("opd", "all")]
    assert json.loads((tmp_path / "bench" / "protocol.json").read_text())["stored_as"] == (
        "protocol.json"
    )


def _as_mapping() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(PROTOCOL)


def test_a_protocol_endpoint_outside_the_default_ones_is_computed_and_held_in_the_family(
    tmp_path: Path,
) -> None:
    """k = 2 is not among the endpoints every benchmark reports (k = 3, k = 5, all): a protocol
    naming it still gets its contrast, in the Holm family; the primary pair's other endpoints
    are secondary."""
    content = {**_as_mapping(), "endpoints": ["all", "k=2"]}
    result = _run(tmp_path / "bench", _write(tmp_path / "p.json", json.dumps(content)), [])
    opd = [c for c in result["contrasts"] if c["arm"] == "opd" and c["reference"] == "offline_kd"]
    assert [c["endpoint"] for c in opd] == ["all", "k=2", "k=3", "k=5"]
    assert [c["primary"] for c in opd] == [True, True, False, False]
    assert [c["holm_family"] for c in opd] == [True, True, False, False]
    assert all(not c["primary"] for c in result["contrasts"] if c not in opd)


def test_the_protocols_primary_contrasts_are_the_pairs_tested(tmp_path: Path) -> None:
    """A protocol naming its own pairs gets exactly those as the Holm family (here two pairs
    over two endpoints: four tests), not the default pairs."""
    pairs = [["opd", "offline_kd"], ["opd", "sft_only"]]
    content = {**_as_mapping(), "endpoints": ["all", "k=3"], "primary_contrasts": pairs}
    result = _run(tmp_path / "bench", _write(tmp_path / "p.json", json.dumps(content)), [])
    family = [
        (c["arm"], c["reference"], c["endpoint"]) for c in result["contrasts"] if c["primary"]
    ]
    assert family == [
        ("opd", "offline_kd", "all"),
        ("opd", "offline_kd", "k=3"),
        ("opd", "sft_only", "all"),
        ("opd", "sft_only", "k=3"),
    ]
    assert all(
        c["holm_family"] and c["p_holm"] is not None for c in result["contrasts"] if c["primary"]
    )
    with pytest.raises(ProtocolError, match="distinct pairs of two different arms"):
        twice = {**content, "primary_contrasts": [*pairs, ["opd", "sft_only"]]}
        _run(tmp_path / "again", _write(tmp_path / "q.json", json.dumps(twice)), [])


def test_the_protocols_seeds_run_in_pieces_and_only_the_whole_is_the_analysis(
    tmp_path: Path,
) -> None:
    """A process may run part of the protocol's seeds in its own directory (a piece, and its
    note says so); a seed outside the protocol is refused; the pieces' cells copied into one
    directory and run over every seed make the pre-registered analysis, nothing recomputed."""
    import shutil

    protocol = _write(tmp_path / "protocol.yaml")
    calls: list[str] = []

    def run(out: Path, seeds: list[int]) -> Any:
        def run_cell(cell: Any, done: Any) -> dict[str, Any]:
            calls.append(cell.name)
            return fake_payload(cell, done)

        return run_benchmark(
            tiny_config().with_overrides(["eval.split=test", "environment.test_tasks=4"]),
            arms=ARMS,
            seeds=seeds,
            output_dir=out,
            resamples=200,
            run_cell=run_cell,
            protocol=protocol if not (out / "protocol.json").exists() else None,
        )

    first = run(tmp_path / "a", [1])
    assert first["protocol"]["missing_seeds"] == [2, 3]
    assert "a piece of it: seeds [2, 3] are not in this run" in first["protocol"]["note"]
    assert run(tmp_path / "b", [2, 3])["protocol"]["missing_seeds"] == [1]
    with pytest.raises(ProtocolError, match=r"do not hold every seed of this run \[3, 4\]"):
        run(tmp_path / "c", [3, 4])
    with pytest.raises(ProtocolError, match=r"seeds \[\[1\], 2, 3\] do not hold"):
        run_benchmark(
            tiny_config().with_overrides(["eval.split=test", "environment.test_tasks=4"]),
            arms=ARMS,
            seeds=[2],
            output_dir=tmp_path / "d",
            run_cell=lambda cell, done: fake_payload(cell, done),
            protocol=_write(tmp_path / "odd.yaml", PROTOCOL.replace("[1, 2, 3]", "[[1], 2, 3]")),
        )
    assert not (tmp_path / "c" / "protocol.json").exists()
    for cell in (tmp_path / "b" / "cells").iterdir():
        shutil.copy(cell, tmp_path / "a" / "cells" / cell.name)
    calls.clear()
    whole = run(tmp_path / "a", [1, 2, 3])
    assert calls == [] and whole["protocol"]["missing_seeds"] == []
    assert "a piece" not in whole["protocol"]["note"]
