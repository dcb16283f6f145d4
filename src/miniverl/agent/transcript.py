"""Segment-wise transcript building.

The text contract it builds on (``TokenizerLike``, the chat framing, the tool tags) lives in
``miniverl.schemas.text``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from miniverl.schemas.text import TokenizerLike, chat_format_of
from miniverl.schemas.trajectory import (
    MODEL_GENERATED_SPAN_TYPES,
    Span,
    SpanType,
    TerminationReason,
    Trajectory,
    Turn,
    VerificationRecord,
)
from miniverl.trajectory.masks import build_masks

__all__ = ["SegmentIds", "TranscriptBuilder"]

SEGMENT_CACHE_SIZE = 4096
"""Distinct segment texts one :class:`SegmentIds` keeps, least recently used evicted first."""


class SegmentIds:
    """The ids of segment texts, each text encoded once per tokenizer and reused.

    A transcript tokenizes every segment on its own, so a segment's ids are
    ``tokenizer.encode(text)`` of that segment's whole text (framing included) whatever
    precedes it; the same text therefore always has the same ids, and the system prompt,
    a task's user turn and a repeated tool result need encoding only once per run.
    Nothing shorter than a whole segment is cached: a header's ids on their own need not
    be the ids it gets inside its segment, where the tokenizer may merge across it.
    """

    def __init__(self, tokenizer: TokenizerLike, max_entries: int = SEGMENT_CACHE_SIZE) -> None:
        self.tokenizer = tokenizer
        self.max_entries = max_entries
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def encode(self, text: str) -> list[int]:
        """``tokenizer.encode(text)``, from the cache when this text was seen before."""
        ids = self._ids.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text))
            self._ids[text] = ids
            if len(self._ids) > self.max_entries:
                self._ids.popitem(last=False)
        else:
            self._ids.move_to_end(text)
        return list(ids)


class TranscriptBuilder:
    """Builds a trajectory one segment at a time, tokenizing each segment on its own.

    Segment-wise tokenization means no token straddles a provenance boundary, and a
    teacher render of a shared segment produces byte-identical ids. Model segments are
    appended as the sampled ids verbatim: nothing here re-tokenizes model output.

    Context segments carry the chat framing around them: ``close_previous`` prepends the
    assistant suffix (``<|im_end|>\\n`` in ChatML) that closes the preceding assistant
    turn, and ``open_next_assistant`` appends the assistant header of the next turn
    (``<|im_start|>assistant\\n``), so the first token of every model span is genuinely
    the first sampled token. ``segment_ids`` (a :class:`SegmentIds` of the same tokenizer)
    lets many transcripts share the ids of segment texts they repeat. The framing is the tokenizer's
    :class:`~miniverl.schemas.text.ChatFormat` (its model's chat template where it has one,
    see :func:`~miniverl.schemas.text.chat_format_of`).
    """

    def __init__(
        self,
        tokenizer: TokenizerLike,
        *,
        trajectory_id: str,
        task_id: str,
        environment: str,
        model_id: str,
        model_revision: str | None = None,
        policy_version: int = 0,
        segment_ids: SegmentIds | None = None,
    ) -> None:
        if segment_ids is not None and segment_ids.tokenizer is not tokenizer:
            raise ValueError("segment_ids caches another tokenizer's ids")
        self.tokenizer = tokenizer
        self.segment_ids = segment_ids
        self.chat_format = chat_format_of(tokenizer)
        self.trajectory_id = trajectory_id
        self.task_id = task_id
        self.environment = environment
        self.model_id = model_id
        self.model_revision = model_revision
        self.policy_version = policy_version
        self.token_ids: list[int] = []
        self.spans: list[Span] = []
        self.turns: list[Turn] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def add(
        self,
        span_type: SpanType | str,
        *,
        segment_key: str,
        text: str | None = None,
        token_ids: Sequence[int] | None = None,
        turn_id: int = 0,
        tool_name: str | None = None,
        tool_call_id: str | None = None,
        env_state_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Span | None:
        """Append one segment given as text (tokenized alone) or as ids (verbatim).

        When ids are given without text, the span text is filled by decoding them; when
        both are given the ids are used verbatim and the text is recorded as-is.
        An empty segment adds nothing and returns ``None``.
        """
        if text is None and token_ids is None:
            raise ValueError("pass text or token_ids")
        if token_ids is not None:
            ids = list(token_ids)
        elif self.segment_ids is not None:
            ids = self.segment_ids.encode(text or "")
        else:
            ids = self.tokenizer.encode(text or "")
        if not ids:
            return None
        if text is None:
            text = self.tokenizer.decode(ids)
        if any(s.segment_key == segment_key for s in self.spans):
            raise ValueError(f"segment key {segment_key!r} is already used in this transcript")
        span = Span(
            span_type=SpanType(span_type),
            start=len(self.token_ids),
            end=len(self.token_ids) + len(ids),
            turn_id=turn_id,
            text=text,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            env_state_id=env_state_id,
            metadata={**(metadata or {}), "segment_key": segment_key},
        )
        self.token_ids.extend(ids)
        self.spans.append(span)
        return span

    def add_context(
        self,
        span_type: SpanType | str,
        role: str,
        content: str,
        *,
        segment_key: str,
        turn_id: int = 0,
        open_next_assistant: bool = True,
        close_previous: bool = True,
        tool_call_id: str | None = None,
        env_state_id: str | None = None,
    ) -> Span | None:
        """Append a context message (system, user or tool result) with its framing.

        ``close_previous`` only applies when an assistant segment precedes this one.
        """
        span_type = SpanType(span_type)
        if span_type in MODEL_GENERATED_SPAN_TYPES:
            raise ValueError(f"{span_type.value} is model-generated; use add_model for sampled ids")
        previous_is_model = bool(self.spans) and self.spans[-1].is_model_generated
        fmt = self.chat_format
        text = (fmt.assistant_close if close_previous and previous_is_model else "") + fmt.render(
            role, content
        )
        if open_next_assistant:
            text += fmt.assistant_header
        return self.add(
            span_type,
            segment_key=segment_key,
            text=text,
            turn_id=turn_id,
            tool_call_id=tool_call_id,
            env_state_id=env_state_id,
        )

    def add_model(
        self,
        span_type: SpanType | str,
        token_ids: Sequence[int],
        *,
        segment_key: str,
        turn_id: int,
        tool_name: str | None = None,
        tool_call_id: str | None = None,
    ) -> Span | None:
        """Append sampled ids verbatim as a model-generated span."""
        span_type = SpanType(span_type)
        if span_type not in MODEL_GENERATED_SPAN_TYPES:
            raise ValueError(f"{span_type.value} is context; use add_context")
        return self.add(
            span_type,
            segment_key=segment_key,
            token_ids=token_ids,
            turn_id=turn_id,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
        )

    def add_turn(self, turn: Turn) -> None:
        self.turns.append(turn)

    def build(
        self,
        *,
        termination_reason: TerminationReason | str,
        verification: VerificationRecord | None = None,
        generated_token_count: int = 0,
        invalid_tool_calls: int = 0,
        metadata: dict[str, Any] | None = None,
    ) -> Trajectory:
        """Derive the masks with ``build_masks`` and return a validated ``Trajectory``."""
        masks = build_masks(self.spans, len(self.token_ids))
        turns = list(self.turns)
        if turns:
            known = {t.turn_id for t in turns}
            turns.extend(Turn(turn_id=t) for t in sorted({s.turn_id for s in self.spans} - known))
            turns.sort(key=lambda t: t.turn_id)
        return Trajectory(
            trajectory_id=self.trajectory_id,
            task_id=self.task_id,
            environment=self.environment,
            token_ids=list(self.token_ids),
            attention_mask=masks.attention_mask,
            model_generated_mask=masks.model_generated_mask,
            critical_mask=masks.critical_mask,
            spans=list(self.spans),
            turns=turns,
            policy_version=self.policy_version,
            tokenizer_fingerprint=self.tokenizer.fingerprint,
            model_id=self.model_id,
            model_revision=self.model_revision,
            verification=verification,
            termination_reason=TerminationReason(termination_reason),
            generated_token_count=generated_token_count,
            invalid_tool_calls=invalid_tool_calls,
            metadata=dict(metadata or {}),
        )
