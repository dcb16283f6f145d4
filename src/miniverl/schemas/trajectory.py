"""The trajectory contract: a flat token sequence plus a typed span partition.

Every token belongs to exactly one span, and the span type alone decides whether a
token may ever enter a loss. The masks are stored explicitly *and* re-derived from the
spans by the validator, so a file that claims tool output is trainable fails to load
(docs/trajectory-schema.md, "What is validated").
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

TRAJECTORY_SCHEMA_VERSION = 1

MAX_TOKEN_ID = 1 << 24
"""Exclusive sanity bound on a token id (16,777,216) when no tokenizer is known to check
against: the largest real vocabularies are a few hundred thousand entries, so an id past
it is an edited or corrupted file, not a bigger tokenizer."""


class SpanType(StrEnum):
    SYSTEM = "system"
    USER = "user"
    TOOL_RESULT = "tool_result"
    ASSISTANT_TEXT = "assistant_text"
    ASSISTANT_TOOL_CALL = "assistant_tool_call"
    ASSISTANT_FINAL = "assistant_final"


MODEL_GENERATED_SPAN_TYPES: frozenset[SpanType] = frozenset(
    {SpanType.ASSISTANT_TEXT, SpanType.ASSISTANT_TOOL_CALL, SpanType.ASSISTANT_FINAL}
)
"""Span types whose tokens the policy sampled: the only ones that may be supervised."""

CRITICAL_SPAN_TYPES: frozenset[SpanType] = frozenset(
    {SpanType.ASSISTANT_TOOL_CALL, SpanType.ASSISTANT_FINAL}
)
"""The structurally load-bearing model tokens: tool JSON and the answer."""

CONTEXT_SPAN_TYPES: frozenset[SpanType] = frozenset(SpanType) - MODEL_GENERATED_SPAN_TYPES


class TerminationReason(StrEnum):
    FINAL_ANSWER = "final_answer"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    PARSE_ERROR_LIMIT = "parse_error_limit"
    REPEATED_CALL_LIMIT = "repeated_call_limit"
    ENVIRONMENT_ERROR = "environment_error"
    EOS_WITHOUT_FINAL = "eos_without_final"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Span(_Strict):
    """A half-open token range ``[start, end)`` with one provenance type."""

    span_type: SpanType
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    turn_id: int = Field(0, ge=0)
    text: str = ""
    tool_name: str | None = None
    tool_call_id: str | None = None
    env_state_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _non_empty(self) -> Span:
        if self.end <= self.start:
            raise ValueError(
                f"span {self.span_type.value} has empty range [{self.start},{self.end})"
            )
        return self

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def is_model_generated(self) -> bool:
        return self.span_type in MODEL_GENERATED_SPAN_TYPES

    @property
    def is_critical(self) -> bool:
        return self.span_type in CRITICAL_SPAN_TYPES

    @property
    def segment_key(self) -> str | None:
        key = self.metadata.get("segment_key")
        return key if isinstance(key, str) else None


class ToolCallRecord(_Strict):
    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_text: str = ""
    valid: bool = True
    parse_error: str | None = None


class ToolResultRecord(_Strict):
    call_id: str
    ok: bool
    result: str = ""
    error: str | None = None
    env_state_id: str | None = None
    duration_ms: float | None = None


class VerificationRecord(_Strict):
    solved: bool
    reward: float = 0.0
    predicted: str | None = None
    expected: str | None = None
    failure_category: str | None = None
    detail: str | None = None


class Turn(_Strict):
    turn_id: int = Field(ge=0)
    tool_call: ToolCallRecord | None = None
    tool_result: ToolResultRecord | None = None
    is_final: bool = False


def expected_masks(spans: list[Span], length: int) -> tuple[list[bool], list[bool]]:
    """(model_generated_mask, critical_mask) implied by a span partition."""
    model = [False] * length
    critical = [False] * length
    for span in spans:
        if span.is_model_generated:
            model[span.start : span.end] = [True] * span.length
        if span.is_critical:
            critical[span.start : span.end] = [True] * span.length
    return model, critical


class Trajectory(_Strict):
    """One rollout. See docs/trajectory-schema.md for every field's meaning."""

    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    trajectory_id: str = Field(min_length=1)
    task_id: str
    environment: str
    token_ids: list[int]
    attention_mask: list[int]
    model_generated_mask: list[bool]
    critical_mask: list[bool]
    spans: list[Span]
    turns: list[Turn] = Field(default_factory=list)
    policy_version: int = Field(0, ge=0)
    tokenizer_fingerprint: str
    model_id: str
    model_revision: str | None = None
    verification: VerificationRecord | None = None
    termination_reason: TerminationReason
    generated_token_count: int = Field(0, ge=0)
    invalid_tool_calls: int = Field(0, ge=0)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _validate_structure(self) -> Trajectory:
        n = len(self.token_ids)
        if n == 0:
            raise ValueError("trajectory has no tokens")
        if any(t < 0 for t in self.token_ids):
            raise ValueError("token ids must be non-negative")
        if max(self.token_ids) >= MAX_TOKEN_ID:
            raise ValueError(
                f"token id {max(self.token_ids)} is past {MAX_TOKEN_ID - 1}, beyond any "
                "tokenizer vocabulary (with a manifest.json beside the file, ids are checked "
                "against its vocab_size)"
            )
        for name in ("attention_mask", "model_generated_mask", "critical_mask"):
            size = len(getattr(self, name))
            if size != n:
                raise ValueError(f"{name} has length {size} but token_ids has length {n}")
        if any(v not in (0, 1) for v in self.attention_mask):
            raise ValueError("attention_mask must contain only 0/1")
        if not self.spans:
            raise ValueError("trajectory has no spans")
        starts = [s.start for s in self.spans]
        if starts != sorted(starts):
            raise ValueError("spans must be stored in ascending start order")
        cursor = 0
        for span in self.spans:
            if span.start != cursor:
                raise ValueError(
                    f"spans must tile the sequence without gaps or overlaps: expected next span to start at {cursor}, got {span.start}"
                )
            cursor = span.end
        if cursor != n:
            raise ValueError(f"spans cover {cursor} tokens but the sequence has {n}")
        expected_model, expected_critical = expected_masks(self.spans, n)
        if list(self.model_generated_mask) != expected_model:
            raise ValueError(
                "model_generated_mask disagrees with the span partition; tool/user/system tokens must never be marked model-generated"
            )
        if list(self.critical_mask) != expected_critical:
            raise ValueError("critical_mask disagrees with the span partition")
        if self.turns:
            known = {t.turn_id for t in self.turns}
            for span in self.spans:
                if span.turn_id not in known:
                    raise ValueError(
                        f"span {span.span_type.value} references unknown turn_id {span.turn_id}"
                    )
        return self

    # -- derived views ------------------------------------------------------------

    @property
    def length(self) -> int:
        return len(self.token_ids)

    def model_token_positions(self) -> list[int]:
        return [i for i, m in enumerate(self.model_generated_mask) if m]

    def critical_token_positions(self) -> list[int]:
        return [i for i, c in enumerate(self.critical_mask) if c]

    def spans_of(self, *span_types: SpanType | str) -> list[Span]:
        wanted = {SpanType(t) for t in span_types}
        return [s for s in self.spans if s.span_type in wanted]

    def span_at(self, position: int) -> Span:
        """The span containing absolute index ``position`` (binary search)."""
        if not 0 <= position < self.length:
            raise IndexError(f"position {position} is outside [0, {self.length})")
        lo, hi = 0, len(self.spans) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.spans[mid].start <= position:
                lo = mid
            else:
                hi = mid - 1
        return self.spans[lo]

    def span_types_at(self, positions: list[int]) -> list[str]:
        return [self.span_at(p).span_type.value for p in positions]

    def token_counts_by_span_type(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for span in self.spans:
            counts[span.span_type.value] += span.length
        return dict(counts)

    @property
    def solved(self) -> bool:
        return bool(self.verification is not None and self.verification.solved)


__all__ = [
    "CONTEXT_SPAN_TYPES",
    "CRITICAL_SPAN_TYPES",
    "MODEL_GENERATED_SPAN_TYPES",
    "TRAJECTORY_SCHEMA_VERSION",
    "Span",
    "SpanType",
    "TerminationReason",
    "ToolCallRecord",
    "ToolResultRecord",
    "Trajectory",
    "Turn",
    "VerificationRecord",
    "expected_masks",
]
