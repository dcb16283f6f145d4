"""Memory strategies and the out-of-memory retry (docs/design.md §3.9).

``resolve_strategy`` turns ``memory.strategy`` into a :class:`MemoryPlan` with a written
reason, recorded in ``config.resolved.yaml`` and the manifest, so ``auto`` never silently
changes what a run did. ``run_with_oom_retry`` halves the projection chunk size and
nothing else: the chunked loss is exactly invariant to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from miniverl.config.models import RunConfig
from miniverl.errors import ConfigError, GpuMemoryError
from miniverl.utils.gpu import free_vram_gib, is_oom_error
from miniverl.utils.logging import EventLog

T = TypeVar("T")

SWAP_QUANTIZED_MESSAGE = (
    "memory.strategy: swap is unavailable with a quantized model: bitsandbytes 4-bit and 8-bit "
    "parameters are pinned to the device they were quantized on; use memory.strategy: resident"
)
AUTO_QUANTIZED_REASON = "auto -> resident: a quantized model cannot be moved off the accelerator, so swap is unavailable"

DEFAULT_CHUNK_BUDGET_ELEMENTS = 64 * 1024 * 1024
"""auto chunk size: about this many ``[chunk, V]`` float32 elements per live buffer (256 MiB)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Where the models live during a cycle, and why."""

    strategy: str
    requested: str
    reason: str
    teacher_resident: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_chunk_size(requested: int | str, vocab_size: int, min_chunk_size: int) -> int:
    """``auto`` -> rows such that one ``[chunk, V]`` float32 buffer stays near 256 MiB."""
    if requested != "auto":
        return int(requested)
    rows = DEFAULT_CHUNK_BUDGET_ELEMENTS // max(1, vocab_size)
    return max(min_chunk_size, min(1024, rows))


def resolve_strategy(
    config: RunConfig,
    *,
    device: str,
    model_bytes: int | None = None,
    free_gib: float | None = None,
) -> MemoryPlan:
    """Decide resident vs swap.

    ``auto``: quantized models force resident (they cannot move); on CPU there is no
    accelerator memory to save, so resident; on CUDA, resident when the free VRAM minus
    the teacher+student weight bytes keeps ``memory.auto_swap_vram_headroom_gb``, else
    swap. The trainer then actually loads the teacher and falls back to swap on OOM.
    """
    requested = config.memory.strategy
    quantized = any(
        getattr(config.models, r).quantization != "none" for r in ("student", "teacher")
    )
    if requested == "swap" and quantized:
        raise ConfigError(SWAP_QUANTIZED_MESSAGE)
    if requested == "resident":
        return MemoryPlan("resident", requested, "requested: resident", True)
    if requested == "swap":
        return MemoryPlan(
            "swap", requested, "requested: swap (teacher targets pass through the cache)", False
        )
    if quantized:
        return MemoryPlan("resident", requested, AUTO_QUANTIZED_REASON, True)
    if not device.startswith("cuda"):
        return MemoryPlan(
            "resident",
            requested,
            f"auto -> resident: device {device} has no accelerator memory to save",
            True,
        )
    free = free_gib if free_gib is not None else free_vram_gib(device)
    if free is None:
        return MemoryPlan(
            "resident", requested, "auto -> resident: free VRAM could not be measured", True
        )
    need = (model_bytes or 0) / (1 << 30)
    headroom = config.memory.auto_swap_vram_headroom_gb
    if free - need >= headroom:
        return MemoryPlan(
            "resident",
            requested,
            f"auto -> resident: {free:.2f} GiB free, models need {need:.2f} GiB, headroom {headroom} GiB kept",
            True,
        )
    return MemoryPlan(
        "swap",
        requested,
        f"auto -> swap: {free:.2f} GiB free, models need {need:.2f} GiB, headroom {headroom} GiB would not be kept",
        False,
    )


OOM_KNOBS = (
    "loss.chunk_size (smaller [chunk, V] projections)",
    "memory.min_chunk_size (let retries go lower)",
    "train.trajectory_batch_size (fewer trajectories per padded forward)",
    "rollout.max_total_tokens (shorter sequences)",
    "memory.strategy: swap (one model on the device at a time)",
    "models.student.quantization / models.teacher.quantization: nf4 (smaller weights)",
)


def run_with_oom_retry(
    fn: Callable[[int], T],
    *,
    chunk_size: int,
    min_chunk_size: int,
    retries: int,
    events: EventLog | None = None,
    on_retry: Callable[[], None] | None = None,
) -> tuple[T, int]:
    """Call ``fn(chunk_size)``; on out-of-memory halve the chunk and call again.

    Returns ``(result, chunk_size_used)``. Only the chunk size changes between attempts;
    ``on_retry`` lets the caller drop partial gradients before the next attempt. When
    retries run out (or the chunk cannot shrink) raise :class:`GpuMemoryError` naming six
    concrete knobs.
    """
    chunk = int(chunk_size)
    attempt = 0
    while True:
        try:
            return fn(chunk), chunk
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            smaller = max(min_chunk_size, chunk // 2)
            if attempt >= retries or smaller == chunk:
                raise GpuMemoryError(
                    f"out of accelerator memory at projection chunk size {chunk} after {attempt} retr{'y' if attempt == 1 else 'ies'}",
                    hint="turn one of these knobs: " + "; ".join(OOM_KNOBS),
                ) from exc
            attempt += 1
            if events is not None:
                events.emit(
                    "oom_chunk_retry",
                    echo=f"chunk {chunk} -> {smaller}",
                    previous_chunk_size=chunk,
                    chunk_size=smaller,
                    attempt=attempt,
                )
            if on_retry is not None:
                on_retry()
            _empty_cuda_cache()
            chunk = smaller


def _empty_cuda_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


TRAJECTORY_ACTIVATION_FACTOR = 24
"""Rough live activation floats per token, layer and hidden unit of a backward pass (with the
attention/MLP intermediates); only used to cap ``train.trajectory_batch_size: auto``."""


def resolve_trajectory_batch_size(
    requested: int | str,
    *,
    group_size: int,
    device: str,
    max_total_tokens: int,
    hidden_size: int,
    num_layers: int,
    free_gib: float | None = None,
) -> tuple[int, str]:
    """``auto`` -> ``(rows, reason)``: the whole optimizer group where it fits the memory plan.

    On CPU there is no accelerator budget, so ``auto`` is the group. On CUDA the rows are
    capped so that ``rows x max_total_tokens x layers x hidden x 24`` float32 activations use
    at most half the free VRAM (a rough, conservative estimate; a batch that still does not
    fit is split at run time by :func:`split_on_oom`). The reason is recorded.
    """
    if requested != "auto":
        return int(requested), f"requested: {requested}"
    if not device.startswith("cuda"):
        return group_size, f"auto -> {group_size}: the optimizer group (device {device})"
    free = free_gib if free_gib is not None else free_vram_gib(device)
    if free is None:
        return group_size, f"auto -> {group_size}: free VRAM could not be measured"
    per_row = 4 * max_total_tokens * num_layers * hidden_size * TRAJECTORY_ACTIVATION_FACTOR
    rows = max(1, min(group_size, int(free * (1 << 30) / 2 // max(1, per_row))))
    return rows, (
        f"auto -> {rows}: {free:.2f} GiB free, ~{per_row / (1 << 20):.1f} MiB of activations "
        f"per trajectory, half the free memory kept"
    )


def split_on_oom(
    fn: Callable[[list[Any]], list[T]],
    items: list[Any],
    *,
    what: str,
    events: EventLog | None = None,
) -> list[T]:
    """``fn(items)``; on out-of-memory split the batch in halves and run each, recursively.

    ``fn`` must be a pure function of its batch (one result per item, in order), which is
    what lets a split batch give the same results. Every split is recorded as an
    ``oom_batch_split`` event; a single item that does not fit raises :class:`GpuMemoryError`.
    """
    try:
        return fn(items)
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        if len(items) <= 1:
            raise GpuMemoryError(
                f"out of accelerator memory on a single {what}",
                hint="turn one of these knobs: " + "; ".join(OOM_KNOBS),
            ) from exc
    _empty_cuda_cache()
    half = len(items) // 2
    if events is not None:
        events.emit(
            "oom_batch_split",
            echo=f"{what} batch {len(items)} -> {half} + {len(items) - half}",
            what=what,
            batch_size=len(items),
            split_into=[half, len(items) - half],
        )
    return split_on_oom(fn, items[:half], what=what, events=events) + split_on_oom(
        fn, items[half:], what=what, events=events
    )
