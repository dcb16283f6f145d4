"""Lazy imports of optional heavy dependencies.

The base install has no torch. Every module that needs it at run time calls
:func:`import_torch` inside a function, so importing miniverl for ``inspect`` or
``validate`` never loads it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from miniverl.errors import BackendError

_EXTRA_FOR = {
    "torch": "torch",
    "numpy": "torch",
    "safetensors": "torch",
    "transformers": "hf",
    "peft": "hf",
    "accelerate": "hf",
    "tokenizers": "hf",
    "bitsandbytes": "quant",
    "scipy": "lab",
}
_TORCH_FREE_EXTRAS = {"lab"}
"""Extras that install without torch: their hint does not send the user to torch first."""


def is_available(module: str) -> bool:
    """True when ``module`` can be imported, without importing it.

    ``find_spec`` raises (rather than returning ``None``) for a submodule whose parent is
    missing, for a module whose ``sys.modules`` entry is ``None`` or has no spec, and when
    an import hook refuses the name; all of those mean "not available".
    """
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise :class:`BackendError` naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRA_FOR.get(module.split(".")[0], "torch")
        why = f" (needed for {purpose})" if purpose else ""
        torch_first = (
            "" if extra in _TORCH_FREE_EXTRAS else "  (install torch first: README, Quick start)"
        )
        raise BackendError(
            f"{module} is not installed{why}", hint=f"pip install 'miniverl[{extra}]'{torch_first}"
        ) from exc


def import_torch(purpose: str = "") -> ModuleType:
    """Import torch lazily, with an actionable error when the extra is missing."""
    return require("torch", purpose)
