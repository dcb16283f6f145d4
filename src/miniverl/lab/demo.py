"""``miniverl demo``'s comparison: two runs of the demo recipe from one SFT warm-up, side by side.

The demo is the positive control in miniature: the recipe as it stands (``opd``) and again as
``offline_kd``, with the same seed and teacher, both from the packaged SFT warm-up
(``config.presets.DEMO_COLD_START``), on a task whose tool flags a wrong call. This module
checks that both loaded the same weights, reads what each run's held-out evaluations say
(success, the curve over updates), continues each trained student from the warm-up student's
own errors (:func:`start_error_recovery`: the states offline KD's traces never show), and
prints and records it (``comparison.json`` in the ``opd`` run, which its report leads with).
It also trains the two runs (:func:`train_demo_arms`: one process each where two cores are
free); the CLI checks the output directories, then calls these pieces in order.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RUN_MARKERS = ("manifest.json", "config.validated.yaml", "events.jsonl")
"""Files only a miniverl run directory holds: ``--overwrite`` deletes nothing else."""


def clear_for_overwrite(run_dir: Path) -> None:
    """Delete an earlier run at ``run_dir``; refuse a directory miniverl did not write."""
    from miniverl.errors import RunDirectoryError
    from miniverl.utils.runlock import LOCK_NAME

    if not run_dir.exists():
        return
    if not run_dir.is_dir() or not any((run_dir / m).exists() for m in RUN_MARKERS):
        raise RunDirectoryError(
            f"{run_dir} exists but is not a miniverl run directory; --overwrite will not delete it",
            hint="choose another --output directory",
        )
    for child in run_dir.iterdir():
        if child.name == LOCK_NAME:  # held by this process while it clears the directory
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def train_demo_arm(
    arm: str,
    directory: Path,
    *,
    fast: bool,
    overwrite: bool,
    quiet: bool,
    verbose: bool,
    in_child: bool,
) -> dict[str, Any]:
    """Train one arm of the demo into ``directory`` from the packaged warm-up (its report
    comes later, from the comparison): the run's summary, or ``{"error": (class name,
    message, hint)}`` for a :class:`~miniverl.errors.MiniverlError` raised in a child process,
    which :func:`train_demo_arms` raises again in the parent. A child trains quietly."""
    from miniverl.config.presets import (
        DEMO_MODE,
        demo_cold_start_path,
        demo_config,
        demo_recipe_bytes,
    )
    from miniverl.errors import MiniverlError
    from miniverl.lab.config import with_lab
    from miniverl.lab.run import start_run
    from miniverl.utils.runlock import run_lock

    try:
        with run_lock(directory) as lock:
            if overwrite and any(child != lock for child in directory.iterdir()):
                clear_for_overwrite(directory)  # under the lock: no other writer is inside
            trainer = start_run(
                with_lab(demo_config(fast=fast, mode=None if arm == DEMO_MODE else arm)),
                cold_start=demo_cold_start_path(),
                output_dir=directory,
                submitted_recipe=demo_recipe_bytes(),
                quiet=quiet or in_child,
                verbose=verbose,
            )
            return dict(trainer.train())
    except MiniverlError as exc:
        if not in_child:
            raise
        return {"error": (type(exc).__name__, exc.message, exc.hint)}


def end_with_parent(parent: int) -> None:
    """In a demo arm's process: on Linux, ask the kernel to end it when the ``miniverl demo``
    process ``parent`` that started it ends (killed, not only interrupted), so no arm trains on
    unattended into a run directory; a parent already gone ends it now. Elsewhere a no-op."""
    if sys.platform != "linux":
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def train_demo_arms(
    run_dirs: dict[str, Path],
    *,
    fast: bool,
    overwrite: bool,
    quiet: bool,
    verbose: bool,
    console: Console,
) -> dict[str, dict[str, Any]]:
    """Train every arm of the demo (:func:`train_demo_arm`): at once, one spawned process
    and one core each, when the machine lets this process use that many cores (and not
    ``--verbose``, whose live output would interleave); else one after the other. Returns each
    arm's summary; an arm's typed error is raised here as the same class."""
    options = {"fast": fast, "overwrite": overwrite, "quiet": quiet, "verbose": verbose}
    usable = (
        os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    )
    if len(usable) < len(run_dirs) or verbose:
        return {
            arm: train_demo_arm(arm, d, **options, in_child=False) for arm, d in run_dirs.items()
        }
    if not quiet:
        console.print(
            f"training {' and '.join(run_dirs)} at once, one process and one core each, from the "
            "same SFT warm-up (each run's progress: its events.jsonl); about 2 minutes",
            markup=False,
        )
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(
        len(run_dirs),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=end_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        futures = {
            arm: pool.submit(train_demo_arm, arm, d, **options, in_child=True)
            for arm, d in run_dirs.items()
        }
        outcomes = {arm: future.result() for arm, future in futures.items()}
    raise_arm_error(outcomes)
    return outcomes


def raise_arm_error(outcomes: dict[str, dict[str, Any]]) -> None:
    """Raise the first arm's error that :func:`train_demo_arm` carried out of its process, as
    the :mod:`miniverl.errors` class it was (message and hint kept)."""
    from miniverl import errors

    for outcome in outcomes.values():
        if "error" in outcome:
            kind, message, hint = outcome["error"]
            raise getattr(errors, kind, errors.MiniverlError)(message, hint=hint)


def start_error_recovery(
    run_dirs: dict[str, Path], cold_start: Path, teacher_weights: Path
) -> dict[str, Any]:
    """What each policy does after the shared start's own tool errors (the positive
    control's endpoint, ``lab/benchmark/fixed_states.py``), and the teacher as the ceiling.

    The states are the cold start's deviated held-out episodes (its ``fixed-states.jsonl``,
    sampled from it at ``rollout.temperature`` when it was made, so every machine continues
    from the same errors) on the run's evaluation tasks (``demo --fast`` evaluates fewer).
    The start student, each arm's final student and the teacher are replayed to the state
    after each episode's first off-path turn (the tool's answer included) and continue
    greedily; ``recovered`` counts the episodes that end solved. The
    teacher's ``teacher_solved`` is its own greedy success on the same held-out tasks.
    Returns ``{tasks, states, recovered: {start, arm..., teacher}, teacher_solved}``.
    """
    from safetensors.torch import load_file

    from miniverl.lab.benchmark.fixed_states import (
        load_final_student,
        policy_recovery,
        stored_states,
    )
    from miniverl.lab.teachers.gate import gate_episodes

    stored = stored_states(next(iter(run_dirs.values())), cold_start)
    policy, rollout = stored.policy, stored.config.rollout

    def recovered_by(loaded: Any) -> int:
        got = policy_recovery(loaded, stored.environment, stored.tasks, rollout, stored.states)
        return int(got["recovered"])

    recovered = {"start": recovered_by(policy)}
    for arm, run_dir in run_dirs.items():
        load_final_student(policy, run_dir)
        recovered[arm] = recovered_by(policy)
    policy.load_full_state_dict(load_file(str(teacher_weights)))
    recovered["teacher"] = recovered_by(policy)
    own = gate_episodes(
        policy,
        stored.environment,
        stored.tasks,
        rollout,
        seed=stored.config.run.seed,
        temperature=0.0,
    )
    return {
        "tasks": len(stored.tasks),
        "states": len(stored.states),
        "recovered": recovered,
        "teacher_solved": sum(int(bool(t.solved)) for t in own),
    }


def comparison_run_dir(run_dir: Path) -> Path:
    """Where ``miniverl demo`` writes its comparison arm: ``<run_dir>-offline_kd`` beside the
    ``opd`` run, so ``run_dir`` stays one complete run every command reads as before."""
    from miniverl.config.presets import DEMO_COMPARISON_MODE

    return run_dir.with_name(f"{run_dir.name}-{DEMO_COMPARISON_MODE}")


def start_weights_sha256(run_dir: Path) -> str | None:
    """SHA-256 of the student weights the run started from (its cold start, as the run's
    ``benchmark_cold_start_loaded`` event records it after verifying the file), or None."""
    from miniverl.inspection.run_dir import read_events
    from miniverl.utils.runs import RunPaths

    loaded = [
        getattr(record, "student_sha256", None)
        for record in read_events(RunPaths(run_dir).events)
        if record.event == "benchmark_cold_start_loaded"
    ]
    return loaded[-1] if loaded else None


def check_shared_start(
    run_dirs: dict[str, Path], weights_sha256: Any = start_weights_sha256
) -> str:
    """The SHA-256 of the start weights every arm of the demo started from, or
    :class:`CheckpointError` when they differ (or one is missing): then the comparison would
    not be like for like, and nothing is printed as if it were."""
    from miniverl.errors import CheckpointError

    starts = {arm: weights_sha256(d) for arm, d in run_dirs.items()}
    if len(set(starts.values())) != 1 or None in starts.values():
        raise CheckpointError(
            "the demo's arms did not start from the same weights ("
            + ", ".join(f"{arm} {str(sha)[:12]}" for arm, sha in starts.items())
            + ")",
            hint="both load the packaged cold start; reinstall miniverl if its files were "
            "changed, then rerun with --overwrite",
        )
    return str(next(iter(starts.values())))


TRAINS_ON = {"student": "the student's own episodes", "teacher_pool": "the teacher's episodes"}
"""What each demo arm trains on, by its mode's kind of trajectories (``config/modes.py``)."""


def held_out_curve(run_dir: Path) -> list[tuple[int, float]]:
    """``(updates after the warm-up, held-out success)`` at every evaluation of the run after
    its SFT warm-up: the warm-up's own at 0 (its ``after_warmup`` evaluation, or the
    ``baseline`` evaluation of a run that loaded a warmed-up cold start), an evaluation after
    cycle ``c`` at ``c + 1``."""
    from miniverl.inspection.run_dir import read_metrics
    from miniverl.schemas.records import EvalRecord
    from miniverl.utils.runs import RunPaths

    points: dict[int, float] = {}
    start: dict[str, float] = {}
    for record in read_metrics(RunPaths(run_dir).metrics):
        if not isinstance(record, EvalRecord) or record.success_rate is None:
            continue
        if record.tag in ("after_warmup", "baseline"):
            start[record.tag] = float(record.success_rate)
        elif record.cycle is not None and record.cycle >= 0:
            points[record.cycle + 1] = float(record.success_rate)
    if start:
        points[0] = start.get("after_warmup", start.get("baseline", 0.0))
    return sorted(points.items())


def demo_comparison(
    summaries: dict[str, dict[str, Any]],
    run_dirs: dict[str, Path],
    *,
    start_sha256: str,
    recovery: dict[str, Any] | None,
    smoke_test: bool,
) -> dict[str, Any]:
    """What ``comparison.json`` records (the report leads with it): per arm, in order, its run
    directory, what it trains on, its results after the shared warm-up and at the end, its
    held-out curve; recovery at the warm-up's own errors
    (:func:`start_error_recovery`), the teacher's success and the plain sentence."""
    from miniverl.config.modes import MODES

    first = next(iter(summaries))
    arms = [
        {
            "name": arm,
            "run_dir": str(run_dirs[arm]),
            "trains_on": TRAINS_ON.get(MODES[arm].trajectories, MODES[arm].description),
            "start": _start(summaries[arm]),
            "final": summaries[arm].get("final"),
            "curve": held_out_curve(run_dirs[arm]),
        }
        for arm in summaries
    ]
    teacher = None
    if recovery and recovery.get("tasks"):
        teacher = recovery["teacher_solved"] / recovery["tasks"]
    sentence = None
    if not smoke_test:
        sentence = demo_sentence(
            _start(summaries[first]),
            {arm: s.get("final") for arm, s in summaries.items()},
            recovery,
        )
    return {
        "arms": arms,
        "start_weights_sha256": start_sha256,
        "recovery": recovery,
        "teacher_success": teacher,
        "sentence": sentence,
        "smoke_test": smoke_test,
    }


def _start(summary: dict[str, Any]) -> dict[str, Any] | None:
    """A run's held-out result at its start: after its own warm-up, or its baseline
    evaluation of the cold start it loaded."""
    return summary.get("after_warmup") or summary.get("baseline")


def _count(result: dict[str, Any] | None) -> str:
    return f"{result['solved']}/{result['tasks']}" if result else "-"


def _more(a: int, b: int, more: str, fewer: str, same: str) -> str:
    return more if a > b else fewer if a < b else same


def demo_sentence(
    start: dict[str, Any] | None,
    arms: dict[str, dict[str, Any] | None],
    recovery: dict[str, Any] | None,
) -> str | None:
    """What the demo's comparison did, in plain words, whichever way it fell; it claims no
    more than one seed's counts (``arms``: the on-policy arm's final result first, then the
    comparison arm's, by arm name; ``recovery``: :func:`start_error_recovery`'s record)."""
    if len(arms) != 2:
        return None
    (mine, opd), (name, other) = arms.items()
    if not start or not opd or not other:
        return None
    text = (
        f"From the same SFT warm-up ({_count(start)} held-out tasks solved), the same teacher "
        f"and the same number of updates, training on the student's own episodes (OPD) reached "
        f"{_count(opd)} and training on the teacher's episodes ({name}) reached {_count(other)}"
    )
    if recovery and recovery.get("states"):
        got, n = recovery["recovered"], recovery["states"]
        text += (
            f"; continued from the warm-up student's own {n} errors, where the warm-up itself "
            f"recovers {got['start']}, OPD's student recovers {got[mine]} and {name}'s "
            f"{got[name]}: "
            + _more(
                got[mine],
                got[name],
                f"OPD learned more recovery from its own mistakes than {name}",
                f"OPD learned less recovery than {name}",
                f"OPD and {name} recovered equally often",
            )
            + f" (the teacher recovers {got['teacher']} and solves "
            f"{recovery['teacher_solved']}/{recovery['tasks']} tasks)"
        )
    else:
        text += ": " + _more(
            opd["solved"],
            other["solved"],
            f"OPD ended ahead of {name}",
            f"OPD ended behind {name}",
            f"OPD and {name} ended level",
        )
    return text + ". One seed shows what happened here, not a difference the lab claims."


def print_comparison(console: Console, comparison: dict[str, Any]) -> None:
    """The demo's side-by-side table from its :func:`demo_comparison` record: the shared
    warm-up, each arm after training, the teacher as the ceiling, each with its held-out
    success and its recovery from the warm-up's own errors; then the plain sentence (or the
    smoke-test notice)."""
    arms = comparison["arms"]
    smoke_test = comparison["smoke_test"]
    recovery = comparison.get("recovery") or {}
    got = recovery.get("recovered") or {}
    states = recovery.get("states")
    title = "the demo: " + ", ".join(f"{a['name']} {a['run_dir']}" for a in arms)
    if smoke_test:
        title += "\nSMOKE TEST (demo --fast): tiny budgets, not a result"
    first, second = (a["name"] for a in arms)
    table = Table(title=title)
    table.caption = (
        f"{first} trains on the student's own episodes, {second} on the teacher's; both start "
        "from the same warm-up weights. Recovered: continued greedily from the warm-up "
        "student's own first error in each held-out episode where it made one, the episode "
        "ends solved."
    )
    table.add_column("", no_wrap=True)
    table.add_column("held-out solved", justify="right")
    table.add_column("success", justify="right")
    table.add_column(f"recovered of the warm-up's {states} errors", justify="right")
    rows = [("SFT warm-up (shared start)", arms[0]["start"], "start")]
    rows += [(a["name"], a["final"], a["name"]) for a in arms]
    for label, result, key in rows:
        if result:
            table.add_row(
                label,
                _count(result),
                f"{100 * result['success_rate']:.1f}%",
                f"{got[key]}/{states}" if key in got else "-",
            )
    teacher = comparison.get("teacher_success")
    if teacher is not None and recovery.get("tasks"):
        table.add_row(
            "teacher (the ceiling)",
            f"{recovery['teacher_solved']}/{recovery['tasks']}",
            f"{100 * teacher:.1f}%",
            f"{got['teacher']}/{states}" if "teacher" in got else "-",
        )
    console.print(table)
    if smoke_test:
        console.print(
            "demo --fast only checks that the pipeline runs end to end; its success rates "
            "are meaningless. Run 'miniverl demo' for the real demo result.",
            markup=False,
        )
    elif comparison["sentence"]:
        console.print(comparison["sentence"], markup=False, soft_wrap=True)


__all__ = [
    "RUN_MARKERS",
    "check_shared_start",
    "clear_for_overwrite",
    "comparison_run_dir",
    "demo_comparison",
    "demo_sentence",
    "end_with_parent",
    "held_out_curve",
    "print_comparison",
    "raise_arm_error",
    "start_error_recovery",
    "start_weights_sha256",
    "train_demo_arm",
    "train_demo_arms",
]
