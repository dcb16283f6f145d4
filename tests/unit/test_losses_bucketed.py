"""Top-k + tail targets and the bucketed divergence against an independent float64 brute force.

The reference merges probabilities into buckets with explicit sums over the vocabulary and
computes the divergence between the two (K + 1)-point distributions term by term. The fused
path and autograd through the plain definitions (``miniverl.losses.divergences``, applied to
the projected buckets) are both checked against it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import force_loss_path
from miniverl.errors import ConfigError
from miniverl.losses import (
    DIVERGENCE_NAMES,
    BucketedTargetProvider,
    ConcatenatedTargetProvider,
    DivergenceSpec,
    ExactTargetProvider,
    bucket_entropy,
    bucketed_divergence,
    concat_providers,
    exact_divergence,
    teacher_entropy,
    teacher_topk_targets,
)

NEG_INF = float("-inf")
DIVERGENCES = DIVERGENCE_NAMES
PATHS = ("fused", "plain")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- brute-force reference


def ref_probs(z: torch.Tensor, tau: float) -> list[torch.Tensor]:
    x = [z[v] / tau for v in range(z.shape[0])]
    top = max(float(xv.detach()) for xv in x)
    weights = [
        torch.exp(xv - top)
        if float(xv.detach()) != NEG_INF
        else torch.zeros((), dtype=torch.float64)
        for xv in x
    ]
    total = sum(weights)
    return [w / total for w in weights]


def ref_buckets(probs: list[torch.Tensor], ids: list[int]) -> list[torch.Tensor]:
    """[P(id_1), ..., P(id_K), P(rest)] with the tail summed token by token."""
    chosen = set(ids)
    tail = sum(
        (probs[v] for v in range(len(probs)) if v not in chosen),
        torch.zeros((), dtype=torch.float64),
    )
    return [probs[v] for v in ids] + [tail]


def ref_kl(p: list[torch.Tensor], q: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for a, b in zip(p, q, strict=True):
        if float(a.detach()) > 0:
            total = total + a * (torch.log(a) - torch.log(b))
    return total


def ref_entropy(p: list[torch.Tensor]) -> torch.Tensor:
    return -sum(
        (a * torch.log(a) for a in p if float(a.detach()) > 0), torch.zeros((), dtype=torch.float64)
    )


def ref_divergence_between(
    ps: list[torch.Tensor], pt: list[torch.Tensor], spec: DivergenceSpec
) -> torch.Tensor:
    if spec.name == "forward_kl":
        return ref_kl(pt, ps)
    if spec.name == "reverse_kl":
        return ref_kl(ps, pt)
    if spec.name == "jsd":
        b = spec.jsd_beta
        m = [b * a + (1 - b) * c for a, c in zip(pt, ps, strict=True)]
        return b * ref_kl(pt, m) + (1 - b) * ref_kl(ps, m)
    if spec.name == "entropy_aware":
        value = ref_kl(ps, pt)
        if float(ref_entropy(pt).detach()) > spec.entropy_threshold:
            value = value + spec.entropy_forward_weight * ref_kl(pt, ps)
        return value
    raise AssertionError(f"no brute-force reference for divergence {spec.name!r}: add one")


def ref_bucketed(
    student: torch.Tensor, teacher: torch.Tensor, ids: torch.Tensor, spec: DivergenceSpec
) -> torch.Tensor:
    rows = []
    for i in range(student.shape[0]):
        row_ids = [int(v) for v in ids[i]]
        ps = ref_buckets(ref_probs(student[i], spec.temperature), row_ids)
        pt = ref_buckets(ref_probs(teacher[i], spec.temperature), row_ids)
        rows.append(ref_divergence_between(ps, pt, spec))
    return torch.stack(rows)


def ref_topk(z: torch.Tensor, k: int) -> list[int]:
    values = z.tolist()
    return sorted(range(len(values)), key=lambda v: (-values[v], v))[:k]


def make_logits(
    n: int, vocab: int, seed: int, scale: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale,
        torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale,
    )


def spec_for(name: str, tau: float = 1.0) -> DivergenceSpec:
    return DivergenceSpec(
        name, temperature=tau, jsd_beta=0.35, entropy_threshold=1.0, entropy_forward_weight=0.6
    )  # type: ignore[arg-type]


# ---------------------------------------------------------------- teacher_topk_targets


def test_topk_targets_match_brute_force_with_ties_lower_id_first() -> None:
    teacher = torch.tensor(
        [
            [1.0, 3.0, 3.0, 0.0, 3.0, 2.0, 3.0],
            [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0],
            [0.0, -1.0, 2.0, 2.0, 9.0, -3.0, 2.0],
        ],
        dtype=torch.float64,
    )
    for k in range(1, 8):
        ids, log_probs, tail = teacher_topk_targets(teacher, k, temperature=0.7)
        assert ids.dtype == torch.long and log_probs.dtype == torch.float64
        for i in range(teacher.shape[0]):
            expected_ids = ref_topk(teacher[i], k)
            assert ids[i].tolist() == expected_ids
            probs = ref_probs(teacher[i], 0.7)
            expected_log_probs = [math.log(float(probs[v])) for v in expected_ids]
            assert log_probs[i].tolist() == pytest.approx(expected_log_probs, rel=1e-12, abs=1e-12)
            rest = sum(float(probs[v]) for v in range(7) if v not in expected_ids)
            if k == 7:
                assert tail[i].item() == NEG_INF
            else:
                assert tail[i].item() == pytest.approx(math.log(rest), rel=1e-12)


def test_topk_targets_are_float32_for_low_precision_teachers_and_ties_resolve_in_bf16() -> None:
    g = torch.Generator().manual_seed(1)
    teacher = (torch.randint(-3, 4, (4, 50), generator=g) * 0.25).to(torch.bfloat16)
    ranked = teacher.float().sort(dim=-1, descending=True).values
    assert bool((ranked[:, 11] == ranked[:, 12]).all())  # ties straddle the top-12 boundary
    ids, log_probs, tail = teacher_topk_targets(teacher, 12)
    assert log_probs.dtype == torch.float32 and tail.dtype == torch.float32
    for i in range(4):
        assert ids[i].tolist() == ref_topk(teacher[i].float(), 12)


def test_tail_is_finite_and_accurate_when_topk_mass_is_one_minus_1e9() -> None:
    vocab, k = 40, 4
    rest = vocab - k
    # Top-k logits 0 (mass ~k); the rest share mass 1e-9 of the total.
    filler = math.log(1e-9 * k / (rest * (1 - 1e-9)))
    teacher = torch.full((2, vocab), filler, dtype=torch.float64)
    teacher[:, :k] = 0.0
    for dtype in (torch.float64, torch.float32):
        _, log_probs, tail = teacher_topk_targets(teacher.to(dtype), k)
        assert math.isfinite(tail[0].item())
        tolerance = 1e-12 if dtype == torch.float64 else 1e-5
        assert tail[0].item() == pytest.approx(math.log(1e-9), abs=tolerance)
        assert float(log_probs[0].double().exp().sum()) == pytest.approx(1 - 1e-9, abs=1e-7)
        if dtype == torch.float32:
            # What the tail must not be computed as: log1p of minus the top-k mass.
            naive = float(torch.log1p(-log_probs[0].exp().sum()))
            assert not math.isfinite(naive) or abs(naive - math.log(1e-9)) > 1.0


def test_topk_rejects_k_outside_the_vocabulary() -> None:
    with pytest.raises(ConfigError):
        teacher_topk_targets(torch.zeros(2, 5), 6)
    with pytest.raises(ConfigError):
        teacher_topk_targets(torch.zeros(2, 5), 0)


def test_bucket_entropy_is_a_lower_bound_equal_at_full_k() -> None:
    _, teacher = make_logits(6, 20, seed=4)
    exact = teacher_entropy(teacher, 1.4)
    for k in (1, 3, 10, 19, 20):
        _, log_probs, tail = teacher_topk_targets(teacher, k, 1.4)
        lower = bucket_entropy(log_probs, tail)
        assert bool((lower <= exact + 1e-12).all())
        expected = torch.stack(
            [
                ref_entropy(ref_buckets(ref_probs(teacher[i], 1.4), ref_topk(teacher[i] / 1.4, k)))
                for i in range(6)
            ]
        )
        torch.testing.assert_close(lower, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lower, exact, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- bucketed divergence


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("case", ["random", "extreme", "one_hot_teacher"])
@pytest.mark.parametrize("tau", [1.0, 0.5, 2.0])
def test_bucketed_matches_brute_force_values_and_gradients(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str, case: str, tau: float
) -> None:
    force_loss_path(monkeypatch, name, "closed_form" if path == "fused" else path)
    n, vocab, k = 5, 13, 4
    student, teacher = make_logits(n, vocab, seed=12)
    if case == "extreme":
        g = torch.Generator().manual_seed(3)
        student = 80 * (torch.randint(0, 2, (n, vocab), generator=g).double() * 2 - 1)
        teacher = torch.linspace(-80, 80, vocab, dtype=torch.float64).repeat(n, 1)
    elif case == "one_hot_teacher":
        teacher = torch.zeros(n, vocab, dtype=torch.float64)
        teacher[:, 2] = 40.0
    spec = spec_for(name, tau)
    ids, log_probs, tail = teacher_topk_targets(teacher, k, tau)
    upstream = torch.linspace(0.5, 1.5, n, dtype=torch.float64)

    mine_in = student.clone().requires_grad_()
    out = bucketed_divergence(mine_in, ids, log_probs, tail, spec)
    (out.divergence @ upstream).backward()
    ref_in = student.clone().requires_grad_()
    expected = ref_bucketed(ref_in, teacher, ids, spec)
    (expected @ upstream).backward()

    torch.testing.assert_close(out.divergence.detach(), expected.detach(), rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(mine_in.grad, ref_in.grad, rtol=1e-8, atol=1e-11)
    assert out.entropy_is_lower_bound is True
    torch.testing.assert_close(out.teacher_entropy, bucket_entropy(log_probs, tail))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", DIVERGENCES)
def test_bucketed_with_arbitrary_buckets_matches_brute_force(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str
) -> None:
    force_loss_path(monkeypatch, name, "closed_form" if path == "fused" else path)
    student, teacher = make_logits(4, 9, seed=21)
    g = torch.Generator().manual_seed(5)
    ids = torch.stack([torch.randperm(9, generator=g)[:3] for _ in range(4)])
    spec = spec_for(name, 1.3)
    log_probs = torch.log_softmax(teacher / 1.3, -1).gather(-1, ids)
    tail = torch.stack(
        [
            torch.log(
                sum(ref_probs(teacher[i], 1.3)[v] for v in range(9) if v not in ids[i].tolist())
            )
            for i in range(4)
        ]
    )
    mine_in = student.clone().requires_grad_()
    out = bucketed_divergence(mine_in, ids, log_probs, tail, spec)
    out.divergence.sum().backward()
    ref_in = student.clone().requires_grad_()
    expected = ref_bucketed(ref_in, teacher, ids, spec)
    expected.sum().backward()
    torch.testing.assert_close(out.divergence.detach(), expected.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(mine_in.grad, ref_in.grad, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_bucketed_with_k_equal_v_equals_exact(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str, tau: float
) -> None:
    """K = V: the tail bucket is empty (``-inf`` on both sides) and drops out."""
    force_loss_path(monkeypatch, name, "closed_form" if path == "fused" else path)
    student, teacher = make_logits(5, 17, seed=30, scale=4.0)
    spec = spec_for(name, tau)
    ids, log_probs, tail = teacher_topk_targets(teacher, 17, tau)
    assert bool(torch.isneginf(tail).all())
    a = student.clone().requires_grad_()
    b = student.clone().requires_grad_()
    bucketed = bucketed_divergence(a, ids, log_probs, tail, spec)
    exact = exact_divergence(b, teacher, spec)
    bucketed.divergence.sum().backward()
    exact.divergence.sum().backward()
    torch.testing.assert_close(
        bucketed.divergence.detach(), exact.divergence.detach(), rtol=1e-10, atol=1e-12
    )
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(
        bucketed.teacher_entropy, exact.teacher_entropy, rtol=1e-10, atol=1e-12
    )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    vocab=st.integers(2, 24),
    k_fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
    name=st.sampled_from(DIVERGENCES),
    tau=st.sampled_from([0.5, 1.0, 1.7]),
    scale=st.sampled_from([0.5, 3.0, 30.0]),
)
def test_bucketed_never_exceeds_exact_and_is_never_negative(
    vocab: int, k_fraction: float, seed: int, name: str, tau: float, scale: float
) -> None:
    k = 1 + round(k_fraction * (vocab - 1))
    student, teacher = make_logits(4, vocab, seed=seed, scale=scale)
    spec = spec_for(name, tau)
    ids, log_probs, tail = teacher_topk_targets(teacher, k, tau)
    bucketed = bucketed_divergence(student, ids, log_probs, tail, spec).divergence
    exact = exact_divergence(student, teacher, spec).divergence
    # float64 rounding of a divergence that is exactly 0 can land at -1e-70
    assert bool((bucketed >= -1e-12).all())
    assert bool((bucketed <= exact * (1 + 1e-9) + 1e-12).all())


@pytest.mark.parametrize("name", DIVERGENCES)
def test_bucketed_is_zero_when_buckets_agree_although_exact_is_not(name: str) -> None:
    _, teacher = make_logits(3, 10, seed=8)
    k = 4
    ids, log_probs, tail = teacher_topk_targets(teacher, k)
    # Same top-k probabilities and the same tail mass, spread differently inside the tail.
    student = torch.log_softmax(teacher, -1).clone()
    for i in range(3):
        rest = [v for v in range(10) if v not in ids[i].tolist()]
        shuffled = torch.log_softmax(torch.arange(len(rest), dtype=torch.float64), -1) + tail[i]
        student[i, rest] = shuffled
    student.requires_grad_()
    spec = spec_for(name)
    out = bucketed_divergence(student, ids, log_probs, tail, spec)
    out.divergence.sum().backward()
    assert torch.allclose(out.divergence.detach(), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(student.grad, torch.zeros_like(student), atol=1e-12)
    assert bool((exact_divergence(student.detach(), teacher, spec).divergence > 1e-3).all())


def test_bucketed_low_precision_student_is_computed_in_float32() -> None:
    student, teacher = make_logits(4, 30, seed=2)
    ids, log_probs, tail = teacher_topk_targets(teacher.float(), 5)
    spec = spec_for("jsd")
    low = student.to(torch.bfloat16).requires_grad_()
    out = bucketed_divergence(low, ids, log_probs, tail, spec)
    assert out.divergence.dtype == torch.float32
    reference = bucketed_divergence(low.detach().float(), ids, log_probs, tail, spec)
    assert torch.equal(out.divergence.detach(), reference.divergence)
    out.divergence.sum().backward()
    assert low.grad.dtype == torch.bfloat16 and bool(torch.isfinite(low.grad.float()).all())


def test_no_gradient_reaches_stored_targets() -> None:
    student, teacher = make_logits(3, 12, seed=9)
    ids, log_probs, tail = teacher_topk_targets(teacher, 3)
    log_probs.requires_grad_()
    tail.requires_grad_()
    student.requires_grad_()
    bucketed_divergence(
        student, ids, log_probs, tail, spec_for("forward_kl")
    ).divergence.sum().backward()
    assert log_probs.grad is None and tail.grad is None and student.grad is not None


# ---------------------------------------------------------------- providers


def _bucketed_provider(
    teacher: torch.Tensor, k: int, spec: DivergenceSpec
) -> BucketedTargetProvider:
    return BucketedTargetProvider(*teacher_topk_targets(teacher, k, spec.temperature), spec)


def test_bucketed_provider_serves_row_ranges_and_moves_devices() -> None:
    student, teacher = make_logits(7, 15, seed=13)
    spec = spec_for("reverse_kl", 0.8)
    provider = _bucketed_provider(teacher, 4, spec).to("cpu")
    assert provider.num_positions == 7 and provider.k == 4
    whole = bucketed_divergence(
        student, provider.topk_indices, provider.topk_log_probs, provider.tail_log_prob, spec
    )
    part = provider.divergence(student[2:6], 2, 6)
    torch.testing.assert_close(part.divergence, whole.divergence[2:6])
    with pytest.raises(ValueError):
        provider.divergence(student[0:3], 5, 8)


def test_exact_provider_equals_exact_divergence_of_the_teacher_head() -> None:
    g = torch.Generator().manual_seed(14)
    head = torch.nn.Linear(6, 15, bias=False, dtype=torch.float64)
    hidden = torch.randn(7, 6, generator=g, dtype=torch.float64)
    student = torch.randn(7, 15, generator=g, dtype=torch.float64)
    spec = spec_for("jsd", 1.6)
    provider = ExactTargetProvider(hidden, head, spec)
    with torch.no_grad():
        teacher = head(hidden)
    part = provider.divergence(student[1:5], 1, 5)
    torch.testing.assert_close(
        part.divergence, exact_divergence(student, teacher, spec).divergence[1:5]
    )
    assert part.entropy_is_lower_bound is False


def test_concat_providers_merges_like_kinds_and_dispatches_mixed_rows() -> None:
    g = torch.Generator().manual_seed(15)
    spec = spec_for("forward_kl", 1.2)
    head = torch.nn.Linear(5, 11, bias=False, dtype=torch.float64)
    hidden = [torch.randn(n, 5, generator=g, dtype=torch.float64) for n in (3, 4, 2)]
    with torch.no_grad():
        teachers = [head(h) for h in hidden]
    student = torch.randn(9, 11, generator=g, dtype=torch.float64)

    exact_parts = [ExactTargetProvider(h, head, spec) for h in hidden]
    merged_exact = concat_providers(exact_parts)
    assert isinstance(merged_exact, ExactTargetProvider) and merged_exact.num_positions == 9
    expected_exact = exact_divergence(student, torch.cat(teachers), spec).divergence
    torch.testing.assert_close(merged_exact.divergence(student, 0, 9).divergence, expected_exact)

    bucketed_parts = [_bucketed_provider(t, 3, spec) for t in teachers]
    merged_bucketed = concat_providers(bucketed_parts)
    assert (
        isinstance(merged_bucketed, BucketedTargetProvider) and merged_bucketed.num_positions == 9
    )
    ids, log_probs, tail = teacher_topk_targets(torch.cat(teachers), 3, spec.temperature)
    expected_bucketed = bucketed_divergence(student, ids, log_probs, tail, spec).divergence
    torch.testing.assert_close(
        merged_bucketed.divergence(student, 0, 9).divergence, expected_bucketed
    )

    mixed = concat_providers([exact_parts[0], bucketed_parts[1], exact_parts[2]])
    assert isinstance(mixed, ConcatenatedTargetProvider) and mixed.num_positions == 9
    expected_mixed = torch.cat([expected_exact[:3], expected_bucketed[3:7], expected_exact[7:]])
    for start, end in [(0, 9), (2, 4), (3, 7), (1, 8), (6, 9), (4, 4)]:
        out = mixed.divergence(student[start:end], start, end)
        torch.testing.assert_close(out.divergence, expected_mixed[start:end])
        assert out.entropy_is_lower_bound is any(3 <= r < 7 for r in range(start, end))

    mixed_k = concat_providers([_bucketed_provider(teachers[0], 2, spec), bucketed_parts[1]])
    assert isinstance(mixed_k, ConcatenatedTargetProvider)
    with pytest.raises(ValueError, match="DivergenceSpec"):
        concat_providers([exact_parts[0], ExactTargetProvider(hidden[1], head, spec_for("jsd"))])
    with pytest.raises(ValueError):
        concat_providers([])
