"""Turn-synchronous batched rollouts equal sequential ones, episode for episode.

Two complementary checks: a real toy decoder in float64 (the batched kernels against the
sequential ones, over several turns: every id, span, mask and termination reason), and a
policy scripted per task and turn (so tool calls, finals, repeated calls, parse errors and
budget exits all occur, and each episode's tools must run against its own environment).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from helpers import (  # noqa: E402
    ScriptedBackend,
    calculator,
    calculator_tasks,
    final_text,
    tool_call_text,
    toy_tokenizer,
)
from miniverl.agent.loop import EpisodeRequest, RolloutRunner  # noqa: E402
from miniverl.config.models import RolloutConfig  # noqa: E402
from miniverl.errors import GpuMemoryError  # noqa: E402
from miniverl.models.toy import ToyBackend  # noqa: E402
from miniverl.models.toy_config import TOY_STUDENT  # noqa: E402
from miniverl.schemas.text import ASSISTANT_HEADER  # noqa: E402
from miniverl.schemas.trajectory import TerminationReason  # noqa: E402
from miniverl.training.resolve import resolve_trajectory_batch_size, split_on_oom  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHARPEN = 6.0

CONFIG = RolloutConfig(
    max_turns=3, max_new_tokens_per_turn=24, max_total_tokens=200, max_parse_errors=3
)


@pytest.fixture(scope="module")
def student() -> ToyBackend:
    """A random toy decoder with weights scaled up so its outputs depend on every position.

    At the default init (std 0.02) the logits barely depend on context, so a wrong rotary
    position or an unmasked pad would not change a single sampled id.
    """
    backend = ToyBackend(TOY_STUDENT, toy_tokenizer(), model_id="toy-student", seed=11)
    with torch.no_grad():
        for name, param in backend.module.named_parameters():
            if "norm" not in name:
                param.mul_(SHARPEN)
    return backend


def _requests(n: int) -> list[EpisodeRequest]:
    return [
        EpisodeRequest(task, 1000 + i, extra_metadata={"i": i})
        for i, task in enumerate(calculator_tasks(n, seed=5))
    ]


def _sequential(runner: RolloutRunner, requests, temperature: float):
    return [
        runner.rollout(r.task, r.seed, temperature=temperature, extra_metadata=r.extra_metadata)
        for r in requests
    ]


def _dump(trajectories) -> list[dict]:
    return [t.model_dump(mode="json") for t in trajectories]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_rollouts_equal_sequential_in_float64(
    student: ToyBackend, temperature: float
) -> None:
    student.module.double()
    try:
        runner = RolloutRunner(student, calculator(), CONFIG)
        requests = _requests(12)
        sequential = _sequential(runner, requests, temperature)
        one_batch = runner.rollout_batch(requests, temperature=temperature)
        uneven = runner.rollout_batch(requests, batch_size=5, temperature=temperature)
    finally:
        student.module.float()
    assert _dump(one_batch) == _dump(sequential)
    assert _dump(uneven) == _dump(sequential)
    assert max(len(t.turns) for t in sequential) >= 2


def test_float32_agreement_rate(student: ToyBackend, capsys: pytest.CaptureFixture[str]) -> None:
    runner = RolloutRunner(student, calculator(), CONFIG)
    requests = _requests(16)
    sequential = _sequential(runner, requests, 1.0)
    batched = runner.rollout_batch(requests, temperature=1.0)
    same = sum(a == b for a, b in zip(_dump(sequential), _dump(batched), strict=True))
    with capsys.disabled():
        print(f"\nfloat32 batched vs sequential: {same}/{len(requests)} identical episodes")
    assert same >= len(requests) * 3 // 4


def test_batch_composition_does_not_change_sampled_ids(student: ToyBackend) -> None:
    """A batch of 8 and eight batches of 1 sample the same ids (per-row generators)."""
    student.module.double()
    try:
        prompts = [r.task.prompt for r in _requests(8)]
        ids = [student.tokenizer.encode(p) for p in prompts]
        together = student.generate_batch(
            ids, max_new_tokens=[16] * 8, seeds=list(range(8)), temperature=1.0
        )
        alone = [
            student.generate_batch([p], max_new_tokens=[16], seeds=[s], temperature=1.0)[0]
            for s, p in enumerate(ids)
        ]
        reversed_rows = student.generate_batch(
            ids[::-1], max_new_tokens=[16] * 8, seeds=list(range(8))[::-1], temperature=1.0
        )[::-1]
    finally:
        student.module.float()
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [g.token_ids for g in reversed_rows] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in together}) > 1


def test_batch_size_one_is_the_sequential_path(student: ToyBackend) -> None:
    class NoBatch:
        def __init__(self, inner):
            self.inner, self.tokenizer, self.capabilities = (
                inner,
                inner.tokenizer,
                inner.capabilities,
            )

        def generate(self, *args, **kwargs):
            return self.inner.generate(*args, **kwargs)

        def trainable_parameters(self):
            return self.inner.trainable_parameters()

        def generate_batch(self, *args, **kwargs):
            raise AssertionError("batch_size=1 must not batch")

    runner = RolloutRunner(NoBatch(student), calculator(), CONFIG)
    requests = _requests(3)
    assert _dump(runner.rollout_batch(requests, batch_size=1, temperature=0.0)) == _dump(
        _sequential(RolloutRunner(student, calculator(), CONFIG), requests, 0.0)
    )


class TaskScriptedBackend(ScriptedBackend):
    """Answers by (task, turn), whatever order the calls come in; batches row by row."""

    def __init__(self, plans: dict[str, list[str]]) -> None:
        super().__init__([])
        self.plans = plans
        self.batch_calls: list[int] = []

    def generate(self, prompt_ids, *, max_new_tokens, stop_sequences=(), **kwargs):
        text = self.tokenizer.decode(list(prompt_ids))
        task = next(k for k in self.plans if k in text)
        turn = text.count(ASSISTANT_HEADER) - 1
        self.script = [self.plans[task][turn]]
        return super().generate(
            prompt_ids, max_new_tokens=max_new_tokens, stop_sequences=stop_sequences, **kwargs
        )

    def generate_batch(self, prompts, *, max_new_tokens, seeds, **kwargs):
        self.batch_calls.append(len(prompts))
        return [
            self.generate(p, max_new_tokens=m, seed=s, **kwargs)
            for p, m, s in zip(prompts, max_new_tokens, seeds, strict=True)
        ]


def test_every_exit_path_matches_sequential_with_per_episode_tools() -> None:
    tasks = calculator_tasks(6, seed=5)
    call, final = tool_call_text, final_text
    scripts = [
        [call("1 + 1"), final(tasks[0].answer)],  # tool call, then final answer
        [call("2 + 2"), call("2 + 2"), call("2 + 2")],  # repeated call limit
        ["no idea", "still no idea", "nope"],  # parse errors
        [call("3 / 0"), final("7")],  # invalid tool call, wrong final
        [call("1 + 2"), call("2 + 3"), call("3 + 4")],  # max turns
        [call("9 * 9 * 9 * 9 * 9 * 9 * 9 * 9 * 9") * 3] * 3,  # token budget
    ]
    plans = {t.prompt: plan for t, plan in zip(tasks, scripts, strict=True)}
    requests = [EpisodeRequest(t, 50 + i) for i, t in enumerate(tasks)]
    cfg = RolloutConfig(
        max_turns=3, max_new_tokens_per_turn=60, max_total_tokens=230, max_parse_errors=2
    )
    sequential_runner = RolloutRunner(TaskScriptedBackend(plans), calculator(), cfg)
    sequential = [sequential_runner.rollout(r.task, r.seed) for r in requests]
    backend = TaskScriptedBackend(plans)
    batched = RolloutRunner(backend, calculator(), cfg).rollout_batch(requests)
    assert backend.batch_calls[0] == 6 and len(backend.batch_calls) >= 2
    assert _dump(batched) == _dump(sequential)
    reasons = {t.termination_reason for t in sequential}
    assert reasons >= {
        TerminationReason.FINAL_ANSWER,
        TerminationReason.REPEATED_CALL_LIMIT,
        TerminationReason.PARSE_ERROR_LIMIT,
        TerminationReason.MAX_TURNS,
    }, reasons
    states = [s.env_state_id for s in batched[4].spans if s.env_state_id]
    assert states == ["calc:1", "calc:2", "calc:3"]


def test_budget_exits_match_with_the_real_decoder() -> None:
    """A tiny total budget ends episodes with max_tokens mid-batch."""
    tok = toy_tokenizer()
    backend = ToyBackend(TOY_STUDENT, tok, model_id="toy-student", seed=2)
    backend.module.double()
    cfg = RolloutConfig(
        max_turns=4, max_new_tokens_per_turn=30, max_total_tokens=90, max_parse_errors=3
    )
    runner = RolloutRunner(backend, calculator(), cfg)
    requests = _requests(6)
    sequential = _sequential(runner, requests, 1.0)
    assert _dump(runner.rollout_batch(requests, temperature=1.0)) == _dump(sequential)
    assert TerminationReason.MAX_TOKENS in {t.termination_reason for t in sequential}


# -- memory: batches that do not fit are split and recorded ------------------------------


class _Events:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict]] = []

    def emit(self, kind: str, echo: str | None = None, **fields) -> None:
        self.records.append((kind, fields))


def test_split_on_oom_halves_until_it_fits_and_records_it() -> None:
    seen: list[int] = []

    def fn(items: list[int]) -> list[int]:
        seen.append(len(items))
        if len(items) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return [x * 10 for x in items]

    events = _Events()
    assert split_on_oom(fn, list(range(7)), what="rollout", events=events) == [
        x * 10 for x in range(7)
    ]
    assert seen == [7, 3, 1, 2, 4, 2, 2]
    assert [f["split_into"] for _, f in events.records] == [[3, 4], [1, 2], [2, 2]]
    with pytest.raises(GpuMemoryError, match="single rollout"):
        split_on_oom(
            lambda items: (_ for _ in ()).throw(RuntimeError("out of memory")), [1], what="rollout"
        )
    with pytest.raises(ValueError, match="boom"):
        split_on_oom(
            lambda items: (_ for _ in ()).throw(ValueError("boom")), [1, 2], what="rollout"
        )


def test_trajectory_batch_size_resolution() -> None:
    common = dict(group_size=8, max_total_tokens=768, hidden_size=896, num_layers=24)
    assert resolve_trajectory_batch_size("auto", device="cpu", **common)[0] == 8
    assert resolve_trajectory_batch_size(3, device="cpu", **common) == (3, "requested: 3")
    rows, reason = resolve_trajectory_batch_size("auto", device="cuda:0", free_gib=8.0, **common)
    per_row = 4 * 768 * 24 * 896 * 24
    assert rows == int(8 * (1 << 30) / 2 // per_row) == 2 and "half the free memory" in reason
    assert resolve_trajectory_batch_size("auto", device="cuda:0", free_gib=0.5, **common)[0] == 1
    assert resolve_trajectory_batch_size("auto", device="cuda:0", free_gib=80.0, **common)[0] == 8


def test_rollout_batch_uses_the_splitter(student: ToyBackend) -> None:
    runner = RolloutRunner(student, calculator(), CONFIG)
    requests = _requests(4)
    sizes: list[int] = []

    def split(decode, items):
        sizes.append(len(items))
        return [out for item in items for out in decode([item])]

    student.module.double()
    try:
        split_run = runner.rollout_batch(requests, temperature=1.0, split=split)
        plain = runner.rollout_batch(requests, temperature=1.0)
    finally:
        student.module.float()
    assert sizes and sizes[0] == 4
    assert _dump(split_run) == _dump(plain)


def test_episode_request_is_frozen() -> None:
    request = _requests(1)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.seed = 3  # type: ignore[misc]


def test_batched_episodes_keep_the_per_task_turn_budget() -> None:
    """calc_chain caps each episode at k + 3 turns; the batched path must cap each row alike."""
    from miniverl.environments.calc_chain import generate_tasks
    from miniverl.environments.registry import make_environment

    tasks = [generate_tasks("test", 1, 5, (k,))[0] for k in (1, 4)]
    plans = {t.prompt: [tool_call_text(f"{i} + 1") for i in range(20)] for t in tasks}
    cfg = RolloutConfig(max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900)
    requests = [EpisodeRequest(t, 7 + i) for i, t in enumerate(tasks)]
    backend = TaskScriptedBackend(plans)
    batched = RolloutRunner(backend, make_environment("calc_chain"), cfg).rollout_batch(requests)
    assert backend.batch_calls[0] == 2
    assert [len(t.turns) for t in batched] == [1 + 3, 4 + 3]
    assert {t.termination_reason for t in batched} == {TerminationReason.MAX_TURNS}
