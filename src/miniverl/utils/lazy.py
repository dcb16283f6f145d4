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

TORCH_INSTALL = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
"""The CPU build of torch, from PyTorch's CPU wheel index: a plain ``pip install torch`` on
Linux resolves to the CUDA build (several GB). On a GPU machine: ``pip install torch==2.13.0``."""

EXTRAS_INSTALL = 'pip install -e ".[hf,dev]"'
"""miniverl with Hugging Face support (transformers, peft, gguf, ...) and the test tools, from
a clone; it keeps the torch installed before it."""

INSTALL_HINT = (
    f"from a clone of miniverl: {TORCH_INSTALL} (on a GPU machine: pip install torch==2.13.0), "
    f"then {EXTRAS_INSTALL} (README, Quick start)"
)
"""The one install line every hint for torch or the ``hf`` extra gives (``doctor``, ``demo``,
``train``, ``models fetch``, ...): the README's quick start, word for word
(``tests/unit/test_doctor_cli.py`` checks them against each other)."""


def install_hint(extra: str) -> str:
    """What to run when a package of ``extra`` (a ``pyproject.toml`` extra) is missing."""
    if extra in ("torch", "hf"):
        return INSTALL_HINT
    return f'from a clone of miniverl: pip install -e ".[{extra}]" (README, Quick start)'


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
        raise BackendError(
            f"{module} is not installed{why}",
            hint=install_hint(extra),
        ) from exc


def import_torch(purpose: str = "") -> ModuleType:
    """Import torch lazily, with an actionable error when the extra is missing."""
    return require("torch", purpose)
