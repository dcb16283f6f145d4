"""Teacher scoring in padded batches equals scoring one trajectory at a time."""

from __future__ import annotations

import pytest
import torch

from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import SelectionConfig
from miniverl.environments.base import make_splits
from miniverl.environments.registry import make_environment
from miniverl.errors import AlignmentError
from miniverl.losses import DivergenceSpec
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend, ToyModelConfig
from miniverl.selection.selectors import select_positions
from miniverl.teachers import LocalTeacherScorer
from miniverl.trajectory.alignment import build_alignment_map

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENIZER = ToyTokenizer()
SMALL = ToyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
SPEC = DivergenceSpec("forward_kl", temperature=1.0)


@pytest.fixture(scope="module")
def items():
    """Oracle trajectories of different lengths, standard and privileged renders."""
    teacher = ToyBackend(SMALL, TOKENIZER, model_id="toy-teacher", seed=5)
    with torch.no_grad():
        for name, param in teacher.module.named_parameters():
            if "norm" not in name:
                param.mul_(6.0)  # context-sensitive outputs: a row mix-up cannot hide
    env = make_environment("calculator")
    tasks = make_splits(env, {"train": 6, "eval": 0, "test": 0}, seed=7, difficulty="medium")[
        "train"
    ]
    runner = RolloutRunner(backend=teacher, environment=env)
    standard, privileged = [], []
    for k, task in enumerate(tasks):
        traj = runner.oracle_rollout(task)
        sel = select_positions(
            traj, SelectionConfig(selector="uniform_ratio", ratio=0.5), run_seed=k
        )
        standard.append((traj, build_alignment_map(traj, sel.positions, sel.weights), None))
        render = runner.privileged_render(traj, task)
        privileged.append(
            (traj, build_alignment_map(traj, sel.positions, sel.weights, teacher=render), render)
        )
    assert len({len(t.token_ids) for t, _, _ in standard}) > 1
    return teacher, standard, privileged


def _tensors(result) -> dict[str, torch.Tensor]:
    return {**result.cache_tensors(), "entropy": result.teacher_entropy}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("which", ["standard", "privileged"])
def test_score_batch_equals_score(items, dtype: torch.dtype, which: str) -> None:
    teacher, standard, privileged = items
    chosen = standard if which == "standard" else privileged
    teacher.module.to(dtype)
    try:
        scorer = LocalTeacherScorer(
            teacher, spec=SPEC, loss_mode="bucketed", top_k=8, chunk_size=16
        )
        one = [scorer.score(t, a, teacher_trajectory=v) for t, a, v in chosen]
        batched = scorer.score_batch(chosen)
    finally:
        teacher.module.float()
    assert [r.trajectory_id for r in batched] == [r.trajectory_id for r in one]
    assert [r.teacher_positions for r in batched] == [r.teacher_positions for r in one]
    for a, b in zip(one, batched, strict=True):
        ta, tb = _tensors(a), _tensors(b)
        assert torch.equal(ta["topk_indices"], tb["topk_indices"])
        for name in ("topk_log_probs", "tail_log_prob", "entropy"):
            if dtype == torch.float64:
                torch.testing.assert_close(ta[name], tb[name], rtol=0, atol=1e-12)
            else:
                torch.testing.assert_close(ta[name], tb[name], rtol=1e-5, atol=1e-5)


def test_exact_shape_and_empty_rows_batch_too(items) -> None:
    teacher, standard, _ = items
    traj = standard[0][0]
    empty = build_alignment_map(traj, [], [])
    scorer = LocalTeacherScorer(teacher, spec=SPEC, loss_mode="exact_full_vocab", top_k=1)
    results = scorer.score_batch([(traj, empty, None), *standard[:3]])
    assert results[0].num_positions == 0
    for result, (t, a, v) in zip(results[1:], standard[:3], strict=True):
        single = scorer.score(t, a, teacher_trajectory=v)
        torch.testing.assert_close(result.teacher_entropy, single.teacher_entropy)


def test_a_bad_item_fails_the_batch_before_any_compute(items) -> None:
    teacher, standard, privileged = items
    scorer = LocalTeacherScorer(teacher, spec=SPEC, loss_mode="bucketed", top_k=8)
    traj, alignment, _ = privileged[1]
    with pytest.raises(AlignmentError, match="must read the render"):
        scorer.score_batch([standard[0], (traj, alignment, None)])
