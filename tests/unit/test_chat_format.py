"""Chat framing derived from a model's chat template, and used by the transcript builder."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import toy_tokenizer
from miniverl.agent.transcript import TranscriptBuilder
from miniverl.schemas.text import CHATML, ChatFormat, chat_format_from_template, chat_format_of
from miniverl.schemas.trajectory import SpanType


def _bracket_template(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """A non-ChatML per-message template with a default system prompt, like many models."""
    text = "<s>"
    if messages[0]["role"] != "system":
        text += "[system]\nDEFAULT\n[/system]\n"
    for m in messages:
        text += f"[{m['role']}]\n{m['content']}\n[/{m['role']}]\n"
    return text + ("[assistant]\n" if add_generation_prompt else "")


def test_the_framing_is_derived_per_role() -> None:
    fmt = chat_format_from_template(_bracket_template)
    assert fmt.source == "chat_template"
    assert fmt.prefix == {
        "system": "<s>[system]\n",
        "user": "[user]\n",
        "assistant": "[assistant]\n",
        "tool": "[tool]\n",
    }
    assert dict(fmt.suffix) == {r: f"\n[/{r}]\n" for r in ("system", "user", "assistant", "tool")}
    assert fmt.assistant_header == "[assistant]\n" and fmt.assistant_close == "\n[/assistant]\n"
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
        {"role": "tool", "content": "T"},
    ]
    assert "".join(fmt.render(m["role"], m["content"]) for m in messages) == _bracket_template(
        messages, False
    )


def test_chatml_templates_reproduce_the_builtin_framing() -> None:
    def chatml(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    fmt = chat_format_from_template(chatml)
    assert (dict(fmt.prefix), dict(fmt.suffix), fmt.assistant_header) == (
        dict(CHATML.prefix),
        dict(CHATML.suffix),
        CHATML.assistant_header,
    )


def test_a_template_that_is_not_per_message_is_refused() -> None:
    def reordering(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return "|".join(m["content"] for m in reversed(messages))

    with pytest.raises(ValueError, match="does not append a user message"):
        chat_format_from_template(reordering)


class _FramedToy:
    """The toy tokenizer with a non-ChatML chat format attached."""

    def __init__(self, fmt: ChatFormat) -> None:
        self._tok = toy_tokenizer()
        self.chat_format = fmt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def test_the_builder_frames_context_with_the_tokenizers_format() -> None:
    fmt = chat_format_from_template(_bracket_template)
    tok = _FramedToy(fmt)
    assert chat_format_of(tok) is fmt and chat_format_of(toy_tokenizer()) is CHATML
    builder = TranscriptBuilder(
        tok, trajectory_id="t", task_id="x", environment="calculator", model_id="m"
    )
    builder.add_context(
        SpanType.SYSTEM, "system", "S", segment_key="sys", open_next_assistant=False
    )
    builder.add_context(SpanType.USER, "user", "U", segment_key="user")
    sampled = tok.encode("<final>\n1\n</final>")
    builder.add_model(SpanType.ASSISTANT_FINAL, sampled, segment_key="gen:0:block", turn_id=0)
    builder.add_context(SpanType.TOOL_RESULT, "user", "R", segment_key="obs:0", turn_id=0)
    texts = [s.text for s in builder.spans]
    assert texts == [
        "<s>[system]\nS\n[/system]\n",
        "[user]\nU\n[/user]\n[assistant]\n",
        "<final>\n1\n</final>",
        "\n[/assistant]\n[user]\nR\n[/user]\n[assistant]\n",
    ]
    assert builder.token_ids[builder.spans[2].start : builder.spans[2].end] == sampled
