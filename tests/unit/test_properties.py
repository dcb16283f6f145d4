"""Property tests: partitions round-trip, single-bit mask flips are rejected, alignment is exact."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from helpers import (
    calculator,
    calculator_tasks,
    make_runner,
    make_trajectory,
    record_of,
    write_records,
)
from miniverl.errors import SchemaValidationError
from miniverl.schemas.trajectory import MODEL_GENERATED_SPAN_TYPES, SpanType, Trajectory
from miniverl.trajectory.alignment import build_alignment_map
from miniverl.trajectory.io import read_trajectories, write_trajectories
from miniverl.trajectory.masks import model_target_positions

SPAN_TYPES = [t.value for t in SpanType]
CONTEXT_TYPES = ["system", "user", "tool_result"]
MODEL_TYPES = sorted(t.value for t in MODEL_GENERATED_SPAN_TYPES)


@st.composite
def partitions(draw: st.DrawFn, min_spans: int = 1, max_spans: int = 8) -> Trajectory:
    """A random valid trajectory: random span types and lengths, random ids, unique keys."""
    segments = draw(
        st.lists(
            st.tuples(st.sampled_from(SPAN_TYPES), st.integers(min_value=1, max_value=12)),
            min_size=min_spans,
            max_size=max_spans,
        )
    )
    seed = draw(st.integers(min_value=0, max_value=2**16))
    with_turns = draw(st.booleans())
    return make_trajectory(segments, seed=seed, with_turns=with_turns, trajectory_id=f"p-{seed}")


@settings(max_examples=100)
@given(trajectories=st.lists(partitions(), min_size=1, max_size=3))
def test_random_partitions_round_trip(trajectories: list[Trajectory]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        write_trajectories(path, trajectories)
        back = read_trajectories(path)
    assert back == trajectories
    for t in back:
        assert sum(s.length for s in t.spans) == t.length
        assert t.model_token_positions() == [
            j for s in t.spans if s.is_model_generated for j in range(s.start, s.end)
        ]


@settings(max_examples=200)
@given(traj=partitions(), data=st.data())
def test_any_single_bit_flip_is_rejected(traj: Trajectory, data: st.DataObject) -> None:
    mask = data.draw(st.sampled_from(["model_generated_mask", "critical_mask"]))
    index = data.draw(st.integers(min_value=0, max_value=traj.length - 1))
    record = record_of(traj)
    record[mask][index] = not record[mask][index]
    expected = (
        "model_generated_mask disagrees with the span partition"
        if mask == "model_generated_mask"
        else "critical_mask disagrees with the span partition"
    )
    with pytest.raises(ValidationError, match=expected):
        Trajectory.model_validate(record)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_records(Path(tmp) / "t.jsonl", [record_of(traj), record])
        with pytest.raises(SchemaValidationError) as info:
            read_trajectories(path)
    assert str(info.value).startswith(f"{path}:2: Value error, {expected}")


@st.composite
def student_and_teacher(draw: st.DrawFn) -> tuple[Trajectory, Trajectory, dict[str, int]]:
    """A student with at least one model token after index 0, and a teacher render that inserts
    random-length privileged context segments at random segment boundaries.

    Returns the expected per-segment offset (teacher start - student start) by segment key.
    """
    student = draw(partitions(min_spans=2))
    if not model_target_positions(student.model_generated_mask):
        extra = [(s.span_type.value, student.token_ids[s.start : s.end]) for s in student.spans]
        student = make_trajectory(
            [*extra, (draw(st.sampled_from(MODEL_TYPES)), 3)], trajectory_id=student.trajectory_id
        )
    n = len(student.spans)
    inserts = draw(
        st.lists(st.tuples(st.integers(0, n), st.integers(1, 40)), min_size=1, max_size=3)
    )
    segments: list[tuple[str, list[int] | int]] = []
    keys: list[str] = []
    offsets: dict[str, int] = {}
    shift = 0
    for index in range(n + 1):
        for k, (where, length) in enumerate(inserts):
            if where == index:
                segments.append((draw(st.sampled_from(CONTEXT_TYPES)), length))
                keys.append(f"priv{k}")
                shift += length
        if index < n:
            span = student.spans[index]
            segments.append((span.span_type.value, student.token_ids[span.start : span.end]))
            keys.append(span.segment_key or "")
            offsets[span.segment_key or ""] = shift
    teacher = make_trajectory(
        segments, segment_keys=keys, seed=draw(st.integers(0, 999)), trajectory_id="teacher"
    )
    return student, teacher, offsets


@settings(max_examples=150)
@given(case=student_and_teacher(), data=st.data())
def test_alignment_under_random_privileged_prefixes(
    case: tuple[Trajectory, Trajectory, dict[str, int]], data: st.DataObject
) -> None:
    student, teacher, offsets = case
    candidates = model_target_positions(student.model_generated_mask)
    targets = sorted(data.draw(st.sets(st.sampled_from(candidates), min_size=1)))
    amap = build_alignment_map(student, targets, teacher=teacher)
    assert amap.student_prediction_positions == [j - 1 for j in targets]
    expected_teacher_targets = [j + offsets[student.span_at(j).segment_key] for j in targets]
    assert amap.teacher_prediction_positions == [k - 1 for k in expected_teacher_targets]
    for j, s, t, tok in zip(
        targets,
        amap.student_prediction_positions,
        amap.teacher_prediction_positions,
        amap.target_token_ids,
        strict=True,
    ):
        assert student.token_ids[j] == teacher.token_ids[t + 1] == tok
        assert s == j - 1
        assert teacher.span_at(t + 1).segment_key == student.span_at(j).segment_key
    assert amap.is_identity() == all(offsets[student.span_at(j).segment_key] == 0 for j in targets)


@settings(max_examples=30)
@given(
    difficulty=st.sampled_from(["easy", "medium", "hard"]),
    seed=st.integers(0, 10_000),
    prompt_style=st.sampled_from(["compact", "verbose"]),
)
def test_privileged_render_alignment_on_oracle_rollouts(
    difficulty: str, seed: int, prompt_style: str
) -> None:
    env = calculator(prompt_style)
    task = calculator_tasks(1, difficulty=difficulty, seed=seed, prompt_style=prompt_style)[0]
    runner = make_runner(environment=env)
    student = runner.oracle_rollout(task)
    teacher = runner.privileged_render(student, task)
    prefix = teacher.spans[0].length
    targets = model_target_positions(student.model_generated_mask)
    amap = build_alignment_map(student, targets, teacher=teacher)
    assert amap.num_positions == sum(student.model_generated_mask)
    assert amap.student_prediction_positions == [j - 1 for j in targets]
    assert amap.teacher_prediction_positions == [j - 1 + prefix for j in targets]
    assert [
        teacher.token_ids[t + 1] for t in amap.teacher_prediction_positions
    ] == amap.target_token_ids
    assert [
        student.token_ids[s + 1] for s in amap.student_prediction_positions
    ] == amap.target_token_ids
    json.dumps(amap.model_dump(mode="json"))
