"""Accelerator memory probes that report honestly when there is no accelerator.

On a CPU-only machine every measurement says ``not_run_no_cuda`` instead of a zero that
would read as "used no memory". torch is consulted only if it is already imported, so
these helpers never pull torch into a torch-free command.
"""

from __future__ import annotations

import sys
from typing import Any

NOT_RUN_NO_CUDA = "not_run_no_cuda"
_GIB = float(1 << 30)


def _torch_if_loaded() -> Any | None:
    return sys.modules.get("torch")


def cuda_available() -> bool:
    torch = _torch_if_loaded()
    return bool(torch is not None and torch.cuda.is_available())


def snapshot(device: str | None = None) -> dict[str, Any]:
    """Allocated/reserved/peak CUDA memory in GiB, or a ``not_run_no_cuda`` status."""
    if not cuda_available():
        return {"status": NOT_RUN_NO_CUDA}
    torch = _torch_if_loaded()
    dev = torch.device(device) if device and device.startswith("cuda") else torch.device("cuda")
    free, total = torch.cuda.mem_get_info(dev)
    return {
        "status": "measured",
        "device": str(dev),
        "allocated_gib": round(torch.cuda.memory_allocated(dev) / _GIB, 4),
        "reserved_gib": round(torch.cuda.memory_reserved(dev) / _GIB, 4),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated(dev) / _GIB, 4),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved(dev) / _GIB, 4),
        "free_gib": round(free / _GIB, 4),
        "total_gib": round(total / _GIB, 4),
    }


def free_vram_gib(device: str | None = None) -> float | None:
    """Free accelerator memory in GiB, or None without CUDA."""
    if not cuda_available():
        return None
    torch = _torch_if_loaded()
    free, _ = torch.cuda.mem_get_info(torch.device(device or "cuda"))
    return free / _GIB


def reset_peak(device: str | None = None) -> None:
    if cuda_available():
        _torch_if_loaded().cuda.reset_peak_memory_stats(device)


def is_oom_error(exc: BaseException) -> bool:
    """True for an allocation failure from torch: CUDA / MPS out of memory, or the CPU
    allocator refusing (``DefaultCPUAllocator: can't allocate memory``), so a CPU run under
    a memory cap splits its batch or fails with the same typed error a GPU run does."""
    torch = _torch_if_loaded()
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    message = str(exc).lower()
    return "out of memory" in message or "can't allocate memory" in message


def describe_gpu() -> dict[str, Any]:
    """Name, count and capability of visible GPUs, or a ``not_run_no_cuda`` status."""
    if not cuda_available():
        return {"status": NOT_RUN_NO_CUDA, "count": 0}
    torch = _torch_if_loaded()
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append(
            {
                "name": props.name,
                "total_memory_gib": round(props.total_memory / _GIB, 2),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return {
        "status": "measured",
        "count": len(devices),
        "devices": devices,
        "cuda": torch.version.cuda,
    }
