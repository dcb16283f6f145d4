"""The strict-OPD check: the update changes exactly the weights that sampled its rollouts.

The trainer calls :func:`check_on_policy` on every optimizer group of a strict ``opd``
run, before any gradient is computed, whatever the supervision path (cache on or off,
teacher resident or swapped, bucketed or ``exact_full_vocab`` targets). It compares
fingerprints (:mod:`miniverl.models.fingerprint`), not the ``policy_version`` counter:

- the rollout's fingerprint, stamped by the rollout runner from the backend that sampled
  it, must equal the fingerprint of the student's current trainable weights (computed
  after the last optimizer commit or weight load);
- the teacher targets' fingerprint (carried by the score result, and by the cache entry
  when targets come back from disk) must equal the rollout's.

Either difference is an :class:`~miniverl.errors.OffPolicyError` (a
:class:`~miniverl.errors.StaleCacheError`) and no gradient is taken.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from miniverl.errors import OffPolicyError


class FingerprintedSample(Protocol):
    """What the check reads from a ``TrainingSample``."""

    rollout_policy_version: int
    rollout_fingerprint: str | None
    target_fingerprint: str | None

    @property
    def trajectory_id(self) -> str: ...


def check_on_policy(
    samples: Iterable[FingerprintedSample], current_fingerprint: str | None
) -> None:
    """Raise :class:`OffPolicyError` unless every sample was sampled and scored for the current weights."""
    for sample in samples:
        rollout = sample.rollout_fingerprint
        if current_fingerprint is None or rollout != current_fingerprint:
            raise OffPolicyError(
                f"strict OPD: rollout {sample.trajectory_id!r} (policy_version "
                f"{sample.rollout_policy_version}) was sampled by weights with policy fingerprint "
                f"{rollout}, but the student about to be updated has fingerprint {current_fingerprint}"
            )
        if sample.target_fingerprint != rollout:
            raise OffPolicyError(
                f"strict OPD: the teacher targets of {sample.trajectory_id!r} were produced for "
                f"policy fingerprint {sample.target_fingerprint}, but the rollout has {rollout}",
                hint="rescore the rollout with the teacher; do not reuse targets across weights",
            )


__all__ = ["FingerprintedSample", "check_on_policy"]
