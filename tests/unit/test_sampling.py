"""The shared generation loop, driven by scripted ``step`` functions."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from miniverl.errors import BackendError, ConfigError
from miniverl.models.sampling import (
    check_right_padded,
    first_stop_sequence,
    run_generation,
    sample_next_token,
    sample_rows,
)
from miniverl.models.tokenizers import ToyTokenizer

TOK = ToyTokenizer()
V = TOK.vocab_size


class Scripted:
    """A ``step`` that forces the given ids one by one and records every call's input."""

    def __init__(self, forced: list[int]) -> None:
        self.forced = forced
        self.calls: list[tuple[list[int], Any]] = []

    def __call__(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        self.calls.append((input_ids[0].tolist(), cache))
        k = 0 if cache is None else cache + 1
        logits = torch.full((1, V), -1e4)
        logits[0, self.forced[min(k, len(self.forced) - 1)]] = 0.0
        return logits, k


def generate(step: Scripted, **kwargs: Any):
    args: dict[str, Any] = {
        "tokenizer": TOK,
        "max_new_tokens": 50,
        "temperature": 0.0,
        "eos_token_id": TOK.eos_token_id,
    }
    return run_generation(step, [1, 11, 89], **(args | kwargs))


def test_prefill_once_then_one_position_per_step() -> None:
    forced = TOK.encode("hello world")
    step = Scripted(forced)
    out = generate(step, max_new_tokens=len(forced))
    assert out.token_ids == forced and out.finish_reason == "max_new_tokens"
    assert step.calls[0] == ([1, 11, 89], None)
    assert [ids for ids, _ in step.calls[1:]] == [[t] for t in forced[:-1]]
    assert len(step.calls) == len(forced)
    assert out.num_prompt_tokens == 3 and out.num_generated == len(forced)


def test_stop_sequence_keeps_the_ids_that_produced_it() -> None:
    forced = TOK.encode('<tool_call>\n{"a": 1}\n</tool_call>more text')
    out = generate(Scripted(forced), stop_sequences=("</final>", "</tool_call>"))
    end = forced.index(TOK.token_to_id("</tool_call>"))
    assert out.token_ids == forced[: end + 1]
    assert out.finish_reason == "stop_sequence" and out.stop_sequence == "</tool_call>"
    assert out.text == '<tool_call>\n{"a": 1}\n</tool_call>'


def test_stop_string_spanning_several_tokens() -> None:
    forced = TOK.encode("x = 42 END tail")
    out = generate(Scripted(forced), stop_sequences=("ND t",))
    assert TOK.decode(out.token_ids).endswith("END t")
    assert out.token_ids == forced[: len(out.token_ids)]
    assert out.finish_reason == "stop_sequence" and out.stop_sequence == "ND t"


def test_eos_is_kept_in_ids_but_not_in_text() -> None:
    forced = [*TOK.encode("42"), TOK.eos_token_id, *TOK.encode("never")]
    out = generate(Scripted(forced), stop_sequences=("</final>",))
    assert out.token_ids == [*TOK.encode("42"), TOK.eos_token_id]
    assert out.finish_reason == "eos" and out.text == "42" and out.stop_sequence is None


def test_max_new_tokens_and_zero() -> None:
    forced = TOK.encode("abcdefgh")
    out = generate(Scripted(forced), max_new_tokens=3)
    assert out.token_ids == forced[:3] and out.finish_reason == "max_new_tokens"
    step = Scripted(forced)
    empty = generate(step, max_new_tokens=0)
    assert empty.token_ids == [] and empty.text == "" and step.calls == []


def test_first_stop_sequence_prefers_earliest_then_longest() -> None:
    assert first_stop_sequence("a</final>b</tool_call>", ("</tool_call>", "</final>")) == "</final>"
    assert first_stop_sequence("xyz", ("yz", "y")) == "yz"
    assert first_stop_sequence("xyz", ("q",)) is None


def _random_logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(1, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_seeded_sampling_ignores_global_rng() -> None:
    def draw(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return [
            sample_next_token(_random_logits(k), temperature=1.0, top_p=0.9, generator=gen)
            for k in range(30)
        ]

    torch.manual_seed(1)
    first = draw(7)
    torch.manual_seed(999)
    torch.rand(100)
    assert draw(7) == first
    assert draw(8) != first


def test_top_p_restricts_to_the_nucleus() -> None:
    logits = torch.full((V,), -30.0)
    logits[[5, 17, 40]] = torch.tensor([2.0, 1.5, 0.0])
    probs = torch.softmax(logits.double(), -1)
    gen = torch.Generator().manual_seed(0)
    drawn = {
        sample_next_token(logits, temperature=1.0, top_p=float(probs[5] + 1e-3), generator=gen)
        for _ in range(200)
    }
    assert drawn == {5, 17}
    gen = torch.Generator().manual_seed(0)
    tiny = {
        sample_next_token(logits, temperature=1.0, top_p=1e-6, generator=gen) for _ in range(50)
    }
    assert tiny == {5}


def test_sampling_frequencies_follow_temperature_scaled_softmax() -> None:
    logits = torch.full((V,), -1e9)
    logits[[3, 4]] = torch.tensor([0.0, 1.0])
    gen = torch.Generator().manual_seed(3)
    draws = [
        sample_next_token(logits, temperature=2.0, top_p=1.0, generator=gen) for _ in range(4000)
    ]
    p4 = torch.softmax(torch.tensor([0.0, 0.5]), -1)[1].item()
    assert abs(draws.count(4) / 4000 - p4) < 0.03


def test_greedy_breaks_ties_by_lowest_id() -> None:
    logits = torch.zeros(V)
    logits[[12, 30]] = 1.0
    assert sample_next_token(logits, temperature=0.0, top_p=1.0, generator=torch.Generator()) == 12


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"temperature": -1.0}, ConfigError),
        ({"top_p": 0.0}, ConfigError),
        ({"top_p": 1.5}, ConfigError),
        ({"max_new_tokens": -1}, ConfigError),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        generate(Scripted([5]), **kwargs)


def test_empty_prompt_and_non_finite_logits_raise() -> None:
    with pytest.raises(BackendError, match="non-empty prompt"):
        run_generation(Scripted([5]), [], tokenizer=TOK, max_new_tokens=3, temperature=0.0)
    with pytest.raises(BackendError, match="non-finite"):
        sample_next_token(
            torch.full((V,), float("nan")), temperature=1.0, top_p=1.0, generator=torch.Generator()
        )


def test_right_padding_check() -> None:
    check_right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(BackendError, match="right-padded"):
        check_right_padded(torch.tensor([[0, 1, 1]]))


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.3])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_batched_draws_equal_row_by_row_draws(temperature: float, top_p: float) -> None:
    """``sample_rows`` over a block gives each row the id and generator state that
    ``sample_next_token`` gives it alone, including rows left out of the draw."""
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(3)) * 4
    rows = [0, 2, 3, 5]

    def generators() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(100 + r) for r in range(6)]

    alone_gens, block_gens = generators(), generators()
    for _ in range(5):
        alone = {
            r: sample_next_token(
                logits[r], temperature=temperature, top_p=top_p, generator=alone_gens[r]
            )
            for r in rows
        }
        block = sample_rows(
            logits, rows, temperature=temperature, top_p=top_p, generators=block_gens
        )
        assert block == alone
    for a, b in zip(alone_gens, block_gens, strict=True):
        assert torch.equal(a.get_state(), b.get_state())


def test_batched_draws_refuse_non_finite_logits() -> None:
    logits = torch.zeros(2, V)
    logits[1, 0] = float("nan")
    gens = [torch.Generator().manual_seed(0) for _ in range(2)]
    with pytest.raises(BackendError, match="non-finite"):
        sample_rows(logits, [0, 1], temperature=1.0, top_p=1.0, generators=gens)
