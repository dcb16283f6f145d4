"""The divergence registry: plain definitions, fused forms, and divergences added by a row.

For every registered divergence with a fused form, the fused path (exact and bucketed, both
fused code paths) must equal autograd through the plain definition in value and gradient,
in float64, over several shapes, temperatures, entropy gates and zero-probability cases.
The plain definitions themselves are checked against token-by-token brute force in
``test_losses_exact.py`` and ``test_losses_bucketed.py``. A divergence registered with a
plain function only must work through every loss, the chunked one included.
"""

from __future__ import annotations

import typing

import pytest
import torch

from helpers import force_loss_path
from miniverl.config.sections import LossConfig
from miniverl.errors import ConfigError
from miniverl.losses import (
    DIVERGENCE_NAMES,
    DIVERGENCES,
    BucketedTargetProvider,
    Divergence,
    DivergenceSpec,
    ExactTargetProvider,
    bucket_log_probs,
    bucketed_divergence,
    chunked_selected_position_loss,
    exact_divergence,
    teacher_topk_targets,
)
from miniverl.losses.bucketed import normalized_buckets

NEG_INF = float("-inf")
FUSED = tuple(name for name, row in DIVERGENCES.items() if row.fused is not None)
SHAPES = [(1, 2), (4, 9), (6, 40)]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_config_literal_lists_exactly_the_registered_divergences() -> None:
    """config is torch-free and below losses, so it keeps its own Literal; this keeps it
    equal to the registry (a new row without a config name, or the reverse, fails here)."""
    allowed = typing.get_args(LossConfig.model_fields["divergence"].annotation)
    assert allowed == tuple(DIVERGENCES) == DIVERGENCE_NAMES
    assert FUSED == DIVERGENCE_NAMES, "every shipped divergence has a fused form"


def test_unknown_divergence_is_refused_with_the_registered_names() -> None:
    with pytest.raises(ConfigError, match="must be one of forward_kl, reverse_kl, jsd"):
        DivergenceSpec("kl")


# ---------------------------------------------------------------- inputs


def make_logits(n: int, vocab: int, case: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher logits ``[n, vocab]`` (float64) for one case:
    ``random``; ``wide`` (logit scale 25, near one-hot rows); ``masked`` (ids that are
    ``-inf`` on both sides); ``teacher_zero`` (teacher ``-inf`` where the student is not)."""
    g = torch.Generator().manual_seed(seed)
    scale = 25.0 if case == "wide" else 2.0
    student = torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale
    teacher = torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale
    if case in ("masked", "teacher_zero") and vocab > 2:
        dead = torch.randperm(vocab, generator=g)[: max(1, vocab // 4)]
        teacher[:, dead] = NEG_INF
        if case == "masked":
            student[:, dead] = NEG_INF
    return student, teacher


def spec_between(name: str, tau: float, entropies: torch.Tensor) -> DivergenceSpec:
    """A spec whose entropy threshold splits ``entropies`` [N] where it can (the gate of
    ``entropy_aware`` then opens on some rows and stays shut on others)."""
    ordered = entropies.sort().values
    mid = len(ordered) // 2
    threshold = float(ordered[mid - 1 : mid + 1].mean()) if len(ordered) > 1 else 0.0
    return DivergenceSpec(
        name,
        temperature=tau,
        jsd_beta=0.3,
        entropy_threshold=max(threshold, 0.0),
        entropy_forward_weight=0.7,
    )


def plain_exact(student: torch.Tensor, teacher: torch.Tensor, spec: DivergenceSpec) -> torch.Tensor:
    """``[N]``: the registry's plain definition on log softmax(z / τ), by autograd."""
    s = torch.log_softmax(student / spec.temperature, -1)
    t = torch.log_softmax(teacher / spec.temperature, -1)
    return DIVERGENCES[spec.name].plain(s, t, spec)


RowsLoss = typing.Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(student logits of the rows [R, V], rows: bool [N]) -> divergence [R]``."""


def assert_value_and_gradient_agree(
    fused: RowsLoss, plain: RowsLoss, student: torch.Tensor
) -> None:
    """Values agree on every row (+inf included); gradients on the rows with a finite
    value, under an uneven upstream gradient."""
    every = torch.ones(student.shape[0], dtype=torch.bool)
    with torch.no_grad():
        expected = plain(student, every)
        torch.testing.assert_close(fused(student, every), expected, rtol=1e-10, atol=1e-12)
    rows = torch.isfinite(expected)
    upstream = torch.linspace(0.5, 2.0, int(rows.sum()), dtype=torch.float64)
    a = student[rows].clone().requires_grad_()
    b = student[rows].clone().requires_grad_()
    (fused(a, rows) @ upstream).backward()
    (plain(b, rows) @ upstream).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- fused == plain


@pytest.mark.parametrize("path", ["closed_form", "general"])
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("tau", [1.0, 0.6, 2.3])
@pytest.mark.parametrize("case", ["random", "wide", "masked", "teacher_zero"])
def test_fused_exact_equals_plain_definition(
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    name: str,
    shape: tuple[int, int],
    tau: float,
    case: str,
) -> None:
    student, teacher = make_logits(*shape, case, seed=sum(shape) + 10 * len(case))
    t = torch.log_softmax(teacher / tau, -1)
    p_t = t.exp()
    spec = spec_between(name, tau, -torch.where(p_t > 0, p_t * t, 0.0).sum(-1))
    force_loss_path(monkeypatch, name, path)
    assert_value_and_gradient_agree(
        lambda z, rows: exact_divergence(z, teacher[rows], spec).divergence,
        lambda z, rows: plain_exact(z, teacher[rows], spec),
        student,
    )


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("tau", [1.0, 0.6, 2.3])
@pytest.mark.parametrize("k_of", ["one", "some", "all"])
@pytest.mark.parametrize("case", ["random", "wide", "masked", "teacher_zero"])
def test_fused_bucketed_equals_plain_definition_on_buckets(
    name: str, shape: tuple[int, int], tau: float, k_of: str, case: str
) -> None:
    """The bucketed loss is the plain definition between the two (K + 1)-point
    distributions; K = V leaves an empty (``-inf``) tail bucket on both sides."""
    n, vocab = shape
    k = {"one": 1, "some": max(1, vocab // 3), "all": vocab}[k_of]
    student, teacher = make_logits(n, vocab, case, seed=sum(shape) + 10 * len(case) + k)
    ids, log_probs, tail = teacher_topk_targets(teacher, k, tau)
    teacher_buckets = normalized_buckets(torch.cat([log_probs, tail.unsqueeze(-1)], -1))
    p_t = teacher_buckets.exp()
    entropies = -torch.where(p_t > 0, p_t * teacher_buckets, 0.0).sum(-1)
    spec = spec_between(name, tau, entropies)

    def plain(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        s = torch.log_softmax(z / tau, -1)
        student_buckets = normalized_buckets(bucket_log_probs(s, ids[rows]))
        return DIVERGENCES[name].plain(student_buckets, teacher_buckets[rows], spec)

    def fused(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return bucketed_divergence(z, ids[rows], log_probs[rows], tail[rows], spec).divergence

    assert_value_and_gradient_agree(fused, plain, student)


@pytest.mark.parametrize("name", FUSED)
def test_plain_bucketed_path_drops_a_tail_impossible_on_both_sides(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """K = the number of possible ids, so the tail holds only ids that are ``-inf`` for
    student and teacher: an empty bucket on both sides. Through the plain path (autograd
    through the projection and the definition) it drops out with a zero, not NaN,
    gradient, exactly as in the fused path."""
    student, teacher = make_logits(4, 12, "masked", seed=3)
    live = int(torch.isfinite(teacher[0]).sum())
    ids, log_probs, tail = teacher_topk_targets(teacher, live, 0.9)
    assert bool(torch.isneginf(tail).all()) and live < 12
    spec = DivergenceSpec(name, temperature=0.9, jsd_beta=0.3, entropy_threshold=1.0)
    upstream = torch.linspace(0.5, 2.0, 4, dtype=torch.float64)
    fused_in = student.clone().requires_grad_()
    fused = bucketed_divergence(fused_in, ids, log_probs, tail, spec).divergence
    (fused @ upstream).backward()
    force_loss_path(monkeypatch, name, "plain")
    plain_in = student.clone().requires_grad_()
    plain = bucketed_divergence(plain_in, ids, log_probs, tail, spec).divergence
    (plain @ upstream).backward()
    assert bool(torch.isfinite(plain_in.grad).all())
    torch.testing.assert_close(plain.detach(), fused.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(plain_in.grad, fused_in.grad, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- a divergence by its row


def squared_hellinger(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, spec: DivergenceSpec
) -> torch.Tensor:
    """H² = 1 − Σ_v sqrt(p_S(v) p_T(v)), ``[N]``: a divergence the package does not ship."""
    return 1.0 - torch.exp(0.5 * (student_log_probs + teacher_log_probs)).sum(-1)


def hellinger_brute_force(p_s: torch.Tensor, p_t: torch.Tensor) -> torch.Tensor:
    """``[N]`` from probability tables ``[N, M]``, one outcome at a time."""
    rows = []
    for i in range(p_s.shape[0]):
        total = torch.zeros((), dtype=torch.float64)
        for v in range(p_s.shape[1]):
            total = total + torch.sqrt(p_s[i, v] * p_t[i, v])
        rows.append(1.0 - total)
    return torch.stack(rows)


def bucket_probs(p: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    in_tail = torch.ones_like(p, dtype=torch.bool).scatter(-1, ids, False)
    return torch.cat([p.gather(-1, ids), (p * in_tail).sum(-1, keepdim=True)], dim=-1)


@pytest.fixture
def hellinger(monkeypatch: pytest.MonkeyPatch) -> str:
    """Registers ``squared_hellinger`` with a plain function and no fused form."""
    with pytest.raises(ConfigError, match="must be one of"):
        DivergenceSpec("squared_hellinger")
    monkeypatch.setitem(DIVERGENCES, "squared_hellinger", Divergence(squared_hellinger))
    return "squared_hellinger"


@pytest.mark.parametrize("tau", [1.0, 1.7])
def test_divergence_registered_without_fused_form_is_exact_and_bucketed(
    hellinger: str, tau: float
) -> None:
    student, teacher = make_logits(5, 12, "random", seed=4)
    spec = DivergenceSpec(hellinger, temperature=tau, entropy_threshold=1.5)
    p_t = torch.softmax(teacher / tau, -1)
    ids, log_probs, tail = teacher_topk_targets(teacher, 4, tau)
    upstream = torch.linspace(0.5, 2.0, 5, dtype=torch.float64)

    for kind in ("exact", "bucketed"):
        mine = student.clone().requires_grad_()
        if kind == "exact":
            out = exact_divergence(mine, teacher, spec)
        else:
            out = bucketed_divergence(mine, ids, log_probs, tail, spec)
        (out.divergence @ upstream).backward()
        ref = student.clone().requires_grad_()
        p_s = torch.softmax(ref / tau, -1)
        if kind == "exact":
            expected = hellinger_brute_force(p_s, p_t)
            entropy = -(p_t * p_t.log()).sum(-1)
        else:
            expected = hellinger_brute_force(bucket_probs(p_s, ids), bucket_probs(p_t, ids))
            q_t = bucket_probs(p_t, ids)
            entropy = -(q_t * q_t.log()).sum(-1)
        (expected @ upstream).backward()
        torch.testing.assert_close(
            out.divergence.detach(), expected.detach(), rtol=1e-10, atol=1e-12
        )
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(out.teacher_entropy, entropy, rtol=1e-10, atol=1e-12)
        assert torch.equal(out.high_entropy, entropy > 1.5)
        assert out.entropy_is_lower_bound is (kind == "bucketed")


@pytest.mark.parametrize("kind", ["exact", "bucketed"])
def test_divergence_registered_without_fused_form_trains_through_the_chunked_loss(
    hellinger: str, kind: str
) -> None:
    """Loss and every gradient (hidden states, LM head) of the chunked loss, at chunk
    sizes 1, 3 and N, against a materialised float64 reference."""
    n, hidden_size, vocab, k = 7, 5, 11, 3
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(n, hidden_size, generator=g, dtype=torch.float64)
    teacher_hidden = torch.randn(n, hidden_size, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(hidden_size, vocab, dtype=torch.float64)
    teacher_head = torch.nn.Linear(hidden_size, vocab, bias=False, dtype=torch.float64)
    teacher_head.requires_grad_(False)
    targets = torch.randint(0, vocab, (n,), generator=g)
    weights = torch.rand(n, generator=g, dtype=torch.float64)
    spec = DivergenceSpec(hellinger, temperature=1.3)
    ce_weight = 0.4
    with torch.no_grad():
        teacher_logits = teacher_head(teacher_hidden)
        ids, log_probs, tail = teacher_topk_targets(teacher_logits, k, 1.3)

    leaf = hidden.clone().requires_grad_()
    logits = head(leaf)
    p_s = torch.softmax(logits / 1.3, -1)
    p_t = torch.softmax(teacher_logits / 1.3, -1)
    if kind == "bucketed":
        p_s, p_t = bucket_probs(p_s, ids), bucket_probs(p_t, ids)
    nll = -torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    reference = (weights * (hellinger_brute_force(p_s, p_t) + ce_weight * nll)).sum() / 2
    reference.backward()
    expected = [leaf.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]

    for chunk in (1, 3, n):
        head.zero_grad()
        leaf = hidden.clone().requires_grad_()
        if kind == "exact":
            provider = ExactTargetProvider(teacher_hidden, teacher_head, spec)
        else:
            provider = BucketedTargetProvider(ids, log_probs, tail, spec)
        result = chunked_selected_position_loss(
            hidden_states=leaf,
            lm_head=head,
            weights=weights,
            weight_normalizer=2,
            provider=provider,
            target_token_ids=targets,
            ce_weight=ce_weight,
            chunk_size=chunk,
            backward=True,
        )
        assert result.loss == pytest.approx(float(reference.detach()), rel=1e-10)
        got = [leaf.grad, head.weight.grad, head.bias.grad]
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
