"""``AlignmentMap``: the six parallel lists, their validator and derived properties."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from miniverl.schemas.alignment import AlignmentMap


def _fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "trajectory_id": "t",
        "student_prediction_positions": [3, 4, 9],
        "teacher_prediction_positions": [10, 11, 16],
        "target_token_ids": [7, 89, 8],
        "model_token_mask": [True, True, True],
        "token_weights": [1.0, 0.5, 2.0],
        "span_types": ["assistant_text", "assistant_tool_call", "assistant_final"],
    }
    fields.update(overrides)
    return fields


def _only_error(info: pytest.ExceptionInfo[ValidationError]) -> str:
    (error,) = info.value.errors(include_url=False)
    assert error["loc"] == ()
    return error["msg"]


PARALLEL = [
    "teacher_prediction_positions",
    "target_token_ids",
    "model_token_mask",
    "token_weights",
    "span_types",
]


@pytest.mark.parametrize("name", PARALLEL)
def test_parallel_length_mismatch(name: str) -> None:
    short = {
        "teacher_prediction_positions": [1],
        "target_token_ids": [1],
        "model_token_mask": [True],
        "token_weights": [1.0],
        "span_types": ["assistant_final"],
    }[name]
    fields = _fields(student_prediction_positions=[1, 2])
    for other in PARALLEL:
        fields[other] = fields[other][:2]
    fields[name] = short
    with pytest.raises(ValidationError) as info:
        AlignmentMap(**fields)
    assert _only_error(info) == f"Value error, alignment field '{name}' has length 1, expected 2"


def test_spec_example_length_message() -> None:
    with pytest.raises(
        ValidationError,
        match=re.escape("alignment field 'target_token_ids' has length 1, expected 2"),
    ):
        AlignmentMap(
            **_fields(
                student_prediction_positions=[1, 2],
                teacher_prediction_positions=[1, 2],
                target_token_ids=[5],
                model_token_mask=[True, True],
                token_weights=[1.0, 1.0],
                span_types=["a", "b"],
            )
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"student_prediction_positions": [-1, 4, 9]}, "student prediction positions must be >= 0"),
        (
            {"teacher_prediction_positions": [10, -2, 16]},
            "teacher prediction positions must be >= 0",
        ),
        (
            {"student_prediction_positions": [3, 3, 9]},
            "student prediction positions must be strictly increasing",
        ),
        (
            {"student_prediction_positions": [3, 9, 4]},
            "student prediction positions must be strictly increasing",
        ),
        ({"token_weights": [1.0, -0.5, 2.0]}, "token weights must be non-negative"),
        (
            {"model_token_mask": [True, False, True]},
            "a non-model token was given a non-zero weight; tool/user/system tokens must never contribute to the distillation loss",
        ),
    ],
)
def test_validator_messages(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        AlignmentMap(**_fields(**overrides))
    assert _only_error(info) == f"Value error, {message}"


def test_non_model_token_with_zero_weight_is_allowed() -> None:
    amap = AlignmentMap(
        **_fields(model_token_mask=[True, False, True], token_weights=[1.0, 0.0, 2.0])
    )
    assert amap.total_weight == 3.0


def test_teacher_positions_need_not_increase_or_match() -> None:
    amap = AlignmentMap(**_fields(teacher_prediction_positions=[20, 11, 16]))
    assert not amap.is_identity()


def test_empty_map_is_valid_and_short_circuits() -> None:
    amap = AlignmentMap(
        trajectory_id="t",
        student_prediction_positions=[],
        teacher_prediction_positions=[],
        target_token_ids=[],
        model_token_mask=[],
        token_weights=[],
        span_types=[],
    )
    assert (
        amap.num_positions,
        amap.total_weight,
        amap.is_identity(),
        amap.counts_by_span_type(),
    ) == (0, 0.0, True, {})


def test_properties() -> None:
    amap = AlignmentMap(**_fields())
    assert amap.num_positions == 3
    assert amap.total_weight == 3.5
    assert amap.is_identity() is False
    assert amap.student_target_positions == [4, 5, 10]
    assert amap.counts_by_span_type() == {
        "assistant_text": 1,
        "assistant_tool_call": 1,
        "assistant_final": 1,
    }
    same = AlignmentMap(**_fields(teacher_prediction_positions=[3, 4, 9]))
    assert same.is_identity() is True


def test_digest_is_canonical() -> None:
    a = AlignmentMap(**_fields())
    b = AlignmentMap(**_fields())
    assert a.digest() == b.digest()
    assert re.fullmatch(r"[0-9a-f]{64}", a.digest())
    assert AlignmentMap(**_fields(token_weights=[1.0, 0.5, 2.5])).digest() != a.digest()


def test_frozen_and_extra_forbid() -> None:
    amap = AlignmentMap(**_fields())
    with pytest.raises(ValidationError):
        amap.trajectory_id = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        AlignmentMap(**_fields(extra_field=1))
