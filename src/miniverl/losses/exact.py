"""Full-vocabulary divergences and the sampled-token NLL (docs/objectives.md).

Every function takes logits ``[N, V]`` and returns one value per row ``[N]`` in nats,
summed over the vocabulary. Computation is in float32 for float16/bfloat16/float32 input
and in float64 for float64 input. Results are differentiable with respect to the student
logits; teacher logits are constants and never receive a gradient.

The divergence is the registry's (:mod:`miniverl.losses.divergences`). With a fused form
the gradient is computed in the forward pass: for s = log_softmax(z_S / τ) and g = dD/ds,

    dD/dz_S = (g − p_S · Σ_v g_v) / τ,

so the autograd graph keeps one ``[N, V]`` tensor (that gradient) per call. Each row of
that gradient is projected back onto the zero-sum plane
(:func:`~miniverl.losses.numerics.project_rows_to_zero_sum`): the exact gradient of a
function of a softmax sums to 0, and float32 at V = 151,936 otherwise drifts by up to 6e-5.
Without a fused form, autograd runs through the plain definition.
"""

from __future__ import annotations

import torch
from torch import Tensor

from miniverl.losses.divergences import (
    DivergenceSpec,
    FusedDivergence,
    PlainDivergence,
    entropy,
    get_divergence,
)
from miniverl.losses.numerics import (
    NEG_INF,
    DivergenceOutput,
    attach_row_gradient,
    compute_dtype,
    needs_grad,
    project_rows_to_zero_sum,
    row_blocks,
    scaled_log_softmax,
)


def _check_pair(student_logits: Tensor, teacher: Tensor) -> None:
    if student_logits.dim() != 2 or student_logits.shape != teacher.shape:
        raise ValueError(
            "student and teacher logits must both be [N, V] with the same shape; got "
            f"{tuple(student_logits.shape)} and {tuple(teacher.shape)}"
        )


def _finite_block(
    s: Tensor, t: Tensor, fused: FusedDivergence, spec: DivergenceSpec, jacobian: Tensor | None
) -> tuple[Tensor, Tensor]:
    """A block whose student and teacher log-probs ``[R, V]`` are all finite: the fused
    closed form, which writes τ · dD/dz_S into ``jacobian`` when given (the general terms
    when the divergence has no closed form). Returns ``(divergence [R], entropy [R])``."""
    closed_form = fused.closed_form
    if closed_form is None:
        return _general_block(s, t, fused, spec, jacobian)
    p_s = s.exp()
    p_t = t.exp()
    teacher_entropy = -torch.linalg.vecdot(p_t, t)
    return closed_form(s, t, p_s, p_t, teacher_entropy, spec, jacobian), teacher_entropy


def _general_block(
    s: Tensor, t: Tensor, fused: FusedDivergence, spec: DivergenceSpec, jacobian: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Any block, including ``-inf`` log-probs: the fused terms chained through the
    softmax, τ · dD/dz = g − p_S Σ_v g_v."""
    teacher_entropy = entropy(t)
    value, grad = fused.terms(s, t, teacher_entropy, spec, jacobian is not None)
    if jacobian is not None and grad is not None:
        torch.sub(grad, s.exp().mul_(grad.sum(-1, keepdim=True)), out=jacobian)
    return value, teacher_entropy


def _plain_exact(
    student_logits: Tensor, teacher_log_probs: Tensor, plain: PlainDivergence, spec: DivergenceSpec
) -> DivergenceOutput:
    """Autograd through the plain definition, for a divergence without a fused form."""
    dtype = compute_dtype(student_logits, teacher_log_probs)
    s = torch.log_softmax(student_logits.to(dtype) / spec.temperature, dim=-1)
    t = teacher_log_probs.detach().to(dtype)
    with torch.no_grad():
        teacher_entropy = entropy(t)
    return DivergenceOutput(
        divergence=plain(s, t, spec),
        teacher_entropy=teacher_entropy,
        high_entropy=teacher_entropy > spec.entropy_threshold,
        entropy_is_lower_bound=False,
    )


def exact_divergence_from_log_probs(
    student_logits: Tensor, teacher_log_probs: Tensor, spec: DivergenceSpec
) -> DivergenceOutput:
    """:func:`exact_divergence` with the teacher already as ``log_softmax(z_T / τ)``.

    ``teacher_log_probs`` ``[N, V]`` must be on the student's device. Live ``[N, V]``
    buffers with a fused form: the two inputs plus the returned gradient; everything else
    is per row block. Without one, autograd keeps several ``[N, V]`` intermediates.
    """
    _check_pair(student_logits, teacher_log_probs)
    row = get_divergence(spec.name)
    if row.fused is None:
        return _plain_exact(student_logits, teacher_log_probs, row.plain, spec)
    fused = row.fused
    dtype = compute_dtype(student_logits, teacher_log_probs)
    n, vocab = student_logits.shape
    need_grad = needs_grad(student_logits)
    tau = spec.temperature
    device = student_logits.device
    divergence = torch.empty(n, dtype=dtype, device=device)
    teacher_entropy = torch.empty(n, dtype=dtype, device=device)
    jacobian = torch.empty((n, vocab), dtype=dtype, device=device) if need_grad else None
    with torch.no_grad():
        for rows in row_blocks(n, vocab, device):
            s = scaled_log_softmax(student_logits[rows], tau, dtype)
            t = teacher_log_probs[rows].to(dtype)
            finite = bool((s.min() > NEG_INF) & (t.min() > NEG_INF))
            block = _finite_block if finite else _general_block
            block_jacobian = jacobian[rows] if jacobian is not None else None
            divergence[rows], teacher_entropy[rows] = block(s, t, fused, spec, block_jacobian)
            if block_jacobian is not None:
                project_rows_to_zero_sum(block_jacobian, s.exp_())
            if block_jacobian is not None and tau != 1.0:
                block_jacobian.div_(tau)
    return DivergenceOutput(
        divergence=attach_row_gradient(student_logits, divergence, jacobian),
        teacher_entropy=teacher_entropy,
        high_entropy=teacher_entropy > spec.entropy_threshold,
        entropy_is_lower_bound=False,
    )


def exact_divergence(
    student_logits: Tensor, teacher_logits: Tensor, spec: DivergenceSpec
) -> DivergenceOutput:
    """The divergence of ``spec`` between full-vocabulary distributions, per row.

    ``student_logits``, ``teacher_logits``: ``[N, V]``. Returns a
    :class:`DivergenceOutput` with ``divergence`` ``[N]`` (nats, differentiable w.r.t. the
    student logits), the exact teacher entropy ``[N]`` and the high-entropy flags.
    """
    _check_pair(student_logits, teacher_logits)
    dtype = compute_dtype(student_logits, teacher_logits)
    with torch.no_grad():
        teacher_log_probs = scaled_log_softmax(teacher_logits.detach(), spec.temperature, dtype)
    return exact_divergence_from_log_probs(student_logits, teacher_log_probs, spec)


def forward_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(p_T ‖ p_S) per row ``[N]`` in nats, from logits ``[N, V]`` at temperature τ."""
    spec = DivergenceSpec("forward_kl", temperature=temperature)
    return exact_divergence(student_logits, teacher_logits, spec).divergence


def reverse_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(p_S ‖ p_T) per row ``[N]`` in nats, analytic over the support (not sampled)."""
    spec = DivergenceSpec("reverse_kl", temperature=temperature)
    return exact_divergence(student_logits, teacher_logits, spec).divergence


def jsd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float = 1.0,
    beta: float = 0.5,
) -> Tensor:
    """Generalised JSD_β = β KL(p_T ‖ M) + (1 − β) KL(p_S ‖ M), M = β p_T + (1 − β) p_S.

    Per row ``[N]`` in nats. β → 0 behaves like forward KL (JSD/β → KL(p_T ‖ p_S)), β → 1
    like reverse KL, as in GKD, TRL and Liger.
    """
    spec = DivergenceSpec("jsd", temperature=temperature, jsd_beta=beta)
    return exact_divergence(student_logits, teacher_logits, spec).divergence


def entropy_aware(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float = 1.0,
    threshold: float = 0.8,
    forward_weight: float = 1.0,
) -> Tensor:
    """EOPD: KL(p_S ‖ p_T) + α · 1[H_T > h] · KL(p_T ‖ p_S) per row ``[N]`` in nats.

    ``threshold`` h is absolute, in nats, on the teacher entropy at temperature τ;
    ``forward_weight`` is α.
    """
    spec = DivergenceSpec(
        "entropy_aware",
        temperature=temperature,
        entropy_threshold=threshold,
        entropy_forward_weight=forward_weight,
    )
    return exact_divergence(student_logits, teacher_logits, spec).divergence


def sampled_token_nll(logits: Tensor, target_token_ids: Tensor) -> Tensor:
    """−log softmax(z)[y] per row ``[N]`` in nats, at temperature 1.

    ``logits`` ``[N, V]``, ``target_token_ids`` ``[N]`` long. Differentiable w.r.t. the
    logits through the analytic gradient softmax(z) − onehot(y).
    """
    if logits.dim() != 2 or target_token_ids.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, V] and target ids [N]; got {tuple(logits.shape)} and "
            f"{tuple(target_token_ids.shape)}"
        )
    n, vocab = logits.shape
    if n and (int(target_token_ids.min()) < 0 or int(target_token_ids.max()) >= vocab):
        raise ValueError(f"target token ids must lie in [0, {vocab})")
    return sampled_token_nll_unchecked(logits, target_token_ids)


def sampled_token_nll_unchecked(logits: Tensor, target_token_ids: Tensor) -> Tensor:
    """:func:`sampled_token_nll` without the range check (which syncs an accelerator);
    for callers that validated the ids once for all chunks."""
    n, vocab = logits.shape
    dtype = compute_dtype(logits)
    need_grad = needs_grad(logits)
    targets = target_token_ids.to(device=logits.device, dtype=torch.long).unsqueeze(-1)
    nll = torch.empty(n, dtype=dtype, device=logits.device)
    jacobian = torch.empty((n, vocab), dtype=dtype, device=logits.device) if need_grad else None
    with torch.no_grad():
        for rows in row_blocks(n, vocab, logits.device):
            z = logits[rows].to(dtype)
            log_norm = torch.logsumexp(z, dim=-1, keepdim=True)
            nll[rows] = (log_norm - z.gather(-1, targets[rows])).squeeze(-1)
            if jacobian is not None:
                probs = torch.sub(z, log_norm, out=jacobian[rows]).exp_()
                probs.scatter_add_(
                    -1, targets[rows], torch.full_like(targets[rows], -1, dtype=dtype)
                )
    return attach_row_gradient(logits, nll, jacobian)


__all__ = [
    "entropy_aware",
    "exact_divergence",
    "exact_divergence_from_log_probs",
    "forward_kl",
    "jsd",
    "reverse_kl",
    "sampled_token_nll",
]
