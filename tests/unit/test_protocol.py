"""The plain-text tool protocol: parsing, canonical rendering, and the prose split point."""

from __future__ import annotations

import json

import pytest

from helpers import char_ids, toy_tokenizer
from miniverl.agent.protocol import (
    format_final,
    format_observation,
    format_tool_call,
    parse_assistant_text,
    stop_sequences,
    token_index_at_char,
)
from miniverl.environments.base import ToolCall
from miniverl.schemas.text import FINAL_CLOSE, TOOL_CALL_CLOSE


def test_stop_sequences() -> None:
    assert stop_sequences() == (TOOL_CALL_CLOSE, FINAL_CLOSE) == ("</tool_call>", "</final>")


def test_parse_tool_call_with_prose() -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
    parsed = parse_assistant_text(text)
    assert parsed.kind == "tool_call"
    assert parsed.prose == "Let me compute.\n"
    assert parsed.block_start == len("Let me compute.\n")
    assert parsed.tool_call == ToolCall("calculator", {"expression": "1+2"})
    assert parsed.error is None and parsed.final_answer is None


def test_parse_tool_call_defaults_arguments() -> None:
    parsed = parse_assistant_text('<tool_call>{"name": "calculator"}</tool_call>')
    assert parsed.tool_call == ToolCall("calculator", {}) and parsed.block_start == 0


def test_parse_final() -> None:
    parsed = parse_assistant_text("So:<final>\n 42 \n</final>")
    assert (parsed.kind, parsed.final_answer, parsed.prose, parsed.block_start) == (
        "final",
        "42",
        "So:",
        3,
    )


def test_first_block_wins() -> None:
    final_first = parse_assistant_text('<final>1</final><tool_call>{"name": "c"}</tool_call>')
    assert final_first.kind == "final"
    call_first = parse_assistant_text('<tool_call>{"name": "c"}</tool_call><final>1</final>')
    assert call_first.kind == "tool_call"


@pytest.mark.parametrize(
    ("text", "error", "block_start"),
    [
        (
            "just prose",
            "no <tool_call> or <final> block found; call a tool or give the final answer",
            None,
        ),
        ("<final>42", "unterminated <final> block; close it with </final>", None),
        ("x<tool_call>{}", "unterminated <tool_call> block; close it with </tool_call>", None),
        (
            "<tool_call>{bad}</tool_call>",
            "tool call is not valid JSON: Expecting property name enclosed in double quotes at character 1",
            0,
        ),
        (
            "ab<tool_call>[1]</tool_call>",
            'tool call must be a JSON object with "name" and "arguments"',
            2,
        ),
        ('<tool_call>{"arguments": {}}</tool_call>', 'tool call needs a string "name"', 0),
        ('<tool_call>{"name": ""}</tool_call>', 'tool call needs a string "name"', 0),
        (
            '<tool_call>{"name": "c", "arguments": [1]}</tool_call>',
            'tool call "arguments" must be a JSON object',
            0,
        ),
        (
            '<tool_call>{"name": "c", "id": 3}</tool_call>',
            "tool call has unexpected keys ['id']; use only name and arguments",
            0,
        ),
        (
            "<tool_call>"
            + json.dumps({"name": "c", "arguments": {"e": "1" * 5000}})
            + "</tool_call>",
            "tool call JSON is too long (5037 characters)",
            0,
        ),
    ],
)
def test_parse_errors(text: str, error: str, block_start: int | None) -> None:
    parsed = parse_assistant_text(text)
    assert parsed.kind == "error"
    assert parsed.error == error
    expected_start = len(text) if block_start is None else block_start
    assert parsed.block_start == expected_start
    assert parsed.prose == text[:expected_start]
    assert parsed.tool_call is None


def test_canonical_rendering() -> None:
    call = ToolCall("calculator", {"expression": "7 - 3"})
    assert format_tool_call(call) == (
        '<tool_call>\n{"arguments": {"expression": "7 - 3"}, "name": "calculator"}\n</tool_call>'
    )
    assert parse_assistant_text(format_tool_call(call)).tool_call == call
    assert format_final("4") == "<final>\n4\n</final>"
    assert parse_assistant_text(format_final("4")).final_answer == "4"
    assert format_observation('{"ok": true}') == '<tool_result>\n{"ok": true}\n</tool_result>'


def test_token_index_at_char_decodes_prefixes() -> None:
    tok = toy_tokenizer()
    ids = tok.encode("I will call the tool.\n<tool_call>")
    assert token_index_at_char(tok, ids, len("I will call the tool.\n")) == len(ids) - 1
    assert token_index_at_char(tok, ids, 0) == 0
    assert token_index_at_char(tok, ids, -5) == 0
    assert token_index_at_char(tok, ids, 10_000) == len(ids)
    chars = char_ids("abc<final>")
    assert token_index_at_char(tok, chars, 3) == 3


def test_token_straddling_the_boundary_stays_with_the_prose() -> None:
    tok = toy_tokenizer()
    ids = [tok.token_to_id("a"), tok.token_to_id("  "), tok.token_to_id("b")]
    assert tok.decode(ids) == "a  b"
    assert token_index_at_char(tok, ids, 2) == 2  # char 2 is inside the two-space token
    assert token_index_at_char(tok, ids, 3) == 2
    assert token_index_at_char(tok, ids, 1) == 1
