"""Top-k + tail ("bucketed") supervision (docs/objectives.md, "Supervision shapes").

The teacher is compressed per entry to K + 1 buckets: its K most probable ids and one tail
bucket holding the rest of the mass. The student is projected onto the same buckets and
the divergence is computed exactly between the two (K + 1)-point distributions. Merging
outcomes never increases an f-divergence, so the result lies in [0, exact divergence] and
equals it when K = V; no clamp is needed.

Gradient w.r.t. the student logits z (s = log_softmax(z / τ), S_b the student bucket
log-probs, g_b = dD/dS_b, G = Σ_b g_b):

    dD/dz_v = (g_b − p_S(v) G) / τ                        for v in top-k bucket b
    dD/dz_v = (g_tail · p_S(v) / P_S(tail) − p_S(v) G) / τ  for v in the tail

computed in the forward pass like the exact divergences. A divergence without a fused
form (:mod:`miniverl.losses.divergences`) is back-propagated by autograd through its plain
definition applied to the projected buckets (:func:`bucket_log_probs`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from miniverl.errors import ConfigError
from miniverl.losses.divergences import (
    DivergenceSpec,
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


def _check_logits(logits: Tensor, name: str) -> None:
    if logits.dim() != 2:
        raise ValueError(f"{name} must be [N, V]; got shape {tuple(logits.shape)}")


def teacher_topk_targets(
    teacher_logits: Tensor, k: int, temperature: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """Compress teacher logits ``[N, V]`` to top-k + tail targets at temperature τ.

    Returns ``(topk_indices [N, K] long, topk_log_probs [N, K] float32, tail_log_prob [N]
    float32)`` (float64 for float64 input). Ids are ordered by decreasing probability,
    ties broken by lower id first, so equal logits (common in bfloat16) give reproducible
    targets. Log-probs come from ``log_softmax`` (max-shifted), not logit − logsumexp:
    at large logit scales (|z| ~ 1e3) the subtraction of two large numbers rounds a small
    log-prob to 0 and shifts the bucketed forward KL by ~1e-3. The tail is the logsumexp of
    the log-probs over the complement: exact even when the top-k mass is 1 − 1e-9, where
    log1p(−Σ p) would have lost every digit. It is ``-inf`` when K = V.
    """
    _check_logits(teacher_logits, "teacher_logits")
    n, vocab = teacher_logits.shape
    if not 1 <= k <= vocab:
        raise ConfigError(
            f"loss.top_k must lie in [1, {vocab}] (the vocabulary size); got {k}",
            hint="lower loss.top_k, or use loss.mode: exact_full_vocab for the whole vocabulary",
        )
    if not temperature > 0:
        raise ConfigError(f"loss.temperature must be > 0; got {temperature}")
    dtype = compute_dtype(teacher_logits)
    device = teacher_logits.device
    indices = torch.empty((n, k), dtype=torch.long, device=device)
    log_probs = torch.empty((n, k), dtype=dtype, device=device)
    tail = torch.empty(n, dtype=dtype, device=device)
    with torch.no_grad():
        for rows in row_blocks(n, vocab, device):
            x = teacher_logits[rows].detach().to(dtype) / temperature
            if bool(torch.isnan(x).any()):
                raise ValueError("teacher logits contain NaN; top-k targets are undefined")
            log_p = torch.log_softmax(x, dim=-1)
            threshold = torch.topk(x, k, dim=-1).values[:, -1:]
            above = x > threshold
            at = x == threshold
            room = k - above.sum(-1, keepdim=True)
            chosen = above | (at & (at.cumsum(-1) <= room))
            ids = chosen.nonzero()[:, 1].view(-1, k)
            order = torch.sort(x.gather(-1, ids), dim=-1, descending=True, stable=True).indices
            ids = ids.gather(-1, order)
            indices[rows] = ids
            log_probs[rows] = log_p.gather(-1, ids)
            tail[rows] = torch.logsumexp(log_p.masked_fill_(chosen, NEG_INF), dim=-1)
    return indices, log_probs, tail


def _entropy_from_log_probs(log_probs: Tensor) -> Tensor:
    probs = log_probs.exp()
    return -torch.where(probs > 0, probs * log_probs, 0.0).sum(-1)


def teacher_entropy(teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Exact teacher entropy H_T = −Σ p_T log p_T ``[N]`` in nats, from logits ``[N, V]``."""
    _check_logits(teacher_logits, "teacher_logits")
    dtype = compute_dtype(teacher_logits)
    n, vocab = teacher_logits.shape
    out = torch.empty(n, dtype=dtype, device=teacher_logits.device)
    with torch.no_grad():
        for rows in row_blocks(n, vocab, teacher_logits.device):
            t = scaled_log_softmax(teacher_logits[rows].detach(), temperature, dtype)
            out[rows] = _entropy_from_log_probs(t)
    return out


def bucket_entropy(topk_log_probs: Tensor, tail_log_prob: Tensor) -> Tensor:
    """Entropy ``[N]`` (nats) of the K + 1 bucket distribution: a lower bound on H_T."""
    buckets = torch.cat([topk_log_probs, tail_log_prob.unsqueeze(-1)], dim=-1).detach()
    return _entropy_from_log_probs(buckets.to(compute_dtype(buckets)))


def normalized_buckets(buckets: Tensor) -> Tensor:
    """Bucket log-probs ``[N, K + 1]`` in float64, shifted so each row's masses sum to 1.

    Stored teacher targets may be float16 or bfloat16 (``cache.dtype``): rounding moves
    each log-prob by up to ~0.4%, the K + 1 masses then no longer sum to 1, and a
    divergence against them can be negative (−4e-3 nats with student = teacher). The
    student's buckets, from a float32 softmax over V, are off by O(V · eps) too. Both
    sides are therefore renormalised in float64 before the (K + 1)-point divergence, which
    is then a divergence between two distributions and ≥ 0 (float64 rounding, ~1e-16, is
    far below the smallest KL two distinct bf16-rounded distributions can have).
    """
    wide = buckets.to(torch.float64)
    if wide.shape[0] == 0:
        return wide
    return wide - torch.logsumexp(wide, dim=-1, keepdim=True)


def bucket_log_probs(log_probs: Tensor, topk_indices: Tensor) -> Tensor:
    """Project a distribution onto K + 1 buckets: ``[N, V], [N, K] -> [N, K + 1]`` log-probs.

    Bucket j < K is log p(topk_indices[:, j]); bucket K, the tail, is the logsumexp of
    log p over the other ids (``-inf`` when there are none, K = V). Plain autograd: the
    logsumexp of an all-``-inf`` row back-propagates NaN, so such rows are computed from a
    stand-in of zeros and then set to ``-inf`` (their gradient is 0, as it should be).
    """
    ids = topk_indices.to(device=log_probs.device, dtype=torch.long)
    rest = log_probs.scatter(-1, ids, NEG_INF)
    with torch.no_grad():
        has_tail = (rest > NEG_INF).any(-1, keepdim=True)
    tail = torch.logsumexp(torch.where(has_tail, rest, 0.0), dim=-1, keepdim=True)
    tail = torch.where(has_tail, tail, NEG_INF)
    return torch.cat([log_probs.gather(-1, ids), tail], dim=-1)


def _plain_bucketed(
    student_logits: Tensor,
    topk_indices: Tensor,
    teacher_buckets: Tensor,
    plain: PlainDivergence,
    spec: DivergenceSpec,
    dtype: torch.dtype,
) -> Tensor:
    """Autograd through the plain definition on the (K + 1)-point distributions, for a
    divergence without a fused form: ``[N]`` in ``dtype``."""
    s = torch.log_softmax(student_logits.to(dtype) / spec.temperature, dim=-1)
    student_buckets = normalized_buckets(bucket_log_probs(s, topk_indices))
    return plain(student_buckets, teacher_buckets, spec).to(dtype)


def bucketed_divergence(
    student_logits: Tensor,
    topk_indices: Tensor,
    topk_log_probs: Tensor,
    tail_log_prob: Tensor,
    spec: DivergenceSpec,
) -> DivergenceOutput:
    """The divergence of ``spec`` between student and teacher projected onto K + 1 buckets.

    ``student_logits`` ``[N, V]``; ``topk_indices`` ``[N, K]`` (distinct ids per row);
    ``topk_log_probs`` ``[N, K]`` and ``tail_log_prob`` ``[N]`` are the teacher's bucket
    log-probs at temperature τ, as :func:`teacher_topk_targets` returns them. The student
    buckets are log p_S at the teacher's ids and the logsumexp of log p_S over the
    complement. A ``-inf`` tail bucket (K = V) has zero mass on both sides and drops out.
    Both bucket vectors are renormalised in float64 (:func:`normalized_buckets`), so
    low-precision stored targets never give a negative divergence.
    ``teacher_entropy`` is the bucket entropy, flagged as a lower bound unless K = V.
    """
    _check_logits(student_logits, "student_logits")
    n, vocab = student_logits.shape
    if (
        topk_indices.dim() != 2
        or topk_indices.shape[0] != n
        or topk_log_probs.shape != topk_indices.shape
    ):
        raise ValueError(
            "expected topk_indices and topk_log_probs [N, K] with N matching the student logits; "
            f"got {tuple(topk_indices.shape)}, {tuple(topk_log_probs.shape)} for N = {n}"
        )
    if tail_log_prob.shape != (n,):
        raise ValueError(f"tail_log_prob must be [N] = [{n}]; got {tuple(tail_log_prob.shape)}")
    if topk_indices.shape[1] > vocab:
        raise ValueError(f"K = {topk_indices.shape[1]} exceeds the vocabulary size {vocab}")
    dtype = compute_dtype(student_logits, topk_log_probs)
    device = student_logits.device
    tau = spec.temperature
    need_grad = needs_grad(student_logits)
    ids = topk_indices.to(device=device, dtype=torch.long)
    teacher_buckets = normalized_buckets(
        torch.cat(
            [
                topk_log_probs.detach().to(device=device, dtype=dtype),
                tail_log_prob.detach().to(device=device, dtype=dtype).unsqueeze(-1),
            ],
            dim=-1,
        )
    )
    with torch.no_grad():
        wide_entropy = entropy(teacher_buckets)
    teacher_entropy = wide_entropy.to(dtype)
    high_entropy = teacher_entropy > spec.entropy_threshold
    lower_bound = topk_indices.shape[1] < vocab
    row = get_divergence(spec.name)
    if row.fused is None:
        return DivergenceOutput(
            divergence=_plain_bucketed(
                student_logits, ids, teacher_buckets, row.plain, spec, dtype
            ),
            teacher_entropy=teacher_entropy,
            high_entropy=high_entropy,
            entropy_is_lower_bound=lower_bound,
        )
    fused = row.fused
    divergence = torch.empty(n, dtype=dtype, device=device)
    jacobian = torch.empty((n, vocab), dtype=dtype, device=device) if need_grad else None
    lowest = torch.finfo(dtype).min
    with torch.no_grad():
        for rows in row_blocks(n, vocab, device):
            s = scaled_log_softmax(student_logits[rows], tau, dtype)
            block_ids = ids[rows]
            tail_log_probs = s.scatter(-1, block_ids, NEG_INF)
            student_tail = torch.logsumexp(tail_log_probs, dim=-1, keepdim=True)
            student_buckets = torch.cat([s.gather(-1, block_ids), student_tail], dim=-1)
            value, grad = fused.terms(
                normalized_buckets(student_buckets),
                teacher_buckets[rows],
                wide_entropy[rows],
                spec,
                need_grad,
            )
            grad = grad.to(dtype) if grad is not None else None
            divergence[rows] = value
            if jacobian is not None and grad is not None:
                # p_S(v) / P_S(tail) for tail tokens, 0 on the top-k ids (and everywhere
                # when the tail is empty: the clamp keeps −inf − (−inf) from giving NaN).
                share_of_tail = tail_log_probs.sub_(student_tail.clamp(min=lowest)).exp_()
                spread = share_of_tail.mul_(grad[:, -1:]).scatter_(-1, block_ids, grad[:, :-1])
                p_s = s.exp_()
                torch.sub(spread, p_s * grad.sum(-1, keepdim=True), out=jacobian[rows])
                project_rows_to_zero_sum(jacobian[rows], p_s)
                if tau != 1.0:
                    jacobian[rows].div_(tau)
    return DivergenceOutput(
        divergence=attach_row_gradient(student_logits, divergence, jacobian),
        teacher_entropy=teacher_entropy,
        high_entropy=high_entropy,
        entropy_is_lower_bound=lower_bound,
    )


__all__ = [
    "bucket_entropy",
    "bucket_log_probs",
    "bucketed_divergence",
    "normalized_buckets",
    "teacher_entropy",
    "teacher_topk_targets",
]
