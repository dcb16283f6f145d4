"""Sanity bounds on recipe numbers and the path-component rule for names.

These sit in their own module because the section models (``config/sections.py``) and
:class:`~miniverl.config.models.RunConfig` (its combination rules and its validation-error
formatter) both need them, and the error messages point a user here to raise a bound.
"""

from __future__ import annotations

# Sanity bounds on numbers: they catch typos such as ``lr: 2e3`` or
# ``train_tasks: 1e9`` before anything is allocated. A real need for more is met by raising
# the constant here; the validation message names this file.
MAX_LR = 1.0
MAX_TEMPERATURE = 100.0
MAX_WEIGHT = 1e6
MAX_TASKS = 100_000
MAX_TOKENS = 131_072
MAX_STEPS = 1_000_000
MAX_SEED = 2**63 - 1
MAX_THREADS = 4096
MAX_NAME_CHARS = 128
MIN_CHUNK_SIZE = 16
"""The smallest loss projection chunk (rows): an explicit ``loss.chunk_size`` may not go
below it, and an out-of-memory retry stops halving there."""
BOUND_HINT = "a sanity bound; to go beyond it, raise the constant in src/miniverl/config/limits.py"


def path_component_problem(name: str) -> str | None:
    """Why ``name`` is not one safe path component (``None`` when it is).

    Names become directory and file names (``runs/<run.name>``), so ``/``, ``\\``, ``..``,
    NUL and other control characters, and a leading ``-`` or ``.`` are refused.
    """
    if not name or len(name) > MAX_NAME_CHARS:
        return f"must be 1 to {MAX_NAME_CHARS} characters"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "must not contain NUL or other control characters"
    if "/" in name or "\\" in name:
        return "must be a single path component (no '/' or '\\')"
    if name in (".", "..") or name.startswith((".", "-")):
        return "must not be '.' or '..' or start with '.' or '-'"
    return None


__all__ = [
    "BOUND_HINT",
    "MAX_LR",
    "MAX_NAME_CHARS",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_TASKS",
    "MAX_TEMPERATURE",
    "MAX_THREADS",
    "MAX_TOKENS",
    "MAX_WEIGHT",
    "path_component_problem",
]
