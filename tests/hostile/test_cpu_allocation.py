"""A CPU allocation failure is handled like CUDA out-of-memory: split, then a typed error.

``train.rollouts_per_cycle=4096`` under a memory cap makes torch raise a raw
``RuntimeError: DefaultCPUAllocator: can't allocate memory``; it must be told apart from other
errors and halved like CUDA's. Every failure here is a real one from torch's CPU allocator (an
impossible 2**62-byte tensor), not a mocked message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from miniverl.errors import GpuMemoryError  # noqa: E402
from miniverl.training.resolve import after_oom, split_on_oom  # noqa: E402
from miniverl.utils import gpu  # noqa: E402
from miniverl.utils.logging import EventLog  # noqa: E402


def _cpu_allocation_failure() -> RuntimeError:
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    raise AssertionError("torch allocated 4 EiB")


def test_the_cpu_allocators_failure_counts_as_out_of_memory() -> None:
    exc = _cpu_allocation_failure()
    assert "DefaultCPUAllocator" in str(exc)
    assert gpu.is_oom_error(exc)
    assert not gpu.is_oom_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_a_batch_too_big_for_cpu_memory_is_split_with_the_same_results(tmp_path: Path) -> None:
    events = EventLog(tmp_path / "events.jsonl")

    def rollout(batch: list[int]) -> list[int]:
        if len(batch) > 2:
            torch.empty(2**62, dtype=torch.uint8)
        return [item * 10 for item in batch]

    assert split_on_oom(rollout, list(range(8)), what="rollout", events=events) == [
        item * 10 for item in range(8)
    ]
    assert '"oom_batch_split"' in (tmp_path / "events.jsonl").read_text()


def test_a_single_item_that_never_fits_is_a_typed_error_with_knobs(tmp_path: Path) -> None:
    def rollout(batch: list[int]) -> list[int]:
        torch.empty(2**62, dtype=torch.uint8)
        return batch

    with pytest.raises(GpuMemoryError, match="out of memory on a single rollout") as caught:
        split_on_oom(rollout, [1, 2, 3, 4], what="rollout", events=None)
    assert "train.trajectory_batch_size" in caught.value.hint


def test_a_loss_step_that_never_fits_in_cpu_memory_is_a_typed_error() -> None:
    """The chunk is halved to the smallest, then the batch, then there is nothing left."""
    exc = _cpu_allocation_failure()
    halvings, chunk, rows = 0, 32, 2
    sizes = []
    with pytest.raises(GpuMemoryError, match="chunk size 16 with one trajectory") as caught:
        while True:
            halvings, chunk, rows = after_oom(
                exc, halvings=halvings, chunk_size=chunk, batch_rows=rows, step_chunk_size=32
            )
            sizes.append((chunk, rows))
    assert sizes == [(16, 2), (32, 1), (16, 1)]
    assert "train.trajectory_batch_size" in caught.value.hint
