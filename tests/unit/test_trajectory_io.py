"""JSONL I/O: validated on write and read, atomic or whole-line appends, no pickle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import oracle_trajectories, record_of, run_cli, write_records
from miniverl.errors import SchemaValidationError
from miniverl.schemas.trajectory import Trajectory
from miniverl.trajectory.io import (
    REFERENCE_KEY,
    SharedTraces,
    append_trajectories,
    count_trajectories,
    iter_trajectories,
    read_trajectories,
    write_trajectories,
)


@pytest.fixture(scope="module")
def trajectories() -> list[Trajectory]:
    return oracle_trajectories(3, difficulty="hard")


def test_write_read_round_trip(tmp_path: Path, trajectories: list[Trajectory]) -> None:
    path = tmp_path / "sub" / "t.jsonl"
    assert write_trajectories(path, trajectories) == 3
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) == 3 and all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    assert [json.loads(line) for line in lines] == [record_of(t) for t in trajectories]
    assert read_trajectories(path) == trajectories
    assert list(iter_trajectories(path)) == trajectories
    assert count_trajectories(path) == 3


def test_write_replaces_and_append_appends(tmp_path: Path, trajectories: list[Trajectory]) -> None:
    path = tmp_path / "t.jsonl"
    write_trajectories(path, trajectories)
    write_trajectories(path, trajectories[:1])
    assert read_trajectories(path) == trajectories[:1]
    assert append_trajectories(path, trajectories[1:]) == 2
    assert append_trajectories(path, []) == 0
    assert read_trajectories(path) == trajectories
    fresh = tmp_path / "new" / "appended.jsonl"
    append_trajectories(fresh, trajectories[:2])
    assert read_trajectories(fresh) == trajectories[:2]


def test_failed_write_leaves_old_file_intact(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    path = tmp_path / "t.jsonl"
    write_trajectories(path, trajectories)
    before = path.read_bytes()

    def exploding() -> Iterator[Trajectory]:
        yield trajectories[0]
        raise RuntimeError("crash while producing trajectories")

    with pytest.raises(RuntimeError, match="crash while producing"):
        write_trajectories(path, exploding())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_write_rejects_non_trajectories(tmp_path: Path, trajectories: list[Trajectory]) -> None:
    path = tmp_path / "t.jsonl"
    with pytest.raises(TypeError, match="expected Trajectory, got dict"):
        write_trajectories(path, [record_of(trajectories[0])])  # type: ignore[list-item]
    assert not path.exists()


def test_write_revalidates_objects_mutated_after_construction(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    tampered = trajectories[0].model_copy(deep=True)
    tampered.model_generated_mask[1] = True  # pydantic does not re-validate in-place mutation
    path = tmp_path / "t.jsonl"
    with pytest.raises(ValueError, match="model_generated_mask disagrees with the span partition"):
        write_trajectories(path, [tampered])
    assert not path.exists()
    with pytest.raises(ValueError, match="model_generated_mask disagrees"):
        append_trajectories(path, [tampered])
    assert not path.exists()


def test_truncated_last_line_is_an_error_not_a_record(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    path = tmp_path / "t.jsonl"
    write_trajectories(path, trajectories[:2])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # a crash in the middle of the second line
    stream = iter_trajectories(path)
    assert next(stream) == trajectories[0]
    with pytest.raises(SchemaValidationError, match=rf"^{path}:2 is not valid JSON: "):
        next(stream)
    assert count_trajectories(path) == 2


def test_count_trajectories_does_not_validate(tmp_path: Path) -> None:
    assert count_trajectories(tmp_path / "missing.jsonl") == 0
    path = write_records(tmp_path / "t.jsonl", ["not json", "", "   ", "{}"])
    assert count_trajectories(path) == 2


def test_empty_file_reads_as_no_trajectories(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    assert read_trajectories(path) == []


def test_tampered_system_token_fails_inspect(tmp_path: Path) -> None:
    """Flip one model_generated_mask bit on a system token in a saved file -> inspect fails."""
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, oracle_trajectories(3))
    lines = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[1])
    system = record["spans"][0]
    assert system["span_type"] == "system"
    assert record["model_generated_mask"][system["start"] + 5] is False
    record["model_generated_mask"][system["start"] + 5] = True
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    with pytest.raises(
        SchemaValidationError, match=rf"^{path}:2: Value error, model_generated_mask disagrees"
    ):
        read_trajectories(path)

    proc = run_cli("inspect", str(path))
    assert proc.returncode != 0
    assert f"{path}:2" in proc.stderr
    assert "model_generated_mask disagrees with the span partition" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "trajectories |" not in proc.stdout  # no reassuring summary was printed


def _renamed(t: Trajectory, cycle: int) -> Trajectory:
    return t.model_copy(
        update={"trajectory_id": f"{t.task_id}:oracle:c{cycle}", "policy_version": cycle}
    )


def _draws(trajectories: list[Trajectory], cycles: int) -> list[list[Trajectory]]:
    return [[_renamed(t, c) for t in trajectories] for c in range(cycles)]


def test_shared_traces_store_each_trace_once_and_read_back_every_copy(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    full, shared_path = tmp_path / "full.jsonl", tmp_path / "shared.jsonl"
    shared = SharedTraces(shared_path)
    cycles = _draws(trajectories, 4)
    cycles[2].append(_renamed(trajectories[0], 9))  # twice in one append
    for batch in cycles:
        append_trajectories(full, batch)
        append_trajectories(shared_path, batch, shared=shared)
    expected = read_trajectories(full)
    got = read_trajectories(shared_path)
    assert got == expected and len(got) == 13
    assert [t.policy_version for t in got] == [t.policy_version for t in expected]
    rows = [json.loads(line) for line in shared_path.read_text().splitlines()]
    assert [REFERENCE_KEY in r for r in rows] == [False] * 3 + [True] * 10
    assert {r["trace_digest"] for r in rows[:3]} == {r[REFERENCE_KEY] for r in rows[3:]}
    assert all(r["task_id"] and r["environment"] == "calculator" for r in rows)
    assert shared_path.stat().st_size < full.stat().st_size / 3
    for edited in (got[0], got[3]):
        edited.token_ids.append(0)
        edited.turns[0].tool_call.arguments["edited"] = True  # type: ignore[union-attr]
    assert got[6] == expected[6] and got[10] == expected[10]
    assert count_trajectories(shared_path) == 13


def test_shared_traces_after_a_resume_equal_an_uninterrupted_log(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    straight, resumed = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl"
    cycles = _draws(trajectories, 3)
    writer = SharedTraces(straight)
    for batch in cycles:
        append_trajectories(straight, batch, shared=writer)
    first_life = SharedTraces(resumed)
    append_trajectories(resumed, cycles[0], shared=first_life)
    cut = resumed.stat().st_size
    append_trajectories(resumed, cycles[1], shared=first_life)
    with open(resumed, "r+b") as handle:  # what a resume does to a log past its checkpoint
        handle.truncate(cut)
    append_trajectories(resumed, cycles[1], shared=first_life)
    append_trajectories(resumed, cycles[2], shared=SharedTraces(resumed))
    assert resumed.read_bytes() == straight.read_bytes()
    with open(resumed, "r+b") as handle:
        handle.truncate(0)
    append_trajectories(resumed, cycles[0], shared=first_life)
    assert read_trajectories(resumed) == cycles[0]
    with pytest.raises(ValueError, match="shared traces of"):
        append_trajectories(tmp_path / "other.jsonl", cycles[0], shared=first_life)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows[3:], "which no earlier line of this file holds"),
        (lambda rows: [rows[3], *rows[:3], *rows[4:]], "which no earlier line of this file holds"),
        (
            lambda rows: [{**rows[0], "generated_token_count": 99}, *rows[1:]],
            "trace_digest does not match the record",
        ),
        (lambda rows: [*rows[:3], {**rows[3], "task_id": "other"}], "differs from the referred"),
        (lambda rows: [*rows[:3], {**rows[3], "spans": []}], "unexpected keys"),
        (lambda rows: [*rows[:3], {**rows[3], "policy_version": -1}], "policy_version"),
    ],
    ids=["dangling", "before-its-trace", "edited-trace", "other-task", "extra-key", "bad-field"],
)
def test_shared_trace_lines_are_validated(
    tmp_path: Path, trajectories: list[Trajectory], edit: object, message: str
) -> None:
    path = tmp_path / "t.jsonl"
    shared = SharedTraces(path)
    for batch in _draws(trajectories, 2):
        append_trajectories(path, batch, shared=shared)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in edit(rows)))  # type: ignore[operator]
    with pytest.raises(SchemaValidationError, match=message):
        read_trajectories(path)
