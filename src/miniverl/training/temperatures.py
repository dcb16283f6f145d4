"""Which temperature does what, recorded and explained (sampling vs. loss temperature).

Two temperatures meet in an OPD cycle and they need not agree:

- ``rollout.temperature`` τ_s: the student *samples* its rollouts from softmax(z / τ_s),
  which decides which states get visited;
- ``loss.temperature`` τ: the divergence compares softmax(z_S / τ) with softmax(z_T / τ)
  at those states, which decides which distribution is being matched.

With τ_s ≠ τ the objective is still well defined, but it is not "match the teacher on the
distribution the student samples from": the states come from the τ_s-policy and the
matched distribution is the τ-policy. Both are recorded in the manifest and in every
metric record, and an ``opd`` run where they differ logs a ``temperature_mismatch``
warning event saying so.
"""

from __future__ import annotations

from typing import Any

from miniverl.config.models import RunConfig


def temperature_fields(config: RunConfig, phase: str | None = None) -> dict[str, float | None]:
    """``sampling_temperature`` and ``loss_temperature`` for a metric record of ``phase``.

    SFT steps train on oracle traces with cross-entropy at temperature 1, so neither
    temperature applies to them (``None``).
    """
    if phase == "sft" or config.run.mode == "sft":
        return {"sampling_temperature": None, "loss_temperature": None}
    return {
        "sampling_temperature": config.rollout.temperature,
        "loss_temperature": config.loss.temperature,
    }


def temperature_mismatch(config: RunConfig) -> dict[str, Any] | None:
    """The warning event's fields when an ``opd`` recipe samples and matches at different τ."""
    sampling, loss = config.rollout.temperature, config.loss.temperature
    if config.run.mode != "opd" or sampling == loss:
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


__all__ = ["temperature_fields", "temperature_mismatch"]
