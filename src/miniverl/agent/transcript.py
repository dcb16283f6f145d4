"""Segment-wise transcript building and the tokenizer contract.

``TokenizerLike`` lives here, next to the code that defines what a tokenizer must do
(docs/design.md §2.2); ``miniverl.models`` imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class TokenizerLike(Protocol):
    """The six tokenizer members miniverl depends on.

    ``fingerprint`` is behavioural: two tokenizers share it iff they encode a fixed probe
    corpus to the same ids with the same special tokens. ``encode`` never adds BOS/EOS.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int: ...

    @property
    def pad_token_id(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ASSISTANT_HEADER = f"{IM_START}assistant\n"


def render_message(role: str, content: str) -> str:
    """ChatML framing of one message, ending with ``<|im_end|>\\n``."""
    return f"{IM_START}{role}\n{content}{IM_END}\n"


CHAT_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatFormat:
    """How one message is framed: ``prefix[role] + content + suffix[role]``.

    ``assistant_header`` is the generation prompt that opens an assistant turn; the
    sampled ids follow it verbatim and the turn is closed by ``suffix["assistant"]``.
    ``source`` says where the framing came from (``chatml`` or ``chat_template``).
    """

    prefix: Mapping[str, str]
    suffix: Mapping[str, str]
    assistant_header: str
    source: str = "chatml"

    def render(self, role: str, content: str) -> str:
        if role not in self.prefix:
            raise ValueError(f"the chat format has no framing for role {role!r}")
        return f"{self.prefix[role]}{content}{self.suffix[role]}"

    @property
    def assistant_close(self) -> str:
        return self.suffix["assistant"]


CHATML = ChatFormat(
    prefix={role: f"{IM_START}{role}\n" for role in CHAT_ROLES},
    suffix={role: f"{IM_END}\n" for role in CHAT_ROLES},
    assistant_header=ASSISTANT_HEADER,
)
"""The built-in framing (used by the toy tokenizer and by HF tokenizers without a template)."""

_SENTINEL = "\u2063MINIVERL-CONTENT\u2063"


def chat_format_from_template(render: Callable[..., str]) -> ChatFormat:
    """Derive the per-role framing from a chat template, by rendering a sentinel.

    ``render(messages, add_generation_prompt=...)`` returns the template's text (for a
    ``transformers`` tokenizer: ``apply_chat_template(..., tokenize=False)``). Every
    message is rendered after a system message, so templates that inject a default
    system prompt never do; the framing of role ``r`` is the text the second message
    adds, split at the sentinel. Raises ``ValueError`` when the template is not a
    per-message concatenation (then no segment-wise rendering can reproduce it).
    """
    system = {"role": "system", "content": "S"}
    head = render([system], add_generation_prompt=False)
    prefix: dict[str, str] = {}
    suffix: dict[str, str] = {}
    first = render([{"role": "system", "content": _SENTINEL}], add_generation_prompt=False)
    if first.count(_SENTINEL) != 1:
        raise ValueError("the chat template does not render the system content verbatim")
    prefix["system"], suffix["system"] = first.split(_SENTINEL)
    for role in CHAT_ROLES[1:]:
        full = render([system, {"role": role, "content": _SENTINEL}], add_generation_prompt=False)
        if not full.startswith(head) or full.count(_SENTINEL) != 1:
            raise ValueError(f"the chat template does not append a {role} message to the text")
        prefix[role], suffix[role] = full[len(head) :].split(_SENTINEL)
    user = [system, {"role": "user", "content": "U"}]
    plain = render(user, add_generation_prompt=False)
    prompted = render(user, add_generation_prompt=True)
    if not prompted.startswith(plain):
        raise ValueError("the chat template's generation prompt is not a suffix")
    return ChatFormat(prefix, suffix, prompted[len(plain) :], source="chat_template")


def chat_format_of(tokenizer: Any) -> ChatFormat:
    """The tokenizer's ``chat_format`` if it has one, else :data:`CHATML`."""
    fmt = getattr(tokenizer, "chat_format", None)
    return fmt if isinstance(fmt, ChatFormat) else CHATML


class TranscriptBuilder:
    """Builds a trajectory one segment at a time, tokenizing each segment on its own.

    Segment-wise tokenization means no token straddles a provenance boundary, and a
    teacher render of a shared segment produces byte-identical ids. Model segments are
    appended as the sampled ids verbatim: nothing here re-tokenizes model output.

    Context segments carry the chat framing around them: ``close_previous`` prepends the
    assistant suffix (``<|im_end|>\\n`` in ChatML) that closes the preceding assistant
    turn, and ``open_next_assistant`` appends the assistant header of the next turn
    (``<|im_start|>assistant\\n``), so the first token of every model span is genuinely
    the first sampled token. The framing is the tokenizer's :class:`ChatFormat` (its
    model's chat template where it has one, see :func:`chat_format_of`).
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
    ) -> None:
        self.tokenizer = tokenizer
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
        ids = list(token_ids) if token_ids is not None else self.tokenizer.encode(text or "")
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
