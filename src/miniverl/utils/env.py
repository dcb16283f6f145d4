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
from pathlib import Path
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


FLOAT_KERNEL_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
"""The x86 vector extensions that decide which matmul kernels torch's CPU backend picks, and so
the last bits of every float32 result: two CPUs that differ here need not reproduce each other's
weights bit for bit (``results/smollm2_calc_chain/LOG.md``, 2026-12-05)."""


def describe_cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model name and which of ``FLOAT_KERNEL_FLAGS`` it has.

    ``cpuinfo`` is the text of ``/proc/cpuinfo`` (read when ``None``; absent off Linux, where
    only ``platform.processor()`` is known and ``isa`` is ``None``).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return {"model": platform.processor() or None, "isa": None}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {
        "model": fields.get("model name") or platform.processor() or None,
        "isa": [flag for flag in FLOAT_KERNEL_FLAGS if flag in flags],
    }


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
        "cpu": describe_cpu(),
        "packages": package_versions(),
        "gpu": describe_gpu(),
        "env_vars": {k: os.environ[k] for k in NUMERIC_ENV_VARS if k in os.environ},
        "byteorder": sys.byteorder,
    }
