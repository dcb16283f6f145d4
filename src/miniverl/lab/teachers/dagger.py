"""DAgger labelling: the student's own states, each labelled with the oracle's next action.

A teacher fitted only on oracle traces has seen only states on the oracle's path; on-policy
distillation asks it what to do at the states the *student* reaches. The warmed-up student
is rolled out on training tasks (:func:`dagger_rollouts`), and every assistant turn it
played becomes one fitting row whose target is the oracle's action from that state (after an
error: the corrective re-call, ``environments/oracle_state.py``), rendered as oracle traces
write it (:func:`dagger_examples`). The toy teacher fit (``lab/teachers/toy_fit.py``) and the
HF adapter fit (``lab/teachers/adapter_fit.py``) add these rows to their oracle traces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.config.sections import RolloutConfig
from miniverl.environments.base import Task, ToolEnvironment
from miniverl.environments.oracle_state import OracleAction, oracle_tool_results
from miniverl.lab.config import DaggerConfig
from miniverl.lab.teachers.fitting import TurnState, turn_states
from miniverl.models.base import CausalLMBackend
from miniverl.schemas.trajectory import Trajectory
from miniverl.utils.seeding import derive_seed

FitExample = tuple[list[int], list[int]]
"""``(token_ids, target_positions)``: one fitting row."""


def render_action(action: OracleAction) -> str:
    """An oracle action as oracle traces write it (``format_tool_call`` / ``format_final``)."""
    if action.call is None:
        return format_final(action.answer or "")
    return format_tool_call(action.call)


def label_student_states(
    environment: ToolEnvironment,
    tasks_by_id: Mapping[str, Task],
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
) -> list[TurnState]:
    """Every assistant turn of ``trajectories`` with the oracle's next action from its state."""
    expected: dict[str, list[str]] = {}
    states: list[TurnState] = []
    for traj in trajectories:
        task = tasks_by_id[traj.task_id]
        if task.task_id not in expected:
            expected[task.task_id] = oracle_tool_results(environment, task)
        states.extend(
            turn_states(
                environment,
                task,
                traj,
                encode=tokenizer.encode,
                render=render_action,
                expected_results=expected[task.task_id],
            )
        )
    return states


def dagger_rollouts(
    student: CausalLMBackend,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    dagger: DaggerConfig,
    rollout: RolloutConfig,
    *,
    seed: int,
    batch_size: int | None,
    split: Any = None,
) -> list[Trajectory]:
    """The student's episodes on ``tasks`` that DAgger labels: ``rollouts_per_task`` each.

    Episode ``r`` of task ``i`` samples at ``temperatures[r % len(temperatures)]`` with seed
    ``derive_seed(seed, "dagger", r, i)``.
    """
    runner = RolloutRunner(student, environment, rollout)
    out: list[Trajectory] = []
    for r in range(dagger.rollouts_per_task):
        temperature = dagger.temperatures[r % len(dagger.temperatures)]
        requests = [
            EpisodeRequest(
                task, derive_seed(seed, "dagger", r, i), trajectory_id=f"{task.task_id}:dagger-{r}"
            )
            for i, task in enumerate(tasks)
        ]
        out.extend(
            runner.rollout_batch(
                requests, batch_size=batch_size, temperature=temperature, split=split
            )
        )
    return out


def dagger_examples(
    student: CausalLMBackend,
    environment: ToolEnvironment,
    train: Sequence[Task],
    dagger: DaggerConfig,
    rollout: RolloutConfig,
    *,
    seed: int,
    batch_size: int | None,
    split: Any = None,
) -> tuple[list[FitExample], dict[str, Any]]:
    """Labelled student states of the training tasks as fit rows, and what they hold.

    Only ``train`` (the first ``dagger.tasks`` of it) is rolled out: a held-out task never
    becomes a fitting state. Each turn gives one row, the oracle's action from the turn's
    state (:meth:`~miniverl.lab.teachers.fitting.TurnState.fit_row`).
    """
    tasks = list(train)[: dagger.tasks] if dagger.tasks is not None else list(train)
    trajectories = dagger_rollouts(
        student, environment, tasks, dagger, rollout, seed=seed, batch_size=batch_size, split=split
    )
    by_id = {t.task_id: t for t in tasks}
    states = label_student_states(environment, by_id, trajectories, student.tokenizer)
    counts = {
        "dagger_tasks": len(tasks),
        "dagger_episodes": len(trajectories),
        "dagger_solved": sum(int(t.solved) for t in trajectories),
        "dagger_states": len(states),
        "dagger_off_path_states": sum(s.off_path for s in states),
        "dagger_deviated_turns": sum(s.deviated for s in states),
    }
    return [s.fit_row() for s in states], counts


__all__ = ["dagger_examples", "dagger_rollouts", "label_student_states", "render_action"]
