"""Full-vocabulary divergences and the sampled-token NLL (docs/objectives.md).

Every function takes logits ``[N, V]`` and returns one value per row ``[N]`` in nats,
summed over the vocabulary. Computation is in float32 for float16/bfloat16/float32 input
and in float64 for float64 input. Results are differentiable with respect to the student
logits; teacher logits are constants and never receive a gradient.

The gradient is computed analytically in the forward pass (see
:mod:`miniverl.losses.numerics`): for s = log_softmax(z_S / τ) and g = dD/ds,

    dD/dz_S = (g − p_S · Σ_v g_v) / τ,

so the autograd graph keeps one ``[N, V]`` tensor (that gradient) per call. Each row of
that gradient is projected back onto the zero-sum plane
(:func:`~miniverl.losses.numerics.project_rows_to_zero_sum`): the exact gradient of a
function of a softmax sums to 0, and float32 at V = 151,936 otherwise drifts by up to 6e-5.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from miniverl.losses.numerics import (
    NEG_INF,
    DivergenceOutput,
    DivergenceSpec,
    attach_row_gradient,
    compute_dtype,
    divergence_terms,
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
    s: Tensor, t: Tensor, spec: DivergenceSpec, jacobian: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Closed forms for a block whose student and teacher log-probs are all finite.

    ``s``, ``t``: ``[R, V]`` log-probs at temperature τ. Writes dD/dz_S · τ into
    ``jacobian`` (``[R, V]``) when given and returns ``(divergence [R], entropy [R])``.
    With g = dD/ds from :func:`divergence_terms`, τ · dD/dz = g − p_S Σ g simplifies to
      forward  p_S − p_T
      reverse  p_S (s − t − D)
      jsd      (1 − β) p_S (s − m − KL(p_S ‖ M))
    Equivalent to the general path, without its zero-probability masks (boolean masks are
    the slowest elementwise operations on CPU).
    """
    p_s = s.exp()
    p_t = t.exp()
    entropy = -torch.linalg.vecdot(p_t, t)
    if spec.name == "forward_kl":
        value = torch.linalg.vecdot(p_t, t - s)
        if jacobian is not None:
            torch.sub(p_s, p_t, out=jacobian)
    elif spec.name == "jsd":
        beta = spec.jsd_beta
        log_m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))
        student_part = torch.linalg.vecdot(p_s, s - log_m)
        value = beta * torch.linalg.vecdot(p_t, t - log_m) + (1.0 - beta) * student_part
        if jacobian is not None:
            log_m.neg_().add_(s).sub_(student_part.unsqueeze(-1)).mul_(p_s)
            torch.mul(log_m, 1.0 - beta, out=jacobian)
    else:
        log_ratio = s - t
        value = torch.linalg.vecdot(p_s, log_ratio)
        gate = forward_value = None
        if spec.name == "entropy_aware":
            gate = (entropy > spec.entropy_threshold).to(value.dtype) * spec.entropy_forward_weight
            forward_value = -torch.linalg.vecdot(p_t, log_ratio)
        if jacobian is not None:
            torch.mul(log_ratio.sub_(value.unsqueeze(-1)), p_s, out=jacobian)
            if gate is not None:
                jacobian.add_(gate.unsqueeze(-1) * (p_s - p_t))
        if gate is not None and forward_value is not None:
            value = value + gate * forward_value
    return value, entropy


def _general_block(
    s: Tensor, t: Tensor, spec: DivergenceSpec, jacobian: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Any block, including ``-inf`` log-probs: :func:`divergence_terms` chained through
    the softmax, τ · dD/dz = g − p_S Σ_v g_v."""
    value, entropy, grad = divergence_terms(s, t, spec, need_grad=jacobian is not None)
    if jacobian is not None and grad is not None:
        torch.sub(grad, s.exp().mul_(grad.sum(-1, keepdim=True)), out=jacobian)
    return value, entropy


def exact_divergence_from_log_probs(
    student_logits: Tensor, teacher_log_probs: Tensor, spec: DivergenceSpec
) -> DivergenceOutput:
    """:func:`exact_divergence` with the teacher already as ``log_softmax(z_T / τ)``.

    ``teacher_log_probs`` ``[N, V]`` must be on the student's device. Live ``[N, V]``
    buffers: the two inputs plus the returned gradient; everything else is per row block.
    """
    _check_pair(student_logits, teacher_log_probs)
    dtype = compute_dtype(student_logits, teacher_log_probs)
    n, vocab = student_logits.shape
    need_grad = needs_grad(student_logits)
    tau = spec.temperature
    device = student_logits.device
    divergence = torch.empty(n, dtype=dtype, device=device)
    entropy = torch.empty(n, dtype=dtype, device=device)
    jacobian = torch.empty((n, vocab), dtype=dtype, device=device) if need_grad else None
    with torch.no_grad():
        for rows in row_blocks(n, vocab, device):
            s = scaled_log_softmax(student_logits[rows], tau, dtype)
            t = teacher_log_probs[rows].to(dtype)
            finite = bool((s.min() > NEG_INF) & (t.min() > NEG_INF))
            block = _finite_block if finite else _general_block
            block_jacobian = jacobian[rows] if jacobian is not None else None
            divergence[rows], entropy[rows] = block(s, t, spec, block_jacobian)
            if block_jacobian is not None:
                project_rows_to_zero_sum(block_jacobian, s.exp_())
            if block_jacobian is not None and tau != 1.0:
                block_jacobian.div_(tau)
    return DivergenceOutput(
        divergence=attach_row_gradient(student_logits, divergence, jacobian),
        teacher_entropy=entropy,
        high_entropy=entropy > spec.entropy_threshold,
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
