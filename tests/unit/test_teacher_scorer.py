"""LocalTeacherScorer: supervision shapes, privileged-context scoring and its refusals."""

from __future__ import annotations

import pytest
import torch

from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import SelectionConfig
from miniverl.environments.base import make_splits
from miniverl.environments.registry import make_environment
from miniverl.errors import AlignmentError, ConfigError, TokenizerMismatchError
from miniverl.losses import (
    BucketedTargetProvider,
    DivergenceSpec,
    ExactTargetProvider,
    chunked_selected_position_loss,
    teacher_entropy,
    teacher_topk_targets,
)
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend, ToyModelConfig
from miniverl.schemas.trajectory import Trajectory
from miniverl.selection.selectors import select_positions
from miniverl.teachers import LocalTeacherScorer, TeacherScoreResult
from miniverl.trajectory.alignment import build_alignment_map

TOKENIZER = ToyTokenizer()
V = TOKENIZER.vocab_size
SMALL = ToyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
SPEC = DivergenceSpec("forward_kl", temperature=1.5)


@pytest.fixture(scope="module")
def teacher() -> ToyBackend:
    return ToyBackend(SMALL, TOKENIZER, model_id="toy-teacher", seed=11)


@pytest.fixture(scope="module")
def student() -> ToyBackend:
    return ToyBackend(SMALL, TOKENIZER, model_id="toy-student", seed=3)


@pytest.fixture(scope="module")
def setup(teacher: ToyBackend):
    env = make_environment("calculator")
    task = make_splits(env, {"train": 4, "eval": 0, "test": 0}, seed=7)["train"][0]
    runner = RolloutRunner(backend=teacher, environment=env)
    trajectory = runner.oracle_rollout(task, policy_version=2)
    selection = select_positions(trajectory, SelectionConfig(), run_seed=1)
    alignment = build_alignment_map(trajectory, selection.positions, selection.weights)
    render = runner.privileged_render(trajectory, task)
    privileged = build_alignment_map(
        trajectory, selection.positions, selection.weights, teacher=render
    )
    return trajectory, alignment, render, privileged


def scorer(teacher: ToyBackend, **kwargs) -> LocalTeacherScorer:
    args = {"spec": SPEC, "loss_mode": "bucketed", "top_k": 8, "chunk_size": 7} | kwargs
    return LocalTeacherScorer(teacher, **args)


def student_loss(
    student: ToyBackend, trajectory: Trajectory, alignment, provider
) -> tuple[float, list[torch.Tensor]]:
    """Loss and student gradients through the chunked loss, as the trainer computes them."""
    for p in student.trainable_parameters():
        p.grad = None
    hidden = student.hidden_states_at(
        trajectory.token_ids, alignment.student_prediction_positions, with_grad=True
    )
    weights = torch.tensor(alignment.token_weights) / alignment.total_weight
    result = chunked_selected_position_loss(
        hidden_states=hidden,
        lm_head=student.project,
        weights=weights,
        weight_normalizer=1,
        provider=provider,
        target_token_ids=torch.tensor(alignment.target_token_ids),
        ce_weight=0.0,
        chunk_size=5,
        backward=True,
    )
    grads = [p.grad.clone() for p in student.trainable_parameters()]
    return result.loss, grads


def test_bucketed_targets_are_top_k_of_the_teacher_at_the_aligned_positions(teacher, setup) -> None:
    trajectory, alignment, _, _ = setup
    result = scorer(teacher).score(trajectory, alignment)
    assert isinstance(result, TeacherScoreResult)
    assert result.shape == "bucketed" and isinstance(result.provider, BucketedTargetProvider)
    assert result.trajectory_id == trajectory.trajectory_id and result.policy_version == 2
    assert result.num_positions == alignment.num_positions == result.provider.num_positions
    assert result.alignment_digest == alignment.digest() and result.top_k == 8
    hidden = teacher.hidden_states_at(trajectory.token_ids, alignment.teacher_prediction_positions)
    ids, log_probs, tail = teacher_topk_targets(teacher.project(hidden), 8, SPEC.temperature)
    assert torch.equal(result.provider.topk_indices, ids)
    torch.testing.assert_close(result.provider.topk_log_probs, log_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(result.provider.tail_log_prob, tail, rtol=0, atol=1e-6)
    exact_entropy = teacher_entropy(teacher.project(hidden), SPEC.temperature)
    assert result.entropy_is_lower_bound
    assert result.teacher_entropy.dtype == torch.float32 and result.teacher_entropy.shape == (
        result.num_positions,
    )
    assert bool((result.teacher_entropy <= exact_entropy + 1e-5).all())


def test_projection_chunk_size_does_not_change_the_targets(teacher, setup) -> None:
    """Up to matmul rounding: a 1-row and a many-row projection may use different kernels."""
    trajectory, alignment, _, _ = setup
    one = scorer(teacher, chunk_size=1).score(trajectory, alignment).cache_tensors()
    many = scorer(teacher, chunk_size=1000).score(trajectory, alignment).cache_tensors()
    assert torch.equal(one["topk_indices"], many["topk_indices"])
    for name in ("topk_log_probs", "tail_log_prob", "teacher_entropy"):
        torch.testing.assert_close(one[name], many[name], rtol=0, atol=1e-5)


def test_exact_hidden_keeps_hidden_states_and_full_entropy(teacher, setup) -> None:
    trajectory, alignment, _, _ = setup
    result = scorer(teacher, loss_mode="exact_full_vocab", top_k=1).score(trajectory, alignment)
    assert result.shape == "exact_hidden" and isinstance(result.provider, ExactTargetProvider)
    assert result.top_k is None and not result.entropy_is_lower_bound
    hidden = teacher.hidden_states_at(trajectory.token_ids, alignment.teacher_prediction_positions)
    assert result.provider.teacher_hidden.shape == (alignment.num_positions, SMALL.hidden_size)
    assert torch.equal(result.provider.teacher_hidden, hidden)
    torch.testing.assert_close(
        result.teacher_entropy, teacher_entropy(teacher.project(hidden), SPEC.temperature)
    )
    with pytest.raises(ConfigError, match="exact_hidden"):
        result.cache_tensors()


def test_exact_and_bucketed_with_k_equal_v_give_the_same_loss_and_gradients(
    teacher, student, setup
) -> None:
    trajectory, alignment, _, _ = setup
    exact = scorer(teacher, loss_mode="exact_full_vocab", top_k=1).score(trajectory, alignment)
    full = scorer(teacher, top_k=V).score(trajectory, alignment)
    swapped = scorer(teacher, loss_mode="exact_full_vocab", top_k=1, teacher_resident=False).score(
        trajectory, alignment
    )
    assert swapped.shape == "bucketed" and swapped.top_k == V and not swapped.entropy_is_lower_bound
    assert bool(torch.isneginf(full.provider.tail_log_prob).all())
    exact_loss, exact_grads = student_loss(student, trajectory, alignment, exact.provider)
    for other in (full, swapped):
        loss, grads = student_loss(student, trajectory, alignment, other.provider)
        assert loss == pytest.approx(exact_loss, rel=1e-5, abs=1e-7)
        for a, b in zip(grads, exact_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(
            other.teacher_entropy, exact.teacher_entropy, rtol=1e-5, atol=1e-5
        )
    assert exact_loss > 0


def test_privileged_context_scores_at_teacher_positions_of_the_render(teacher, setup) -> None:
    trajectory, _, render, privileged = setup
    assert privileged.teacher_prediction_positions != privileged.student_prediction_positions
    direct = teacher.hidden_states_at(
        render.token_ids, privileged.teacher_prediction_positions, with_grad=False
    )
    exact = scorer(teacher, loss_mode="exact_full_vocab", top_k=1).score(
        trajectory, privileged, teacher_trajectory=render
    )
    assert exact.teacher_positions == privileged.teacher_prediction_positions
    assert torch.equal(exact.provider.teacher_hidden, direct)
    at_student = teacher.hidden_states_at(render.token_ids, privileged.student_prediction_positions)
    assert not torch.equal(exact.provider.teacher_hidden, at_student)

    bucketed = scorer(teacher).score(trajectory, privileged, teacher_trajectory=render)
    ids, log_probs, _ = teacher_topk_targets(teacher.project(direct), 8, SPEC.temperature)
    assert torch.equal(bucketed.provider.topk_indices, ids)
    torch.testing.assert_close(bucketed.provider.topk_log_probs, log_probs, rtol=0, atol=1e-6)
    assert bucketed.alignment_digest == privileged.digest()


def test_a_shifted_alignment_without_its_render_is_refused(teacher, setup) -> None:
    trajectory, _, _, privileged = setup
    with pytest.raises(AlignmentError, match="teacher must read the render"):
        scorer(teacher).score(trajectory, privileged)


def test_a_target_that_does_not_follow_its_teacher_position_is_refused(teacher, setup) -> None:
    trajectory, alignment, _, _ = setup
    targets = list(alignment.target_token_ids)
    targets[3] = (targets[3] + 1) % V
    broken = alignment.model_copy(update={"target_token_ids": targets})
    with pytest.raises(AlignmentError, match="but the alignment targets"):
        scorer(teacher).score(trajectory, broken)


def test_tokenizer_mismatch_is_refused(teacher, setup) -> None:
    trajectory, alignment, render, privileged = setup
    teacher_fp = TOKENIZER.fingerprint
    foreign = trajectory.model_copy(update={"tokenizer_fingerprint": "f" * 64})
    expected = (
        rf"student and teacher tokenizers differ \(ffffffffffff vs {teacher_fp[:12]}\); "
        "miniVERL currently supports same-tokenizer distillation only"
    )
    with pytest.raises(TokenizerMismatchError, match=expected):
        scorer(teacher).score(foreign, alignment)
    with pytest.raises(TokenizerMismatchError, match=expected):
        scorer(teacher, student_fingerprint="f" * 64)
    foreign_render = render.model_copy(update={"tokenizer_fingerprint": "e" * 64})
    with pytest.raises(TokenizerMismatchError):
        scorer(teacher).score(trajectory, privileged, teacher_trajectory=foreign_render)


def test_exact_mode_with_a_swapped_teacher_is_refused_above_exact_max_vocab(teacher) -> None:
    with pytest.raises(ConfigError) as caught:
        scorer(teacher, loss_mode="exact_full_vocab", teacher_resident=False, exact_max_vocab=V - 1)
    assert f"V = {V} exceeds the {V - 1} entries" in caught.value.message
    assert "loss.mode: bucketed" in caught.value.hint
    assert "memory.strategy: resident" in caught.value.hint
    allowed = scorer(
        teacher,
        loss_mode="exact_full_vocab",
        teacher_resident=False,
        exact_max_vocab=V - 1,
        allow_large_exact=True,
    )
    assert allowed.shape == "bucketed" and allowed.top_k == V
    resident = scorer(teacher, loss_mode="exact_full_vocab", exact_max_vocab=V - 1)
    assert resident.shape == "exact_hidden"
    resident._check_exact_is_affordable(10**6)
    with pytest.raises(ConfigError, match=rf"V = {V} exceeds"):
        allowed.allow_large_exact = False
        allowed._check_exact_is_affordable(V)


def test_invalid_settings_are_config_errors(teacher) -> None:
    with pytest.raises(ConfigError, match=r"loss.top_k"):
        scorer(teacher, top_k=V + 1)
    with pytest.raises(ConfigError, match=r"loss.chunk_size"):
        scorer(teacher, chunk_size=0)
    with pytest.raises(ConfigError, match=r"loss.mode"):
        scorer(teacher, loss_mode="full")


def test_an_empty_alignment_scores_to_empty_targets(teacher, setup) -> None:
    trajectory, _, _, _ = setup
    empty = build_alignment_map(trajectory, [], [])
    result = scorer(teacher).score(trajectory, empty)
    assert result.num_positions == 0 and result.teacher_entropy_mean is None
    tensors = result.cache_tensors()
    assert tensors["topk_indices"].shape == (0, 8) and tensors["tail_log_prob"].shape == (0,)


def test_cache_tensors_are_in_the_compute_dtype(teacher, setup) -> None:
    """The scorer never applies a storage dtype; the cache converts (test_supervision_one_way)."""
    trajectory, alignment, _, _ = setup
    result = scorer(teacher).score(trajectory, alignment)
    tensors = result.cache_tensors()
    assert tensors["topk_indices"].dtype == torch.long
    assert (
        tensors["topk_log_probs"].dtype == torch.float32
        and tensors["tail_log_prob"].dtype == torch.float32
    )
    assert tensors["teacher_entropy"].dtype == torch.float32
    with pytest.raises(TypeError):
        result.cache_tensors("bfloat16")  # type: ignore[call-arg]
    provenance = scorer(teacher).cache_provenance(
        dtype="bfloat16", teacher_mode="privileged_context"
    )
    assert (provenance.top_k, provenance.vocab_size, provenance.temperature) == (
        8,
        V,
        SPEC.temperature,
    )
    assert (
        provenance.tokenizer_fingerprint == TOKENIZER.fingerprint
        and provenance.teacher_model_id == "toy-teacher"
    )
    with pytest.raises(ConfigError, match="cannot be cached"):
        scorer(teacher, loss_mode="exact_full_vocab").cache_provenance()
