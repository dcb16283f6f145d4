"""Machine and package description for ``environment.json`` (docs/design.md §5.2).

An allow-list, not a deny-list: hostname, username, home directory, absolute paths
outside the run and every environment variable except the five that can change numerics
are never collected, so a run directory can be shared as-is.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

from miniverl.utils.gpu import describe_gpu

NUMERIC_ENV_VARS = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
)

TRACKED_PACKAGES = (
    "miniverl",
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "tokenizers",
    "safetensors",
    "bitsandbytes",
    "pydantic",
    "numpy",
    "typer",
    "rich",
    "matplotlib",
    "jinja2",
    "pyyaml",
)


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed version of each package, ``None`` when absent. Imports nothing."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def collect_environment() -> dict[str, Any]:
    """The allow-listed machine description. Contains no identifying data."""
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
        },
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        "gpu": describe_gpu(),
        "env_vars": {k: os.environ[k] for k in NUMERIC_ENV_VARS if k in os.environ},
        "byteorder": sys.byteorder,
    }
