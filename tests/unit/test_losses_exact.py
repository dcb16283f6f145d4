"""Full-vocabulary divergences against an independent float64 brute force.

The reference below never calls the library: it builds log-probabilities and divergences
with explicit sums over the vocabulary, one row and one token at a time, skipping terms
whose weight is exactly zero. Gradients of the library are compared with
``torch.autograd`` run through that reference. Every loss path is checked against it: the
fused closed forms, the fused general terms, and autograd through the plain definitions of
``miniverl.losses.divergences`` (the readable definition of each divergence).
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import LOSS_PATHS, force_loss_path
from miniverl.errors import ConfigError
from miniverl.losses import (
    DIVERGENCE_NAMES,
    DivergenceSpec,
    ExactTargetProvider,
    entropy_aware,
    exact_divergence,
    forward_kl,
    jsd,
    normalize_trajectory_weights,
    reverse_kl,
    sampled_token_nll,
    teacher_entropy,
)

NEG_INF = float("-inf")
DIVERGENCES = DIVERGENCE_NAMES


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- brute-force reference


def ref_log_probs(z: torch.Tensor, tau: float) -> list[torch.Tensor]:
    """log softmax(z / τ) of one row, token by token; -inf logits stay -inf."""
    x = [z[v] / tau for v in range(z.shape[0])]
    top = max(float(xv.detach()) for xv in x)
    total = sum(torch.exp(xv - top) for xv in x if float(xv.detach()) != NEG_INF)
    log_total = top + torch.log(total)
    return [xv - log_total for xv in x]


def ref_kl(log_p: list[torch.Tensor], log_q: list[torch.Tensor]) -> torch.Tensor:
    """KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v)), terms with p(v) = 0 omitted."""
    total = torch.zeros((), dtype=torch.float64)
    for lp, lq in zip(log_p, log_q, strict=True):
        if float(lp.detach()) != NEG_INF:
            total = total + torch.exp(lp) * (lp - lq)
    return total


def ref_entropy(log_p: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for lp in log_p:
        if float(lp.detach()) != NEG_INF:
            total = total - torch.exp(lp) * lp
    return total


def ref_from_log_probs(
    ls: list[torch.Tensor], lt: list[torch.Tensor], spec: DivergenceSpec
) -> torch.Tensor:
    if spec.name == "forward_kl":
        return ref_kl(lt, ls)
    if spec.name == "reverse_kl":
        return ref_kl(ls, lt)
    if spec.name == "jsd":
        beta = spec.jsd_beta
        lm = [
            torch.log(beta * torch.exp(a) + (1 - beta) * torch.exp(b))
            for a, b in zip(lt, ls, strict=True)
        ]
        return beta * ref_kl(lt, lm) + (1 - beta) * ref_kl(ls, lm)
    if spec.name == "entropy_aware":
        reverse = ref_kl(ls, lt)
        if float(ref_entropy(lt).detach()) > spec.entropy_threshold:
            return reverse + spec.entropy_forward_weight * ref_kl(lt, ls)
        return reverse
    raise AssertionError(f"no brute-force reference for divergence {spec.name!r}: add one")


def ref_divergence(
    student: torch.Tensor, teacher: torch.Tensor, spec: DivergenceSpec
) -> torch.Tensor:
    """``[N]`` reference divergences, differentiable w.r.t. ``student`` (float64)."""
    rows = []
    for i in range(student.shape[0]):
        ls = ref_log_probs(student[i], spec.temperature)
        lt = ref_log_probs(teacher[i].detach(), spec.temperature)
        rows.append(ref_from_log_probs(ls, lt, spec))
    return torch.stack(rows)


# ---------------------------------------------------------------- inputs


def make_case(
    case: str, n: int = 5, vocab: int = 11, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2
    teacher = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2
    if case == "extreme":
        signs = torch.randint(0, 2, (n, vocab), generator=g).to(torch.float64) * 2 - 1
        student = 80 * signs + torch.randn(n, vocab, generator=g, dtype=torch.float64)
        teacher = -80 * signs.roll(1, dims=1) + torch.randn(
            n, vocab, generator=g, dtype=torch.float64
        )
        teacher[0] = torch.linspace(-80, 80, vocab, dtype=torch.float64)
    elif case == "one_hot_teacher":
        teacher = torch.zeros(n, vocab, dtype=torch.float64)
        teacher[torch.arange(n), torch.arange(n) % vocab] = 40.0
    return student, teacher


def spec_for(name: str, tau: float = 1.0, **kwargs: float) -> DivergenceSpec:
    kwargs.setdefault("entropy_threshold", 1.2)
    return DivergenceSpec(name, temperature=tau, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- values and gradients


@pytest.mark.parametrize("path", LOSS_PATHS)
@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("case", ["random", "extreme", "one_hot_teacher"])
@pytest.mark.parametrize("tau", [1.0, 0.5, 2.5])
def test_exact_matches_brute_force_values_and_gradients(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str, case: str, tau: float
) -> None:
    """Every code path: the closed forms used for all-finite blocks, the masked general
    form used when a block holds a zero probability (forced here), and the plain
    definition through autograd."""
    force_loss_path(monkeypatch, name, path)
    student, teacher = make_case(case)
    spec = spec_for(name, tau, jsd_beta=0.3)
    upstream = torch.linspace(0.5, 2.0, student.shape[0], dtype=torch.float64)

    mine_in = student.clone().requires_grad_()
    out = exact_divergence(mine_in, teacher, spec)
    (out.divergence @ upstream).backward()

    ref_in = student.clone().requires_grad_()
    expected = ref_divergence(ref_in, teacher, spec)
    (expected @ upstream).backward()

    torch.testing.assert_close(out.divergence.detach(), expected.detach(), rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(mine_in.grad, ref_in.grad, rtol=1e-8, atol=1e-11)
    expected_entropy = torch.stack(
        [ref_entropy(ref_log_probs(teacher[i], tau)) for i in range(teacher.shape[0])]
    )
    torch.testing.assert_close(out.teacher_entropy, expected_entropy, rtol=1e-9, atol=1e-11)
    assert torch.equal(out.high_entropy, expected_entropy > spec.entropy_threshold)
    assert out.entropy_is_lower_bound is False
    assert bool((out.divergence >= 0).all())


def test_named_functions_equal_exact_divergence() -> None:
    student, teacher = make_case("random", seed=3)
    torch.testing.assert_close(
        forward_kl(student, teacher, 0.7),
        ref_divergence(student, teacher, spec_for("forward_kl", 0.7)),
    )
    torch.testing.assert_close(
        reverse_kl(student, teacher, 0.7),
        ref_divergence(student, teacher, spec_for("reverse_kl", 0.7)),
    )
    torch.testing.assert_close(
        jsd(student, teacher, 0.7, beta=0.2),
        ref_divergence(student, teacher, spec_for("jsd", 0.7, jsd_beta=0.2)),
    )
    torch.testing.assert_close(
        entropy_aware(student, teacher, 0.7, threshold=1.5, forward_weight=0.25),
        ref_divergence(
            student,
            teacher,
            spec_for("entropy_aware", 0.7, entropy_threshold=1.5, entropy_forward_weight=0.25),
        ),
    )


def test_teacher_entropy_matches_brute_force() -> None:
    _, teacher = make_case("extreme")
    expected = torch.stack(
        [ref_entropy(ref_log_probs(teacher[i], 1.3)) for i in range(teacher.shape[0])]
    )
    torch.testing.assert_close(teacher_entropy(teacher, 1.3), expected, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- jsd


def test_jsd_closed_form_at_half() -> None:
    student, teacher = make_case("random", seed=7)
    mine = jsd(student, teacher, 1.0, beta=0.5)
    for i in range(student.shape[0]):
        p_s = torch.softmax(student[i], -1).tolist()
        p_t = torch.softmax(teacher[i], -1).tolist()
        closed = 0.5 * sum(
            a * math.log(2 * a / (a + b)) for a, b in zip(p_t, p_s, strict=True)
        ) + 0.5 * sum(b * math.log(2 * b / (a + b)) for a, b in zip(p_t, p_s, strict=True))
        assert float(mine[i]) == pytest.approx(closed, rel=1e-10, abs=1e-13)
        assert float(mine[i]) <= math.log(2)


def test_jsd_tends_to_forward_kl_and_reverse_kl() -> None:
    student, teacher = make_case("random", seed=11)
    fwd = forward_kl(student, teacher)
    rev = reverse_kl(student, teacher)
    steps = (1e-4, 1e-6, 1e-8)
    errors_forward = [
        ((jsd(student, teacher, beta=b) / b - fwd).abs() / fwd).max().item() for b in steps
    ]
    errors_reverse = [
        ((jsd(student, teacher, beta=1 - e) / e - rev).abs() / rev).max().item() for e in steps
    ]
    for errors in (errors_forward, errors_reverse):
        assert errors[2] < 1e-6
        # First-order convergence: two decades of β buy two decades of error.
        assert 50 < errors[0] / errors[1] < 200
        assert 50 < errors[1] / errors[2] < 200


# ---------------------------------------------------------------- special inputs


@pytest.mark.parametrize("path", LOSS_PATHS)
@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_identical_inputs_give_zero_and_zero_gradient(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str, tau: float
) -> None:
    force_loss_path(monkeypatch, name, path)
    logits, _ = make_case("extreme", seed=5)
    student = logits.clone().requires_grad_()
    out = exact_divergence(student, logits.clone(), spec_for(name, tau))
    out.divergence.sum().backward()
    assert torch.allclose(
        out.divergence.detach(), torch.zeros(logits.shape[0], dtype=torch.float64), atol=1e-12
    )
    assert torch.allclose(student.grad, torch.zeros_like(logits), atol=1e-12)


@pytest.mark.parametrize("path", LOSS_PATHS)
@pytest.mark.parametrize("name", ["forward_kl", "jsd"])
def test_minus_inf_teacher_logits_contribute_zero(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str
) -> None:
    force_loss_path(monkeypatch, name, path)
    student, teacher = make_case("random", seed=2)
    teacher[:, 3] = NEG_INF
    teacher[1, 5:] = NEG_INF
    spec = spec_for(name, 0.8)
    mine_in = student.clone().requires_grad_()
    out = exact_divergence(mine_in, teacher, spec)
    out.divergence.sum().backward()
    ref_in = student.clone().requires_grad_()
    expected = ref_divergence(ref_in, teacher, spec)
    expected.sum().backward()
    assert bool(torch.isfinite(out.divergence).all()) and bool(torch.isfinite(mine_in.grad).all())
    torch.testing.assert_close(out.divergence.detach(), expected.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(mine_in.grad, ref_in.grad, rtol=1e-8, atol=1e-12)
    assert bool(torch.isfinite(out.teacher_entropy).all())


@pytest.mark.parametrize("path", LOSS_PATHS)
@pytest.mark.parametrize("name", DIVERGENCES)
def test_tokens_impossible_on_both_sides_contribute_zero(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str
) -> None:
    """Ids that neither model can emit (``-inf`` logits on both sides, e.g. a padded
    vocabulary) drop out of every divergence, and their gradient is 0, not NaN."""
    force_loss_path(monkeypatch, name, path)
    student, teacher = make_case("random", seed=13)
    student[:, [2, 7]] = NEG_INF
    teacher[:, [2, 7]] = NEG_INF
    spec = spec_for(name, 0.8, jsd_beta=0.4)
    mine_in = student.clone().requires_grad_()
    out = exact_divergence(mine_in, teacher, spec)
    out.divergence.sum().backward()
    ref_in = student.clone().requires_grad_()
    expected = ref_divergence(ref_in, teacher, spec)
    expected.sum().backward()
    torch.testing.assert_close(out.divergence.detach(), expected.detach(), rtol=1e-9, atol=1e-12)
    assert bool(torch.isfinite(mine_in.grad).all())
    assert torch.equal(mine_in.grad[:, [2, 7]], torch.zeros(5, 2, dtype=torch.float64))
    torch.testing.assert_close(mine_in.grad, ref_in.grad, rtol=1e-8, atol=1e-12)


def test_reverse_kl_against_zero_probability_teacher_is_infinite_not_nan() -> None:
    student, teacher = make_case("random", seed=2)
    teacher[0, 3] = NEG_INF
    value = reverse_kl(student, teacher)
    assert math.isinf(float(value[0])) and float(value[0]) > 0
    assert bool(torch.isfinite(value[1:]).all())


@pytest.mark.parametrize("name", DIVERGENCES)
def test_float32_extreme_logits_stay_finite_and_accurate(name: str) -> None:
    student, teacher = make_case("extreme", seed=4)
    spec = spec_for(name, 1.0)
    got = exact_divergence(student.float().requires_grad_(), teacher.float(), spec).divergence
    assert got.dtype == torch.float32
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(
        got.double(), ref_divergence(student, teacher, spec), rtol=1e-5, atol=1e-4
    )


def test_zero_upstream_gradient_on_infinite_row_gives_zero_not_nan() -> None:
    student, teacher = make_case("random", seed=2)
    teacher[0, 3] = NEG_INF
    mine = student.clone().requires_grad_()
    value = reverse_kl(mine, teacher)
    torch.where(torch.arange(5) == 0, 0.0, value).sum().backward()
    assert bool(torch.isfinite(mine.grad).all())
    assert torch.equal(mine.grad[0], torch.zeros_like(mine.grad[0]))


# ---------------------------------------------------------------- entropy-aware mixing


def test_entropy_aware_is_reverse_below_threshold_and_adds_forward_above() -> None:
    g = torch.Generator().manual_seed(9)
    student = torch.randn(6, 12, generator=g, dtype=torch.float64)
    teacher = torch.randn(6, 12, generator=g, dtype=torch.float64) * 0.3
    teacher[:3, 0] += 12.0
    h = float(teacher_entropy(teacher).sort().values[2:4].mean())
    alpha = 0.7
    spec = spec_for("entropy_aware", 1.0, entropy_threshold=h, entropy_forward_weight=alpha)
    out = exact_divergence(student, teacher, spec)
    entropy = teacher_entropy(teacher)
    low, high = entropy <= h, entropy > h
    assert int(low.sum()) == 3 and int(high.sum()) == 3
    torch.testing.assert_close(
        out.divergence[low], reverse_kl(student, teacher)[low], rtol=1e-12, atol=0
    )
    torch.testing.assert_close(
        out.divergence[high],
        (reverse_kl(student, teacher) + alpha * forward_kl(student, teacher))[high],
        rtol=1e-12,
        atol=0,
    )
    assert torch.equal(out.high_entropy, high)


# ---------------------------------------------------------------- teacher never gets gradient


def test_no_gradient_reaches_teacher_tensors() -> None:
    student, teacher = make_case("random")
    student.requires_grad_()
    teacher.requires_grad_()
    for name in DIVERGENCES:
        exact_divergence(student, teacher, spec_for(name)).divergence.sum().backward()
    assert teacher.grad is None
    assert student.grad is not None

    head = torch.nn.Linear(4, 11, bias=False, dtype=torch.float64)
    hidden = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    provider = ExactTargetProvider(hidden, head, spec_for("jsd"))
    logits = torch.randn(5, 11, dtype=torch.float64, requires_grad=True)
    provider.divergence(logits, 0, 5).divergence.sum().backward()
    assert head.weight.grad is None and hidden.grad is None
    assert logits.grad is not None


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input_is_computed_in_float32(dtype: torch.dtype) -> None:
    student, teacher = make_case("random", seed=6)
    student_low = student.to(dtype).requires_grad_()
    teacher_low = teacher.to(dtype)
    spec = spec_for("reverse_kl", 0.9)
    out = exact_divergence(student_low, teacher_low, spec)
    assert out.divergence.dtype == torch.float32 and out.teacher_entropy.dtype == torch.float32
    upcast = student_low.detach().float().requires_grad_()
    reference = exact_divergence(upcast, teacher_low.float(), spec)
    assert torch.equal(out.divergence.detach(), reference.divergence.detach())
    out.divergence.sum().backward()
    reference.divergence.sum().backward()
    assert student_low.grad.dtype == dtype
    assert torch.equal(student_low.grad, upcast.grad.to(dtype))
    torch.testing.assert_close(
        out.divergence.double(),
        ref_divergence(student_low.double(), teacher_low.double(), spec),
        rtol=1e-5,
        atol=1e-6,
    )


def test_float64_input_is_computed_in_float64() -> None:
    student, teacher = make_case("random")
    assert forward_kl(student, teacher).dtype == torch.float64
    assert forward_kl(student.float(), teacher.float()).dtype == torch.float32


# ---------------------------------------------------------------- sampled-token NLL


def test_sampled_token_nll_matches_brute_force() -> None:
    student, _ = make_case("extreme", seed=8)
    targets = torch.tensor([0, 3, 10, 4, 7])
    mine_in = student.clone().requires_grad_()
    nll = sampled_token_nll(mine_in, targets)
    (nll * torch.arange(1.0, 6.0, dtype=torch.float64)).sum().backward()
    ref_in = student.clone().requires_grad_()
    expected = torch.stack([-ref_log_probs(ref_in[i], 1.0)[int(targets[i])] for i in range(5)])
    (expected * torch.arange(1.0, 6.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(nll.detach(), expected.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mine_in.grad, ref_in.grad, rtol=1e-9, atol=1e-12)


def test_sampled_token_nll_rejects_out_of_range_targets() -> None:
    with pytest.raises(ValueError, match="target token ids"):
        sampled_token_nll(torch.zeros(2, 4), torch.tensor([0, 4]))


def test_backward_twice_is_refused_with_a_clear_message() -> None:
    student, teacher = make_case("random")
    student.requires_grad_()
    total = forward_kl(student, teacher).sum()
    total.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        total.backward()


# ---------------------------------------------------------------- spec validation


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "kl"},
        {"name": "forward_kl", "temperature": 0.0},
        {"name": "forward_kl", "temperature": float("inf")},
        {"name": "jsd", "jsd_beta": 0.0},
        {"name": "jsd", "jsd_beta": 1.0},
        {"name": "entropy_aware", "entropy_threshold": -0.1},
        {"name": "entropy_aware", "entropy_forward_weight": -1.0},
    ],
)
def test_divergence_spec_rejects_invalid_settings(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        DivergenceSpec(**kwargs)


def test_divergence_spec_ignores_beta_outside_jsd_and_is_frozen() -> None:
    spec = DivergenceSpec("forward_kl", jsd_beta=0.0)
    with pytest.raises(AttributeError):
        spec.temperature = 2.0  # type: ignore[misc]


# ---------------------------------------------------------------- weight normalisation


def test_normalize_trajectory_weights_rows_sum_to_one_and_zero_rows_stay_zero() -> None:
    rows = normalize_trajectory_weights(
        [[1.0, 3.0], torch.tensor([2.0, 2.0, 4.0], dtype=torch.float64), [0.0, 0.0], []]
    )
    assert rows[0].tolist() == [0.25, 0.75]
    assert rows[1].dtype == torch.float64 and rows[1].tolist() == [0.25, 0.25, 0.5]
    assert rows[2].tolist() == [0.0, 0.0]
    assert rows[3].numel() == 0
    with pytest.raises(ValueError):
        normalize_trajectory_weights([[1.0, -1.0]])


# ---------------------------------------------------------------- row blocking


@pytest.mark.parametrize("rows_per_block", [1, 2])
def test_row_blocking_does_not_change_values_or_gradients(
    monkeypatch: pytest.MonkeyPatch, rows_per_block: int
) -> None:
    """Vocabulary work runs in blocks of rows; tiny blocks must give identical results,
    also when finite blocks and blocks with ``-inf`` teacher logits alternate."""
    from miniverl.losses import bucketed_divergence, numerics, teacher_topk_targets

    student, teacher = make_case("extreme", n=5, vocab=11, seed=12)
    teacher[1, 4] = NEG_INF
    targets = torch.tensor([1, 0, 10, 3, 7])

    def run_all() -> list[torch.Tensor]:
        results = []
        for name in DIVERGENCES:
            spec = spec_for(name, 0.9)
            exact_in = student.clone().requires_grad_()
            exact = exact_divergence(exact_in, teacher, spec)
            exact.divergence.sum().backward()
            ids, log_probs, tail = teacher_topk_targets(teacher, 4, 0.9)
            bucket_in = student.clone().requires_grad_()
            bucketed = bucketed_divergence(bucket_in, ids, log_probs, tail, spec)
            bucketed.divergence.sum().backward()
            results += [exact.divergence.detach(), exact.teacher_entropy, exact_in.grad]
            results += [ids.double(), log_probs, tail, bucketed.divergence.detach(), bucket_in.grad]
        nll_in = student.clone().requires_grad_()
        sampled_token_nll(nll_in, targets).sum().backward()
        return [*results, nll_in.grad, teacher_entropy(teacher, 0.9)]

    default = run_all()
    monkeypatch.setattr(numerics, "_CPU_BLOCK_ELEMENTS", rows_per_block * 11)
    blocked = run_all()
    for a, b in zip(default, blocked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, equal_nan=True)
