"""Shared machinery of the objective layer: dtypes, row blocks, gradient attachment.

Nothing here is specific to a divergence (those are :mod:`miniverl.losses.divergences`).
The fused losses compute their gradient in the forward pass and attach it to the student
logits with :func:`attach_row_gradient` (the pattern of Liger-Kernel's fused linear
losses): autograd then saves one ``[R, V]`` tensor per call, the gradient itself, instead
of the softmaxes, differences and products a plain autograd graph would keep alive.

Work over the vocabulary is done in blocks of rows (:func:`row_blocks`), so temporaries are
``O(block · V)`` and never ``[R, V]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

NEG_INF = float("-inf")

# Elements per row block. On CPU, 2^19 (3 rows at V = 151,936, 2 MiB per float32
# temporary) keeps temporaries cache-sized and under glibc's mmap threshold, so they are not
# mapped and page-faulted afresh for every block. On an accelerator, 2^22 (27 rows, 16 MiB)
# keeps kernel launches few while the ~8 temporaries stay near one [256, V] chunk buffer.
_CPU_BLOCK_ELEMENTS = 1 << 19
_ACCELERATOR_BLOCK_ELEMENTS = 1 << 22


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
    "DivergenceOutput",
    "attach_row_gradient",
    "compute_dtype",
    "needs_grad",
    "project_rows_to_zero_sum",
    "row_blocks",
    "scaled_log_softmax",
]
