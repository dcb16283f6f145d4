"""Greedy held-out endpoints of calc_chain runs at every evaluation, side by side.

    python benchmarks/run_endpoints.py RUN_DIR [RUN_DIR ...] [--episodes OUT.json]

For each run (a ``miniverl train`` directory, or a benchmark cell's run directory) and each
evaluation tag (``after_warmup``, ``cycle-0009`` from ``eval.every``, ``final``, ...): the
optimizer step, success over all tasks and per chain length k, the episodes with a flagged tool
error (an ``"ok": false`` observation of the checked environment) and how many of those ended
solved: the recovery rate a benchmark cell records for its final evaluation
(``lab/benchmark/endpoints.py`` ``summarize_episodes``), here along the whole run, so a pilot
can see when an arm stops improving. ``--episodes`` writes every evaluated episode compactly
(the task's start and steps, each call's expression and whether the tool accepted it, the
answer, solved), enough to recompute every figure without the trajectories
(``tests/integration/test_stored_smollm2_checked.py`` does).

The tasks come from the run's resolved config (``environment.split_seed``); nothing is sampled.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from miniverl.config.loading import load_resolved_config
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.inspection.run_dir import read_metrics
from miniverl.lab.benchmark.endpoints import (
    AnswerEvent,
    CallEvent,
    analyze_episode,
    chain_task_of,
    events_of,
    summarize_episodes,
)
from miniverl.trajectory.io import read_trajectories
from miniverl.utils.io import write_json
from miniverl.utils.runs import RunPaths


def compact_episode(trajectory: Any, task_data: dict[str, Any]) -> dict[str, Any]:
    """One evaluated episode as the endpoints need it: task, call/answer events, solved."""
    events: list[list[Any]] = []
    for event in events_of(trajectory):
        if isinstance(event, CallEvent):
            events.append(["call", event.expression, event.ok])
        else:
            events.append(["answer", event.answer])
    return {
        "task_id": trajectory.task_id,
        "start": int(task_data["start"]),
        "steps": [[str(op), int(y)] for op, y in task_data["steps"]],
        "events": events,
        "solved": bool(trajectory.solved),
    }


def summarize_compact(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`summarize_episodes` of compact episodes (the inverse of :func:`compact_episode`)."""
    analyses = []
    for e in episodes:
        events = [
            CallEvent(x[1], bool(x[2])) if x[0] == "call" else AnswerEvent(x[1])
            for x in e["events"]
        ]
        task = chain_task_of({"start": e["start"], "steps": e["steps"]})
        analyses.append(analyze_episode(task, events, bool(e["solved"])))
    return summarize_episodes(analyses)


def run_episodes(run_dir: Path) -> dict[str, dict[str, Any]]:
    """``{tag: {"step": optimizer step, "episodes": [compact episode, ...]}}`` in evaluation order."""
    config = load_resolved_config(run_dir)
    env = make_environment(config.environment.name, **config.environment.params)
    tasks = {t.task_id: t for s in build_splits(env, config.environment).values() for t in s}
    steps = {
        str(r.get("tag")): int(r.get("global_optimizer_step") or 0)
        for r in read_metrics(RunPaths(run_dir).metrics)
        if r.get("kind") == "eval"
    }
    tags: dict[str, dict[str, Any]] = {}
    for trajectory in read_trajectories(RunPaths(run_dir).eval_trajectories):
        tag = str(trajectory.metadata.get("eval_tag"))
        entry = tags.setdefault(tag, {"step": steps.get(tag), "episodes": []})
        entry["episodes"].append(compact_episode(trajectory, tasks[trajectory.task_id].data))
    return tags


def line(tag: str, step: int | None, summary: dict[str, Any]) -> str:
    n = summary["episodes"]
    solved = round((summary["success"] or 0) * n)
    flagged = summary["flagged_episodes"]
    recovered = round((summary["flagged_recovery_rate"] or 0) * flagged)
    by_k = " ".join(f"k={k} {v:.3f}" for k, v in summary["success_by_k"].items())
    rate = "-" if not flagged else f"{recovered / flagged:.3f}"
    return (
        f"  {tag:<13} step {step!s:>4}  solved {solved:>3}/{n:<3} ({by_k})  "
        f"flagged {flagged:>3}, recovered {recovered:>3} ({rate})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--episodes", type=Path, help="write every evaluated episode here (JSON)")
    args = parser.parse_args()
    stored: dict[str, Any] = {}
    for run_dir in args.runs:
        tags = run_episodes(run_dir)
        stored[run_dir.as_posix()] = tags
        print(run_dir)
        for tag, entry in tags.items():
            print(line(tag, entry["step"], summarize_compact(entry["episodes"])))
    if args.episodes is not None:
        write_json(args.episodes, {"schema": "miniverl.run_endpoints/1", "runs": stored})


if __name__ == "__main__":
    main()
