"""Every validation of docs/trajectory-schema.md, on the model and through the file reader."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from helpers import make_trajectory, oracle_trajectory, record_of, write_records
from miniverl.errors import SchemaValidationError
from miniverl.schemas import (
    CRITICAL_SPAN_TYPES,
    MODEL_GENERATED_SPAN_TYPES,
    TRAJECTORY_SCHEMA_VERSION,
    Span,
    SpanType,
    TerminationReason,
    Trajectory,
)
from miniverl.trajectory.io import iter_trajectories, read_trajectories

Mutation = Callable[[dict[str, Any]], tuple[str, str]]
"""Mutates a record in place; returns (error location, exact pydantic message)."""


@pytest.fixture(scope="module")
def base_record() -> dict[str, Any]:
    record = record_of(oracle_trajectory())
    # Layout of the schema doc's worked example: system, user, tool call, tool result, final.
    assert [s["span_type"] for s in record["spans"]] == [
        "system",
        "user",
        "assistant_tool_call",
        "tool_result",
        "assistant_final",
    ]
    return record


def _empty_sequence(r: dict[str, Any]) -> tuple[str, str]:
    for key in ("token_ids", "attention_mask", "model_generated_mask", "critical_mask"):
        r[key] = []
    return "", "Value error, trajectory has no tokens"


def _short_mask(name: str) -> Mutation:
    def mutate(r: dict[str, Any]) -> tuple[str, str]:
        n = len(r["token_ids"])
        r[name] = r[name][:-1]
        return "", f"Value error, {name} has length {n - 1} but token_ids has length {n}"

    return mutate


def _attention_value(value: int) -> Mutation:
    def mutate(r: dict[str, Any]) -> tuple[str, str]:
        r["attention_mask"][3] = value
        return "", "Value error, attention_mask must contain only 0/1"

    return mutate


def _no_spans(r: dict[str, Any]) -> tuple[str, str]:
    r["spans"] = []
    return "", "Value error, trajectory has no spans"


def _out_of_order(r: dict[str, Any]) -> tuple[str, str]:
    r["spans"][0], r["spans"][1] = r["spans"][1], r["spans"][0]
    return "", "Value error, spans must be stored in ascending start order"


def _shift_start(delta: int) -> Mutation:
    def mutate(r: dict[str, Any]) -> tuple[str, str]:
        expected = r["spans"][0]["end"]
        r["spans"][1]["start"] += delta
        return "", (
            "Value error, spans must tile the sequence without gaps or overlaps: "
            f"expected next span to start at {expected}, got {expected + delta}"
        )

    return mutate


def _drop_last_span(r: dict[str, Any]) -> tuple[str, str]:
    last = r["spans"].pop()
    return (
        "",
        f"Value error, spans cover {last['start']} tokens but the sequence has {len(r['token_ids'])}",
    )


def _overrun_last_span(r: dict[str, Any]) -> tuple[str, str]:
    n = len(r["token_ids"])
    r["spans"][-1]["end"] = n + 3
    return "", f"Value error, spans cover {n + 3} tokens but the sequence has {n}"


def _empty_span(r: dict[str, Any]) -> tuple[str, str]:
    span = r["spans"][2]
    span["end"] = span["start"]
    return (
        "spans.2",
        f"Value error, span assistant_tool_call has empty range [{span['start']},{span['start']})",
    )


MODEL_MSG = (
    "Value error, model_generated_mask disagrees with the span partition; "
    "tool/user/system tokens must never be marked model-generated"
)
CRITICAL_MSG = "Value error, critical_mask disagrees with the span partition"


def _flip_model_on_system(r: dict[str, Any]) -> tuple[str, str]:
    r["model_generated_mask"][1] = True
    return "", MODEL_MSG


def _flip_model_on_tool_result(r: dict[str, Any]) -> tuple[str, str]:
    r["model_generated_mask"][r["spans"][3]["start"]] = True
    return "", MODEL_MSG


def _flip_model_off_tool_call(r: dict[str, Any]) -> tuple[str, str]:
    r["model_generated_mask"][r["spans"][2]["start"]] = False
    return "", MODEL_MSG


def _flip_critical_off(r: dict[str, Any]) -> tuple[str, str]:
    r["critical_mask"][r["spans"][4]["end"] - 1] = False
    return "", CRITICAL_MSG


def _flip_critical_on_user(r: dict[str, Any]) -> tuple[str, str]:
    r["critical_mask"][r["spans"][1]["start"]] = True
    return "", CRITICAL_MSG


def _unknown_turn(r: dict[str, Any]) -> tuple[str, str]:
    r["spans"][0]["turn_id"] = 9
    return "", "Value error, span system references unknown turn_id 9"


def _extra_key(*path: str | int) -> Mutation:
    def mutate(r: dict[str, Any]) -> tuple[str, str]:
        node: Any = r
        for part in path:
            node = node[part]
        node["bogus"] = 1
        return ".".join(str(p) for p in (*path, "bogus")), "Extra inputs are not permitted"

    return mutate


def _negative_token(r: dict[str, Any]) -> tuple[str, str]:
    r["token_ids"][5] = -1
    return "", "Value error, token ids must be non-negative"


def _missing_termination(r: dict[str, Any]) -> tuple[str, str]:
    del r["termination_reason"]
    return "termination_reason", "Field required"


MUTATIONS: dict[str, Mutation] = {
    "empty sequence": _empty_sequence,
    "attention_mask length": _short_mask("attention_mask"),
    "model_generated_mask length": _short_mask("model_generated_mask"),
    "critical_mask length": _short_mask("critical_mask"),
    "attention value 2": _attention_value(2),
    "attention value -1": _attention_value(-1),
    "no spans": _no_spans,
    "spans out of order": _out_of_order,
    "gap": _shift_start(+1),
    "overlap": _shift_start(-1),
    "coverage short": _drop_last_span,
    "coverage long": _overrun_last_span,
    "empty span": _empty_span,
    "model mask on system token": _flip_model_on_system,
    "model mask on tool_result token": _flip_model_on_tool_result,
    "model mask off on tool call token": _flip_model_off_tool_call,
    "critical mask off on final token": _flip_critical_off,
    "critical mask on user token": _flip_critical_on_user,
    "unknown turn_id": _unknown_turn,
    "unknown top-level key": _extra_key(),
    "unknown span key": _extra_key("spans", 0),
    "unknown tool_call key": _extra_key("turns", 0, "tool_call"),
    "unknown tool_result key": _extra_key("turns", 0, "tool_result"),
    "unknown turn key": _extra_key("turns", 1),
    "unknown verification key": _extra_key("verification"),
    "negative token id": _negative_token,
    "missing termination_reason": _missing_termination,
}


def _mutated(base: dict[str, Any], mutation: Mutation) -> tuple[dict[str, Any], str, str]:
    record = copy.deepcopy(base)
    loc, msg = mutation(record)
    return record, loc, msg


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_model_rejects_with_exact_message(base_record: dict[str, Any], name: str) -> None:
    record, loc, msg = _mutated(base_record, MUTATIONS[name])
    with pytest.raises(ValidationError) as info:
        Trajectory.model_validate(record)
    errors = [
        (".".join(str(p) for p in e["loc"]), e["msg"]) for e in info.value.errors(include_url=False)
    ]
    assert errors == [(loc, msg)]


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_reader_rejects_with_path_and_line(
    tmp_path: Path, base_record: dict[str, Any], name: str
) -> None:
    record, loc, msg = _mutated(base_record, MUTATIONS[name])
    path = write_records(tmp_path / "t.jsonl", [base_record, record])
    stream = iter_trajectories(path)
    assert next(stream).trajectory_id == base_record["trajectory_id"]
    with pytest.raises(SchemaValidationError) as info:
        next(stream)
    expected = f"{path}:2: {loc}: {msg}" if loc else f"{path}:2: {msg}"
    assert str(info.value) == expected
    assert str(info.value).startswith(f"{path}:2")


def test_base_record_is_valid_and_round_trips(base_record: dict[str, Any]) -> None:
    traj = Trajectory.model_validate(copy.deepcopy(base_record))
    assert record_of(traj) == base_record
    assert traj.schema_version == TRAJECTORY_SCHEMA_VERSION == 1


def test_spec_example_message_shapes() -> None:
    """The literal numbers of the schema doc's table, reproduced on a 206-token record."""
    traj = make_trajectory(
        [
            ("system", 97),
            ("user", 37),
            ("assistant_tool_call", 35),
            ("tool_result", 32),
            ("assistant_final", 5),
        ]
    )
    assert traj.length == 206
    record = record_of(traj)

    short = copy.deepcopy(record)
    short["attention_mask"] = short["attention_mask"][:-1]
    with pytest.raises(
        ValidationError,
        match=re.escape("attention_mask has length 205 but token_ids has length 206"),
    ):
        Trajectory.model_validate(short)

    gap = copy.deepcopy(record)
    gap["spans"][1]["start"] = 98
    with pytest.raises(
        ValidationError,
        match=re.escape(
            "spans must tile the sequence without gaps or overlaps: expected next span to start at 97, got 98"
        ),
    ):
        Trajectory.model_validate(gap)

    cover = copy.deepcopy(record)
    del cover["spans"][-1]  # the 5-token final answer
    with pytest.raises(
        ValidationError, match=re.escape("spans cover 201 tokens but the sequence has 206")
    ):
        Trajectory.model_validate(cover)

    empty = copy.deepcopy(record)
    empty["spans"][2]["end"] = 134
    with pytest.raises(ValidationError) as info:
        Trajectory.model_validate(empty)
    (error,) = info.value.errors(include_url=False)
    assert error["loc"] == ("spans", 2)
    assert error["msg"] == "Value error, span assistant_tool_call has empty range [134,134)"


# -- reader-only failures ---------------------------------------------------------------


def test_missing_file_has_hint(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(SchemaValidationError) as info:
        list(iter_trajectories(path))
    assert str(info.value) == f"trajectory file not found: {path}"
    assert info.value.hint == "run 'miniverl demo' or 'miniverl train <recipe>' first"


def test_invalid_json_line(tmp_path: Path) -> None:
    line = '{"schema_version": 1, "token_ids": [1, 2'
    path = write_records(tmp_path / "t.jsonl", [line])
    try:
        json.loads(line + "\n")
    except json.JSONDecodeError as exc:
        decoder_message = str(exc)
    with pytest.raises(SchemaValidationError) as info:
        read_trajectories(path)
    assert str(info.value) == f"{path}:1 is not valid JSON: {decoder_message}"


def test_unknown_schema_version_checked_before_parsing(
    tmp_path: Path, base_record: dict[str, Any]
) -> None:
    record = copy.deepcopy(base_record)
    record["schema_version"] = 2
    record["bogus"] = "would also be an error, but the version is checked first"
    record["token_ids"] = []
    path = write_records(tmp_path / "t.jsonl", [record])
    with pytest.raises(SchemaValidationError) as info:
        read_trajectories(path)
    assert (
        str(info.value) == f"{path}:1 has trajectory schema_version 2, this build reads version 1"
    )
    assert "regenerate" in info.value.hint


def test_line_numbers_count_blank_lines(tmp_path: Path, base_record: dict[str, Any]) -> None:
    bad = copy.deepcopy(base_record)
    bad["model_generated_mask"][0] = True
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(base_record) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(SchemaValidationError, match=re.escape(f"{path}:3: {MODEL_MSG}")):
        read_trajectories(path)


def test_non_object_line(tmp_path: Path) -> None:
    path = write_records(tmp_path / "t.jsonl", ["[1, 2, 3]"])
    with pytest.raises(SchemaValidationError) as info:
        read_trajectories(path)
    assert str(info.value) == f"{path}:1 is not a JSON object"


def test_non_utf8_line(tmp_path: Path, base_record: dict[str, Any]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(json.dumps(base_record).encode() + b"\n\xff\xfe\n")
    with pytest.raises(SchemaValidationError, match=re.escape(f"{path}:2 is not UTF-8 text")):
        read_trajectories(path)


# -- the contract itself --------------------------------------------------------------------


def test_span_type_tables() -> None:
    assert {t.value for t in SpanType} == {
        "system",
        "user",
        "tool_result",
        "assistant_text",
        "assistant_tool_call",
        "assistant_final",
    }
    assert {t.value for t in MODEL_GENERATED_SPAN_TYPES} == {
        "assistant_text",
        "assistant_tool_call",
        "assistant_final",
    }
    assert {t.value for t in CRITICAL_SPAN_TYPES} == {"assistant_tool_call", "assistant_final"}
    assert SpanType.TOOL_RESULT not in MODEL_GENERATED_SPAN_TYPES
    assert [r.value for r in TerminationReason] == [
        "final_answer",
        "max_turns",
        "max_tokens",
        "parse_error_limit",
        "repeated_call_limit",
        "environment_error",
        "eos_without_final",
    ]


def test_span_model() -> None:
    span = Span(span_type="assistant_final", start=3, end=8, metadata={"segment_key": "k"})
    assert (span.length, span.is_model_generated, span.is_critical, span.segment_key) == (
        5,
        True,
        True,
        "k",
    )
    text = Span(span_type="assistant_text", start=0, end=1)
    assert (
        text.is_model_generated,
        text.is_critical,
        text.segment_key,
        text.turn_id,
        text.text,
    ) == (
        True,
        False,
        None,
        0,
        "",
    )
    assert not Span(span_type="tool_result", start=0, end=1).is_model_generated
    with pytest.raises(ValidationError, match=re.escape("span user has empty range [4,4)")):
        Span(span_type="user", start=4, end=4)
    with pytest.raises(ValidationError, match=re.escape("span user has empty range [5,4)")):
        Span(span_type="user", start=5, end=4)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Span(span_type="user", start=0, end=1, colour="red")
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        Span(span_type="user", start=-1, end=1)


def test_derived_views(oracle_traj: Trajectory) -> None:
    t = oracle_traj
    assert t.length == len(t.token_ids)
    assert t.model_token_positions() == [i for i, m in enumerate(t.model_generated_mask) if m]
    assert t.critical_token_positions() == [i for i, c in enumerate(t.critical_mask) if c]
    model_spans = t.spans_of(*MODEL_GENERATED_SPAN_TYPES)
    assert t.model_token_positions() == [i for s in model_spans for i in range(s.start, s.end)]
    assert [s.span_type for s in t.spans_of("tool_result")] == [SpanType.TOOL_RESULT]
    for span in t.spans:
        assert t.span_at(span.start) is span
        assert t.span_at(span.end - 1) is span
    for bad in (-1, t.length):
        with pytest.raises(
            IndexError, match=re.escape(f"position {bad} is outside [0, {t.length})")
        ):
            t.span_at(bad)
    counts = t.token_counts_by_span_type()
    assert counts == {s.span_type.value: s.length for s in t.spans}
    assert sum(counts.values()) == t.length
    assert t.solved is True
    assert t.termination_reason is TerminationReason.FINAL_ANSWER


def test_defaults_and_bounds(oracle_traj: Trajectory) -> None:
    record = record_of(oracle_traj)
    for key in (
        "schema_version",
        "turns",
        "policy_version",
        "generated_token_count",
        "invalid_tool_calls",
        "metadata",
    ):
        record.pop(key)
    record.pop("model_revision")
    record.pop("verification")
    traj = Trajectory.model_validate(record)
    assert (traj.schema_version, traj.turns, traj.policy_version, traj.metadata) == (1, [], 0, {})
    assert traj.verification is None and traj.solved is False
    for key in ("policy_version", "generated_token_count", "invalid_tool_calls"):
        bad = record_of(oracle_traj)
        bad[key] = -1
        with pytest.raises(ValidationError) as info:
            Trajectory.model_validate(bad)
        assert [e["loc"] for e in info.value.errors()] == [(key,)]
