"""A short measured probe of one decode step's matmuls, for ``run.cpu_threads`` and
``models.rollout_dtype`` set to ``auto`` (``training/resolve.py`` decides from it).

Whether a second thread or bf16 weights pay off depends on this CPU (AVX-512 BF16 or not,
cores shared with other jobs) and on the model's matrix shapes, so neither is guessed: the
probe multiplies a ``[rows, in]`` activation by every distinct ``[out, in]`` weight of the
model's linear layers, each as often as one decode step does, and times that set at each
thread count and dtype asked for. The rounds are interleaved (1, N, 1, N, ...) and the median
kept, so a burst of load elsewhere does not favour one arm. A fraction of a second in all.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def decode_matmul_shapes(module: torch.nn.Module) -> Counter[tuple[int, int]]:
    """``(out, in) -> count`` of every 2-D linear weight one forward multiplies by.

    The tied LM head of a model whose output embedding is its input embedding is counted
    once as a linear layer (``get_output_embeddings``) when the module exposes it.
    """
    shapes: Counter[tuple[int, int]] = Counter()
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear):
            out_features, in_features = sub.weight.shape
            shapes[(int(out_features), int(in_features))] += 1
    get_head = getattr(module, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is not None and not isinstance(head, torch.nn.Linear):
        out_features, in_features = head.weight.shape
        shapes[(int(out_features), int(in_features))] += 1
    return shapes


@dataclass(frozen=True)
class DecodeProbe:
    """Median seconds of one decode step's matmuls, by ``(threads, dtype name)``.

    ``rows`` is the decode batch the step was timed at; ``shape`` names the matrices.
    """

    seconds: Mapping[tuple[int, str], float]
    rows: int
    shape: str

    def describe(self) -> str:
        """``"1 thread float32 12.3 ms, 2 threads float32 8.1 ms, ..."`` for a reason line."""
        parts = []
        for (threads, dtype), secs in sorted(self.seconds.items()):
            plural = "thread" if threads == 1 else "threads"
            parts.append(f"{threads} {plural} {dtype} {1e3 * secs:.2f} ms")
        return ", ".join(parts)


def probe_decode_step(
    module: torch.nn.Module,
    *,
    rows: int,
    thread_counts: Sequence[int],
    dtypes: Sequence[str] = ("float32",),
    budget_s: float = 0.3,
    rounds: int = 5,
) -> DecodeProbe:
    """Time one decode step's matmuls of ``module`` at ``rows`` rows per thread count and dtype.

    ``budget_s`` bounds the whole probe (about; at least one call per arm and round). torch's
    thread count is restored afterwards.
    """
    shapes = decode_matmul_shapes(module)
    if not shapes:
        return DecodeProbe({}, rows, "no linear layers")
    arms = [(t, d) for t in dict.fromkeys(thread_counts) for d in dict.fromkeys(dtypes)]
    operands = {
        d: [
            (
                torch.randn(rows, k, dtype=getattr(torch, d)),
                torch.randn(n, k, dtype=getattr(torch, d)),
                c,
            )
            for (n, k), c in shapes.items()
        ]
        for d in dict.fromkeys(dtypes)
    }

    def step(dtype: str) -> None:
        for x, w, count in operands[dtype]:
            for _ in range(count):
                F.linear(x, w)

    before = torch.get_num_threads()
    samples: dict[tuple[int, str], list[float]] = {arm: [] for arm in arms}
    try:
        for threads, dtype in arms:
            torch.set_num_threads(threads)
            step(dtype)
        per_arm = budget_s / (rounds * len(arms))
        for _ in range(rounds):
            for threads, dtype in arms:
                torch.set_num_threads(threads)
                calls, start = 0, time.perf_counter()
                while calls == 0 or time.perf_counter() - start < per_arm:
                    step(dtype)
                    calls += 1
                samples[(threads, dtype)].append((time.perf_counter() - start) / calls)
    finally:
        torch.set_num_threads(before)
    described = ", ".join(f"{c}x[{n}, {k}]" for (n, k), c in sorted(shapes.items()))
    return DecodeProbe(
        {arm: statistics.median(v) for arm, v in samples.items()},
        rows,
        f"[{rows}, in] x {described}",
    )


__all__ = ["DecodeProbe", "decode_matmul_shapes", "probe_decode_step"]
