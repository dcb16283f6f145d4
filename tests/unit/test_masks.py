"""Target positions j vs prediction positions j - 1, and the guards around them."""

from __future__ import annotations

import re

import pytest

from helpers import make_trajectory, toy_tokenizer
from miniverl.errors import TrajectoryError
from miniverl.schemas.text import ASSISTANT_HEADER, IM_END
from miniverl.schemas.trajectory import Span, SpanType, Trajectory
from miniverl.trajectory.masks import (
    build_masks,
    model_target_positions,
    prediction_positions,
    validate_target_positions,
)

# -- build_masks --------------------------------------------------------------------------


def test_build_masks_from_partition() -> None:
    spans = [
        Span(span_type="system", start=0, end=2),
        Span(span_type="assistant_text", start=2, end=4),
        Span(span_type="assistant_tool_call", start=4, end=6),
        Span(span_type="tool_result", start=6, end=7),
        Span(span_type="assistant_final", start=7, end=8),
    ]
    masks = build_masks(spans, 8)
    assert masks.attention_mask == [1] * 8
    assert masks.model_generated_mask == [False, False, True, True, True, True, False, True]
    assert masks.critical_mask == [False, False, False, False, True, True, False, True]


def test_build_masks_agrees_with_the_validator(oracle_traj: Trajectory) -> None:
    masks = build_masks(oracle_traj.spans, oracle_traj.length)
    assert masks.model_generated_mask == oracle_traj.model_generated_mask
    assert masks.critical_mask == oracle_traj.critical_mask
    assert masks.attention_mask == oracle_traj.attention_mask


# -- model_target_positions / prediction_positions ---------------------------------------


def test_model_target_positions_excludes_index_zero_even_when_marked() -> None:
    assert model_target_positions([True, True, False, True]) == [1, 3]
    assert model_target_positions([True]) == []
    assert model_target_positions([False, False]) == []
    assert model_target_positions([]) == []


def test_prediction_positions_is_j_minus_one() -> None:
    assert prediction_positions([1, 2, 7, 40]) == [0, 1, 6, 39]
    assert prediction_positions([]) == []


@pytest.mark.parametrize("j", [0, -3])
def test_prediction_position_of_zero_or_negative_raises(j: int) -> None:
    with pytest.raises(TrajectoryError) as info:
        prediction_positions([5, j])
    assert str(info.value) == (
        f"target position {j} has no preceding prediction position; position 0 can never be a training target"
    )


def test_prediction_positions_spec_message() -> None:
    with pytest.raises(
        TrajectoryError,
        match=re.escape(
            "target position 0 has no preceding prediction position; position 0 can never be a training target"
        ),
    ):
        prediction_positions([0])


# -- validate_target_positions: the five exact messages ------------------------------------


@pytest.mark.parametrize(
    ("targets", "mask", "message"),
    [
        ([9], [False, True], "target position 9 is outside [0, 2)"),
        ([-1], [False, True], "target position -1 is outside [0, 2)"),
        ([2], [False, True], "target position 2 is outside [0, 2)"),
        ([0], [True, True], "position 0 can never be a training target"),
        (
            [1],
            [True, False],
            "target position 1 is not a model-generated token; system, user and tool-result tokens must never be supervised",
        ),
        ([1, 1], [False, True], "target position 1 appears more than once"),
        ([2, 1], [False, True, True], "target positions must be strictly increasing"),
    ],
)
def test_validate_target_positions_messages(
    targets: list[int], mask: list[bool], message: str
) -> None:
    with pytest.raises(TrajectoryError) as info:
        validate_target_positions(targets, mask)
    assert str(info.value) == message


def test_validate_accepts_model_positions(oracle_traj: Trajectory) -> None:
    targets = model_target_positions(oracle_traj.model_generated_mask)
    validate_target_positions(targets, oracle_traj.model_generated_mask)
    validate_target_positions([], oracle_traj.model_generated_mask)


@pytest.mark.parametrize("span_type", ["system", "user", "tool_result"])
def test_every_context_token_is_refused(oracle_traj: Trajectory, span_type: str) -> None:
    for span in oracle_traj.spans_of(span_type):
        for j in range(max(span.start, 1), span.end):
            with pytest.raises(
                TrajectoryError, match=f"target position {j} is not a model-generated token"
            ):
                validate_target_positions([j], oracle_traj.model_generated_mask)


# -- the off-by-one, from both sides ---------------------------------------------------------


def test_first_model_token_is_predicted_by_the_assistant_header(oracle_traj: Trajectory) -> None:
    tok = toy_tokenizer()
    header = tok.encode(ASSISTANT_HEADER)
    targets = model_target_positions(oracle_traj.model_generated_mask)
    predictions = prediction_positions(targets)
    for span in oracle_traj.spans_of(SpanType.ASSISTANT_TOOL_CALL, SpanType.ASSISTANT_FINAL):
        j = span.start
        assert j in targets
        p = predictions[targets.index(j)]
        assert p == j - 1
        # The prediction position is the last header token, inside the preceding context span.
        preceding = oracle_traj.span_at(p)
        assert not preceding.is_model_generated
        assert preceding.end == j
        assert oracle_traj.token_ids[j - len(header) : j] == header
        assert preceding.text.endswith(ASSISTANT_HEADER)


def test_im_end_after_a_tool_call_is_never_a_target(oracle_traj: Trajectory) -> None:
    tok = toy_tokenizer()
    im_end = tok.encode(IM_END)
    targets = set(model_target_positions(oracle_traj.model_generated_mask))
    for call in oracle_traj.spans_of(SpanType.ASSISTANT_TOOL_CALL):
        after = call.end
        assert oracle_traj.token_ids[after : after + len(im_end)] == im_end
        assert oracle_traj.span_at(after).span_type is SpanType.TOOL_RESULT
        assert after not in targets
        assert not oracle_traj.model_generated_mask[after]
        with pytest.raises(
            TrajectoryError, match=f"target position {after} is not a model-generated token"
        ):
            validate_target_positions([after], oracle_traj.model_generated_mask)
    # ... and the trajectory ends at the last generated token: no trailing <|im_end|>.
    assert oracle_traj.spans[-1].span_type is SpanType.ASSISTANT_FINAL
    assert oracle_traj.spans[-1].end == oracle_traj.length


def test_targets_are_exactly_the_model_spans(oracle_traj: Trajectory) -> None:
    targets = model_target_positions(oracle_traj.model_generated_mask)
    expected = [j for s in oracle_traj.spans if s.is_model_generated for j in range(s.start, s.end)]
    assert targets == expected
    assert len(targets) == sum(oracle_traj.model_generated_mask)


def test_model_span_at_index_zero_drops_only_index_zero() -> None:
    traj = make_trajectory([("assistant_text", 3), ("user", 2), ("assistant_final", 2)])
    assert traj.model_generated_mask[0] is True
    assert model_target_positions(traj.model_generated_mask) == [1, 2, 5, 6]
    with pytest.raises(TrajectoryError, match=r"^position 0 can never be a training target$"):
        validate_target_positions([0, 1], traj.model_generated_mask)
