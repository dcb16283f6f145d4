"""Memory one training forward and backward of SmolLM2-135M keeps, with and without
``memory.activation_checkpointing``, per token.

Each arm runs in a child process with glibc's mmap threshold fixed at 128 KiB
(``MALLOC_MMAP_THRESHOLD_``), so every large block goes back to the system when freed and the
child's peak RSS is what was live at once, not what a fragmented heap held
(docs/performance.md, "Where a SmolLM2 cycle's memory goes"). The child loads the model with
the student's LoRA adapter (rank 16 on the seven projections), runs one no-grad forward so
every weight page is resident, then one forward and backward of ``--rows`` x ``--tokens``
random ids with the loss on every position; it prints the RSS before the training forward,
the peak RSS, and (peak - before) / tokens in MB (10^6 bytes) per token.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/activation_memory.py \\
        --model-dir models/smollm2-135m-instruct --rows 4 --tokens 400
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError("no VmRSS (Linux only)")


def child(model_dir: str, rows: int, tokens: int, checkpointing: bool) -> dict[str, float]:
    import torch

    from miniverl.models.batching import build_padded_trajectory_batch
    from miniverl.models.hf import HFBackend

    torch.set_num_threads(1)
    lora = {"enabled": True, "r": 16, "alpha": 32, "target_modules": TARGETS}
    backend = HFBackend(
        model_dir, lora=lora, adapter_name="actor", activation_checkpointing=checkpointing
    )
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 49_000, (tokens,), generator=generator).tolist() for _ in range(rows)]
    batch = build_padded_trajectory_batch(ids, [list(range(tokens - 1))] * rows, 2, "cpu")
    with torch.no_grad():
        backend.hidden_states_at_batch(batch)
    before = rss_mb()
    backend.set_train(True)
    started = time.perf_counter()
    hidden = backend.hidden_states_at_batch(batch, with_grad=True)
    hidden.float().pow(2).mean().backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    return {
        "activation_checkpointing": checkpointing,
        "rss_before_mb": round(before, 1),
        "peak_rss_mb": round(peak, 1),
        "mb_per_token": round((peak - before) / (rows * tokens), 3),
        "forward_backward_s": round(seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="models/smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--child", choices=["plain", "checkpointed"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        result = child(args.model_dir, args.rows, args.tokens, args.child == "checkpointed")
        print(json.dumps(result))
        return 0
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    for arm in ("plain", "checkpointed"):
        out = subprocess.run(
            [sys.executable, __file__, *(argv or sys.argv[1:]), "--child", arm],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{arm:<13} {args.rows} x {args.tokens} tokens: RSS before {result['rss_before_mb']} MB, "
            f"peak {result['peak_rss_mb']} MB, {result['mb_per_token']} MB per token, "
            f"forward+backward {result['forward_backward_s']} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
