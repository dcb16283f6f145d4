"""The out-of-memory retries (docs/design.md §3.9).

``run_with_oom_retry`` halves the projection chunk size and nothing else: the chunked loss
is exactly invariant to it. ``split_on_oom`` halves a batch of independent items. The
memory *plan* (resident vs swap, and every other ``auto``) is decided once, in
:mod:`miniverl.training.resolve`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from miniverl.errors import GpuMemoryError
from miniverl.utils.gpu import is_oom_error
from miniverl.utils.logging import EventLog

T = TypeVar("T")

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
