"""The chunked loss equals a plain float64 reference, for every chunk size and micro-batch split.

A group of G trajectories runs through a small trainable backbone (embedding + linear +
tanh) and LM head. The reference materialises every selected position's logits, computes
L = (1/G) Σ_r Σ_i ŵ_{r,i} (D_{r,i} + c · NLL_{r,i}) with D the plain definition of the
divergence (``miniverl.losses.divergences``, itself checked against a brute force in
``test_losses_exact.py``) on explicitly summed (bucket) probabilities, and back-propagates
with plain autograd. The chunked loss must reproduce the loss and the
gradient of every parameter (backbone and LM head) within 1e-6 relative for chunk sizes
1, 3, 7 and N and for every split of the group into micro-batches, with micro-batch b
passing weight_normalizer = B_b and loss_scale = B_b / G (docs/objectives.md). One trajectory
has all-zero weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from miniverl.errors import ConfigError
from miniverl.losses import (
    BucketedTargetProvider,
    ChunkTargetProvider,
    DivergenceSpec,
    ExactTargetProvider,
    chunked_selected_position_loss,
    concat_providers,
    get_divergence,
    normalize_trajectory_weights,
    teacher_topk_targets,
)

VOCAB, HIDDEN = 23, 6
LENGTHS = (8, 6, 9, 5, 7)
ZERO_ROW = 3
G = len(LENGTHS)
SPLITS = {
    "B=G": [[0, 1, 2, 3, 4]],
    "B=1": [[0], [1], [2], [3], [4]],
    "B=2": [[0, 1], [2, 3], [4]],
    "B=3": [[0, 1, 2], [3, 4]],
}
SPAN_NAMES = ("assistant_text", "tool_call", "final_answer")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Backbone(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN, dtype=torch.float64)
        self.mix = torch.nn.Linear(HIDDEN, HIDDEN, dtype=torch.float64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mix(self.embed(ids)))


class Group:
    """G trajectories with selected positions, raw weights, targets and span types."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.student = Backbone()
        self.head = torch.nn.Linear(HIDDEN, VOCAB, dtype=torch.float64)
        self.teacher = Backbone().requires_grad_(False)
        self.teacher_head = torch.nn.Linear(
            HIDDEN, VOCAB, bias=False, dtype=torch.float64
        ).requires_grad_(False)
        with torch.no_grad():
            self.teacher_head.weight.mul_(4.0)
        self.tokens = [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]
        self.positions = [
            torch.arange(0, n - 1)[torch.rand(n - 1, generator=g) < 0.7] for n in LENGTHS
        ]
        self.positions = [p if p.numel() else torch.tensor([0]) for p in self.positions]
        self.targets = [t[p + 1] for t, p in zip(self.tokens, self.positions, strict=True)]
        self.raw_weights = [
            [0.0] * p.numel()
            if r == ZERO_ROW
            else [2.0 if j % 3 == 0 else 1.0 for j in range(p.numel())]
            for r, p in enumerate(self.positions)
        ]
        self.span_types = [
            [SPAN_NAMES[(r + j) % 3] for j in range(p.numel())]
            for r, p in enumerate(self.positions)
        ]

    def student_hidden(self, r: int) -> torch.Tensor:
        return self.student(self.tokens[r])[self.positions[r]]

    def teacher_hidden(self, r: int) -> torch.Tensor:
        with torch.no_grad():
            return self.teacher(self.tokens[r])[self.positions[r]]

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.student.parameters(), *self.head.parameters()]

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def grads(self) -> list[torch.Tensor]:
        return [
            p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in self.parameters()
        ]


# ---------------------------------------------------------------- float64 reference


def ref_log_probs(z: torch.Tensor, tau: float) -> torch.Tensor:
    x = z / tau
    top = x.max(-1, keepdim=True).values.detach()
    return x - top - torch.log(torch.exp(x - top).sum(-1, keepdim=True))


def ref_bucket(p: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    in_tail = torch.ones_like(p, dtype=torch.bool).scatter(-1, ids, False)
    return torch.cat([p.gather(-1, ids), (p * in_tail).sum(-1, keepdim=True)], dim=-1)


def reference_loss(
    group: Group, kind: str, spec: DivergenceSpec, ce_weight: float, k: int = 5
) -> tuple[float, list[torch.Tensor], torch.Tensor]:
    """Loss, parameter gradients and per-entry teacher entropies of the whole group."""
    group.zero_grad()
    total = torch.zeros((), dtype=torch.float64)
    entropies = []
    for r in range(G):
        logits = group.head(group.student_hidden(r))
        raw = torch.tensor(group.raw_weights[r], dtype=torch.float64)
        w_hat = raw / raw.sum() if float(raw.sum()) > 0 else torch.zeros_like(raw)
        nll = -ref_log_probs(logits, 1.0).gather(-1, group.targets[r].unsqueeze(-1)).squeeze(-1)
        per_entry = ce_weight * nll
        if kind != "sft":
            teacher_logits = group.teacher_head(group.teacher_hidden(r))
            p_s = torch.exp(ref_log_probs(logits, spec.temperature))
            p_t = torch.exp(ref_log_probs(teacher_logits, spec.temperature))
            if kind == "bucketed":
                ids = teacher_topk_targets(teacher_logits, k, spec.temperature)[0]
                p_s, p_t = ref_bucket(p_s, ids), ref_bucket(p_t, ids)
            entropies.append(-(p_t * torch.log(p_t)).sum(-1))
            plain = get_divergence(spec.name).plain
            per_entry = per_entry + plain(torch.log(p_s), torch.log(p_t), spec)
        total = total + (w_hat * per_entry).sum() / G
    total.backward()
    return (
        float(total.detach()),
        group.grads(),
        torch.cat(entropies) if entropies else torch.zeros(0),
    )


# ---------------------------------------------------------------- chunked runs


def providers_for(
    group: Group, rows: Sequence[int], kind: str, spec: DivergenceSpec, k: int = 5
) -> ChunkTargetProvider | None:
    if kind == "sft":
        return None
    parts: list[ChunkTargetProvider] = []
    for r in rows:
        hidden = group.teacher_hidden(r)
        if kind == "exact":
            parts.append(ExactTargetProvider(hidden, group.teacher_head, spec))
        else:
            with torch.no_grad():
                targets = teacher_topk_targets(group.teacher_head(hidden), k, spec.temperature)
            parts.append(BucketedTargetProvider(*targets, spec))
    return concat_providers(parts)


def chunked_group(
    group: Group,
    kind: str,
    spec: DivergenceSpec,
    ce_weight: float,
    chunk: int | None,
    split: list[list[int]],
) -> tuple[float, list[torch.Tensor], list]:
    group.zero_grad()
    total = 0.0
    results = []
    for rows in split:
        hidden = torch.cat([group.student_hidden(r) for r in rows])
        result = chunked_selected_position_loss(
            hidden_states=hidden,
            lm_head=group.head,
            weights=normalize_trajectory_weights([group.raw_weights[r] for r in rows]),
            weight_normalizer=len(rows),
            provider=providers_for(group, rows, kind, spec),
            target_token_ids=torch.cat([group.targets[r] for r in rows]),
            ce_weight=ce_weight,
            chunk_size=chunk if chunk is not None else hidden.shape[0],
            backward=True,
            loss_scale=len(rows) / G,
            span_types=[name for r in rows for name in group.span_types[r]],
        )
        total += result.loss
        results.append(result)
    return total, group.grads(), results


def assert_same(
    loss: float, grads: list[torch.Tensor], ref_loss: float, ref_grads: list[torch.Tensor]
) -> None:
    assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-12)
    for got, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-12)


CASES = [
    ("exact", DivergenceSpec("reverse_kl", temperature=0.8), 0.3),
    ("exact", DivergenceSpec("forward_kl"), 0.0),
    ("bucketed", DivergenceSpec("jsd", temperature=1.5, jsd_beta=0.3), 0.2),
    ("sft", DivergenceSpec("forward_kl"), 1.0),
]


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("chunk", [1, 3, 7, None], ids=["c1", "c3", "c7", "cN"])
@pytest.mark.parametrize(
    ("kind", "spec", "ce_weight"), CASES, ids=[f"{c[0]}-{c[1].name}-ce{c[2]}" for c in CASES]
)
def test_loss_and_every_gradient_match_reference(
    kind: str, spec: DivergenceSpec, ce_weight: float, chunk: int | None, split: str
) -> None:
    group = Group()
    ref_loss, ref_grads, _ = reference_loss(group, kind, spec, ce_weight)
    loss, grads, _ = chunked_group(group, kind, spec, ce_weight, chunk, SPLITS[split])
    assert_same(loss, grads, ref_loss, ref_grads)
    assert any(float(g.abs().max()) > 0 for g in grads[:3])


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "jsd", "entropy_aware"])
@pytest.mark.parametrize("kind", ["exact", "bucketed"])
def test_every_divergence_is_chunk_and_split_invariant(kind: str, name: str) -> None:
    group = Group(seed=1)
    spec = DivergenceSpec(
        name, temperature=1.3, jsd_beta=0.6, entropy_threshold=1.0, entropy_forward_weight=0.5
    )  # type: ignore[arg-type]
    ref_loss, ref_grads, ref_entropy = reference_loss(group, kind, spec, 0.1)
    for chunk, split in [(1, "B=1"), (4, "B=2"), (None, "B=G")]:
        loss, grads, results = chunked_group(group, kind, spec, 0.1, chunk, SPLITS[split])
        assert_same(loss, grads, ref_loss, ref_grads)
    whole = results[0]
    assert whole.teacher_entropy_mean == pytest.approx(float(ref_entropy.mean()), rel=1e-9)
    assert whole.high_entropy_fraction == pytest.approx(float((ref_entropy > 1.0).double().mean()))
    assert whole.teacher_entropy_is_lower_bound is (kind == "bucketed")


def test_metrics_decompose_the_loss() -> None:
    group = Group(seed=2)
    spec = DivergenceSpec("reverse_kl")
    _, _, results = chunked_group(group, "exact", spec, 0.4, 3, SPLITS["B=2"])
    for result in results:
        assert result.loss == pytest.approx(
            result.divergence_loss + 0.4 * result.sampled_token_nll, rel=1e-12
        )
        assert sum(result.loss_by_span_type.values()) == pytest.approx(result.loss, rel=1e-12)
        assert result.chunk_size == 3 and result.num_chunks == -(-result.num_positions // 3)
    # Each field sums over micro-batches to the group value: the NLL part alone.
    sft_loss, _, _ = reference_loss(group, "sft", spec, 1.0)
    assert sum(r.sampled_token_nll for r in results) == pytest.approx(sft_loss, rel=1e-9)


def test_loss_by_span_type_matches_reference_per_type() -> None:
    group = Group(seed=3)
    spec = DivergenceSpec("forward_kl")
    _, _, results = chunked_group(group, "sft", spec, 1.0, 2, SPLITS["B=G"])
    by_type = results[0].loss_by_span_type
    expected = dict.fromkeys(SPAN_NAMES, 0.0)
    for r in range(G):
        raw = torch.tensor(group.raw_weights[r], dtype=torch.float64)
        w_hat = raw / raw.sum() if float(raw.sum()) > 0 else torch.zeros_like(raw)
        with torch.no_grad():
            nll = (
                -ref_log_probs(group.head(group.student_hidden(r)), 1.0)
                .gather(-1, group.targets[r].unsqueeze(-1))
                .squeeze(-1)
            )
        for j, name in enumerate(group.span_types[r]):
            expected[name] += float(w_hat[j] * nll[j]) / G
    assert set(by_type) == set(SPAN_NAMES)
    for name in SPAN_NAMES:
        assert by_type[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-15)


def test_zero_weight_row_contributes_nothing() -> None:
    group = Group(seed=4)
    spec = DivergenceSpec("jsd")
    rows_with, rows_without = [0, 1, 2, 3, 4], [0, 1, 2, 4]
    outcomes = []
    for rows in (rows_with, rows_without):
        group.zero_grad()
        hidden = torch.cat([group.student_hidden(r) for r in rows]).detach().requires_grad_()
        result = chunked_selected_position_loss(
            hidden,
            group.head,
            normalize_trajectory_weights([group.raw_weights[r] for r in rows]),
            len(rows),
            providers_for(group, rows, "exact", spec),
            torch.cat([group.targets[r] for r in rows]),
            0.5,
            3,
            True,
            loss_scale=len(rows) / G,
        )
        outcomes.append((result.loss, group.grads(), hidden.grad))
    (loss_with, grads_with, hidden_with), (loss_without, grads_without, _) = outcomes
    # Same G: the zero row's entries add nothing, neither to the loss nor to any gradient.
    assert_same(loss_with, grads_with, loss_without, grads_without)
    start = sum(group.positions[r].numel() for r in range(ZERO_ROW))
    stop = start + group.positions[ZERO_ROW].numel()
    assert torch.equal(hidden_with[start:stop], torch.zeros_like(hidden_with[start:stop]))


def test_frozen_lm_head_sends_gradient_to_a_leaf_hidden_state_only() -> None:
    group = Group(seed=5)
    group.head.requires_grad_(False)
    spec = DivergenceSpec("reverse_kl")
    hidden = torch.cat([group.student_hidden(r) for r in range(G)]).detach()
    weights = normalize_trajectory_weights(group.raw_weights)
    targets = torch.cat(group.targets)
    grads = []
    for chunk in (1, 4, hidden.shape[0]):
        leaf = hidden.clone().requires_grad_()
        chunked_selected_position_loss(
            leaf,
            group.head,
            weights,
            G,
            providers_for(group, range(G), "exact", spec),
            targets,
            0.0,
            chunk,
            True,
        )
        grads.append(leaf.grad)
    assert group.head.weight.grad is None
    for grad in grads[1:]:
        torch.testing.assert_close(grad, grads[0], rtol=1e-6, atol=1e-14)


def test_frozen_backbone_still_trains_the_head_and_no_backward_builds_no_gradient() -> None:
    group = Group(seed=6)
    spec = DivergenceSpec("forward_kl")
    hidden = torch.cat([group.student_hidden(r) for r in range(G)]).detach()
    weights = normalize_trajectory_weights(group.raw_weights)
    targets = torch.cat(group.targets)
    provider = providers_for(group, range(G), "bucketed", spec)
    group.zero_grad()
    trained = chunked_selected_position_loss(
        hidden, group.head, weights, G, provider, targets, 0.0, 5, True
    )
    assert group.head.weight.grad is not None and float(group.head.weight.grad.abs().max()) > 0
    group.zero_grad()
    evaluated = chunked_selected_position_loss(
        hidden, group.head, weights, G, provider, targets, 0.0, 2, False
    )
    assert group.head.weight.grad is None
    assert evaluated.loss == pytest.approx(trained.loss, rel=1e-12)


def test_empty_selection_returns_zeros_without_backward() -> None:
    group = Group()
    hidden = torch.zeros(0, HIDDEN, dtype=torch.float64, requires_grad=True)
    provider = BucketedTargetProvider(
        torch.zeros(0, 3, dtype=torch.long),
        torch.zeros(0, 3),
        torch.zeros(0),
        DivergenceSpec("reverse_kl"),
    )
    result = chunked_selected_position_loss(
        hidden,
        group.head,
        torch.zeros(0),
        0,
        provider,
        torch.zeros(0, dtype=torch.long),
        0.0,
        4,
        True,
    )
    assert (result.loss, result.divergence_loss, result.sampled_token_nll) == (0.0, 0.0, 0.0)
    assert result.num_positions == 0 and result.num_chunks == 0
    assert hidden.grad is None and group.head.weight.grad is None


def test_invalid_arguments_are_rejected() -> None:
    group = Group()
    n = 50
    hidden = torch.zeros(n, HIDDEN, dtype=torch.float64)
    targets = torch.zeros(n, dtype=torch.long)
    weights = torch.full((n,), 1 / n, dtype=torch.float64)
    with pytest.raises(ConfigError):
        chunked_selected_position_loss(hidden, group.head, weights, 1, None, targets, 1.0, 0, True)
    with pytest.raises(ValueError, match="provider"):
        provider = providers_for(group, [0], "exact", DivergenceSpec("forward_kl"))
        chunked_selected_position_loss(
            hidden, group.head, weights, 1, provider, targets, 1.0, 2, True
        )
    with pytest.raises(ValueError, match="weights"):
        chunked_selected_position_loss(
            hidden, group.head, weights[:3], 1, None, targets, 1.0, 2, True
        )
    with pytest.raises(ValueError, match="target token ids"):
        chunked_selected_position_loss(
            hidden, group.head, weights, 1, None, targets + VOCAB, 1.0, 2, True
        )
    with pytest.raises(ValueError, match="span_types"):
        chunked_selected_position_loss(
            hidden, group.head, weights, 1, None, targets, 1.0, 2, True, span_types=["x"]
        )


@settings(max_examples=12, deadline=None, derandomize=True)
@given(chunk=st.integers(1, 40), seed=st.integers(0, 1000))
def test_any_chunk_size_gives_the_same_loss_and_gradient(chunk: int, seed: int) -> None:
    group = Group(seed=seed % 7)
    spec = DivergenceSpec("entropy_aware", entropy_threshold=1.5)
    ref_loss, ref_grads, _ = reference_loss(group, "exact", spec, 0.25)
    loss, grads, _ = chunked_group(group, "exact", spec, 0.25, chunk, SPLITS["B=3"])
    assert_same(loss, grads, ref_loss, ref_grads)


def test_low_precision_head_computes_in_float32() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.bfloat16)
    teacher_head = (
        torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.bfloat16).requires_grad_(False)
    )
    hidden = torch.randn(10, HIDDEN).to(torch.bfloat16).requires_grad_()
    spec = DivergenceSpec("reverse_kl")
    provider = ExactTargetProvider(torch.randn(10, HIDDEN).to(torch.bfloat16), teacher_head, spec)
    weights = torch.full((10,), 0.1)
    targets = torch.arange(10)
    result = chunked_selected_position_loss(
        hidden, head, weights, 1, provider, targets, 0.5, 3, True
    )
    upcast = chunked_selected_position_loss(
        hidden.detach(), head, weights, 1, provider, targets, 0.5, 10, False
    )
    assert result.loss == pytest.approx(upcast.loss, rel=1e-6)
    assert hidden.grad is not None and hidden.grad.dtype == torch.bfloat16
    assert bool(torch.isfinite(hidden.grad.float()).all())
