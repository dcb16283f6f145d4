"""The held-out state gate of three teachers against one stored cold-start student.

A diagnostic, not a timing. For a cold start's ``student.safetensors`` it fits (or reuses, by
digest) the toy teacher of ``--old-recipe`` (oracle and noise-injected traces) and that of
``--recipe`` (the same plus the student's labelled states on training tasks,
``lab.toy_fit.dagger``), builds the smoothed oracle of ``--oracle-recipe``, and scores each
with ``evaluate_state_gate`` (``src/miniverl/lab/teachers/gate.py``) on the student's
rollouts of the first ``--tasks`` validation tasks: per-position top-1 agreement on and off
the oracle's path (a privileged prediction is an off-path miss) and the teacher's recovery
rate, with the CPU and wall seconds of each fit and gate. Writes ``--out/gate.json``.

    PYTHONPATH=src python benchmarks/dagger_teacher_gate.py \\
        results/calc_chain_oracle/pilot/seed-1/cold-start --out /tmp/dagger-gate \\
        [--recipe recipes/toy_calc_chain_dagger.yaml] [--tasks 60] [override ...]

Overrides apply to both fitted teachers (e.g. ``lab.toy_fit.max_steps=800``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.lab.config import lab_of, load_recipe
from miniverl.lab.teachers.gate import (
    evaluate_state_gate,
    state_gate_failures,
    state_gate_thresholds,
)
from miniverl.lab.teachers.oracle import build_oracle_teacher
from miniverl.lab.teachers.prepare import prepare_teacher
from miniverl.models.factory import build_student, build_tokenizer
from miniverl.utils.io import write_json
from miniverl.utils.logging import EventLog


def _fit(config: RunConfig, student: Any, out: Path) -> tuple[Any, dict]:
    """The toy teacher ``config``'s lab section fits (or reuses by digest), as a benchmark's
    cold start would fit it for ``student``; its events in ``out/events.jsonl``."""
    out.mkdir(parents=True, exist_ok=True)
    dagger = lab_of(config).toy_fit.dagger.enabled
    prepared = prepare_teacher(config, student=student if dagger else None)
    prepared.events.replay(EventLog(out / "events.jsonl"))
    return prepared.backend, prepared.record or {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cold_start", type=Path)
    parser.add_argument("overrides", nargs="*", help="dotted overrides of both fitted teachers")
    parser.add_argument("--recipe", default="recipes/toy_calc_chain_dagger.yaml")
    parser.add_argument("--old-recipe", default="recipes/toy_calc_chain.yaml")
    parser.add_argument("--oracle-recipe", default="recipes/toy_calc_chain_oracle.yaml")
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=["old", "dagger", "oracle"])
    args = parser.parse_args()

    config = load_recipe(args.recipe, args.overrides)
    configs = {
        "old": load_recipe(args.old_recipe, args.overrides),
        "dagger": config,
    }
    oracle_config = load_recipe(args.oracle_recipe)
    tokenizer = build_tokenizer(config)
    env = make_environment(config.environment.name, **config.environment.params)
    splits = build_splits(env, config.environment)
    student = build_student(config, tokenizer, "cpu")
    student.load_full_state_dict(load_file(str(args.cold_start / "student.safetensors")))
    gate = lab_of(config).teacher_gate
    tasks = splits["eval"][: args.tasks or gate.tasks]
    thresholds = state_gate_thresholds(gate)
    rows: dict[str, Any] = {"cold_start": str(args.cold_start), "thresholds": thresholds}
    for name in args.only:
        wall, cpu = time.perf_counter(), time.process_time()
        if name == "oracle":
            every = [t for split in splits.values() for t in split]
            teacher, report = build_oracle_teacher(oracle_config, tokenizer, every), {}
            fit_ids = [t.task_id for t in splits["train"]]
        else:
            teacher, report = _fit(configs[name], student, args.out / name)
            fit_ids = report["fit_task_ids"]
        fit_wall, fit_cpu = time.perf_counter() - wall, time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        result = evaluate_state_gate(
            teacher,
            student,
            env,
            tasks,
            config.rollout,
            seed=config.run.seed,
            fit_task_ids=fit_ids,
            batch_size=config.eval.batch_size,
        )
        gate_wall, gate_cpu = time.perf_counter() - wall, time.process_time() - cpu
        figures = result.to_dict()
        figures.pop("per_turn")
        rows[name] = {
            "gate": figures,
            "failures": state_gate_failures(result, thresholds),
            "fit": {k: v for k, v in report.items() if k != "fit_task_ids"},
            "fit_wall_seconds": round(fit_wall, 1),
            "fit_cpu_seconds": round(fit_cpu, 1),
            "gate_wall_seconds": round(gate_wall, 1),
            "gate_cpu_seconds": round(gate_cpu, 1),
        }
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        print(
            f"{name:7s} on-path {fmt(result.on_path_agreement)} "
            f"({result.on_path_correct}/{result.on_path_positions})  off-path "
            f"{fmt(result.off_path_agreement)} ({result.off_path_correct}/{result.off_path_positions}, "
            f"{result.privileged_predictions} privileged)  recovery {fmt(result.recovery_rate)} "
            f"({result.recovered}/{result.recovery_states})  fit {fit_cpu:.0f} CPU-s / "
            f"{fit_wall:.0f} s, gate {gate_cpu:.0f} CPU-s; "
            f"{'pass' if not rows[name]['failures'] else 'FAIL ' + '; '.join(rows[name]['failures'])}",
            flush=True,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "gate.json", rows)


if __name__ == "__main__":
    main()
