"""``identity_alignment`` / ``build_alignment_map``: j -> j-1 on both sides, and every refusal."""

from __future__ import annotations

import pytest

from helpers import calculator, calculator_tasks, make_runner, make_trajectory, oracle_trajectory
from miniverl.config.models import SelectionConfig
from miniverl.errors import AlignmentError, TokenizerMismatchError, TrajectoryError
from miniverl.schemas.trajectory import Trajectory
from miniverl.selection.selectors import select_positions
from miniverl.trajectory.alignment import build_alignment_map, identity_alignment
from miniverl.trajectory.masks import model_target_positions

# -- standard mode ---------------------------------------------------------------------------


def test_identity_alignment(oracle_traj: Trajectory) -> None:
    targets = model_target_positions(oracle_traj.model_generated_mask)
    amap = build_alignment_map(oracle_traj, targets)
    assert amap == identity_alignment(oracle_traj, targets)
    assert amap.trajectory_id == oracle_traj.trajectory_id
    assert amap.student_prediction_positions == [j - 1 for j in targets]
    assert amap.teacher_prediction_positions == amap.student_prediction_positions
    assert amap.is_identity()
    assert amap.target_token_ids == [oracle_traj.token_ids[j] for j in targets]
    assert amap.model_token_mask == [True] * len(targets)
    assert amap.token_weights == [1.0] * len(targets)
    assert amap.span_types == [oracle_traj.span_at(j).span_type.value for j in targets]
    assert amap.num_positions == sum(oracle_traj.model_generated_mask)
    assert amap.total_weight == float(len(targets))


def test_identity_alignment_with_weights(oracle_traj: Trajectory) -> None:
    targets = model_target_positions(oracle_traj.model_generated_mask)[:3]
    amap = build_alignment_map(oracle_traj, targets, [0.5, 2, 0.0])
    assert amap.token_weights == [0.5, 2.0, 0.0]
    assert amap.total_weight == 2.5


def test_context_target_is_refused_before_alignment(oracle_traj: Trajectory) -> None:
    with pytest.raises(TrajectoryError, match="target position 3 is not a model-generated token"):
        build_alignment_map(oracle_traj, [3])
    with pytest.raises(TrajectoryError, match="target positions must be strictly increasing"):
        targets = model_target_positions(oracle_traj.model_generated_mask)
        build_alignment_map(oracle_traj, [targets[1], targets[0]])


@pytest.mark.parametrize("teacher_mode", ["standard", "privileged"])
def test_weight_count_mismatch(oracle_traj: Trajectory, teacher_mode: str) -> None:
    targets = model_target_positions(oracle_traj.model_generated_mask)[:2]
    teacher = None if teacher_mode == "standard" else oracle_traj
    with pytest.raises(AlignmentError) as info:
        build_alignment_map(oracle_traj, targets, [1.0, 1.0, 1.0], teacher=teacher)
    assert str(info.value) == "got 3 weights for 2 target positions"


# -- privileged_context mode -------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_privileged_render_alignment(difficulty: str) -> None:
    env = calculator()
    task = calculator_tasks(1, difficulty=difficulty)[0]
    runner = make_runner(environment=env)
    student = runner.oracle_rollout(task)
    teacher = runner.privileged_render(student, task)
    priv = teacher.spans[0]
    assert priv.segment_key == "priv"
    assert priv.span_type.value == "system"
    assert teacher.length == student.length + priv.length
    assert teacher.token_ids[priv.length :] == student.token_ids
    assert teacher.metadata["source"] == "privileged_teacher_render"

    selection = select_positions(student, SelectionConfig(), run_seed=1234)
    amap = build_alignment_map(student, selection.positions, selection.weights, teacher=teacher)
    assert not amap.is_identity()
    assert amap.num_positions == sum(student.model_generated_mask)
    assert amap.total_weight == float(amap.num_positions)
    assert amap.student_prediction_positions == [j - 1 for j in selection.positions]
    assert amap.teacher_prediction_positions == [j - 1 + priv.length for j in selection.positions]
    for s, t, tok in zip(
        amap.student_prediction_positions,
        amap.teacher_prediction_positions,
        amap.target_token_ids,
        strict=True,
    ):
        assert student.token_ids[s + 1] == teacher.token_ids[t + 1] == tok


def _teacher_from(
    student: Trajectory,
    *,
    order: list[int] | None = None,
    keys: list[str] | None = None,
    replace: dict[int, list[int]] | None = None,
    prefix: int = 0,
) -> Trajectory:
    """A hand-built teacher render from the student's segments (reordered/rekeyed/replaced)."""
    segments: list[tuple[str, list[int] | int]] = [("system", prefix)] if prefix else []
    seg_keys = ["priv"] if prefix else []
    for index in order if order is not None else range(len(student.spans)):
        span = student.spans[index]
        ids = (replace or {}).get(index, student.token_ids[span.start : span.end])
        segments.append((span.span_type.value, ids))
        seg_keys.append(keys[index] if keys is not None else span.segment_key)
    teacher = make_trajectory(segments, segment_keys=seg_keys, seed=99)
    return teacher.model_copy(update={"tokenizer_fingerprint": student.tokenizer_fingerprint})


def _student() -> Trajectory:
    return make_trajectory(
        [
            ("system", 4),
            ("user", 3),
            ("assistant_tool_call", 3),
            ("tool_result", 2),
            ("assistant_final", 2),
        ],
        segment_keys=["sys", "user", "gen:0:block", "obs:0", "gen:1:block"],
    )


def test_per_span_offsets_are_recomputed_not_assumed_constant() -> None:
    student = _student()
    # Privileged block inserted *between* segments: the offset differs per span.
    segments = [
        ("system", student.token_ids[0:4]),
        ("user", student.token_ids[4:7]),
        ("system", 5),
        ("assistant_tool_call", student.token_ids[7:10]),
        ("tool_result", student.token_ids[10:12]),
        ("system", 2),
        ("assistant_final", student.token_ids[12:14]),
    ]
    teacher = make_trajectory(
        segments,
        segment_keys=["sys", "user", "priv", "gen:0:block", "obs:0", "priv2", "gen:1:block"],
    )
    targets = model_target_positions(student.model_generated_mask)
    assert targets == [7, 8, 9, 12, 13]
    amap = build_alignment_map(student, targets, teacher=teacher)
    assert amap.student_prediction_positions == [6, 7, 8, 11, 12]
    assert amap.teacher_prediction_positions == [11, 12, 13, 18, 19]
    assert amap.target_token_ids == [student.token_ids[j] for j in targets]


def test_tokenizer_fingerprint_mismatch() -> None:
    student = _student()
    teacher = student.model_copy(update={"tokenizer_fingerprint": "b" * 64})
    student = student.model_copy(update={"tokenizer_fingerprint": "a" * 64})
    with pytest.raises(TokenizerMismatchError) as info:
        build_alignment_map(student, [7], teacher=teacher)
    assert str(info.value) == (
        f"student and teacher tokenizers differ ({'a' * 12} vs {'b' * 12}); "
        "miniVERL currently supports same-tokenizer distillation only"
    )


def test_student_span_without_segment_key() -> None:
    student = _student()
    spans = list(student.spans)
    spans[1] = spans[1].model_copy(update={"metadata": {}})
    keyless = student.model_copy(update={"spans": spans})
    with pytest.raises(AlignmentError) as info:
        build_alignment_map(keyless, [7], teacher=student)
    assert str(info.value) == (
        "span user at [4,7) has no 'segment_key' metadata; "
        "build trajectories with TranscriptBuilder so every span carries its segment identity"
    )


def test_teacher_span_without_segment_key() -> None:
    student = _student()
    spans = list(student.spans)
    spans[4] = spans[4].model_copy(update={"metadata": {"other": 1}})
    teacher = student.model_copy(update={"spans": spans})
    with pytest.raises(
        AlignmentError, match=r"^span assistant_final at \[12,14\) has no 'segment_key' metadata; "
    ):
        build_alignment_map(student, [7], teacher=teacher)


def test_duplicate_teacher_segment_key() -> None:
    student = _student()
    spans = list(student.spans)
    spans[4] = spans[4].model_copy(update={"metadata": {"segment_key": "obs:0"}})
    teacher = student.model_copy(update={"spans": spans})  # TranscriptBuilder would refuse this
    with pytest.raises(AlignmentError) as info:
        build_alignment_map(student, [7], teacher=teacher)
    assert (
        str(info.value)
        == "teacher render contains duplicate segment key 'obs:0'; keys must be unique"
    )


def test_missing_counterpart() -> None:
    student = _student()
    teacher = _teacher_from(student, order=[0, 1, 2, 3], prefix=6)
    with pytest.raises(AlignmentError) as info:
        build_alignment_map(student, [7], teacher=teacher)
    assert str(info.value) == (
        "student span assistant_final 'gen:1:block' at [12,14) has no counterpart in the teacher render; "
        "the privileged render must keep every student segment"
    )


def test_segment_length_differs() -> None:
    student = _student()
    teacher = _teacher_from(student, replace={3: [50, 51, 52]}, prefix=2)
    with pytest.raises(AlignmentError) as info:
        build_alignment_map(student, [7], teacher=teacher)
    assert str(info.value) == (
        "segment 'obs:0' has 2 student tokens but 3 teacher tokens; "
        "the shared content must tokenize identically on both sides"
    )


def test_target_token_mismatch() -> None:
    student = _student()
    changed = list(student.token_ids[12:14])
    changed[1] = changed[1] + 1 if changed[1] < 185 else changed[1] - 1
    teacher = _teacher_from(student, replace={4: changed}, prefix=3)
    targets = model_target_positions(student.model_generated_mask)
    # The tool-call targets align; the second final-answer token does not.
    build_alignment_map(student, targets[:4], teacher=teacher)
    with pytest.raises(AlignmentError) as info:
        build_alignment_map(student, targets, teacher=teacher)
    assert str(info.value) == (
        f"target token mismatch at student position 13 / teacher position 16: "
        f"{student.token_ids[13]} != {changed[1]}"
    )


def test_target_landing_at_teacher_position_zero() -> None:
    student = _student()
    # The teacher puts the tool-call segment first, so its first token sits at index 0.
    teacher = _teacher_from(student, order=[2, 0, 1, 3, 4])
    with pytest.raises(AlignmentError) as info:
        build_alignment_map(student, [7], teacher=teacher)
    assert (
        str(info.value)
        == "a target token landed at teacher position 0, which has no preceding prediction position"
    )
    # Other targets of the same span land at 1 and 2 and are fine.
    amap = build_alignment_map(student, [8, 9], teacher=teacher)
    assert amap.teacher_prediction_positions == [0, 1]
    assert amap.student_prediction_positions == [7, 8]


def test_oracle_with_itself_as_teacher_is_identity() -> None:
    student = oracle_trajectory()
    targets = model_target_positions(student.model_generated_mask)
    amap = build_alignment_map(student, targets, teacher=student)
    assert amap.is_identity()
    assert amap == identity_alignment(student, targets)
