"""Incremental prefill: a batched round feeds only each episode's new ids into a kept KV cache.

Every check compares three paths on a real toy decoder in float64: the incremental path
(``PrefixCache``), the full re-prefill of whole transcripts (``incremental_prefill=False``)
and the sequential single-sequence loop. A last test counts the real tokens each round's
prefill forward runs and proves they are exactly the ids appended since the last decode.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from helpers import calculator, calculator_tasks, tool_call_text, toy_tokenizer  # noqa: E402
from miniverl.agent.loop import EpisodeRequest, RolloutRunner  # noqa: E402
from miniverl.agent.protocol import format_observation  # noqa: E402
from miniverl.config.models import RolloutConfig  # noqa: E402
from miniverl.models.sampling import PrefixCache  # noqa: E402
from miniverl.models.toy import ToyBackend  # noqa: E402
from miniverl.models.toy_config import TOY_STUDENT  # noqa: E402
from miniverl.schemas.text import ASSISTANT_HEADER  # noqa: E402
from miniverl.schemas.trajectory import SpanType  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHARPEN = 6.0
CONFIG = RolloutConfig(
    max_turns=4, max_new_tokens_per_turn=24, max_total_tokens=440, max_parse_errors=4
)


def _sharpened(cls: type[ToyBackend] = ToyBackend) -> ToyBackend:
    """A float64 random toy decoder whose outputs depend on every position and key."""
    backend = cls(TOY_STUDENT, toy_tokenizer(), model_id="toy-student", seed=11)
    with torch.no_grad():
        for name, param in backend.module.named_parameters():
            if "norm" not in name:
                param.mul_(SHARPEN)
    backend.module.double()
    return backend


@pytest.fixture(scope="module")
def student() -> ToyBackend:
    return _sharpened()


class FirstTurnToolCall(ToyBackend):
    """The real decoder, with turn 0 steered into a calculator tool call by a logit bias.

    The bias follows a script by step count (prefill = step 0) and only while every prompt
    of the call is a first turn (one assistant header), so later turns are the decoder's
    own samples over a transcript that holds a real tool call and its real result.
    """

    def _script_for(self, prompts) -> list[int]:
        header = self.tokenizer.encode(ASSISTANT_HEADER)
        first = all(_count(p, header) == 1 for p in prompts)
        return self.tokenizer.encode(tool_call_text("2 + 3")) if first else []

    def generate(self, prompt_ids, **kwargs):
        self._script, self._k = self._script_for([prompt_ids]), 0
        return super().generate(prompt_ids, **kwargs)

    def generate_batch(self, prompts, **kwargs):
        self._script, self._k, self._rows = self._script_for(prompts), 0, len(prompts)
        return super().generate_batch(prompts, **kwargs)

    def _steer(self, logits: torch.Tensor) -> torch.Tensor:
        if self._k < len(self._script):
            logits = logits.clone()
            logits[..., self._script[self._k]] += 1e4
        self._k += 1
        return logits

    def _step(self, input_ids, cache):
        logits, cache = super()._step(input_ids, cache)
        return self._steer(logits), cache

    def _batch_step(self, input_ids, key_mask, positions, cache):
        logits, cache = super()._batch_step(input_ids, key_mask, positions, cache)
        if input_ids.shape[0] < self._rows:
            return logits, cache  # the shared-prefix forward samples nothing
        return self._steer(logits), cache


def _count(ids: list[int], sub: list[int]) -> int:
    return sum(ids[i : i + len(sub)] == sub for i in range(len(ids) - len(sub) + 1))


def _requests(n: int) -> list[EpisodeRequest]:
    return [EpisodeRequest(t, 300 + i) for i, t in enumerate(calculator_tasks(n, seed=9))]


def _dump(trajectories) -> list[dict]:
    return [t.model_dump(mode="json") for t in trajectories]


def _three_paths(backend: ToyBackend, requests, temperature: float, batch_size: int | None):
    incremental = RolloutRunner(backend, calculator(), CONFIG)
    full = RolloutRunner(backend, calculator(), CONFIG, incremental_prefill=False)
    sequential = [incremental.rollout(r.task, r.seed, temperature=temperature) for r in requests]
    return (
        incremental.rollout_batch(requests, batch_size=batch_size, temperature=temperature),
        full.rollout_batch(requests, batch_size=batch_size, temperature=temperature),
        sequential,
    )


@pytest.mark.parametrize(("temperature", "batch_size"), [(0.0, None), (1.0, None), (1.0, 5)])
def test_incremental_equals_full_reprefill_equals_sequential(
    student: ToyBackend, temperature: float, batch_size: int | None
) -> None:
    incremental, full, sequential = _three_paths(student, _requests(10), temperature, batch_size)
    assert _dump(incremental) == _dump(full) == _dump(sequential)
    assert sum(len(t.turns) >= 3 for t in sequential) >= len(sequential) // 2


def test_tool_call_episodes_equal_on_all_three_paths() -> None:
    backend = _sharpened(FirstTurnToolCall)
    incremental, full, sequential = _three_paths(backend, _requests(8), 1.0, None)
    assert _dump(incremental) == _dump(full) == _dump(sequential)
    for trajectory in sequential:
        assert trajectory.turns[0].tool_call is not None
        assert trajectory.turns[0].tool_call.name == "calculator"
        assert trajectory.turns[0].tool_result is not None and trajectory.turns[0].tool_result.ok
    assert sum(len(t.turns) >= 3 for t in sequential) >= 4
    assert any(s.span_type == SpanType.TOOL_RESULT for t in sequential for s in t.spans)


def test_generate_batch_across_calls_with_dropping_rows(student: ToyBackend) -> None:
    """Rows leave between calls, a fresh prompt joins, observations differ in length."""
    tok = student.tokenizer
    header = tok.encode(ASSISTANT_HEADER)
    prompts = [tok.encode(t.prompt) + header for t in calculator_tasks(7, seed=3)]
    cache = PrefixCache()
    live = list(range(6))
    for round_ in range(4):
        if round_ == 2:
            live.append(6)
        budgets = [3 + (i + round_) % 7 for i in live]
        seeds = [i + 10 * round_ for i in live]
        batch = [prompts[i] for i in live]
        kwargs = {"max_new_tokens": budgets, "seeds": seeds, "temperature": 1.0}
        warm = student.generate_batch(batch, prefix_cache=cache, **kwargs)
        cold = student.generate_batch(batch, **kwargs)
        alone = [
            student.generate(p, max_new_tokens=b, seed=s, temperature=1.0)
            for p, b, s in zip(batch, budgets, seeds, strict=True)
        ]
        assert [g.token_ids for g in warm] == [g.token_ids for g in cold]
        assert [g.token_ids for g in warm] == [g.token_ids for g in alone]
        assert [g.finish_reason for g in warm] == [g.finish_reason for g in alone]
        for i, g in zip(live, warm, strict=True):
            observation = format_observation('{"result": ' + "7" * (i + round_) + "}")
            prompts[i] = prompts[i] + g.token_ids + tok.encode(observation) + header
        live = [i for i in live if (i + round_) % 4 != 0]
    assert len(cache.prefilled_tokens) == 4


class CountingToy(ToyBackend):
    """Records, per ``generate_batch`` call, the real tokens each prefill forward ran.

    ``prefix`` is the shared-prefix forward (one row) when the call had one, ``fed`` and
    ``positions`` the per-row prefill forward after it.
    """

    def generate_batch(self, prompts, **kwargs):
        self.calls.append({"prompts": [list(p) for p in prompts], "fed": None, "prefix": None})
        results = super().generate_batch(prompts, **kwargs)
        self.calls[-1]["results"] = [list(g.token_ids) for g in results]
        return results

    def _batch_step(self, input_ids, key_mask, positions, cache):
        call = self.calls[-1]
        if call["fed"] is None:
            new = key_mask[:, -input_ids.shape[1] :]
            fed = [
                [int(t) for t, m in zip(row, mask, strict=True) if m]
                for row, mask in zip(input_ids.tolist(), new.tolist(), strict=True)
            ]
            where = [
                [int(p) for p, m in zip(row, mask, strict=True) if m]
                for row, mask in zip(positions.tolist(), new.tolist(), strict=True)
            ]
            if len(fed) < len(call["prompts"]):
                call["prefix"], call["prefix_positions"] = fed[0], where[0]
            else:
                call["fed"], call["positions"] = fed, where
        return super()._batch_step(input_ids, key_mask, positions, cache)


def _common_prefix(prompts: list[list[int]]) -> int:
    n = 0
    while n < min(map(len, prompts)) - 1 and len({p[n] for p in prompts}) == 1:
        n += 1
    return n


def test_each_round_prefills_only_the_new_tokens() -> None:
    backend = _sharpened(CountingToy)
    backend.calls = []
    requests = _requests(8)
    trajectories = RolloutRunner(backend, calculator(), CONFIG).rollout_batch(
        requests, temperature=1.0
    )
    calls = backend.calls
    assert len(calls) >= 3
    first = calls[0]["prompts"]
    shared = _common_prefix(first)
    assert shared >= 40, "every calculator episode starts with the system prompt"
    assert calls[0]["prefix"] == first[0][:shared]
    assert calls[0]["prefix_positions"] == list(range(shared))
    assert calls[0]["fed"] == [p[shared:] for p in first]
    assert calls[0]["positions"] == [list(range(shared, len(p))) for p in first]
    assert all(call["prefix"] is None for call in calls[1:])
    previous: dict[tuple[int, ...], int] = {}
    for prompt, result in zip(calls[0]["prompts"], calls[0]["results"], strict=True):
        previous[tuple(prompt + result)] = len(prompt) + len(result) - 1
    per_round = [shared + sum(len(p) - shared for p in first)]
    for call in calls[1:]:
        expected_fed, expected_positions, nxt = [], [], {}
        for prompt, result in zip(call["prompts"], call["results"], strict=True):
            cached = next(n for key, n in previous.items() if tuple(prompt[: len(key)]) == key)
            expected_fed.append(prompt[cached:])
            expected_positions.append(list(range(cached, len(prompt))))
            nxt[tuple(prompt + result)] = len(prompt) + len(result) - 1
        assert call["fed"] == expected_fed
        assert call["positions"] == expected_positions
        assert all(len(f) < len(p) // 2 for f, p in zip(call["fed"], call["prompts"], strict=True))
        per_round.append(sum(len(f) for f in call["fed"]))
        previous = nxt
    full = [sum(len(p) for p in call["prompts"]) for call in calls]
    assert sum(per_round[1:]) < sum(full[1:]) // 3
    assert max(len(t.turns) for t in trajectories) >= 3


def _shared_prefix_prompts(tok) -> list[list[int]]:
    """Prompts that all start with the calculator system prompt, one of them only one id longer.

    The shortest row caps the shared length one short of itself, so the other rows have
    more of the common ids to prefill on their own.
    """
    header = tok.encode(ASSISTANT_HEADER)
    system = tok.encode(calculator().system_prompt())
    prompts = [system + tok.encode(t.prompt) + header for t in calculator_tasks(5, seed=4)]
    return [*prompts, system[:-1]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_equals_per_row_prefill_across_rounds(
    student: ToyBackend, temperature: float
) -> None:
    tok = student.tokenizer
    header = tok.encode(ASSISTANT_HEADER)
    prompts = _shared_prefix_prompts(tok)
    shared, per_row = PrefixCache(), PrefixCache(share_prefix=False)
    expected = len(prompts[-1]) - 1
    for round_ in range(3):
        budgets = [2 + (i + round_) % 5 for i in range(len(prompts))]
        seeds = [i + 10 * round_ for i in range(len(prompts))]
        kwargs = {"max_new_tokens": budgets, "seeds": seeds, "temperature": temperature}
        warm = student.generate_batch(prompts, prefix_cache=shared, **kwargs)
        rows = student.generate_batch(prompts, prefix_cache=per_row, **kwargs)
        cold = student.generate_batch(prompts, **kwargs)
        alone = [
            student.generate(p, max_new_tokens=b, seed=s, temperature=temperature)
            for p, b, s in zip(prompts, budgets, seeds, strict=True)
        ]
        ids = [g.token_ids for g in warm]
        assert ids == [g.token_ids for g in rows] == [g.token_ids for g in cold]
        assert ids == [g.token_ids for g in alone]
        for i, g in enumerate(warm):
            observation = format_observation('{"result": ' + "3" * (1 + i) + "}")
            prompts[i] = prompts[i] + g.token_ids + tok.encode(observation) + header
    assert shared.shared_prefix_tokens == [expected, 0, 0]
    assert per_row.shared_prefix_tokens == [0, 0, 0]
    first = sum(len(p) for p in _shared_prefix_prompts(tok))
    assert per_row.prefilled_tokens[0] == first
    assert shared.prefilled_tokens[0] == first - expected * (len(prompts) - 1)
    assert shared.prefilled_tokens[1:] == per_row.prefilled_tokens[1:]


def test_shared_prefix_length_caps_and_needs_two_rows() -> None:
    from miniverl.models.sampling import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4]]) == 0
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5]]) == 3
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 4]]) == 3
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2]]) == 1
    assert shared_prefix_length([[1, 2], [2, 2]]) == 0
