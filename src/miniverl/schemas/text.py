"""The text contract: the tokenizer protocol, the chat framing and the tool-tag vocabulary.

Everything that reads or writes model text agrees on these strings: the rollout loop and
its parser (``miniverl.agent``), the tokenizers and the tiny test checkpoint
(``miniverl.models``), and the environments' system prompts. They live on the ground floor
(``schemas``, torch-free, importing only the standard library) so that no layer has to
import another layer sideways or upward to learn them; ``tests/unit/test_layering.py``
checks that each tag is spelled out in this module and nowhere else under ``src/``.

The protocol is plain text on purpose, not a vendor function-calling format: every
supported model emits the same ``<tool_call>{json}</tool_call>`` and ``<final>…</final>``
blocks, so one parser and one mask derivation work across model families without
special-token surgery or an embedding resize.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


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


# -- chat markers (ChatML) -------------------------------------------------------------------

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_MARKERS: tuple[str, ...] = (IM_START, IM_END)
ASSISTANT_HEADER = f"{IM_START}assistant\n"
CHAT_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

# -- tool tags -------------------------------------------------------------------------------

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESULT_OPEN = "<tool_result>"
TOOL_RESULT_CLOSE = "</tool_result>"
FINAL_OPEN = "<final>"
FINAL_CLOSE = "</final>"
TOOL_TAGS: tuple[str, ...] = (
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESULT_OPEN,
    TOOL_RESULT_CLOSE,
    FINAL_OPEN,
    FINAL_CLOSE,
)
PROTOCOL_TOKENS: tuple[str, ...] = (*CHAT_MARKERS, *TOOL_TAGS)
"""Every marker and tag, in the order the toy tokenizer gives them ids 1..8."""

TOOL_PROTOCOL_HINT = (
    f'Call a tool: {TOOL_CALL_OPEN}{{"arguments": {{...}}, "name": ...}}{TOOL_CALL_CLOSE}\n'
    f"Answer: {FINAL_OPEN}value{FINAL_CLOSE}"
)
"""The two-line reminder of the block syntax that ends each built-in system prompt."""


def render_message(role: str, content: str) -> str:
    """ChatML framing of one message, ending with ``<|im_end|>\\n``."""
    return f"{IM_START}{role}\n{content}{IM_END}\n"


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


__all__ = [
    "ASSISTANT_HEADER",
    "CHATML",
    "CHAT_MARKERS",
    "CHAT_ROLES",
    "FINAL_CLOSE",
    "FINAL_OPEN",
    "IM_END",
    "IM_START",
    "PROTOCOL_TOKENS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_PROTOCOL_HINT",
    "TOOL_RESULT_CLOSE",
    "TOOL_RESULT_OPEN",
    "TOOL_TAGS",
    "ChatFormat",
    "TokenizerLike",
    "chat_format_from_template",
    "chat_format_of",
    "render_message",
]
