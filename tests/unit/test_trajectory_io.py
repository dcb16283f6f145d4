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
