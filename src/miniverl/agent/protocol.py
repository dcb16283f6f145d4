"""The plain-text tool protocol: formatting and parsing tool-call and final-answer blocks.

The tags themselves are the text contract of ``miniverl.schemas.text`` (why plain text and
not a vendor function-calling format is said there).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from miniverl.environments.base import ToolCall
from miniverl.schemas.text import (
    FINAL_CLOSE,
    FINAL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESULT_CLOSE,
    TOOL_RESULT_OPEN,
    TokenizerLike,
)
from miniverl.utils.safe_load import json_depth

MAX_TOOL_JSON_CHARS = 4096
MAX_TOOL_JSON_DEPTH = 8
"""Deepest object/array nesting of a tool call (``{"arguments": {...}}`` needs 2)."""


def stop_sequences() -> tuple[str, ...]:
    """Generation stops right after a closed block."""
    return (TOOL_CALL_CLOSE, FINAL_CLOSE)


@dataclass(frozen=True)
class ParsedAssistant:
    """One assistant turn's text, split into optional prose and one block.

    ``block_start`` is the character offset of the block's opening tag (``len(text)``
    when there is no block); everything before it is prose.
    """

    kind: Literal["tool_call", "final", "error"]
    prose: str
    block_start: int
    tool_call: ToolCall | None = None
    final_answer: str | None = None
    error: str | None = None


def _error(text: str, message: str, block_start: int | None = None) -> ParsedAssistant:
    start = len(text) if block_start is None else block_start
    return ParsedAssistant(kind="error", prose=text[:start], block_start=start, error=message)


def parse_assistant_text(text: str) -> ParsedAssistant:
    """Parse the first block in ``text``; errors are model-readable sentences."""
    call_at = text.find(TOOL_CALL_OPEN)
    final_at = text.find(FINAL_OPEN)
    if call_at < 0 and final_at < 0:
        return _error(
            text,
            f"no {TOOL_CALL_OPEN} or {FINAL_OPEN} block found; call a tool or give the final answer",
        )
    if final_at >= 0 and (call_at < 0 or final_at < call_at):
        close = text.find(FINAL_CLOSE, final_at)
        if close < 0:
            return _error(text, f"unterminated {FINAL_OPEN} block; close it with {FINAL_CLOSE}")
        answer = text[final_at + len(FINAL_OPEN) : close].strip()
        return ParsedAssistant(
            kind="final", prose=text[:final_at], block_start=final_at, final_answer=answer
        )
    close = text.find(TOOL_CALL_CLOSE, call_at)
    if close < 0:
        return _error(text, f"unterminated {TOOL_CALL_OPEN} block; close it with {TOOL_CALL_CLOSE}")
    body = text[call_at + len(TOOL_CALL_OPEN) : close].strip()
    if len(body) > MAX_TOOL_JSON_CHARS:
        return _error(text, f"tool call JSON is too long ({len(body)} characters)", call_at)
    if json_depth(body) > MAX_TOOL_JSON_DEPTH:
        return _error(
            text, f"tool call JSON is nested too deeply (limit {MAX_TOOL_JSON_DEPTH})", call_at
        )
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return _error(
            text, f"tool call is not valid JSON: {exc.msg} at character {exc.pos}", call_at
        )
    except (ValueError, RecursionError) as exc:
        return _error(text, f"tool call is not acceptable JSON: {type(exc).__name__}", call_at)
    if not isinstance(payload, dict):
        return _error(text, 'tool call must be a JSON object with "name" and "arguments"', call_at)
    name = payload.get("name")
    arguments: Any = payload.get("arguments", {})
    if not isinstance(name, str) or not name:
        return _error(text, 'tool call needs a string "name"', call_at)
    if not isinstance(arguments, dict):
        return _error(text, 'tool call "arguments" must be a JSON object', call_at)
    extra = set(payload) - {"name", "arguments"}
    if extra:
        return _error(
            text,
            f"tool call has unexpected keys {sorted(extra)}; use only name and arguments",
            call_at,
        )
    return ParsedAssistant(
        kind="tool_call",
        prose=text[:call_at],
        block_start=call_at,
        tool_call=ToolCall(name, arguments),
    )


def format_tool_call(call: ToolCall) -> str:
    """Canonical rendering used by oracle traces (sorted keys)."""
    payload = json.dumps({"arguments": call.arguments, "name": call.name}, sort_keys=True)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def format_final(answer: str) -> str:
    return f"{FINAL_OPEN}\n{answer}\n{FINAL_CLOSE}"


def format_observation(observation_json: str) -> str:
    """Body of the user message that carries a tool result (or a parse error)."""
    return f"{TOOL_RESULT_OPEN}\n{observation_json}\n{TOOL_RESULT_CLOSE}"


def token_index_at_char(tokenizer: TokenizerLike, token_ids: Sequence[int], char_index: int) -> int:
    """Smallest k such that ``decode(token_ids[:k])`` covers ``char_index`` characters.

    Splits sampled ids at a character boundary *without re-tokenizing*: it decodes
    prefixes of the ids the policy actually sampled. A token that straddles the
    boundary stays with the earlier (prose) part. Binary search, since decoded prefix
    length is non-decreasing in k.
    """
    ids = list(token_ids)
    if char_index <= 0:
        return 0
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid])) >= char_index:
            hi = mid
        else:
            lo = mid + 1
    return lo


__all__ = [
    "MAX_TOOL_JSON_CHARS",
    "MAX_TOOL_JSON_DEPTH",
    "ParsedAssistant",
    "format_final",
    "format_observation",
    "format_tool_call",
    "parse_assistant_text",
    "stop_sequences",
    "token_index_at_char",
]
