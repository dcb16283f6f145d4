"""Shared numerics of the objective layer (docs/objectives.md).

One routine, :func:`divergence_terms`, holds the mathematics of every divergence. It works
on any pair of normalised log-probability tensors ``[R, M]``: the full vocabulary
(``M = V``, exact supervision) or the K + 1 buckets of top-k + tail supervision. It
returns the divergence, the teacher entropy and the gradient of the divergence with
respect to the student log-probabilities, all in closed form. The bucketed module chains
that gradient back to the student logits; the exact module does too for blocks that hold a
zero probability, and uses the simplified closed forms (``exact._finite_block``) for the
usual all-finite blocks.

Gradients are computed in the forward pass and attached to the student logits by
:func:`attach_row_gradient` (the pattern of Liger-Kernel's fused linear losses). Autograd
therefore saves one ``[R, V]`` tensor per call, the gradient itself, instead of the
softmaxes, differences and products a plain autograd graph would keep alive.

Work over the vocabulary is done in blocks of rows (:func:`row_blocks`), so temporaries are
``O(block · V)`` and never ``[R, V]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from miniverl.errors import ConfigError

DivergenceName = Literal["forward_kl", "reverse_kl", "jsd", "entropy_aware"]
DIVERGENCE_NAMES: tuple[str, ...] = get_args(DivergenceName)

NEG_INF = float("-inf")

# Elements per row block. On CPU, 2^19 (3 rows at V = 151,936, 2 MiB per float32
# temporary) keeps temporaries cache-sized and under glibc's mmap threshold, so they are not
# mapped and page-faulted afresh for every block. On an accelerator, 2^22 (27 rows, 16 MiB)
# keeps kernel launches few while the ~8 temporaries stay near one [256, V] chunk buffer.
_CPU_BLOCK_ELEMENTS = 1 << 19
_ACCELERATOR_BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class DivergenceSpec:
    """Which divergence to compute and its parameters (``loss.*`` in a recipe).

    - ``name``: ``forward_kl`` KL(p_T ‖ p_S), ``reverse_kl`` KL(p_S ‖ p_T), ``jsd`` the
      generalised JSD with weight ``jsd_beta`` on the teacher, or ``entropy_aware``
      reverse KL plus ``entropy_forward_weight`` · forward KL where H_T >
      ``entropy_threshold``. With bucketed targets H_T is the entropy of the K + 1
      buckets, a lower bound on the teacher's entropy, so the gate thresholds that
      estimate and opens at most as often as the full-vocabulary entropy would open it.
    - ``temperature``: τ > 0, applied to student and teacher logits alike.
    - ``jsd_beta``: β in (0, 1); checked only when ``name`` is ``jsd``.
    - ``entropy_threshold``: h in nats (absolute), ≥ 0. Also used to report the fraction
      of high-entropy entries for every divergence.
    - ``entropy_forward_weight``: α ≥ 0.
    """

    name: DivergenceName
    temperature: float = 1.0
    jsd_beta: float = 0.5
    entropy_threshold: float = 0.8
    entropy_forward_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in DIVERGENCE_NAMES:
            raise ConfigError(
                f"loss.divergence must be one of {', '.join(DIVERGENCE_NAMES)}; got {self.name!r}"
            )
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(
                f"loss.temperature must be a finite number > 0; got {self.temperature}"
            )
        if self.name == "jsd" and not (0.0 < self.jsd_beta < 1.0):
            raise ConfigError(
                f"loss.jsd_beta must satisfy 0 < beta < 1; got {self.jsd_beta}",
                hint="use divergence: forward_kl for beta = 0 or reverse_kl for beta = 1",
            )
        if not (math.isfinite(self.entropy_threshold) and self.entropy_threshold >= 0):
            raise ConfigError(
                f"loss.entropy_threshold must be a finite number of nats >= 0; got {self.entropy_threshold}"
            )
        if not (math.isfinite(self.entropy_forward_weight) and self.entropy_forward_weight >= 0):
            raise ConfigError(
                "loss.entropy_forward_weight must be a finite number >= 0; "
                f"got {self.entropy_forward_weight}"
            )


@dataclass
class DivergenceOutput:
    """Per-entry result of a divergence over ``N`` entries.

    - ``divergence``: ``[N]`` nats, differentiable with respect to the student logits only.
    - ``teacher_entropy``: ``[N]`` nats, no gradient. From bucketed targets it is the
      entropy of the K + 1 bucket distribution, a lower bound on the true entropy.
    - ``high_entropy``: ``[N]`` bool, ``teacher_entropy > spec.entropy_threshold``.
    - ``entropy_is_lower_bound``: true when any entry's entropy came from buckets.
    """

    divergence: Tensor
    teacher_entropy: Tensor
    high_entropy: Tensor
    entropy_is_lower_bound: bool

    @staticmethod
    def concat(parts: list[DivergenceOutput]) -> DivergenceOutput:
        """Row-wise concatenation; the divergence stays differentiable."""
        return DivergenceOutput(
            divergence=torch.cat([p.divergence for p in parts]),
            teacher_entropy=torch.cat([p.teacher_entropy for p in parts]),
            high_entropy=torch.cat([p.high_entropy for p in parts]),
            entropy_is_lower_bound=any(p.entropy_is_lower_bound for p in parts),
        )


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (float16/bfloat16 are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def row_blocks(num_rows: int, row_width: int, device: torch.device) -> Iterator[slice]:
    """Slices of consecutive rows, a few MiB of elements each (see the block sizes above)."""
    elements = _CPU_BLOCK_ELEMENTS if device.type == "cpu" else _ACCELERATOR_BLOCK_ELEMENTS
    step = max(1, elements // max(1, row_width))
    for start in range(0, num_rows, step):
        yield slice(start, min(start + step, num_rows))


def scaled_log_softmax(logits: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
    """``log_softmax(logits / τ)`` in ``dtype`` along the last axis, ``[R, V] -> [R, V]``.

    Filled block by block into one output buffer, so the only full-size allocation is the
    result (no upcast copy and no scaled copy of the input).
    """
    out = torch.empty(logits.shape, dtype=dtype, device=logits.device)
    for rows in row_blocks(logits.shape[0], logits.shape[-1], logits.device):
        block = logits[rows].to(dtype)
        if temperature != 1.0:
            block = block / temperature
        torch.log_softmax(block, dim=-1, out=out[rows])
    return out


def divergence_terms(
    student_log_probs: Tensor,
    teacher_log_probs: Tensor,
    spec: DivergenceSpec,
    *,
    need_grad: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Divergence, teacher entropy and dD/d(student log-probs) over ``[R, M]`` inputs.

    Both inputs are normalised log-probabilities over the same M outcomes (the vocabulary,
    or the K + 1 buckets). A term whose weight p(v) is 0 (a ``-inf`` log-prob, an empty
    tail bucket, or a probability below the dtype's range) contributes 0, so none of them
    produces NaN; reverse KL against a teacher zero where p_S(v) > 0 is +inf, as it
    should. Returns ``(divergence [R], teacher_entropy [R], grad [R, M] or None)``, where
    ``grad`` treats the student log-probabilities as free coordinates; the callers chain it
    through the softmax (and the bucket projection).

    Gradients with respect to s = log p_S (m = log M for jsd):
      forward  D = Σ p_T (t − s)                    dD/ds = −p_T
      reverse  D = Σ p_S (s − t)                    dD/ds = p_S (s − t + 1)
      jsd      D = β Σ p_T (t − m) + (1−β) Σ p_S (s − m)   dD/ds = (1−β) p_S (s − m)
    (for jsd the terms through ∂m/∂s cancel exactly).
    """
    s, t = student_log_probs, teacher_log_probs
    p_s = s.exp()
    p_t = t.exp()
    s_live = p_s > 0
    t_live = p_t > 0
    teacher_entropy = -torch.where(t_live, p_t * t, 0.0).sum(-1)
    high_entropy = teacher_entropy > spec.entropy_threshold

    def forward() -> tuple[Tensor, Tensor | None]:
        value = torch.where(t_live, p_t * (t - s), 0.0).sum(-1)
        return value, (-p_t if need_grad else None)

    def reverse() -> tuple[Tensor, Tensor | None]:
        log_ratio = torch.where(s_live, s - t, 0.0)
        value = (p_s * log_ratio).sum(-1)
        return value, (torch.where(s_live, p_s * (log_ratio + 1.0), 0.0) if need_grad else None)

    if spec.name == "forward_kl":
        value, grad = forward()
    elif spec.name == "reverse_kl":
        value, grad = reverse()
    elif spec.name == "jsd":
        beta = spec.jsd_beta
        log_m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))
        teacher_part = torch.where(t_live, p_t * (t - log_m), 0.0).sum(-1)
        student_log_ratio = torch.where(s_live, s - log_m, 0.0)
        value = beta * teacher_part + (1.0 - beta) * (p_s * student_log_ratio).sum(-1)
        grad = (1.0 - beta) * p_s * student_log_ratio if need_grad else None
    else:
        value, grad = reverse()
        alpha = spec.entropy_forward_weight
        gate = high_entropy.to(value.dtype) * alpha
        forward_value, forward_grad = forward()
        value = value + torch.where(high_entropy, gate * forward_value, 0.0)
        if grad is not None and forward_grad is not None:
            grad = grad + gate.unsqueeze(-1) * forward_grad
    return value, teacher_entropy, grad


def project_rows_to_zero_sum(jacobian: Tensor, student_probs: Tensor) -> Tensor:
    """Remove the float32 drift of ``jacobian`` ``[R, M]`` rows off the zero-sum plane, in place.

    Every divergence depends on the logits only through the softmax, which is invariant
    to adding a constant to a row, so each row of dD/dz sums to exactly 0. In float32 at
    large M it does not: Σ_v p_S(v) differs from 1 by O(M · eps), and closed forms such
    as p_S (s − t − D) inherit D · (1 − Σ p_S) (6.4e-5 at V = 151,936 for reverse KL).
    That residue is proportional to p_S, so it is removed along p_S:
    ``jacobian -= p_S · Σ jacobian / Σ p_S``, which leaves rows whose entries are
    negligible (p_S ≈ 0) untouched, unlike subtracting the row mean.
    """
    total = student_probs.sum(-1, keepdim=True)
    drift = jacobian.sum(-1, keepdim=True).div_(total.clamp(min=torch.finfo(total.dtype).tiny))
    return jacobian.sub_(student_probs * drift)


class _AttachRowGradient(torch.autograd.Function):
    """Identity on per-row values whose Jacobian w.r.t. the logits was computed already.

    ``jacobian[i]`` is d values[i] / d logits[i] (``[R, V]``, each value depends only on its
    own row). Backward scales it in place by the incoming ``[R]`` gradient and hands it to
    autograd, so the saved Jacobian is the only ``[R, V]`` tensor this node keeps alive.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, values: Tensor, jacobian: Tensor) -> Tensor:
        ctx.jacobian = jacobian
        ctx.logits_dtype = logits.dtype
        return values.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_values: Tensor) -> tuple[Tensor, None, None]:
        jacobian = ctx.jacobian
        if jacobian is None:
            raise RuntimeError(
                "this divergence stores its gradient, not its inputs, so it can be "
                "back-propagated only once; recompute it instead of using retain_graph"
            )
        ctx.jacobian = None
        scale = grad_values.to(jacobian.dtype).unsqueeze(-1)
        jacobian.mul_(scale)
        # A row with an infinite divergence but zero weight would otherwise give 0 · inf.
        jacobian.masked_fill_(scale == 0, 0.0)
        return jacobian.to(ctx.logits_dtype), None, None


def attach_row_gradient(logits: Tensor, values: Tensor, jacobian: Tensor | None) -> Tensor:
    """Return ``values`` ``[R]`` made differentiable w.r.t. ``logits`` ``[R, V]``.

    ``jacobian`` ``[R, V]`` is consumed (scaled in place during backward). With
    ``jacobian=None`` the values are returned detached.
    """
    if jacobian is None:
        return values
    return _AttachRowGradient.apply(logits, values, jacobian)


def needs_grad(tensor: Tensor) -> bool:
    """Whether a gradient w.r.t. ``tensor`` can be requested in the current grad mode."""
    return torch.is_grad_enabled() and tensor.requires_grad


__all__ = [
    "DIVERGENCE_NAMES",
    "DivergenceName",
    "DivergenceOutput",
    "DivergenceSpec",
    "attach_row_gradient",
    "compute_dtype",
    "divergence_terms",
    "needs_grad",
    "project_rows_to_zero_sum",
    "row_blocks",
    "scaled_log_softmax",
]
