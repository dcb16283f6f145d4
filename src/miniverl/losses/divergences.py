"""The divergences: each defined once, in plain PyTorch, and the registry (docs/objectives.md).

Read this module against docs/objectives.md. Every divergence is a plain autograd function
of two normalised log-probability tensors over the same M outcomes,

    divergence(student_log_probs [N, M], teacher_log_probs [N, M], spec) -> [N] nats,

in the manner of TRL's ``generalized_jsd_loss``, with the temperature already applied:
the inputs are log softmax(z / τ). Both supervision shapes use the same definition:

- ``exact_full_vocab``: M = V, the two full-vocabulary distributions;
- ``bucketed``: M = K + 1, the teacher's top-k ids and a tail bucket, with the student
  projected onto the same buckets (:func:`~miniverl.losses.bucketed.bucket_log_probs`).
  The bucketed loss *is* the divergence between the two (K + 1)-point distributions, so
  no divergence needs a bucketed variant.

An outcome of zero probability (a ``-inf`` log-prob: a masked token, or the empty tail
bucket when K = V) contributes 0 to every sum, and back-propagates 0, not NaN.

**Registry.** :data:`DIVERGENCES` maps each ``loss.divergence`` name to a
:class:`Divergence`: the plain function above and, optionally, a :class:`FusedDivergence`
with hand-derived gradients. The losses (:mod:`~miniverl.losses.exact`,
:mod:`~miniverl.losses.bucketed`, hence the chunked loss) use the fused form when a row has
one, and autograd through the plain function when it does not. Adding a divergence is one
plain function and one row here, plus its name in the ``loss.divergence`` Literal of
``config/sections.py`` (config cannot import torch-using code;
``tests/unit/test_divergences.py`` checks that the Literal lists exactly these names).
A fused form is an optimisation: it must agree with the plain function in value and
gradient, which ``tests/unit/test_divergences.py`` checks for every row that has one.

The plain path keeps autograd's intermediates, several ``[N, M]`` tensors per call; the
fused path computes the gradient in the forward pass and keeps one (docs/design.md §3.7).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from miniverl.errors import ConfigError

NEG_INF = float("-inf")


# ====================================================================== parameters


@dataclass(frozen=True)
class DivergenceSpec:
    """Which divergence to compute and its parameters (``loss.*`` in a recipe).

    - ``name``: a key of :data:`DIVERGENCES`: ``forward_kl`` KL(p_T ‖ p_S),
      ``reverse_kl`` KL(p_S ‖ p_T), ``jsd`` the generalised JSD with weight ``jsd_beta``
      on the teacher, or ``entropy_aware`` reverse KL plus ``entropy_forward_weight`` ·
      forward KL where H_T > ``entropy_threshold``. With bucketed targets H_T is the
      entropy of the K + 1 buckets, a lower bound on the teacher's entropy, so the gate
      thresholds that estimate and opens at most as often as the full-vocabulary entropy
      would open it.
    - ``temperature``: τ > 0, applied to student and teacher logits alike.
    - ``jsd_beta``: β in (0, 1); checked only when ``name`` is ``jsd``.
    - ``entropy_threshold``: h in nats (absolute), ≥ 0. Also used to report the fraction
      of high-entropy entries for every divergence.
    - ``entropy_forward_weight``: α ≥ 0.
    """

    name: str
    temperature: float = 1.0
    jsd_beta: float = 0.5
    entropy_threshold: float = 0.8
    entropy_forward_weight: float = 1.0

    def __post_init__(self) -> None:
        get_divergence(self.name)
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


# ====================================================================== the definitions


def kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v)) per row: ``[N, M], [N, M] -> [N]`` nats.

    Terms with p(v) = 0 are 0. The log-ratio is masked as well as the product, so a
    ``-inf − (−inf)`` never reaches autograd (it would turn the gradient into NaN).
    """
    p = log_p.exp()
    log_ratio = torch.where(p > 0, log_p - log_q, 0.0)
    return (p * log_ratio).sum(-1)


def entropy(log_p: Tensor) -> Tensor:
    """H(p) = −Σ_v p(v) log p(v) per row: ``[N, M] -> [N]`` nats; p(v) = 0 contributes 0."""
    p = log_p.exp()
    return -(p * torch.where(p > 0, log_p, 0.0)).sum(-1)


def log_mixture(log_p: Tensor, log_q: Tensor, weight: float) -> Tensor:
    """log(w p + (1 − w) q) per outcome, ``[N, M]``, for 0 < w < 1.

    Where p(v) = q(v) = 0 the result is ``-inf``; it is built from a finite stand-in there
    because ``logaddexp(−inf, −inf)`` back-propagates NaN even under a zero gradient.
    """
    empty = (log_p == NEG_INF) & (log_q == NEG_INF)
    a = torch.where(empty, 0.0, log_p + math.log(weight))
    b = torch.where(empty, 0.0, log_q + math.log1p(-weight))
    return torch.where(empty, NEG_INF, torch.logaddexp(a, b))


def forward_kl(
    student_log_probs: Tensor, teacher_log_probs: Tensor, spec: DivergenceSpec
) -> Tensor:
    """KL(p_T ‖ p_S) ``[N]`` nats: mode-covering."""
    return kl(teacher_log_probs, student_log_probs)


def reverse_kl(
    student_log_probs: Tensor, teacher_log_probs: Tensor, spec: DivergenceSpec
) -> Tensor:
    """KL(p_S ‖ p_T) ``[N]`` nats: mode-seeking, analytic over the support (not sampled).
    +inf where the teacher has zero probability and the student does not."""
    return kl(student_log_probs, teacher_log_probs)


def jsd(student_log_probs: Tensor, teacher_log_probs: Tensor, spec: DivergenceSpec) -> Tensor:
    """JSD_β = β KL(p_T ‖ M) + (1 − β) KL(p_S ‖ M), M = β p_T + (1 − β) p_S, ``[N]`` nats.

    β = ``spec.jsd_beta``; β → 0 behaves like forward KL, β → 1 like reverse KL (GKD, TRL).
    """
    beta = spec.jsd_beta
    log_m = log_mixture(teacher_log_probs, student_log_probs, beta)
    return beta * kl(teacher_log_probs, log_m) + (1.0 - beta) * kl(student_log_probs, log_m)


def entropy_aware(
    student_log_probs: Tensor, teacher_log_probs: Tensor, spec: DivergenceSpec
) -> Tensor:
    """EOPD: KL(p_S ‖ p_T) + α · 1[H_T > h] · KL(p_T ‖ p_S), ``[N]`` nats.

    H_T is the entropy of the teacher distribution given (of the K + 1 buckets under
    bucketed targets), h = ``spec.entropy_threshold`` nats, α = ``spec.entropy_forward_weight``.
    """
    gate = entropy(teacher_log_probs) > spec.entropy_threshold
    forward = spec.entropy_forward_weight * kl(teacher_log_probs, student_log_probs)
    return kl(student_log_probs, teacher_log_probs) + torch.where(gate, forward, 0.0)


# ====================================================================== fused forms
#
# Hand-derived gradients for the default path. Each ``*_terms`` works on any pair of
# normalised log-probs [R, M] (zero probabilities included) and returns the divergence [R]
# and dD/ds [R, M], the gradient with the student log-probs s as free coordinates; the
# caller chains it through the softmax and the bucket projection. With m = log M:
#   forward  D = Σ p_T (t − s)                          dD/ds = −p_T
#   reverse  D = Σ p_S (s − t)                          dD/ds = p_S (s − t + 1)
#   jsd      D = β Σ p_T (t − m) + (1−β) Σ p_S (s − m)  dD/ds = (1−β) p_S (s − m)
# (for jsd the terms through ∂m/∂s cancel exactly). Each ``*_closed_form`` is the
# full-vocabulary shortcut for blocks whose log-probs are all finite: it writes
# τ · dD/dz = g − p_S Σ_v g_v (g = dD/ds), simplified, into ``jacobian``:
#   forward  p_S − p_T
#   reverse  p_S (s − t − D)
#   jsd      (1 − β) p_S (s − m − KL(p_S ‖ M))
# without the zero-probability masks (boolean masks are the slowest elementwise
# operations on CPU).


def _forward_kl_terms(
    s: Tensor, t: Tensor, teacher_entropy: Tensor, spec: DivergenceSpec, need_grad: bool
) -> tuple[Tensor, Tensor | None]:
    p_t = t.exp()
    value = torch.where(p_t > 0, p_t * (t - s), 0.0).sum(-1)
    return value, (-p_t if need_grad else None)


def _reverse_kl_terms(
    s: Tensor, t: Tensor, teacher_entropy: Tensor, spec: DivergenceSpec, need_grad: bool
) -> tuple[Tensor, Tensor | None]:
    p_s = s.exp()
    s_live = p_s > 0
    log_ratio = torch.where(s_live, s - t, 0.0)
    value = (p_s * log_ratio).sum(-1)
    return value, (torch.where(s_live, p_s * (log_ratio + 1.0), 0.0) if need_grad else None)


def _jsd_terms(
    s: Tensor, t: Tensor, teacher_entropy: Tensor, spec: DivergenceSpec, need_grad: bool
) -> tuple[Tensor, Tensor | None]:
    p_s, p_t = s.exp(), t.exp()
    beta = spec.jsd_beta
    log_m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))
    teacher_part = torch.where(p_t > 0, p_t * (t - log_m), 0.0).sum(-1)
    student_log_ratio = torch.where(p_s > 0, s - log_m, 0.0)
    value = beta * teacher_part + (1.0 - beta) * (p_s * student_log_ratio).sum(-1)
    return value, ((1.0 - beta) * p_s * student_log_ratio if need_grad else None)


def _entropy_aware_terms(
    s: Tensor, t: Tensor, teacher_entropy: Tensor, spec: DivergenceSpec, need_grad: bool
) -> tuple[Tensor, Tensor | None]:
    value, grad = _reverse_kl_terms(s, t, teacher_entropy, spec, need_grad)
    high = teacher_entropy > spec.entropy_threshold
    gate = high.to(value.dtype) * spec.entropy_forward_weight
    forward_value, forward_grad = _forward_kl_terms(s, t, teacher_entropy, spec, need_grad)
    value = value + torch.where(high, gate * forward_value, 0.0)
    if grad is not None and forward_grad is not None:
        grad = grad + gate.unsqueeze(-1) * forward_grad
    return value, grad


def _forward_kl_closed_form(
    s: Tensor,
    t: Tensor,
    p_s: Tensor,
    p_t: Tensor,
    teacher_entropy: Tensor,
    spec: DivergenceSpec,
    jacobian: Tensor | None,
) -> Tensor:
    value = torch.linalg.vecdot(p_t, t - s)
    if jacobian is not None:
        torch.sub(p_s, p_t, out=jacobian)
    return value


def _reverse_kl_closed_form(
    s: Tensor,
    t: Tensor,
    p_s: Tensor,
    p_t: Tensor,
    teacher_entropy: Tensor,
    spec: DivergenceSpec,
    jacobian: Tensor | None,
) -> Tensor:
    log_ratio = s - t
    value = torch.linalg.vecdot(p_s, log_ratio)
    if jacobian is not None:
        torch.mul(log_ratio.sub_(value.unsqueeze(-1)), p_s, out=jacobian)
    return value


def _jsd_closed_form(
    s: Tensor,
    t: Tensor,
    p_s: Tensor,
    p_t: Tensor,
    teacher_entropy: Tensor,
    spec: DivergenceSpec,
    jacobian: Tensor | None,
) -> Tensor:
    beta = spec.jsd_beta
    log_m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))
    student_part = torch.linalg.vecdot(p_s, s - log_m)
    value = beta * torch.linalg.vecdot(p_t, t - log_m) + (1.0 - beta) * student_part
    if jacobian is not None:
        log_m.neg_().add_(s).sub_(student_part.unsqueeze(-1)).mul_(p_s)
        torch.mul(log_m, 1.0 - beta, out=jacobian)
    return value


def _entropy_aware_closed_form(
    s: Tensor,
    t: Tensor,
    p_s: Tensor,
    p_t: Tensor,
    teacher_entropy: Tensor,
    spec: DivergenceSpec,
    jacobian: Tensor | None,
) -> Tensor:
    log_ratio = s - t
    value = torch.linalg.vecdot(p_s, log_ratio)
    gate = (teacher_entropy > spec.entropy_threshold).to(value.dtype)
    gate = gate * spec.entropy_forward_weight
    forward_value = -torch.linalg.vecdot(p_t, log_ratio)
    if jacobian is not None:
        torch.mul(log_ratio.sub_(value.unsqueeze(-1)), p_s, out=jacobian)
        jacobian.add_(gate.unsqueeze(-1) * (p_s - p_t))
    return value + gate * forward_value


# ====================================================================== the registry

PlainDivergence = Callable[[Tensor, Tensor, DivergenceSpec], Tensor]
"""``(student_log_probs [N, M], teacher_log_probs [N, M], spec) -> divergence [N]`` nats."""

FusedTerms = Callable[[Tensor, Tensor, Tensor, DivergenceSpec, bool], tuple[Tensor, Tensor | None]]
"""``(s [R, M], t [R, M], teacher_entropy [R], spec, need_grad) -> (D [R], dD/ds [R, M] | None)``."""

FusedClosedForm = Callable[
    [Tensor, Tensor, Tensor, Tensor, Tensor, DivergenceSpec, Tensor | None], Tensor
]
"""``(s, t, p_S, p_T [R, V], teacher_entropy [R], spec, jacobian [R, V] | None) -> D [R]``."""


@dataclass(frozen=True)
class FusedDivergence:
    """The hand-derived form of one divergence, used by the default chunked path.

    - ``terms``: value and dD/ds on any normalised log-probs ``[R, M]``, zero
      probabilities included (bucketed targets, and full-vocabulary blocks holding a
      ``-inf``). Required.
    - ``closed_form``: the full-vocabulary shortcut for all-finite blocks, writing
      τ · dD/dz_S into ``jacobian``. When ``None``, such blocks use ``terms`` too.
    """

    terms: FusedTerms
    closed_form: FusedClosedForm | None = None


@dataclass(frozen=True)
class Divergence:
    """One registry row: the definition, and the fused form when there is one.

    With ``fused=None`` the losses back-propagate through ``plain`` with autograd.
    """

    plain: PlainDivergence
    fused: FusedDivergence | None = None


DIVERGENCES: dict[str, Divergence] = {
    "forward_kl": Divergence(
        forward_kl, FusedDivergence(_forward_kl_terms, _forward_kl_closed_form)
    ),
    "reverse_kl": Divergence(
        reverse_kl, FusedDivergence(_reverse_kl_terms, _reverse_kl_closed_form)
    ),
    "jsd": Divergence(jsd, FusedDivergence(_jsd_terms, _jsd_closed_form)),
    "entropy_aware": Divergence(
        entropy_aware, FusedDivergence(_entropy_aware_terms, _entropy_aware_closed_form)
    ),
}
"""``loss.divergence`` name -> :class:`Divergence`, the one list of divergences."""

DIVERGENCE_NAMES: tuple[str, ...] = tuple(DIVERGENCES)
"""The names the package ships (the keys of :data:`DIVERGENCES` at import)."""


def get_divergence(name: str) -> Divergence:
    """The registry row of ``name``; :class:`ConfigError` naming the choices if unknown."""
    row = DIVERGENCES.get(name)
    if row is None:
        raise ConfigError(f"loss.divergence must be one of {', '.join(DIVERGENCES)}; got {name!r}")
    return row


__all__ = [
    "DIVERGENCES",
    "DIVERGENCE_NAMES",
    "Divergence",
    "DivergenceSpec",
    "FusedDivergence",
    "entropy",
    "entropy_aware",
    "forward_kl",
    "get_divergence",
    "jsd",
    "kl",
    "log_mixture",
    "reverse_kl",
]
