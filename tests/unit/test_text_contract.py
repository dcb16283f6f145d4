"""The text contract (schemas/text.py): one vocabulary, re-exported under the old names."""

from __future__ import annotations

import miniverl.schemas.text as text
from miniverl.environments.calc_chain import CalcChainEnvironment
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.environments.shop import ShopEnvironment
from miniverl.models.tokenizers import ToyTokenizer


def test_the_vocabulary_values() -> None:
    assert text.PROTOCOL_TOKENS == (
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_result>",
        "</tool_result>",
        "<final>",
        "</final>",
    )
    assert text.ASSISTANT_HEADER == "<|im_start|>assistant\n"
    assert text.render_message("user", "hi") == "<|im_start|>user\nhi<|im_end|>\n"


def test_the_toy_tokenizer_gives_the_vocabulary_ids_1_to_8() -> None:
    """The order fixes the toy ids (and so every fingerprint and docs/trajectory-schema.md)."""
    tok = ToyTokenizer()
    expected = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    expected += ["<tool_result>", "</tool_result>", "<final>", "</final>"]
    assert [tok.encode(tag) for tag in expected] == [[i] for i in range(1, 9)]


def test_every_builtin_prompt_ends_with_the_protocol_hint() -> None:
    hint = (
        'Call a tool: <tool_call>{"arguments": {...}, "name": ...}</tool_call>\n'
        "Answer: <final>value</final>"
    )
    assert hint == text.TOOL_PROTOCOL_HINT
    for env in (CalculatorEnvironment(), ShopEnvironment(), CalcChainEnvironment()):
        assert env.system_prompt().endswith(hint), type(env).__name__
