"""Recovery at fixed states: every arm of a seed continues from the same student errors.

Why: the flagged-recovery rate over an arm's own greedy episodes (``endpoints.py``) has a
denominator the arm chooses. Once a student solves most tasks it makes few errors (a SmolLM2
pilot: 0 to 8 flagged episodes of 90 per evaluation), so two arms' rates rest on different,
small sets of episodes and cannot carry a contrast. Here the states are fixed per seed before
any arm runs (``lab.fixed_state_recovery``):

- the cold-start student's episodes on the arms' evaluation tasks
  (``eval.split``, its first ``eval.max_tasks``), sampled at ``rollout.temperature`` exactly as
  the held-out state gate samples them (:func:`~miniverl.lab.teachers.gate.gate_episodes`,
  seed ``run.seed``), so on the validation split they are the gate's recovery states;
- in each episode with a deviation, the state after its first off-path turn, that turn's tool
  answer included (:func:`~miniverl.lab.teachers.gate.first_off_path_turns`).

The deviated episodes are stored with the cold start (:data:`FIXED_STATES_FILE`, their SHA-256
in the cold-start cell). A policy -- the cold start itself, then each arm's final student -- is
replayed to each state and continues greedily (:func:`~miniverl.lab.teachers.gate.recovery_outcomes`);
the outcome is whether the episode ends solved. Every arm of a seed answers the same states, so
a contrast pairs them one by one (``contrasts.FIXED_RECOVERY``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniverl.config.models import RolloutConfig, RunConfig
from miniverl.environments.base import Task, ToolEnvironment
from miniverl.errors import CheckpointError
from miniverl.lab.teachers.gate import first_off_path_turns, gate_episodes, recovery_outcomes
from miniverl.schemas.trajectory import Trajectory
from miniverl.utils.hashing import sha256_file

FIXED_STATES_FILE = "fixed-states.jsonl"
"""The cold start's deviated episodes (trajectory JSONL), beside its weights."""


def evaluation_tasks(config: RunConfig, splits: Mapping[str, Sequence[Task]]) -> list[Task]:
    """The tasks every arm's final evaluation runs: ``eval.max_tasks`` of ``eval.split``."""
    return list(splits[config.eval.split][: config.eval.max_tasks])


def sample_fixed_states(
    student: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    config: RunConfig,
    directory: Path,
) -> dict[str, Any]:
    """Sample the cold start's (``student``'s) states on ``tasks`` and store its deviated
    episodes in ``directory``.

    ``config`` gives the rollout bounds and temperature, the seed (``run.seed``) and the batch
    size. Returns the record the cold-start cell keeps: the split, the number of tasks and
    episodes, the states, the file's SHA-256 and the cold start's own outcomes at the states
    (:func:`policy_recovery`).
    """
    from miniverl.trajectory.io import write_trajectories

    episodes = gate_episodes(
        student,
        environment,
        tasks,
        config.rollout,
        seed=config.run.seed,
        temperature=config.rollout.temperature,
        batch_size=config.eval.batch_size,
    )
    by_id = {t.task_id: t for t in tasks}
    first_off = first_off_path_turns(environment, by_id, episodes, student.tokenizer)
    deviated = [e for e in episodes if e.trajectory_id in first_off]
    path = directory / FIXED_STATES_FILE
    write_trajectories(path, deviated)
    return {
        "split": config.eval.split,
        "tasks": len(tasks),
        "episodes": len(episodes),
        "states": len(deviated),
        "file": FIXED_STATES_FILE,
        "sha256": sha256_file(path),
        "cold_start": policy_recovery(student, environment, tasks, config.rollout, deviated),
    }


def load_fixed_states(directory: Path, record: Mapping[str, Any]) -> list[Trajectory]:
    """The stored deviated episodes, refused when they are not the bytes the cold start wrote."""
    from miniverl.trajectory.io import read_trajectories

    path = directory / str(record["file"])
    if not path.is_file() or sha256_file(path) != record["sha256"]:
        raise CheckpointError(
            f"{path}: the cold start's fixed states are missing or changed since it stored them",
            hint="start the benchmark again in a fresh directory; the states every arm continues from must be the ones the cold start sampled",
        )
    return list(read_trajectories(path))


def policy_recovery(
    policy: Any,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    rollout: RolloutConfig,
    states: Sequence[Trajectory],
) -> dict[str, Any]:
    """``policy`` continuing greedily from each state: ``{states, recovered, rate, outcomes:
    [{trajectory_id, from_turn, solved}]}`` in the states' order."""
    by_id = {t.task_id: t for t in tasks}
    first_off = first_off_path_turns(environment, by_id, states, policy.tokenizer)
    outcomes = recovery_outcomes(policy, environment, by_id, states, first_off, rollout)
    recovered = sum(int(bool(o["solved"])) for o in outcomes)
    return {
        "states": len(outcomes),
        "recovered": recovered,
        "rate": recovered / len(outcomes) if outcomes else None,
        "outcomes": [{**o, "solved": int(bool(o["solved"]))} for o in outcomes],
    }


@dataclass
class StoredStates:
    """What replaying a run's fixed states needs: the run's resolved config, its environment
    and evaluation tasks, the cold start's stored deviated episodes on those tasks, and one
    student-shaped ``policy`` that holds the cold start's weights until
    :func:`load_final_student` swaps in an arm's."""

    config: RunConfig
    environment: ToolEnvironment
    tasks: list[Task]
    states: list[Trajectory]
    policy: Any


def stored_states(run_dir: Path, cold_start: Path) -> StoredStates:
    """The fixed states of ``cold_start`` (its ``fixed-states.jsonl``) on the evaluation tasks
    of ``run_dir``'s resolved config, and a policy loaded with the cold start's weights."""
    from miniverl.config.loading import load_resolved_config
    from miniverl.environments.registry import make_environment
    from miniverl.environments.tasks_file import build_splits
    from miniverl.models.factory import build_tokenizer
    from miniverl.models.runtime import build_runtime
    from miniverl.training.cold_start import load_cold_start
    from miniverl.trajectory.io import read_trajectories

    config = load_resolved_config(run_dir)
    environment = make_environment(config.environment.name, **config.environment.params)
    tasks = evaluation_tasks(config, build_splits(environment, config.environment))
    held_out = {t.task_id for t in tasks}
    states = [t for t in read_trajectories(cold_start / FIXED_STATES_FILE) if t.task_id in held_out]
    policy = build_runtime(config, build_tokenizer(config), "cpu", with_teacher=False).student
    load_cold_start(cold_start, student=policy)
    return StoredStates(config, environment, tasks, states, policy)


def load_final_student(policy: Any, run_dir: Path) -> None:
    """Load ``run_dir``'s final trained weights into ``policy`` (the same student shape)."""
    from miniverl.training.checkpoint import load_checkpoint
    from miniverl.utils.runs import RunPaths

    policy.load_trainable_state_dict(load_checkpoint(RunPaths(run_dir).final_checkpoint).trainable)


def recovery_by_seed(
    cold_starts: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per seed with fixed states: ``{seed, states, cold_start, arms: {arm: [recovered per arm
    seed]}}``, counts of states each policy ended solved (``benchmark.json``'s
    ``fixed_state_recovery``; the console and the report show it)."""
    out = []
    for cold in cold_starts:
        record = cold.get("fixed_states")
        if not record:
            continue
        arms: dict[str, list[int]] = {}
        for row in rows:
            got = row.get("fixed_state_recovery")
            if row.get("seed") == cold["seed"] and got:
                arms.setdefault(str(row["arm"]), []).append(int(got["recovered"]))
        out.append(
            {
                "seed": cold["seed"],
                "split": record["split"],
                "states": record["states"],
                "cold_start": record["cold_start"]["recovered"],
                "arms": arms,
            }
        )
    return out


def recovery_lines(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """One plain line per seed: how many of the same states each policy recovered from."""
    lines = []
    for row in table:
        arms = ", ".join(
            f"{arm} {' / '.join(str(n) for n in counts)}" for arm, counts in row["arms"].items()
        )
        lines.append(
            f"seed {row['seed']}: of the cold start's {row['states']} own deviations on the "
            f"{row['split']} split, recovered by the cold start {row['cold_start']}"
            + (f", {arms}" if arms else "")
        )
    return lines


__all__ = [
    "FIXED_STATES_FILE",
    "StoredStates",
    "evaluation_tasks",
    "load_final_student",
    "load_fixed_states",
    "policy_recovery",
    "recovery_by_seed",
    "recovery_lines",
    "sample_fixed_states",
    "stored_states",
]
