"""How far SmolLM2-135M-Instruct is from solving calc_chain: greedy success per chain length.

``recipes/smollm2_calc_chain.yaml`` as written (its rollout limits, its LoRA student, its
``sft_lr``), on one torch thread: greedy success at k = 1, 2, 3 on the first ``--per-k``
validation tasks of each k, for the raw model (state 0, the student adapter at its
initialisation, ``lora_B = 0``) and after ``--cycles`` oracle-SFT warm-up cycles of the
recipe's ``train.rollouts_per_cycle`` oracle traces each (state N). The teacher adapter is
neither fitted nor used. Also printed: the mean number of sampled ids and of turns per
episode, and how many episodes ended with a final answer at all (right or wrong), which
separates "does not follow the tool protocol" from "follows it and computes wrong", how the
episodes ended (``termination_reason``), and the last 300 characters of the first episode of
each k at state N.

    miniverl models fetch smollm2-135m-instruct --dir models/smollm2-135m-instruct
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/smollm2_chain_headroom.py \\
        --model-dir models/smollm2-135m-instruct --cycles 4 --per-k 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from miniverl.agent.loop import EpisodeRequest
from miniverl.environments.base import Task
from miniverl.errors import ConfigError
from miniverl.lab.config import load_recipe
from miniverl.lab.cycles import warm_up
from miniverl.lab.run import start_run
from miniverl.training.recipe import OPDTrainer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2_calc_chain.yaml"
SMOLLM2 = "smollm2-135m-instruct"
CHAIN_LENGTHS = (1, 2, 3)


def tasks_per_k(tasks: Sequence[Task], per_k: int, ks: Sequence[int]) -> dict[int, list[Task]]:
    """The first ``per_k`` tasks of each chain length ``k`` in ``tasks`` (split order)."""
    picked: dict[int, list[Task]] = {k: [] for k in ks}
    for task in tasks:
        k = task.data.get("k")
        if k in picked and len(picked[k]) < per_k:
            picked[k].append(task)
    short = {k: len(v) for k, v in picked.items() if len(v) < per_k}
    if short:
        raise ConfigError(
            f"the validation split has too few tasks of chain length {sorted(short)} "
            f"(found {short}, need {per_k} each)",
            hint="raise --eval-tasks, or lower --per-k",
        )
    return picked


def headroom_trainer(root: Path, args: argparse.Namespace) -> OPDTrainer:
    from miniverl.models import acquire

    model_dir = args.model_dir or acquire.fetch_model(SMOLLM2, root / "models" / SMOLLM2)
    overrides = [
        f"models.student.model_id={model_dir}",
        f"models.teacher.model_id={model_dir}",
        "lab.teacher_fit.enabled=false",
        f"environment.eval_tasks={args.eval_tasks}",
        "environment.test_tasks=1",
        "eval.baseline=false",
        "eval.after_warmup=false",
        "run.cpu_threads=1",
    ]
    return start_run(load_recipe(RECIPE, overrides), output_dir=root / "run")


def greedy_by_k(trainer: OPDTrainer, picked: dict[int, list[Task]]) -> dict[str, Any]:
    """Greedy episodes of every picked task in one batch; success and protocol figures per k."""
    cfg = trainer.config
    order = [(k, t) for k, tasks in picked.items() for t in tasks]
    requests = [EpisodeRequest(t, cfg.run.seed + i) for i, (_, t) in enumerate(order)]
    trainer.student.set_train(False)
    t0 = time.perf_counter()
    trajectories = trainer.runner.rollout_batch(
        requests,
        batch_size=cfg.eval.batch_size,
        policy_version=trainer.state.parameter_version,
        temperature=0.0,
    )
    seconds = time.perf_counter() - t0
    by_k: dict[str, Any] = {}
    for k in picked:
        rows = [tr for (kk, _), tr in zip(order, trajectories, strict=True) if kk == k]
        by_k[str(k)] = {
            "tasks": len(rows),
            "solved": sum(int(tr.solved) for tr in rows),
            "success": sum(int(tr.solved) for tr in rows) / len(rows),
            "final_answers": sum(int(bool(tr.spans_of("assistant_final"))) for tr in rows),
            "mean_sampled_ids": statistics.mean(tr.generated_token_count for tr in rows),
            "mean_turns": statistics.mean(len(tr.turns) for tr in rows),
            "endings": dict(Counter(str(tr.termination_reason) for tr in rows)),
            "last_chars": trainer.tokenizer.decode(rows[0].token_ids)[-300:],
        }
    return {"seconds": seconds, "by_k": by_k}


def headroom(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = headroom_trainer(Path(tmp), args)
        picked = tasks_per_k(trainer.splits["eval"], args.per_k, CHAIN_LENGTHS)
        report: dict[str, Any] = {
            "recipe": str(RECIPE.relative_to(ROOT)),
            "per_k": args.per_k,
            "cycles": args.cycles,
            "rollouts_per_cycle": trainer.config.train.rollouts_per_cycle,
            "task_ids": {str(k): [t.task_id for t in v] for k, v in picked.items()},
        }
        report["state_0"] = greedy_by_k(trainer, picked)
        t0 = time.perf_counter()
        warm_up(trainer, args.cycles)
        report["sft_seconds"] = time.perf_counter() - t0
        report["state_n"] = greedy_by_k(trainer, picked)
        report["optimizer_steps"] = trainer.state.global_step
        return report


def print_headroom(report: dict[str, Any]) -> None:
    n = report["cycles"]
    print(
        f"greedy success on calc_chain, {report['recipe']}, first {report['per_k']} validation "
        f"tasks per k; state 0 = raw model, state {n} = after {n} oracle-SFT cycles of "
        f"{report['rollouts_per_cycle']} traces ({report['optimizer_steps']} optimizer steps, "
        f"{report['sft_seconds']:.0f} s)"
    )
    print(f"{'k':>2}  {'state 0':>22}  {f'state {n}':>22}")
    for k in report["state_0"]["by_k"]:
        cells = []
        for state in ("state_0", "state_n"):
            r = report[state]["by_k"][k]
            cells.append(
                f"{r['solved']}/{r['tasks']} ({r['final_answers']} final, "
                f"{r['mean_sampled_ids']:.0f} ids)"
            )
        print(f"{k:>2}  {cells[0]:>22}  {cells[1]:>22}")
    for state in ("state_0", "state_n"):
        endings = {k: r["endings"] for k, r in report[state]["by_k"].items()}
        print(f"episode endings by k, {state.replace('_n', f'_{n}')}: {endings}")
    for k, r in report["state_n"]["by_k"].items():
        print(f"k={k}, state {n}, end of the first episode: {r['last_chars']!r}")
    print(
        f"greedy evaluation {report['state_0']['seconds']:.0f} s (state 0), "
        f"{report['state_n']['seconds']:.0f} s (state {n})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a converted SmolLM2 directory")
    parser.add_argument("--cycles", type=int, default=4, help="oracle-SFT cycles before state N")
    parser.add_argument("--per-k", type=int, default=3, help="validation tasks per chain length")
    parser.add_argument("--eval-tasks", type=int, default=30, help="validation split size")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    report = headroom(args)
    print_headroom(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
