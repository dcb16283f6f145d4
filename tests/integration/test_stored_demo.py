"""The README's demo table is what the stored demo runs printed.

``results/demo/avx512`` and ``results/demo/avx2`` hold the ``comparison.json`` of
``miniverl demo`` on AVX-512 kernels and with torch held to AVX2 kernels (the commands are in
``results/demo/LOG.md``). Each README row is read back from them, and each record is checked
against itself: the sentence names the counts the table holds, and both started from the
packaged warm-up.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO_ROOT
from miniverl.lab.demo import demo_sentence
from miniverl.utils.hashing import sha256_file

STORED = REPO_ROOT / "results" / "demo"
KERNELS = ("avx512", "avx2")


def _record(kernels: str) -> dict:
    return json.loads((STORED / kernels / "comparison.json").read_text(encoding="utf-8"))


def _readme_rows() -> dict[str, list[str]]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| 60 held-out tasks, AVX-512 / AVX2 kernels") :]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _pair(cell: str) -> tuple[int, int]:
    a, b = re.findall(r"\d+", cell)
    return int(a), int(b)


@pytest.mark.parametrize("kernels", KERNELS)
def test_each_record_is_consistent_and_started_from_the_packaged_warm_up(kernels: str) -> None:
    from miniverl.config.presets import demo_cold_start_path

    record = _record(kernels)
    recovery = record["recovery"]
    assert record["start_weights_sha256"] == sha256_file(
        demo_cold_start_path() / "student.safetensors"
    )
    assert record["smoke_test"] is False and recovery["states"] == 29 and recovery["tasks"] == 60
    arms = {a["name"]: a for a in record["arms"]}
    assert list(arms) == ["opd", "offline_kd"]
    for arm in arms.values():
        assert arm["curve"][0][1] == arm["start"]["success_rate"]
        assert arm["curve"][-1] == [200, arm["final"]["success_rate"]]
        assert len(arm["curve"]) == 5  # every 50 updates
    assert record["sentence"] == demo_sentence(
        arms["opd"]["start"], {n: a["final"] for n, a in arms.items()}, recovery
    )


def test_the_readme_table_is_the_stored_records() -> None:
    rows = _readme_rows()
    records = [_record(k) for k in KERNELS]
    arms = [{a["name"]: a for a in r["arms"]} for r in records]
    got = [r["recovery"]["recovered"] for r in records]
    assert _pair(rows["SFT warm-up (the shared start)"][0]) == tuple(
        a["opd"]["start"]["solved"] for a in arms
    )
    assert _pair(rows["SFT warm-up (the shared start)"][1]) == tuple(g["start"] for g in got)
    for name in ("opd", "offline_kd"):
        row = rows[f"`{name}`, 200 updates"]
        assert _pair(row[0]) == tuple(a[name]["final"]["solved"] for a in arms)
        assert _pair(row[1]) == tuple(g[name] for g in got)
    teacher = rows["teacher (the ceiling)"]
    assert _pair(teacher[0]) == tuple(r["recovery"]["teacher_solved"] for r in records)
    assert _pair(teacher[1]) == tuple(g["teacher"] for g in got)
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    opd, other = (g["opd"] for g in got), (g["offline_kd"] for g in got)
    assert "OPD's student recovers from 6\n  of the warm-up student's 29 own errors" in readme
    assert list(opd) == [6, 8] and list(other) == [0, 0]
