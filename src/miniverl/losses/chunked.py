"""The chunked selected-position loss with a two-stage backward (docs/objectives.md, docs/design.md §3.7).

Only the hidden states of selected prediction positions reach the loss (``[N, H]``). They
are projected to logits a chunk of rows at a time; each chunk's loss is back-propagated
into a leaf copy of its hidden states (and into the LM-head parameters) and its logits are
freed before the next chunk. One backward through the backbone follows, with the
concatenated hidden-state gradients. Peak extra memory is O(chunk · V), independent of N
and of sequence length, and neither the loss nor any gradient depends on the chunk size,
which is what lets an out-of-memory retry halve it and change nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from miniverl.errors import ConfigError
from miniverl.losses.exact import sampled_token_nll_unchecked
from miniverl.losses.numerics import compute_dtype
from miniverl.losses.providers import ChunkTargetProvider


@dataclass
class ChunkedLossResult:
    """Values of one :func:`chunked_selected_position_loss` call.

    Scaling convention: ``loss``, ``divergence_loss``, ``sampled_token_nll`` and the values
    of ``loss_by_span_type`` all carry the factor ``loss_scale / weight_normalizer`` of the
    loss, so summing a field over the micro-batches of a group gives the group value
    (1/G) Σ_r Σ_i ŵ_{r,i} x_{r,i}. ``loss = divergence_loss + ce_weight ·
    sampled_token_nll``, and ``loss_by_span_type`` sums to ``loss``. ``sampled_token_nll``
    is not multiplied by ``ce_weight``.

    ``teacher_entropy_mean`` (nats) and ``high_entropy_fraction`` are unweighted over the
    N entries of this call; ``None`` without a provider or with N = 0.
    ``teacher_entropy_is_lower_bound`` says whether they came from bucketed targets.
    """

    loss: float
    divergence_loss: float
    sampled_token_nll: float
    teacher_entropy_mean: float | None
    high_entropy_fraction: float | None
    loss_by_span_type: dict[str, float] = field(default_factory=dict)
    num_positions: int = 0
    num_chunks: int = 0
    chunk_size: int = 1
    teacher_entropy_is_lower_bound: bool = False


def check_chunk_size(chunk_size: int) -> int:
    """The one guard on a projection chunk (rows per ``[chunk, V]``), for every projector.

    The recipe's ``loss.chunk_size`` is checked by the config rules and decided by
    :func:`miniverl.training.resolve.resolve_chunk_size`; this refuses a bad argument at the
    functions that project (the chunked loss and the teacher scorer).
    """
    if chunk_size < 1:
        raise ConfigError(f"loss.chunk_size must be >= 1; got {chunk_size}")
    return chunk_size


def _flat_weights(weights: Tensor | Sequence[Tensor], device: torch.device) -> Tensor:
    if isinstance(weights, Tensor):
        flat = weights
    elif len(weights) == 0:
        flat = torch.zeros(0)
    else:
        flat = torch.cat([torch.as_tensor(row).reshape(-1) for row in weights])
    return flat.detach().to(device=device, dtype=torch.float64)


def chunked_selected_position_loss(
    hidden_states: Tensor,
    lm_head: Callable[[Tensor], Tensor],
    weights: Tensor | Sequence[Tensor],
    weight_normalizer: int | float,
    provider: ChunkTargetProvider | None,
    target_token_ids: Tensor,
    ce_weight: float,
    chunk_size: int,
    backward: bool,
    loss_scale: float = 1.0,
    span_types: Sequence[str] | None = None,
) -> ChunkedLossResult:
    """Loss = loss_scale · (1/weight_normalizer) · Σ_i w_i (D_i + ce_weight · NLL_i).

    - ``hidden_states``: ``[N, H]`` student hidden states at the selected positions, in
      row order; may be a non-leaf attached to the backbone graph.
    - ``lm_head``: ``[c, H] -> [c, V]`` (e.g. ``student.project``), trainable or frozen.
    - ``weights``: ``[N]`` normalised weights (each trajectory's entries sum to one, see
      :func:`~miniverl.losses.reduction.normalize_trajectory_weights`), or that function's
      list of rows, concatenated here.
    - ``weight_normalizer``: B_b, the number of trajectories in this micro-batch.
    - ``provider``: teacher targets for the N rows, or ``None`` for the sampled-token NLL
      alone (SFT; then pass ``ce_weight=1``).
    - ``target_token_ids``: ``[N]`` the sampled tokens y_i; NLL_i is at temperature 1, D_i
      at the provider's temperature.
    - ``chunk_size``: rows projected at once, any value ≥ 1; results do not depend on it.
    - ``backward``: back-propagate now (two-stage, below); otherwise compute under
      ``torch.no_grad()``.
    - ``loss_scale``: B_b / G, so micro-batches accumulate to the group mean.
    - ``span_types``: optional ``N`` span-type names for ``loss_by_span_type``.

    Backward: for each chunk, a leaf copy of the chunk's hidden states is projected and its
    loss is back-propagated into that copy and the LM-head parameters; after the last chunk
    one ``hidden_states.backward`` with the concatenated gradients runs the backbone (skipped
    when ``hidden_states`` does not require grad). Gradients accumulate into ``.grad``.
    Entries with zero weight contribute exactly 0, even if their divergence is infinite.
    """
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states must be [N, H]; got {tuple(hidden_states.shape)}")
    check_chunk_size(chunk_size)
    n = int(hidden_states.shape[0])
    device = hidden_states.device
    flat_weights = _flat_weights(weights, device)
    if flat_weights.shape != (n,):
        raise ValueError(f"weights must hold N = {n} entries; got {tuple(flat_weights.shape)}")
    if target_token_ids.shape != (n,):
        raise ValueError(
            f"target_token_ids must be [N] = [{n}]; got {tuple(target_token_ids.shape)}"
        )
    if provider is not None and provider.num_positions != n:
        raise ValueError(
            f"the provider holds {provider.num_positions} positions for N = {n} hidden states"
        )
    if span_types is not None and len(span_types) != n:
        raise ValueError(f"span_types must name N = {n} entries; got {len(span_types)}")

    num_chunks = -(-n // chunk_size)
    if n == 0:
        return ChunkedLossResult(0.0, 0.0, 0.0, None, None, {}, 0, 0, chunk_size)
    if not weight_normalizer > 0:
        raise ValueError(f"weight_normalizer must be > 0; got {weight_normalizer}")
    targets = target_token_ids.to(device=device, dtype=torch.long)
    lowest_target, highest_target = int(targets.min()), int(targets.max())

    row_scale = flat_weights * (float(loss_scale) / float(weight_normalizer))
    divergences = torch.zeros(n, dtype=torch.float64, device=device)
    nlls = torch.zeros(n, dtype=torch.float64, device=device)
    entropies = torch.zeros(n, dtype=torch.float64, device=device)
    high = torch.zeros(n, dtype=torch.bool, device=device)
    lower_bound = False
    track_hidden = backward and hidden_states.requires_grad
    hidden_grads: list[Tensor] = []

    with torch.enable_grad() if backward else torch.no_grad():
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            hidden_chunk = hidden_states[start:end].detach()
            if track_hidden:
                hidden_chunk.requires_grad_()
            # Live [c, V] buffers per chunk, never more than three at once:
            #   - the student logits, until both terms below exist;
            #   - inside provider.divergence (exact): teacher logits, then teacher log-probs
            #     (the logits are freed once these exist), then the divergence gradient
            #     while the log-probs are still alive; the log-probs go on return;
            #   - the NLL gradient, only when ce_weight != 0 (with the logits and the
            #     divergence gradient).
            # Backward scales the saved gradients in place; all else is per row block or [c].
            logits = lm_head(hidden_chunk)
            if lowest_target < 0 or highest_target >= logits.shape[-1]:
                raise ValueError(f"target token ids must lie in [0, {logits.shape[-1]})")
            dtype = compute_dtype(logits)
            scale = row_scale[start:end].to(dtype)
            chunk_loss = logits.new_zeros((), dtype=dtype)
            if provider is not None:
                out = provider.divergence(logits, start, end)
                lower_bound = lower_bound or out.entropy_is_lower_bound
                divergence = out.divergence.to(dtype)
                chunk_loss = chunk_loss + torch.where(scale != 0, scale * divergence, 0.0).sum()
                divergences[start:end] = divergence.detach().to(torch.float64)
                entropies[start:end] = out.teacher_entropy.to(torch.float64)
                high[start:end] = out.high_entropy
            if ce_weight != 0:
                nll = sampled_token_nll_unchecked(logits, targets[start:end])
                chunk_loss = (
                    chunk_loss + ce_weight * torch.where(scale != 0, scale * nll, 0.0).sum()
                )
            else:
                with torch.no_grad():
                    nll = sampled_token_nll_unchecked(logits, targets[start:end])
            nlls[start:end] = nll.detach().to(torch.float64)
            del logits
            if backward and chunk_loss.requires_grad:
                chunk_loss.backward()
            del chunk_loss
            if track_hidden:
                grad = hidden_chunk.grad
                hidden_grads.append(grad if grad is not None else torch.zeros_like(hidden_chunk))

    if track_hidden:
        hidden_states.backward(torch.cat(hidden_grads))

    live = row_scale != 0
    zero = torch.zeros((), dtype=torch.float64, device=device)
    weighted_div = torch.where(live, row_scale * divergences, zero)
    weighted_nll = torch.where(live, row_scale * nlls, zero)
    per_entry = weighted_div + ce_weight * weighted_nll
    by_span: dict[str, float] = {}
    if span_types is not None:
        for name in dict.fromkeys(span_types):
            mask = torch.tensor([s == name for s in span_types], device=device)
            by_span[name] = float(per_entry[mask].sum())
    return ChunkedLossResult(
        loss=float(per_entry.sum()),
        divergence_loss=float(weighted_div.sum()) if provider is not None else 0.0,
        sampled_token_nll=float(weighted_nll.sum()),
        teacher_entropy_mean=float(entropies.mean()) if provider is not None else None,
        high_entropy_fraction=float(high.double().mean()) if provider is not None else None,
        loss_by_span_type=by_span,
        num_positions=n,
        num_chunks=num_chunks,
        chunk_size=chunk_size,
        teacher_entropy_is_lower_bound=lower_bound,
    )


__all__ = ["ChunkedLossResult", "check_chunk_size", "chunked_selected_position_loss"]
