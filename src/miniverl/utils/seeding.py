"""Deterministic seeds that are identical across processes, Python versions and OSes.

Python's ``hash()`` is salted per process (PYTHONHASHSEED), so it must never feed a seed.
:func:`derive_seed` hashes its parts with SHA-256 instead.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any


def derive_seed(*parts: object, bits: int = 63) -> int:
    """A non-negative integer seed from ``parts``, stable everywhere.

    ``derive_seed(1234, "calc-train-0:v0:s7")`` is the same integer in every process.
    Parts are joined by their ``repr`` of ``str`` form with a separator that cannot occur
    inside an integer, so ``(1, 23)`` and ``(12, 3)`` differ.
    """
    if not 1 <= bits <= 64:
        raise ValueError("bits must be in [1, 64]")
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - bits)


def seed_everything(seed: int, *, deterministic: bool = True) -> None:
    """Seed Python's ``random`` and, when torch is already installed, torch and numpy."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def capture_rng_state() -> dict[str, Any]:
    """JSON-serializable RNG state of Python and torch (CPU and CUDA) for checkpoints."""
    state: dict[str, Any] = {"python": _python_state_to_json(random.getstate())}
    try:
        import torch
    except ImportError:
        return state
    state["torch_cpu"] = torch.get_rng_state().tolist()
    if torch.cuda.is_available():
        state["torch_cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_python_state_from_json(state["python"]))
    if "torch_cpu" not in state:
        return
    import torch

    torch.set_rng_state(torch.tensor(state["torch_cpu"], dtype=torch.uint8))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.tensor(s, dtype=torch.uint8) for s in state["torch_cuda"]]
        )


def _python_state_to_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_state_from_json(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)
