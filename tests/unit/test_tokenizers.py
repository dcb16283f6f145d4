"""The embedded toy tokenizer and the behavioural fingerprint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from miniverl.errors import TokenizerMismatchError
from miniverl.models.tokenizers import (
    PROBE_CORPUS,
    TOY_VOCAB_SIZE,
    ToyTokenizer,
    check_same_tokenizer,
    compute_fingerprint,
)
from miniverl.schemas.text import TokenizerLike

SRC = Path(__file__).resolve().parents[2] / "src"
TOK = ToyTokenizer()
SPECIALS = (
    "<pad>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_result>",
    "</tool_result>",
    "<final>",
    "</final>",
    "<eos>",
)


def test_satisfies_protocol_and_fixed_ids() -> None:
    assert isinstance(TOK, TokenizerLike)
    assert TOK.vocab_size == TOY_VOCAB_SIZE
    assert 200 < TOK.vocab_size < 500
    assert (TOK.pad_token_id, TOK.eos_token_id) == (0, 9)
    # ids of the worked example in docs/trajectory-schema.md
    expected = {"<|im_start|>": 1, "<|im_end|>": 2, "<tool_call>": 3, "</tool_call>": 4}
    expected |= {"<final>": 7, "</final>": 8, "assistant": 11, "\n": 89, "{": 182}
    for piece, token_id in expected.items():
        assert TOK.token_to_id(piece) == token_id
        assert TOK.id_to_token(token_id) == piece
    assert TOK.encode("<|im_start|>system\nUse tools")[:6] == [1, 69, 89, 144, 174, 160]


@pytest.mark.parametrize("special", SPECIALS)
def test_specials_are_single_tokens(special: str) -> None:
    assert TOK.encode(special) == [TOK.special_token_ids[special]]
    assert TOK.encode(f"x{special}y") == [
        TOK.token_to_id("x"),
        TOK.special_token_ids[special],
        TOK.token_to_id("y"),
    ]


def test_calculator_text_uses_word_pieces() -> None:
    text = '<tool_call>\n{"arguments": {"expression": "7 - 3"}, "name": "calculator"}\n</tool_call>'
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text
    assert TOK.token_to_id("calculator") in ids and TOK.token_to_id("expression") in ids
    assert len(ids) < len(text) / 2


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127)))
def test_ascii_round_trip(text: str) -> None:
    assert TOK.decode(TOK.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips_through_byte_pieces(text: str) -> None:
    ids = TOK.encode(text)
    assert all(0 <= i < TOK.vocab_size for i in ids)
    assert TOK.decode(ids) == text


def test_non_ascii_uses_utf8_byte_pieces_and_prefixes_decode() -> None:
    ids = TOK.encode("é")
    assert [TOK.id_to_token(i) for i in ids] == ["<0xC3>", "<0xA9>"]
    assert TOK.decode(ids[:1]) == "\ufffd"
    text = "<final>\n42\n</final> café"
    full = TOK.encode(text)
    for k in range(len(full) + 1):
        assert isinstance(TOK.decode(full[:k]), str)
    with pytest.raises(ValueError, match="outside the toy vocabulary"):
        TOK.decode([TOK.vocab_size])


def test_fingerprint_is_stable_across_processes() -> None:
    code = "from miniverl.models.tokenizers import ToyTokenizer; print(ToyTokenizer().fingerprint)"
    outputs = set()
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(SRC)}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(done.stdout.strip())
    assert outputs == {TOK.fingerprint}
    assert len(TOK.fingerprint) == 64


class _CharLevel(ToyTokenizer):
    """Same vocabulary, but never uses word pieces: tokenizes differently."""

    def encode(self, text: str) -> list[int]:
        whole = super().encode
        return [i for ch in text for i in whole(ch)]


def test_fingerprint_differs_iff_tokenization_differs() -> None:
    assert ToyTokenizer().fingerprint == TOK.fingerprint
    other = _CharLevel()
    assert other.fingerprint != TOK.fingerprint
    with pytest.raises(TokenizerMismatchError) as info:
        check_same_tokenizer(TOK, other)
    assert str(info.value) == (
        f"student and teacher tokenizers differ ({TOK.fingerprint[:12]} vs {other.fingerprint[:12]}); "
        "miniVERL currently supports same-tokenizer distillation only"
    )
    check_same_tokenizer(TOK, ToyTokenizer())


def test_compute_fingerprint_covers_ids_specials_and_vocab() -> None:
    base = compute_fingerprint(TOK.encode, {"<eos>": 9}, 10)
    assert base == compute_fingerprint(TOK.encode, {"<eos>": 9}, 10)
    assert base != compute_fingerprint(TOK.encode, {"<eos>": 8}, 10)
    assert base != compute_fingerprint(TOK.encode, {"<eos>": 9}, 11)
    assert base != compute_fingerprint(lambda s: TOK.encode(s)[::-1], {"<eos>": 9}, 10)
    assert any("<tool_call>" in p for p in PROBE_CORPUS) and any(
        not p.isascii() for p in PROBE_CORPUS
    )


def _reference_encode(tok: ToyTokenizer, text: str) -> list[int]:
    """The greedy longest match written out position by position (the regex's reference)."""
    lookup = tok._text_to_id
    longest = max(len(p) for p in lookup)
    ids: list[int] = []
    i, n = 0, len(text)
    while i < n:
        for length in range(min(longest, n - i), 0, -1):
            token_id = lookup.get(text[i : i + length])
            if token_id is not None:
                ids.append(token_id)
                i += length
                break
        else:
            ids.extend(tok._byte_to_id[b] for b in text[i].encode("utf-8"))
            i += 1
    return ids


_PIECES = sorted(TOK._text_to_id)
_FRAGMENTS = st.sampled_from(_PIECES) | st.sampled_from(_PIECES).flatmap(
    lambda p: st.integers(0, len(p)).map(lambda k: p[:k] if k % 2 else p[k:])
)
"""Whole pieces and their prefixes / suffixes: where a longer piece almost matches."""


@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAGMENTS | st.text(max_size=3), max_size=40).map("".join))
def test_encode_equals_the_position_by_position_longest_match(text: str) -> None:
    assert TOK.encode(text) == _reference_encode(TOK, text)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_encode_equals_the_longest_match_on_any_text(text: str) -> None:
    assert TOK.encode(text) == _reference_encode(TOK, text)


def test_encode_on_adversarial_strings_and_the_documented_fingerprint() -> None:
    cases = [
        "",
        "<|im_start",
        "<|im_start|",
        "<|im_start|>|>",
        "</tool_call",
        "<</tool_call>>",
        "<tool_resul<tool_result>",
        "calculatorcalculato",
        "expressionexpressio\n\n\t\t    ",
        "é\u0000\u001f\u007f\U0001f600<final>",
        "\r\n\x0b\x0c",
        "".join(_PIECES),
        "".join(reversed(_PIECES)),
    ]
    for text in cases:
        assert TOK.encode(text) == _reference_encode(TOK, text), text
    assert TOK.fingerprint == (
        "c33777a2eedc9cf5866f210604586d6bc96ff22cb162ad2580396d9bf8effd86"
    )  # as in docs/trajectory-schema.md


def test_decode_fast_path_equals_piece_by_piece_and_checks_ids() -> None:
    tok = ToyTokenizer()
    ids = tok.encode('<|im_start|>assistant\n<tool_call>{"a": 12}</tool_call>')
    assert tok.decode(ids) == "".join(tok.id_to_token(i) for i in ids)
    assert tok.decode(tuple(ids)) == tok.decode(torch.tensor(ids)) == tok.decode(ids)
    mixed = ids + tok.encode("é") + ids[:3]
    assert tok.decode(mixed) == tok.decode(ids) + "é" + tok.decode(ids[:3])
    for bad in (-1, tok.vocab_size):
        with pytest.raises(ValueError, match="outside the toy vocabulary"):
            tok.decode([*ids, bad])
