"""Peak memory and time of one loss forward+backward: full logits vs the chunked loss.

At a Qwen3-size vocabulary (V = 151,936), H = 1024 and N selected positions, with the LM
head frozen (as under LoRA, so the gradient flows to the hidden states only), compares

  (a) full:    materialise student and teacher logits [N, V], then a full-vocabulary
               divergence with plain autograd (what GKD-style trainers do);
  (b) chunked: chunked_selected_position_loss with an ExactTargetProvider that rebuilds
               the teacher's [chunk, V] logits from [N, H] teacher hidden states.

Each arm runs alone in its own subprocess (``--arm``), which reports its resident set
after setup (weights, hidden states) and its peak resident set (``ru_maxrss``). The table
gives both the absolute peak and the peak above that setup baseline, then per N the
memory ratio (a)/(b) and the time ratio (b)/(a).

    PYTHONPATH=src python benchmarks/loss_memory.py            # full configuration
    PYTHONPATH=src python benchmarks/loss_memory.py --quick    # small smoke configuration
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

FULL = {"vocab": 151_936, "hidden": 1024, "positions": (1024, 2048), "chunks": (256, 1024)}
QUICK = {"vocab": 16_384, "hidden": 256, "positions": (256, 512), "chunks": (64, 256)}
ROWS_PER_TRAJECTORY = 64


def _rss_now_bytes() -> int:
    with open("/proc/self/statm") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_arm(
    arm: str,
    vocab: int,
    hidden: int,
    positions: int,
    divergence: str,
    temperature: float,
    repeats: int,
) -> dict:
    """Run one arm in this process; time the best of ``repeats`` forward+backward passes."""
    import torch
    import torch.nn.functional as F

    from miniverl.losses import (
        DivergenceSpec,
        ExactTargetProvider,
        chunked_selected_position_loss,
        normalize_trajectory_weights,
    )

    torch.manual_seed(0)
    student_head = torch.randn(vocab, hidden).mul_(hidden**-0.5)
    teacher_head = torch.randn(vocab, hidden).mul_(hidden**-0.5)
    student_hidden = torch.randn(positions, hidden).requires_grad_()
    teacher_hidden = torch.randn(positions, hidden)
    targets = torch.randint(0, vocab, (positions,))
    rows = [
        torch.ones(min(ROWS_PER_TRAJECTORY, positions - start))
        for start in range(0, positions, ROWS_PER_TRAJECTORY)
    ]
    weights = torch.cat(normalize_trajectory_weights(rows))
    num_rows = len(rows)
    spec = DivergenceSpec(divergence, temperature=temperature)  # type: ignore[arg-type]

    def student_lm_head(h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, student_head)

    def teacher_lm_head(h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, teacher_head)

    def full_logits_loss(n: int) -> float:
        student_logits = student_lm_head(student_hidden[:n])
        with torch.no_grad():
            teacher_log_probs = F.log_softmax(
                teacher_lm_head(teacher_hidden[:n]) / temperature, dim=-1
            )
        student_log_probs = F.log_softmax(student_logits / temperature, dim=-1)
        if divergence == "forward_kl":
            per_row = F.kl_div(
                student_log_probs, teacher_log_probs, reduction="none", log_target=True
            ).sum(-1)
        else:
            per_row = F.kl_div(
                teacher_log_probs, student_log_probs, reduction="none", log_target=True
            ).sum(-1)
        loss = (weights[:n] * per_row).sum() / num_rows
        loss.backward()
        return float(loss.detach())

    def chunked_loss(n: int, chunk: int) -> float:
        provider = ExactTargetProvider(teacher_hidden[:n], teacher_lm_head, spec)
        result = chunked_selected_position_loss(
            hidden_states=student_hidden[:n],
            lm_head=student_lm_head,
            weights=weights[:n],
            weight_normalizer=num_rows,
            provider=provider,
            target_token_ids=targets[:n],
            ce_weight=0.0,
            chunk_size=chunk,
            backward=True,
        )
        return result.loss

    def run(n: int) -> float:
        if arm == "full":
            return full_logits_loss(n)
        return chunked_loss(n, int(arm.removeprefix("chunk")))

    run(2)
    student_hidden.grad = None
    setup_rss = _rss_now_bytes()
    setup_peak = _peak_rss_bytes()
    times = []
    for _ in range(repeats):
        student_hidden.grad = None
        start = time.perf_counter()
        loss = run(positions)
        times.append(time.perf_counter() - start)
    return {
        "arm": arm,
        "positions": positions,
        "setup_rss": setup_rss,
        "setup_peak": setup_peak,
        "peak_rss": _peak_rss_bytes(),
        "seconds": min(times),
        "all_seconds": times,
        "loss": loss,
        "grad_norm": float(student_hidden.grad.norm()),
        "threads": torch.get_num_threads(),
    }


@dataclass
class ArmResult:
    arm: str
    positions: int
    data: dict | None
    failure: str | None


def _spawn(arm: str, args: argparse.Namespace, config: dict, positions: int) -> ArmResult:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--arm",
        arm,
        "--vocab",
        str(config["vocab"]),
        "--hidden",
        str(config["hidden"]),
        "--positions",
        str(positions),
        "--divergence",
        args.divergence,
        "--temperature",
        str(args.temperature),
        "--repeats",
        str(args.repeats),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        if (
            proc.returncode in (-9, 137)
            or "MemoryError" in proc.stderr
            or "DefaultCPUAllocator" in proc.stderr
        ):
            reason = "did not fit in RAM (killed / out of memory)"
        else:
            reason = (
                f"failed with exit code {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
            )
        return ArmResult(arm, positions, None, reason)
    return ArmResult(arm, positions, json.loads(proc.stdout.strip().splitlines()[-1]), None)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small smoke configuration")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--positions", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--divergence", default="reverse_kl", choices=("reverse_kl", "forward_kl"))
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes per arm; the best is reported"
    )
    args = parser.parse_args()

    if args.arm:
        print(
            json.dumps(
                run_arm(
                    args.arm,
                    args.vocab,
                    args.hidden,
                    args.positions,
                    args.divergence,
                    args.temperature,
                    args.repeats,
                )
            )
        )
        return

    config = QUICK if args.quick else FULL
    arms = ["full"] + [f"chunk{c}" for c in config["chunks"]]
    print(
        f"loss forward+backward, V={config['vocab']:,} H={config['hidden']} divergence={args.divergence} "
        f"tau={args.temperature}, float32 CPU, LM heads frozen (gradient to hidden states only)"
    )
    print(
        "(a) full = materialised student+teacher logits, plain autograd; "
        "(b) chunkC = chunked_selected_position_loss, ExactTargetProvider, chunk C"
    )
    print(
        f"each arm in its own subprocess, one at a time; memory in GiB (resident set); "
        f"seconds = best of {args.repeats} passes (the host's timing noise is large)\n"
    )
    header = f"{'N':>5}  {'arm':<10} {'setup':>7} {'peak':>7} {'above setup':>11} {'seconds':>8}  {'loss':>12}"
    print(header)
    print("-" * len(header))
    results: dict[tuple[int, str], ArmResult] = {}
    for positions in config["positions"]:
        for arm in arms:
            result = _spawn(arm, args, config, positions)
            results[(positions, arm)] = result
            if result.data is None:
                print(f"{positions:>5}  {arm:<10} {result.failure}")
                continue
            d = result.data
            print(
                f"{positions:>5}  {arm:<10} {_gib(d['setup_rss'])} {_gib(d['peak_rss'])} "
                f"{_gib(d['peak_rss'] - d['setup_rss']):>11} {d['seconds']:8.2f}  {d['loss']:12.6f}",
                flush=True,
            )
    print()
    for positions in config["positions"]:
        full = results[(positions, "full")].data
        for chunk in config["chunks"]:
            chunked = results[(positions, f"chunk{chunk}")].data
            if full is None or chunked is None:
                print(f"N={positions} chunk {chunk}: ratio unavailable (an arm did not complete)")
                continue
            above_full = full["peak_rss"] - full["setup_rss"]
            above_chunked = chunked["peak_rss"] - chunked["setup_rss"]
            loss_gap = abs(full["loss"] - chunked["loss"]) / max(abs(full["loss"]), 1e-30)
            grad_gap = abs(full["grad_norm"] - chunked["grad_norm"]) / max(full["grad_norm"], 1e-30)
            print(
                f"N={positions} chunk {chunk}: memory (a)/(b) {above_full / above_chunked:6.2f}x above setup, "
                f"{full['peak_rss'] / chunked['peak_rss']:5.2f}x absolute peak; "
                f"time (b)/(a) {chunked['seconds'] / full['seconds']:5.2f}x; "
                f"|loss diff| {loss_gap:.1e} rel, |grad-norm diff| {grad_gap:.1e} rel"
            )


if __name__ == "__main__":
    main()
