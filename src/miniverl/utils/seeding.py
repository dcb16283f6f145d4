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
    """Put back what :func:`capture_rng_state` took; a malformed ``state`` is a ``ValueError``
    naming the part (``rng.python``...) before any generator is touched."""
    problem = rng_state_problem(state)
    if problem is not None:
        raise ValueError(problem)
    random.setstate(_python_state_from_json(state["python"]))
    if "torch_cpu" not in state:
        return
    import torch

    torch.set_rng_state(torch.tensor(state["torch_cpu"], dtype=torch.uint8))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.tensor(s, dtype=torch.uint8) for s in state["torch_cuda"]]
        )


_MT_WORDS = 624
"""Mersenne Twister state words; Python's state tuple holds them plus the position (0..624)."""


def _byte_list_problem(value: Any, where: str) -> str | None:
    if not isinstance(value, list) or not value:
        return f"{where} must be a non-empty list of bytes"
    if not all(type(b) is int and 0 <= b <= 255 for b in value):
        return f"{where} must hold only integers in [0, 255]"
    return None


def rng_state_problem(state: Any) -> str | None:
    """Why ``state`` is not a JSON RNG block :func:`restore_rng_state` can apply (None if it is).

    The shape is ``{"python": [3, [625 ints], gauss], "torch_cpu"?: [bytes],
    "torch_cuda"?: [[bytes], ...]}``: Python's Mersenne Twister words are unsigned 32-bit,
    its position is 0..624, ``gauss`` is null or a number; torch states are byte lists.
    Checked here, before anything is restored, so an edited ``state.json`` is a message
    naming the part rather than an unpacking error deep in ``random.setstate``.
    """
    if not isinstance(state, dict):
        return "rng must be a JSON object"
    python = state.get("python")
    if "python" not in state:
        return "rng.python is missing"
    if not isinstance(python, list) or len(python) != 3:
        return "rng.python must be [version, [625 state words], gauss]"
    version, internal, gauss = python
    if version != 3 or type(version) is not int:
        return f"rng.python version must be 3, got {version!r}"
    if not isinstance(internal, list) or len(internal) != _MT_WORDS + 1:
        return f"rng.python state must be a list of {_MT_WORDS + 1} integers"
    if not all(type(w) is int and 0 <= w < 2**32 for w in internal):
        return "rng.python state words must be integers in [0, 2**32)"
    if internal[-1] > _MT_WORDS:
        return f"rng.python position {internal[-1]} is past {_MT_WORDS}"
    if gauss is not None and (isinstance(gauss, bool) or not isinstance(gauss, int | float)):
        return "rng.python gauss must be null or a number"
    if "torch_cpu" in state:
        problem = _byte_list_problem(state["torch_cpu"], "rng.torch_cpu")
        if problem:
            return problem
    if "torch_cuda" in state:
        cuda = state["torch_cuda"]
        if not isinstance(cuda, list):
            return "rng.torch_cuda must be a list of per-device byte lists"
        for i, device_state in enumerate(cuda):
            problem = _byte_list_problem(device_state, f"rng.torch_cuda[{i}]")
            if problem:
                return problem
    return None


def _python_state_to_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_state_from_json(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)
