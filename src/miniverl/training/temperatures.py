"""Which temperature does what, recorded and explained (sampling vs. loss temperature).

Two temperatures meet in an OPD cycle and they need not agree:

- ``rollout.temperature`` τ_s: the student *samples* its rollouts from softmax(z / τ_s),
  which decides which states get visited;
- ``loss.temperature`` τ: the divergence compares softmax(z_S / τ) with softmax(z_T / τ)
  at those states, which decides which distribution is being matched.

With τ_s ≠ τ the objective is still well defined, but it is not "match the teacher on the
distribution the student samples from": the states come from the τ_s-policy and the
matched distribution is the τ-policy. Both are recorded in the manifest and in every
metric record, and an on-policy run (``opd``, ``gkd_mix``) where they differ logs a ``temperature_mismatch``
warning event saying so.
"""

from __future__ import annotations

from typing import Any

from miniverl.config.models import RunConfig

SAMPLING_MODES = frozenset({"offline_kd", "opd", "seqkd", "gkd_mix"})
"""Modes whose training trajectories are sampled (by the student or the teacher) at
``rollout.temperature``; ``sft`` and ``kd_oracle`` train on oracle traces."""
TEACHER_TARGET_MODES = frozenset({"offline_kd", "opd", "kd_oracle", "gkd_mix"})
"""Modes whose loss is a divergence at ``loss.temperature``; ``sft`` and ``seqkd`` are
cross-entropy on hard labels (temperature 1)."""
ON_POLICY_MODES = frozenset({"opd", "gkd_mix"})
"""Modes whose (some) rollouts come from the student being trained."""


def temperature_fields(config: RunConfig, phase: str | None = None) -> dict[str, float | None]:
    """``sampling_temperature`` and ``loss_temperature`` for a metric record of ``phase``.

    A temperature that does not apply is ``None``: SFT steps (and the warm-up, phase
    ``sft``) train on oracle traces with cross-entropy; ``seqkd`` samples but trains with
    cross-entropy; ``kd_oracle`` matches the teacher but samples nothing.
    """
    mode = "sft" if phase == "sft" else config.run.mode
    return {
        "sampling_temperature": config.rollout.temperature if mode in SAMPLING_MODES else None,
        "loss_temperature": config.loss.temperature if mode in TEACHER_TARGET_MODES else None,
    }


def temperature_mismatch(config: RunConfig) -> dict[str, Any] | None:
    """The warning event's fields when an ``opd`` recipe samples and matches at different τ."""
    sampling, loss = config.rollout.temperature, config.loss.temperature
    if config.run.mode not in ON_POLICY_MODES or sampling == loss:
        return None
    return {
        "sampling_temperature": sampling,
        "loss_temperature": loss,
        "explanation": (
            f"rollout.temperature {sampling:g} != loss.temperature {loss:g}: rollouts visit the states "
            f"of softmax(z/{sampling:g}), but the loss matches softmax(z_S/{loss:g}) to softmax(z_T/{loss:g}) "
            "there; the sampling distribution itself is not what is matched"
        ),
    }


__all__ = [
    "ON_POLICY_MODES",
    "SAMPLING_MODES",
    "TEACHER_TARGET_MODES",
    "temperature_fields",
    "temperature_mismatch",
]
