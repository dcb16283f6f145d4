"""``TranscriptBuilder``: segment-wise tokenization, framing, and provenance-safe building."""

from __future__ import annotations

import pytest

from helpers import toy_tokenizer
from miniverl.agent.transcript import SegmentIds, TranscriptBuilder
from miniverl.schemas.text import ASSISTANT_HEADER, IM_END, TokenizerLike, render_message
from miniverl.schemas.trajectory import SpanType, TerminationReason, Turn


def _builder() -> TranscriptBuilder:
    return TranscriptBuilder(
        toy_tokenizer(),
        trajectory_id="t",
        task_id="task",
        environment="calculator",
        model_id="m",
        model_revision="r1",
        policy_version=3,
    )


def test_toy_tokenizer_satisfies_the_protocol() -> None:
    assert isinstance(toy_tokenizer(), TokenizerLike)


def test_render_message() -> None:
    assert render_message("user", "hi") == "<|im_start|>user\nhi<|im_end|>\n"
    assert ASSISTANT_HEADER == "<|im_start|>assistant\n"


def test_context_framing_and_segmentwise_ids() -> None:
    tok = toy_tokenizer()
    b = _builder()
    system = b.add_context(
        SpanType.SYSTEM, "system", "Be exact.", segment_key="sys", open_next_assistant=False
    )
    user = b.add_context(SpanType.USER, "user", "Compute 1 + 1", segment_key="user")
    assert system.text == render_message("system", "Be exact.")
    assert user.text == render_message("user", "Compute 1 + 1") + ASSISTANT_HEADER
    # close_previous only applies after a model span: no <|im_end|> was prepended to the user message.
    assert b.token_ids == tok.encode(system.text) + tok.encode(user.text)
    call_ids = tok.encode('<tool_call>{"name": "calculator"}</tool_call>')
    call = b.add_model(
        SpanType.ASSISTANT_TOOL_CALL,
        call_ids,
        segment_key="gen:0:block",
        turn_id=0,
        tool_name="calculator",
        tool_call_id="c0",
    )
    assert call.text == tok.decode(call_ids) and call.start == user.end
    obs = b.add_context(
        SpanType.TOOL_RESULT,
        "user",
        "<tool_result>2</tool_result>",
        segment_key="obs:0",
        tool_call_id="c0",
        env_state_id="calc:1",
    )
    assert (
        obs.text
        == IM_END + "\n" + render_message("user", "<tool_result>2</tool_result>") + ASSISTANT_HEADER
    )
    assert (obs.tool_call_id, obs.env_state_id) == ("c0", "calc:1")
    assert [s.segment_key for s in b.spans] == ["sys", "user", "gen:0:block", "obs:0"]
    assert len(b) == obs.end


def test_model_ids_are_verbatim_and_text_recorded() -> None:
    tok = toy_tokenizer()
    b = _builder()
    weird = [tok.token_to_id(c) for c in "user"]  # not the canonical "user" piece
    span = b.add(SpanType.ASSISTANT_TEXT, segment_key="k", token_ids=weird)
    assert b.token_ids == weird and span.text == "user"
    explicit = b.add(
        SpanType.ASSISTANT_TEXT, segment_key="k2", token_ids=[tok.token_to_id("a")], text="as given"
    )
    assert explicit.text == "as given"


def test_guards() -> None:
    b = _builder()
    with pytest.raises(ValueError, match="pass text or token_ids"):
        b.add(SpanType.USER, segment_key="x")
    assert b.add(SpanType.USER, segment_key="empty", text="") is None
    assert b.add_model(SpanType.ASSISTANT_TEXT, [], segment_key="e", turn_id=0) is None
    assert b.spans == [] and b.token_ids == []
    with pytest.raises(ValueError, match="tool_result is context; use add_context"):
        b.add_model(SpanType.TOOL_RESULT, [5], segment_key="x", turn_id=0)
    with pytest.raises(
        ValueError, match="assistant_final is model-generated; use add_model for sampled ids"
    ):
        b.add_context(SpanType.ASSISTANT_FINAL, "assistant", "x", segment_key="x")
    b.add(SpanType.USER, segment_key="dup", text="a")
    with pytest.raises(ValueError, match="segment key 'dup' is already used in this transcript"):
        b.add(SpanType.USER, segment_key="dup", text="b")


def test_build_derives_masks_and_fills_turns() -> None:
    tok = toy_tokenizer()
    b = _builder()
    b.add_context(SpanType.USER, "user", "q", segment_key="user")
    b.add_model(SpanType.ASSISTANT_TEXT, tok.encode("hm"), segment_key="gen:0:prose", turn_id=0)
    b.add_model(
        SpanType.ASSISTANT_FINAL,
        tok.encode("<final>1</final>"),
        segment_key="gen:2:block",
        turn_id=2,
    )
    b.add_turn(Turn(turn_id=2, is_final=True))
    traj = b.build(
        termination_reason="final_answer",
        generated_token_count=5,
        invalid_tool_calls=1,
        metadata={"a": 1},
    )
    assert [t.turn_id for t in traj.turns] == [0, 2]  # the span's turn 0 was added, sorted
    assert traj.turns[1].is_final
    n_user = b.spans[0].length
    assert traj.model_generated_mask == [False] * n_user + [True] * (traj.length - n_user)
    assert traj.critical_mask == [False] * (n_user + 2) + [True] * (traj.length - n_user - 2)
    assert traj.attention_mask == [1] * traj.length
    assert traj.termination_reason is TerminationReason.FINAL_ANSWER
    assert (traj.model_id, traj.model_revision, traj.policy_version) == ("m", "r1", 3)
    assert traj.tokenizer_fingerprint == tok.fingerprint
    assert (traj.generated_token_count, traj.invalid_tool_calls, traj.metadata) == (5, 1, {"a": 1})


def test_build_without_turns_keeps_none() -> None:
    b = _builder()
    b.add(SpanType.SYSTEM, segment_key="s", text="x", turn_id=4)
    assert b.build(termination_reason=TerminationReason.MAX_TURNS).turns == []


class _CountingTokenizer:
    """The toy tokenizer, recording every text it is asked to encode."""

    def __init__(self) -> None:
        self.inner = toy_tokenizer()
        self.encoded: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def encode(self, text: str) -> list[int]:
        self.encoded.append(text)
        return self.inner.encode(text)


def _contexts(builder: TranscriptBuilder, prompt: str) -> TranscriptBuilder:
    builder.add_context(
        SpanType.SYSTEM, "system", "Be exact.", segment_key="sys", open_next_assistant=False
    )
    builder.add_context(SpanType.USER, "user", prompt, segment_key="user")
    builder.add_model(
        SpanType.ASSISTANT_FINAL,
        builder.tokenizer.encode("<final>2</final>"),
        segment_key="m",
        turn_id=0,
    )
    builder.add_context(SpanType.TOOL_RESULT, "user", "ok", segment_key="obs", turn_id=0)
    return builder


def test_segment_ids_encode_each_segment_text_once_with_the_uncached_ids() -> None:
    tok = _CountingTokenizer()
    shared = SegmentIds(tok)
    user_text = render_message("user", "Compute 2 + 2") + ASSISTANT_HEADER
    expected_encodes = [3, [user_text], []]
    for prompt, expected in zip(
        ["Compute 1 + 1", "Compute 2 + 2", "Compute 1 + 1"], expected_encodes, strict=True
    ):
        reference = _contexts(_builder(), prompt)
        tok.encoded.clear()
        cached = _contexts(
            TranscriptBuilder(
                tok,
                trajectory_id="t",
                task_id="task",
                environment="e",
                model_id="m",
                segment_ids=shared,
            ),
            prompt,
        )
        assert cached.token_ids == reference.token_ids
        assert [s.text for s in cached.spans] == [s.text for s in reference.spans]
        assert [(s.start, s.end) for s in cached.spans] == [
            (s.start, s.end) for s in reference.spans
        ]
        context_encodes = [t for t in tok.encoded if t != "<final>2</final>"]
        if isinstance(expected, int):
            assert len(context_encodes) == expected
        else:
            assert context_encodes == expected
    ids = shared.encode("Be exact.")
    ids.append(-1)
    assert shared.encode("Be exact.") == toy_tokenizer().encode("Be exact.")


def test_segment_ids_forget_the_least_recently_used_text() -> None:
    tok = _CountingTokenizer()
    shared = SegmentIds(tok, max_entries=2)
    for text in ["a", "b", "a", "c", "a", "b"]:
        assert shared.encode(text) == toy_tokenizer().encode(text)
    assert tok.encoded == ["a", "b", "c", "b"]
    with pytest.raises(ValueError, match="another tokenizer"):
        TranscriptBuilder(
            toy_tokenizer(),
            trajectory_id="t",
            task_id="x",
            environment="e",
            model_id="m",
            segment_ids=shared,
        )
