"""Policy fingerprint: a digest of the weights that sample, so "on-policy" can be checked.

``policy_version`` is a counter the trainer assigns; comparing it with itself proves
nothing about which weights produced a rollout. The fingerprint is computed from the
weights themselves: BLAKE2b-128 over the raw bytes (plus dtype and shape) of every
trainable parameter, in ``trainable_parameters()`` order. For the toy student that is
every weight; for a LoRA student it is the adapter. Two backends whose trainable tensors
differ in a single bit get different fingerprints, and a frozen teacher (no trainable
parameters) gets the fingerprint of the empty set, which no trained student has.

Cost: one pass over the trainable bytes (about 0.4 MB for the toy student, a few MB for a
LoRA adapter), plus a device-to-host copy when the weights live on an accelerator;
``benchmarks/fingerprint_cost.py`` measures it against a training cycle.

torch is imported inside the functions only: the rollout loop (a torch-free module) calls
:func:`backend_fingerprint` on whatever backend it was given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

FINGERPRINT_PREFIX = "b2-"
"""Marks the algorithm, so a fingerprint of another scheme can never compare equal."""


def tensor_fingerprint(tensors: Iterable[Any]) -> str:
    """``"b2-" + 32 hex``: BLAKE2b-128 of each tensor's dtype, shape and bytes, in order."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    count = 0
    with torch.no_grad():
        for tensor in tensors:
            t = tensor.detach()
            if t.device.type != "cpu":
                t = t.to("cpu")
            t = t.contiguous().reshape(-1)
            digest.update(f"{t.dtype}:{tuple(tensor.shape)};".encode())
            digest.update(t.view(torch.uint8).numpy() if t.numel() else b"")
            count += 1
    digest.update(f"n={count}".encode())
    return FINGERPRINT_PREFIX + digest.hexdigest()


def backend_fingerprint(backend: Any) -> str | None:
    """Fingerprint of ``backend.trainable_parameters()``; ``None`` for a backend without them.

    ``None`` never equals a real fingerprint, so a rollout from a backend that cannot be
    fingerprinted fails the strict on-policy check instead of passing it.
    """
    params = getattr(backend, "trainable_parameters", None)
    if params is None:
        return None
    return tensor_fingerprint(params())


__all__ = ["FINGERPRINT_PREFIX", "backend_fingerprint", "tensor_fingerprint"]
