"""Rollout, decode, OPD-cycle and cache-commit throughput, each measured side by side in one run.

Three parts (``--parts``, default all):

  rollouts  Toy backend: ``RolloutRunner.rollout_batch`` over the same calculator episodes at
            ``rollout.batch_size`` 1 (the sequential path), 8 and 32; episodes/s and generated
            tokens/s. Tiny Hugging Face checkpoint (Qwen3-style, built offline): our batched
            greedy decode (``HFBackend.generate_batch``) against ``model.generate()`` on the
            same left-padded batch at batch 1, 8, 16 and 32, plus our one-prompt-at-a-time
            loop; the ids of the two batched arms are asserted equal. Then incremental
            prefill (each round feeds only the ids appended since the last decode into the
            kept KV cache) against full re-prefill of whole transcripts
            (``RolloutRunner(incremental_prefill=False)``) at batch 8 and 32 on the toy,
            with the prompt tokens each arm's prefill forwards ran (random toy weights
            scaled x6 and ``max_parse_errors = max_turns``, so episodes last several turns).
  opd       The OPD arm of ``recipes/toy_calculator.yaml`` twice from one shared SFT cold start:
            ``today`` (rollout.batch_size=1, teacher.batch_size=1, eval.batch_size=1,
            train.trajectory_batch_size=1, cache.journal=false: the whole-index flush) and
            ``batched`` (the defaults). Wall time of each arm's ``train()``.
  flush     ``TeacherCache.flush`` of 8 entries per cycle for ``--flush-cycles`` cycles, with
            the journal and with the old whole-index rewrite; commit milliseconds by cycle.

    PYTHONPATH=src nice -n 10 python benchmarks/rollout_throughput.py
    PYTHONPATH=src python benchmarks/rollout_throughput.py --parts rollouts,flush --quick
    PYTHONPATH=src python benchmarks/rollout_throughput.py --parts opd --cycles 100 --sft-cycles 100

Timings on a shared machine are noisy; compare the ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.cache.store import TeacherCache
from miniverl.config.models import RunConfig
from miniverl.environments.base import make_splits
from miniverl.environments.registry import make_environment
from miniverl.models.hf import HFBackend
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend
from miniverl.models.toy_config import TOY_STUDENT
from miniverl.schemas.cache import CacheProvenance

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "toy_calculator.yaml"

TODAY_OVERRIDES = (
    "rollout.batch_size=1",
    "teacher.batch_size=1",
    "eval.batch_size=1",
    "train.trajectory_batch_size=1",
    "cache.journal=false",
)


def _median_time(fn, reps: int) -> tuple[float, object]:
    fn()
    times, out = [], None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


# ----------------------------------------------------------------------------- rollouts


def bench_toy_rollouts(episodes: int, reps: int) -> None:
    recipe = RunConfig.from_yaml(RECIPE)
    env = make_environment("calculator")
    tasks = make_splits(env, {"train": episodes, "eval": 0, "test": 0}, seed=7)["train"]
    backend = ToyBackend(TOY_STUDENT, ToyTokenizer(), model_id="toy-student", seed=0)
    runner = RolloutRunner(backend, env, recipe.rollout)
    requests = [EpisodeRequest(t, 100 + i) for i, t in enumerate(tasks)]
    print(
        f"\nToy student rollouts: {episodes} episodes, rollout config of {RECIPE.name}, random weights"
    )
    print(f"{'batch':>6} {'seconds':>9} {'episodes/s':>11} {'tokens/s':>10} {'speedup':>8}")
    base = None
    reference = None
    for size in (1, 8, 32):
        seconds, out = _median_time(
            lambda s=size: runner.rollout_batch(requests, batch_size=s), reps
        )
        trajectories = list(out)  # type: ignore[call-overload]
        tokens = sum(t.generated_token_count for t in trajectories)
        ids = [t.token_ids for t in trajectories]
        same = (
            ""
            if reference is None
            else f"  same episodes: {sum(a == b for a, b in zip(reference, ids, strict=False))}/{len(ids)}"
        )
        reference = reference or ids
        base = base or seconds
        print(
            f"{size:>6} {seconds:>9.3f} {len(trajectories) / seconds:>11.1f} {tokens / seconds:>10.0f} {base / seconds:>7.2f}x{same}"
        )


class _PrefillCounter:
    """Delegates to a backend and counts the prompt tokens each round's prefill runs."""

    supports_prefix_cache = True

    def __init__(self, inner: ToyBackend) -> None:
        self.inner, self.tokenizer, self.capabilities = inner, inner.tokenizer, inner.capabilities
        self.prefilled = 0

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def generate_batch(self, prompts, **kwargs):
        cache = kwargs.get("prefix_cache")
        before = 0 if cache is None else sum(cache.prefilled_tokens)
        out = self.inner.generate_batch(prompts, **kwargs)
        if cache is None:
            self.prefilled += sum(len(p) for p in prompts)
        else:
            self.prefilled += sum(cache.prefilled_tokens) - before
        return out

    def trainable_parameters(self):
        return self.inner.trainable_parameters()


def bench_toy_prefill(episodes: int, reps: int) -> None:
    recipe = RunConfig.from_yaml(RECIPE)
    env = make_environment("calculator")
    tasks = make_splits(env, {"train": episodes, "eval": 0, "test": 0}, seed=7)["train"]
    toy = ToyBackend(TOY_STUDENT, ToyTokenizer(), model_id="toy-student", seed=0)
    with torch.no_grad():
        for name, param in toy.module.named_parameters():
            if "norm" not in name:
                param.mul_(6.0)
    backend = _PrefillCounter(toy)
    rollout = recipe.rollout.model_copy(update={"max_parse_errors": recipe.rollout.max_turns})
    requests = [EpisodeRequest(t, 100 + i) for i, t in enumerate(tasks)]
    print(
        f"\nToy rollouts, incremental prefill vs full re-prefill: {episodes} episodes, "
        f"rollout config of {RECIPE.name}, random weights scaled x6, "
        "max_parse_errors = max_turns (so episodes run several turns: unparsed text, error "
        "observation, next turn)"
    )
    print(
        f"{'batch':>6} {'full s':>8} {'incr. s':>8} {'speedup':>8} "
        f"{'prefill tok full':>17} {'prefill tok incr.':>18} {'same episodes':>14}"
    )
    for size in (8, 32):
        arms = {}
        for incremental in (False, True):
            runner = RolloutRunner(backend, env, rollout, incremental_prefill=incremental)
            seconds, out = _median_time(
                lambda r=runner, s=size: r.rollout_batch(requests, batch_size=s), reps
            )
            backend.prefilled = 0
            runner.rollout_batch(requests, batch_size=size)
            arms[incremental] = (seconds, list(out), backend.prefilled)  # type: ignore[call-overload]
        (full_s, full_out, full_tok), (inc_s, inc_out, inc_tok) = arms[False], arms[True]
        same = sum(a.token_ids == b.token_ids for a, b in zip(full_out, inc_out, strict=True))
        print(
            f"{size:>6} {full_s:>8.3f} {inc_s:>8.3f} {full_s / inc_s:>7.2f}x "
            f"{full_tok:>17} {inc_tok:>18} {same:>9}/{len(inc_out)}"
        )


def bench_hf_decode(new_tokens: int, reps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_hf_checkpoint(Path(tmp) / "tiny", arch="qwen3", hidden_size=64, seed=0)
        backend = HFBackend(path)
    env = make_environment("calculator")
    tasks = make_splits(env, {"train": 32, "eval": 0, "test": 0}, seed=7)["train"]
    tok = backend.tokenizer
    prompts = [
        tok.encode(f"<|im_start|>user\n{t.prompt}<|im_end|>\n<|im_start|>assistant\n")
        for t in tasks
    ]
    pad, eos = tok.pad_token_id, tok.eos_token_id
    model = backend.model
    print(
        f"\nTiny HF (Qwen3-style, hidden 64, 2 layers) greedy decode, {new_tokens} new tokens max"
    )
    print(
        f"{'batch':>6} {'ours tok/s':>11} {'generate tok/s':>15} {'ours/generate':>14} {'ours batch-1 loop tok/s':>24}"
    )

    def useful(rows: list[list[int]]) -> int:
        return sum(row.index(eos) + 1 if eos in row else len(row) for row in rows)

    for size in (1, 8, 16, 32):
        batch = prompts[:size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])

        def ours(batch=batch) -> list[list[int]]:
            out = backend.generate_batch(
                batch,
                max_new_tokens=[new_tokens] * len(batch),
                seeds=[0] * len(batch),
                temperature=0.0,
            )
            return [r.token_ids for r in out]

        def reference(ids=ids, mask=mask) -> list[list[int]]:
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=new_tokens,
                    pad_token_id=pad,
                    eos_token_id=eos,
                )
            return out[:, ids.shape[1] :].tolist()

        def loop(batch=batch) -> list[list[int]]:
            return [
                backend.generate(p, max_new_tokens=new_tokens, temperature=0.0).token_ids
                for p in batch
            ]

        t_ours, rows_ours = _median_time(ours, reps)
        t_ref, rows_ref = _median_time(reference, reps)
        t_loop, _ = _median_time(loop, max(1, reps // 2))
        for a, b in zip(rows_ours, rows_ref, strict=False):  # type: ignore[call-overload]
            assert a == b[: len(a)], "batched decode and generate() disagree"
        n = useful(rows_ours)  # type: ignore[arg-type]
        print(
            f"{size:>6} {n / t_ours:>11.0f} {useful(rows_ref) / t_ref:>15.0f} {t_ref / t_ours * n / useful(rows_ref):>13.2f}x {n / t_loop:>24.0f}"
        )  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- opd


def bench_opd_arm(
    cycles: int | None, sft_cycles: int | None, fit_steps: int | None, root: Path
) -> None:
    from miniverl.lab.benchmark.arms import arm_config, cold_start_config
    from miniverl.training.recipe import OPDTrainer

    base = RunConfig.from_yaml(RECIPE)
    shorten = []
    if cycles is not None:
        shorten.append(f"train.cycles={cycles}")
    if sft_cycles is not None:
        shorten.append(f"train.sft_warmup_cycles={sft_cycles}")
    if fit_steps is not None:
        shorten.append(f"lab.toy_fit.max_steps={fit_steps}")
    base = base.with_overrides(shorten) if shorten else base
    seed = base.run.seed
    print(
        f"\nOPD arm of {RECIPE.name}: {base.train.cycles} OPD cycles x {base.train.rollouts_per_cycle} rollouts"
        f" from one shared cold start ({base.train.sft_warmup_cycles} SFT cycles)"
        f"{' [shortened: ' + ', '.join(shorten) + ']' if shorten else ''}"
    )
    t0 = time.perf_counter()
    cold = OPDTrainer(
        cold_start_config(base, seed),
        output_dir=root / "cold-start-run",
        quiet=True,
        progress=False,
    )
    cold.train()
    cold.export_cold_start(root / "cold-start")
    print(f"cold start (teacher fit + SFT warm-up): {time.perf_counter() - t0:.1f} s")
    arms = {"today": list(TODAY_OVERRIDES), "batched": []}
    seconds: dict[str, float] = {}
    finals: dict[str, float] = {}
    for name, overrides in arms.items():
        config = arm_config(
            base, f"opd-{name}", ["run.mode=opd", "loss.divergence=forward_kl", *overrides], seed
        )
        trainer = OPDTrainer(
            config,
            output_dir=root / name,
            quiet=True,
            progress=False,
            cold_start=root / "cold-start",
        )
        start = time.perf_counter()
        summary = trainer.train()
        seconds[name] = time.perf_counter() - start
        finals[name] = summary["final"]["success_rate"]
        print(
            f"{name:>8}: {seconds[name]:8.1f} s   final held-out success {finals[name]:.3f}   overrides {overrides or 'none'}"
        )
    print(f"speedup batched vs today: {seconds['today'] / seconds['batched']:.2f}x")


# -------------------------------------------------------------------------------- flush


def bench_flush(cycles: int, positions: int, root: Path) -> None:
    from miniverl.losses import DivergenceSpec  # noqa: F401  (torch already imported)

    k, vocab = 32, 96
    provenance = CacheProvenance(
        teacher_model_id="toy-teacher",
        tokenizer_fingerprint="a" * 64,
        top_k=k,
        temperature=1.0,
        vocab_size=vocab,
    )
    g = torch.Generator().manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(positions, vocab, generator=g), dim=-1)
    top = torch.topk(log_probs, k, dim=-1)
    tensors = {
        "topk_indices": top.indices,
        "topk_log_probs": top.values,
        "tail_log_prob": torch.log1p(-top.values.exp().sum(-1).clamp(max=1 - 1e-6)),
        "teacher_entropy": -(log_probs.exp() * log_probs).sum(-1),
    }
    marks = sorted({1, *range(cycles // 4, cycles + 1, max(1, cycles // 4))})
    print(
        f"\nCache commit (flush of 8 entries x {positions} positions, K={k}): median ms per flush"
        " by cycle range; wall includes the fsyncs, cpu is process time; close = final compaction"
    )
    results: dict[str, dict[int, float]] = {}
    for journal in (True, False):
        cache = TeacherCache(root / f"journal-{journal}", provenance, journal=journal)
        times: dict[int, list[float]] = {}
        cpu_times: dict[int, list[float]] = {}
        for cycle in range(1, cycles + 1):
            for row in range(8):
                key = f"traj-{cycle}-{row}"
                cache.write(
                    key,
                    tensors,
                    trajectory_id=key,
                    policy_version=cycle,
                    alignment_digest=hashlib.sha256(key.encode()).hexdigest(),
                )
            start, cpu = time.perf_counter(), time.process_time()
            cache.flush()
            elapsed = (time.perf_counter() - start) * 1000
            bucket = min(m for m in marks if m >= cycle)
            times.setdefault(bucket, []).append(elapsed)
            cpu_times.setdefault(bucket, []).append((time.process_time() - cpu) * 1000)
        start = time.perf_counter()
        cache.close()
        close_ms = (time.perf_counter() - start) * 1000
        mode = "journal" if journal else "whole index"
        results[f"{mode} wall"] = {m: statistics.median(v) for m, v in times.items()} | {
            -1: close_ms
        }
        results[f"{mode} cpu"] = {m: statistics.median(v) for m, v in cpu_times.items()} | {
            -1: close_ms
        }
    header = "".join(f"{'<=' + str(m):>9}" for m in marks)
    print(f"{'mode':>17}{header}{'close':>9}")
    for mode, row in results.items():
        print(f"{mode:>17}" + "".join(f"{row[m]:>9.1f}" for m in marks) + f"{row[-1]:>9.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="rollouts,opd,flush")
    parser.add_argument(
        "--quick", action="store_true", help="fewer episodes, reps and flush cycles"
    )
    parser.add_argument(
        "--cycles", type=int, default=None, help="shorten the OPD arm (default: the recipe's 400)"
    )
    parser.add_argument(
        "--sft-cycles", type=int, default=None, help="shorten the cold start's SFT warm-up"
    )
    parser.add_argument(
        "--fit-steps", type=int, default=None, help="shorten the cold start's toy-teacher fit"
    )
    parser.add_argument("--flush-cycles", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (recorded)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), python {sys.version.split()[0]}"
    )
    reps = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "rollouts" in parts:
            bench_toy_rollouts(16 if args.quick else 32, reps)
            bench_toy_prefill(32 if args.quick else 64, reps)
            bench_hf_decode(16 if args.quick else 32, reps)
        if "flush" in parts:
            bench_flush(40 if args.quick else args.flush_cycles, 60, root / "flush")
        if "opd" in parts:
            bench_opd_arm(args.cycles, args.sft_cycles, args.fit_steps, root / "opd")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
