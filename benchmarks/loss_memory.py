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
from dataclasses import dataclass, field

FULL = {"vocab": 151_936, "hidden": 1024, "positions": (1024, 2048), "chunks": (256, 1024)}
QUICK = {"vocab": 16_384, "hidden": 256, "positions": (256, 512), "chunks": (64, 256)}
ROWS_PER_TRAJECTORY = 64


def _rss_now_bytes() -> int:
    with open("/proc/self/statm") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
    threads: int,
    device: str = "cpu",
) -> dict:
    """Run one arm in this process and return its memory and per-pass time measurements.

    On ``device="cuda"`` the tensors live on the GPU, every timed pass is synchronised, and
    the result also holds ``cuda_setup_allocated`` / ``cuda_peak_allocated`` /
    ``cuda_peak_reserved`` (bytes; the peak is reset after setup, so arms can share a
    process there, unlike the resident set, which only grows).
    """
    import torch
    import torch.nn.functional as F

    if threads > 0:
        torch.set_num_threads(threads)
    on_cuda = torch.device(device).type == "cuda"

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize(device)

    from miniverl.losses import (
        DivergenceSpec,
        ExactTargetProvider,
        chunked_selected_position_loss,
        normalize_trajectory_weights,
    )

    torch.manual_seed(0)
    student_head = torch.randn(vocab, hidden, device=device).mul_(hidden**-0.5)
    teacher_head = torch.randn(vocab, hidden, device=device).mul_(hidden**-0.5)
    student_hidden = torch.randn(positions, hidden, device=device).requires_grad_()
    teacher_hidden = torch.randn(positions, hidden, device=device)
    targets = torch.randint(0, vocab, (positions,), device=device)
    rows = [
        torch.ones(min(ROWS_PER_TRAJECTORY, positions - start), device=device)
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
    sync()
    setup_rss = _rss_now_bytes()
    setup_peak = _peak_rss_bytes()
    if on_cuda:
        cuda_setup = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    wall, cpu = [], []
    for _ in range(repeats):
        student_hidden.grad = None
        sync()
        cpu_start, start = _cpu_seconds(), time.perf_counter()
        loss = run(positions)
        sync()
        wall.append(time.perf_counter() - start)
        cpu.append(_cpu_seconds() - cpu_start)
    cuda = {}
    if on_cuda:
        cuda = {
            "cuda_setup_allocated": cuda_setup,
            "cuda_peak_allocated": torch.cuda.max_memory_allocated(device),
            "cuda_peak_reserved": torch.cuda.max_memory_reserved(device),
        }
    return {
        "device": str(device),
        **cuda,
        "arm": arm,
        "positions": positions,
        "setup_rss": setup_rss,
        "setup_peak": setup_peak,
        "peak_rss": _peak_rss_bytes(),
        "wall": wall,
        "cpu": cpu,
        "loss": loss,
        "grad_norm": float(student_hidden.grad.norm()),
        "threads": torch.get_num_threads(),
    }


@dataclass
class ArmSummary:
    """Every subprocess run of one arm at one N."""

    arm: str
    positions: int
    runs: list[dict] = field(default_factory=list)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and bool(self.runs)

    @property
    def setup_rss(self) -> int:
        return max(r["setup_rss"] for r in self.runs)

    @property
    def peak_rss(self) -> int:
        return max(r["peak_rss"] for r in self.runs)

    @property
    def peak_above_setup(self) -> int:
        return max(r["peak_rss"] - r["setup_rss"] for r in self.runs)

    @property
    def wall(self) -> float:
        return min(min(r["wall"]) for r in self.runs)

    @property
    def cpu(self) -> float:
        return min(min(r["cpu"]) for r in self.runs)


def _spawn(arm: str, args: argparse.Namespace, config: dict, positions: int) -> dict | str:
    """Run one arm in a fresh interpreter; its measurements, or why it failed."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        *("--arm", arm, "--vocab", str(config["vocab"]), "--hidden", str(config["hidden"])),
        *("--positions", str(positions), "--divergence", args.divergence),
        *("--temperature", str(args.temperature), "--repeats", str(args.repeats)),
        *("--threads", str(args.threads)),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    if proc.returncode in (-9, 137) or "DefaultCPUAllocator" in proc.stderr:
        return "did not fit in RAM (killed or allocation failed)"
    return f"failed with exit code {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f}"


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
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per subprocess")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads per arm (0: torch's default); one by default because on a "
        "shared 2-vCPU machine OpenMP synchronisation, not the loss, dominates multi-threaded runs",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="subprocesses per arm, interleaved across arms"
    )
    args = parser.parse_args()

    if args.arm:
        measured = run_arm(
            args.arm,
            args.vocab,
            args.hidden,
            args.positions,
            args.divergence,
            args.temperature,
            args.repeats,
            args.threads,
        )
        print(json.dumps(measured))
        return

    config = QUICK if args.quick else FULL
    arms = ["full"] + [f"chunk{c}" for c in config["chunks"]]
    print(
        f"one loss forward+backward: V={config['vocab']:,} H={config['hidden']} "
        f"divergence={args.divergence} tau={args.temperature}, float32 on CPU "
        f"({os.cpu_count()} cores, {args.threads or 'default'} torch thread(s) per arm), "
        "LM heads frozen (gradient to hidden states only)"
    )
    print(
        "(a) full      = materialised [N, V] student and teacher logits, plain autograd\n"
        "(b) chunkC    = chunked_selected_position_loss + ExactTargetProvider, chunk C"
    )
    print(
        f"Each arm runs alone in its own subprocess, {args.rounds} rounds interleaved across "
        f"arms, {args.repeats} timed passes each.\nMemory: resident set in GiB (setup = after "
        "weights and hidden states exist; peak = ru_maxrss). Time: best wall seconds and best\n"
        "process CPU seconds (user + sys) over all passes; this host's wall times are noisy.\n"
    )
    header = (
        f"{'N':>5}  {'arm':<10} {'setup':>6} {'peak':>6} {'above setup':>11} "
        f"{'wall s':>7} {'cpu s':>7}  {'loss':>10}"
    )
    print(header)
    print("-" * len(header))
    summaries: dict[tuple[int, str], ArmSummary] = {}
    for positions in config["positions"]:
        for arm in arms:
            summaries[(positions, arm)] = ArmSummary(arm, positions)
        for _ in range(args.rounds):
            for arm in arms:
                summary = summaries[(positions, arm)]
                if summary.failure is not None:
                    continue
                outcome = _spawn(arm, args, config, positions)
                if isinstance(outcome, str):
                    summary.failure = outcome
                else:
                    summary.runs.append(outcome)
        for arm in arms:
            summary = summaries[(positions, arm)]
            if not summary.ok:
                print(f"{positions:>5}  {arm:<10} {summary.failure}")
                continue
            print(
                f"{positions:>5}  {arm:<10} {_gib(summary.setup_rss):>6} "
                f"{_gib(summary.peak_rss):>6} {_gib(summary.peak_above_setup):>11} "
                f"{summary.wall:7.2f} {summary.cpu:7.2f}  {summary.runs[-1]['loss']:10.6f}",
                flush=True,
            )
    print()
    for positions in config["positions"]:
        full = summaries[(positions, "full")]
        for chunk in config["chunks"]:
            chunked = summaries[(positions, f"chunk{chunk}")]
            if not (full.ok and chunked.ok):
                print(f"N={positions} chunk {chunk}: no ratio, an arm did not complete")
                continue
            full_run, chunked_run = full.runs[-1], chunked.runs[-1]
            loss_gap = abs(full_run["loss"] - chunked_run["loss"]) / abs(full_run["loss"])
            grad_gap = abs(full_run["grad_norm"] - chunked_run["grad_norm"]) / full_run["grad_norm"]
            print(
                f"N={positions} chunk {chunk}: memory (a)/(b) "
                f"{full.peak_above_setup / chunked.peak_above_setup:5.2f}x above setup, "
                f"{full.peak_rss / chunked.peak_rss:4.2f}x absolute; time (b)/(a) "
                f"{chunked.wall / full.wall:4.2f}x wall, {chunked.cpu / full.cpu:4.2f}x cpu; "
                f"loss differs by {loss_gap:.0e}, grad norm by {grad_gap:.0e} (relative)"
            )


if __name__ == "__main__":
    main()
