"""``miniverl demo``'s comparison: two runs of the demo recipe from one SFT warm-up, side by side.

The demo trains the recipe as it stands (``opd``) and again as ``offline_kd``, with the same
seed, teacher and warm-up; this module checks that both started from the same weights, reads
what each run's held-out evaluations say (success, the curve over updates, episodes with a
refused call) and prints and records it (``comparison.json`` in the ``opd`` run, which its
report leads with). It reads run directories only; the CLI trains the runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def teacher_heldout(run_dir: Path) -> float | None:
    """The fitted toy teacher's greedy success on the run's held-out tasks (the same tasks the
    student is evaluated on), from its ``toy_teacher_fitted`` / ``toy_teacher_reused`` event."""
    from miniverl.inspection.run_dir import read_events
    from miniverl.utils.runs import RunPaths

    rates = [
        getattr(record, "heldout_success", None)
        for record in read_events(RunPaths(run_dir).events)
        if record.event in ("toy_teacher_fitted", "toy_teacher_reused")
    ]
    return rates[-1] if rates else None


def comparison_run_dir(run_dir: Path) -> Path:
    """Where ``miniverl demo`` writes its comparison arm: ``<run_dir>-offline_kd`` beside the
    ``opd`` run, so ``run_dir`` stays one complete run every command reads as before."""
    from miniverl.config.presets import DEMO_COMPARISON_MODE

    return run_dir.with_name(f"{run_dir.name}-{DEMO_COMPARISON_MODE}")


def warmup_weights_sha256(run_dir: Path) -> str | None:
    """SHA-256 of the student's weights when the run's SFT warm-up ended (its ``warmup``
    checkpoint), or None without one."""
    from miniverl.errors import CheckpointError
    from miniverl.training.checkpoint import ADAPTER_FILE, read_marker
    from miniverl.utils.runs import RunPaths

    try:
        return str(read_marker(RunPaths(run_dir).checkpoint("warmup"))["files"][ADAPTER_FILE])
    except CheckpointError:
        return None


def check_shared_start(
    run_dirs: dict[str, Path], weights_sha256: Any = warmup_weights_sha256
) -> str:
    """The SHA-256 of the warm-up weights every arm of the demo started from, or
    :class:`CheckpointError` when they differ (or one is missing): then the comparison would
    not be like for like, and nothing is printed as if it were."""
    from miniverl.errors import CheckpointError

    starts = {arm: weights_sha256(d) for arm, d in run_dirs.items()}
    if len(set(starts.values())) != 1 or None in starts.values():
        raise CheckpointError(
            "the demo's arms did not start from the same SFT warm-up weights ("
            + ", ".join(f"{arm} {str(sha)[:12]}" for arm, sha in starts.items())
            + ")",
            hint="the warm-up is deterministic at a seed on one machine; rerun with --overwrite, "
            "and report it if it happens again",
        )
    return str(next(iter(starts.values())))


def refused_call_episodes(run_dir: Path, tag: str = "final") -> tuple[int, int]:
    """``(episodes, solved)``: the run's held-out episodes of evaluation ``tag`` in which the
    tool or the parser refused at least one call (``invalid_tool_calls``: an ``ok: false``
    answer or an unparseable call), and how many of those still ended solved: the demo's
    recovery figure."""
    from miniverl.trajectory.io import iter_trajectories
    from miniverl.utils.runs import RunPaths

    path = RunPaths(run_dir).eval_trajectories
    episodes = solved = 0
    if not path.is_file():
        return 0, 0
    for t in iter_trajectories(path):
        if t.metadata.get("eval_tag") != tag:
            continue
        if t.invalid_tool_calls > 0:
            episodes += 1
            solved += int(t.solved)
    return episodes, solved


TRAINS_ON = {"student": "the student's own episodes", "teacher_pool": "the teacher's episodes"}
"""What each demo arm trains on, by its mode's kind of trajectories (``config/modes.py``)."""


def held_out_curve(run_dir: Path) -> list[tuple[int, float]]:
    """``(updates after the warm-up, held-out success)`` at every evaluation of the run after
    its SFT warm-up: the warm-up's own at 0, an evaluation after cycle ``c`` at ``c + 1``."""
    from miniverl.inspection.run_dir import read_metrics
    from miniverl.schemas.records import EvalRecord
    from miniverl.utils.runs import RunPaths

    points: dict[int, float] = {}
    for record in read_metrics(RunPaths(run_dir).metrics):
        if not isinstance(record, EvalRecord) or record.success_rate is None:
            continue
        if record.tag == "after_warmup":
            points[0] = float(record.success_rate)
        elif record.tag != "baseline" and record.cycle is not None and record.cycle >= 0:
            points[record.cycle + 1] = float(record.success_rate)
    return sorted(points.items())


def demo_comparison(
    summaries: dict[str, dict[str, Any]],
    run_dirs: dict[str, Path],
    *,
    warmup_sha256: str,
    teacher_success: float | None,
    smoke_test: bool,
) -> dict[str, Any]:
    """What ``comparison.json`` records (the report leads with it): per arm, in order, its run directory,
    what it trains on, its results after the shared warm-up and at the end, its held-out
    curve and refused-call counts; the teacher's success and the plain sentence."""
    from miniverl.config.modes import MODES

    first = next(iter(summaries))
    arms = [
        {
            "name": arm,
            "run_dir": str(run_dirs[arm]),
            "trains_on": TRAINS_ON.get(MODES[arm].trajectories, MODES[arm].description),
            "after_warmup": summaries[arm].get("after_warmup"),
            "final": summaries[arm].get("final"),
            "curve": held_out_curve(run_dirs[arm]),
            "refused_after_warmup": list(refused_call_episodes(run_dirs[arm], "after_warmup")),
            "refused_final": list(refused_call_episodes(run_dirs[arm], "final")),
        }
        for arm in summaries
    ]
    sentence = None
    if not smoke_test:
        sentence = demo_sentence(
            summaries[first].get("after_warmup"),
            {arm: s.get("final") for arm, s in summaries.items()},
            teacher_success,
        )
    return {
        "arms": arms,
        "warmup_weights_sha256": warmup_sha256,
        "teacher_success": teacher_success,
        "sentence": sentence,
        "smoke_test": smoke_test,
    }


def _count(result: dict[str, Any] | None) -> str:
    return f"{result['solved']}/{result['tasks']}" if result else "-"


def demo_sentence(
    start: dict[str, Any] | None,
    arms: dict[str, dict[str, Any] | None],
    teacher: float | None,
) -> str | None:
    """What the demo's comparison did, in plain words, whichever way it fell; it claims no
    more than one seed's counts (``arms``: the on-policy arm's final result first, then the
    comparison arm's, by arm name)."""
    if len(arms) != 2:
        return None
    (_, opd), (name, other) = arms.items()
    if not start or not opd or not other:
        return None
    if opd["solved"] == other["solved"]:
        verdict = f"OPD and {name} ended level"
    else:
        verdict = f"OPD ended {'ahead of' if opd['solved'] > other['solved'] else 'behind'} {name}"
    text = (
        f"From the same SFT warm-up ({_count(start)} held-out tasks solved), the same teacher "
        f"and the same number of updates, training on the student's own episodes (OPD) reached "
        f"{_count(opd)} and training on the teacher's episodes ({name}) reached {_count(other)}: "
        f"{verdict} in this one run"
    )
    if teacher is not None:
        text += f"; the teacher solves {100 * teacher:.0f}% of the same tasks"
    return text + ". One seed shows what happened here, not a difference the lab claims."


def print_comparison(console: Console, comparison: dict[str, Any]) -> None:
    """The demo's side-by-side table from its :func:`demo_comparison` record: the shared
    warm-up, each arm after training, the teacher as the ceiling; then the plain sentence (or
    the smoke-test notice)."""
    arms = comparison["arms"]
    smoke_test = comparison["smoke_test"]
    title = "held-out success: " + ", ".join(f"{a['name']} {a['run_dir']}" for a in arms)
    if smoke_test:
        title += "\nSMOKE TEST (demo --fast): tiny budgets, not a result"
    first, second = (a["name"] for a in arms)
    table = Table(title=title)
    table.caption = (
        f"{first} trains on the student's own episodes, {second} on the teacher's; both start "
        "from the same warm-up weights. Refused call: the tool or the parser answered ok: false."
    )
    table.add_column("", no_wrap=True)
    for column in ("solved", "success", "with a refused call", "solved of those"):
        table.add_column(column, justify="right")
    rows = [
        ("SFT warm-up (shared start)", arms[0]["after_warmup"], arms[0]["refused_after_warmup"])
    ]
    rows += [(a["name"], a["final"], a["refused_final"]) for a in arms]
    tasks = None
    for label, result, (episodes, solved) in rows:
        if result:
            tasks = result["tasks"]
            table.add_row(
                label,
                _count(result),
                f"{100 * result['success_rate']:.1f}%",
                str(episodes),
                f"{solved}/{episodes}" if episodes else "-",
            )
    teacher = comparison["teacher_success"]
    if teacher is not None and tasks:
        table.add_row(
            "teacher (the ceiling)",
            f"{round(teacher * tasks)}/{tasks}",
            f"{100 * teacher:.1f}%",
            "-",
            "-",
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
    "check_shared_start",
    "comparison_run_dir",
    "demo_comparison",
    "demo_sentence",
    "held_out_curve",
    "print_comparison",
    "refused_call_episodes",
    "teacher_heldout",
    "warmup_weights_sha256",
]
