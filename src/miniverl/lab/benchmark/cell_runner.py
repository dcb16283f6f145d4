"""The trainer behind each benchmark cell: cold starts and arm phases, measured into cell payloads.

:func:`make_trainer_cell_runner` returns the ``run_cell(cell, done)`` callable that
:func:`miniverl.lab.benchmark.cells.run_cells` drives. A cold-start cell first removes
whatever an interrupted attempt left in its directories; an arm cell continues an
interrupted attempt of the same arm config from the same cold start at its run's latest
checkpoint (``train.checkpoint_every``), and otherwise removes it too
(:func:`resume_spend`; the cost of a cell run in pieces:
:mod:`miniverl.lab.benchmark.budgets`). Then it trains, then measures:

- a cold-start cell: the exported weights' SHA-256, the cold start's evaluations, the
  teacher gate (``teacher_gate``: :func:`~miniverl.lab.teachers.gate.cold_start_teacher_gate`
  of the finished cold start, ``{value, threshold, passed, ...}`` or ``{skipped, reason}``;
  also copied beside the cold-start weights) and, for calc_chain,
  the endpoints of its last greedy evaluation (the state every arm starts from);
- an arm cell: :func:`measure_arm` (read back from the run's artifacts), the budget
  (:func:`miniverl.lab.benchmark.budgets.measure_budget`), the final greedy outcome of every
  held-out task, the learning curve over every evaluation tag and, for calc_chain, the
  endpoints of :mod:`miniverl.lab.benchmark.endpoints`, the model-scored exposure endpoints
  (:func:`~miniverl.lab.benchmark.endpoints.score_exposure`) included;
- with ``lab.fixed_state_recovery``, the cold start also samples and stores its fixed states
  and each arm records its final student's recovery from them
  (:mod:`miniverl.lab.benchmark.fixed_states`).

Every cell's teacher comes from the lab (``lab/teachers/prepare.py``): the cold start
prepares it (fitting a DAgger teacher from its own warmed-up student after the warm-up) and
keeps it beside the student; each arm loads it from there and hands it to its run.

**Compute-matched mode.** ``compute_matched=<resource>`` hands every non-reference arm a
:class:`~miniverl.lab.benchmark.budgets.BudgetCap` at the reference arm's spend of the same
(seed, arm seed) (the reference is planned first). The run enforces it through a
:class:`~miniverl.lab.benchmark.budgets.CapMeter` as its ``stop_after_cycle``: each cycle's
spend is charged over its optimizer steps and training stops cleanly after the cycle that
spends it, ``enforced: true`` and ``stopped_at``. The cell records
:func:`~miniverl.lab.benchmark.budgets.cap_outcome`.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.config.modes import MODES
from miniverl.errors import CheckpointError
from miniverl.lab.benchmark.arms import arm_config_for_arm_seed, with_cold_start_teacher
from miniverl.lab.benchmark.budgets import (
    CELL_COST_FILE,
    REFERENCE_ARM,
    CapMeter,
    PieceLedger,
    Spend,
    Stopwatch,
    cap_outcome,
    expected_cap,
    measure_budget,
    read_ledger,
    spend_at,
)
from miniverl.lab.benchmark.cells import COLD_START, Cell, RunCell
from miniverl.lab.benchmark.endpoints import (
    PRIMARY_KS,
    analyze_trajectory,
    area_under_curve,
    curve_is_dense_enough,
    score_exposure,
    summarize_episodes,
)
from miniverl.lab.benchmark.fixed_states import (
    evaluation_tasks,
    load_fixed_states,
    policy_recovery,
    sample_fixed_states,
)
from miniverl.lab.teachers.gate import (
    TEACHER_GATE_FILE,
    GateSubject,
    cold_start_teacher_gate,
)
from miniverl.lab.teachers.prepare import PreparedTeacher, prepare_teacher
from miniverl.training.checkpoint import select_resume_checkpoint
from miniverl.training.cold_start import COLD_START_MARKER, COLD_START_STUDENT
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import read_json
from miniverl.utils.runs import RunPaths


def cell_dirs(root: Path, cell: Cell) -> tuple[Path, Path]:
    """``(seed directory, run directory)``; arm seed 0 keeps the single-arm-seed layout."""
    seed_dir = root / f"seed-{cell.seed}"
    if cell.is_cold_start:
        return seed_dir, seed_dir / "cold-start-run"
    parent = seed_dir if cell.arm_seed == 0 else seed_dir / f"arm-seed-{cell.arm_seed}"
    return seed_dir, parent / cell.arm


def _eval_trajectories(run_dir: Path) -> dict[str, list[Any]]:
    from miniverl.trajectory.io import read_trajectories

    path = RunPaths(run_dir).eval_trajectories
    by_tag: dict[str, list[Any]] = {}
    if path.exists():
        for traj in read_trajectories(path):
            by_tag.setdefault(str(traj.metadata.get("eval_tag")), []).append(traj)
    return by_tag


def resume_spend(run_dir: Path, key: Mapping[str, Any]) -> Spend | None:
    """What an interrupted attempt of this arm cell committed, when it can be continued.

    It can when its ``cell-cost.json`` was written for ``key`` (the same arm config and cold
    start), the run has not finished, and its latest checkpoint verifies and is recorded in
    the ledger. None otherwise: the cell starts again from the cold start.
    """
    ledger = read_ledger(run_dir / CELL_COST_FILE, key)
    paths = RunPaths(run_dir)
    if ledger is None or paths.eval_json.exists():
        return None
    try:
        checkpoint = select_resume_checkpoint(paths.checkpoints)
    except CheckpointError:
        return None
    return None if checkpoint is None else spend_at(ledger, checkpoint.name)


def measure_arm(run_dir: Path) -> dict[str, Any]:
    """What one finished arm run measured, read back from its artifacts."""
    from miniverl.inspection.run_dir import read_eval_summary, read_events, read_metrics
    from miniverl.schemas.records import CycleRecord, StepRecord

    paths = RunPaths(run_dir)
    metrics = read_metrics(paths.metrics)
    events = read_events(paths.events)
    summary = read_eval_summary(paths)
    steps = [r for r in metrics if isinstance(r, StepRecord)]
    cycles = [r for r in metrics if isinstance(r, CycleRecord)]
    mode = summary.get("mode")
    model_tokens = sum(int((c.get("selection") or {}).get("model_tokens") or 0) for c in cycles)
    selected_in_cycles = sum(
        int((c.get("selection") or {}).get("selected_positions") or 0) for c in cycles
    )
    loaded = [e for e in events if e.event == "benchmark_cold_start_loaded"]
    final = summary.get("final") or {}
    baseline = summary.get("baseline") or {}
    return {
        "mode": mode,
        "objective": summary.get("objective"),
        "config_digest": summary.get("config_digest"),
        "baseline_success": baseline.get("success_rate"),
        "final_success": final.get("success_rate"),
        "final_solved": final.get("solved"),
        "final_tasks": final.get("tasks"),
        "generated_tokens": sum(
            int((c.get("rollouts") or {}).get("generated_tokens") or 0) for c in cycles
        ),
        "teacher_generated_tokens": sum(
            int(e.get("generated_tokens") or 0)
            for e in events
            if e.event == "rollouts_collected"
            and (e.get("offline_kd_pool") or e.get("teacher_sampled"))
        ),
        "selected_training_tokens": sum(int(s.get("selected_positions") or 0) for s in steps),
        "teacher_query_ratio": None
        if mode not in MODES or not MODES[mode].teacher_targets or not model_tokens
        else selected_in_cycles / model_tokens,
        "optimizer_steps": summary.get("global_optimizer_step"),
        "skipped_cycles": sum(1 for c in cycles if c.get("skipped")),
        "cold_start_student_sha256": loaded[-1].get("student_sha256") if loaded else None,
    }


def _is_chain(task: Any) -> bool:
    return isinstance(task.data, dict) and "steps" in task.data and "start" in task.data


def task_outcomes(trajectories: list[Any], tasks: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{task_id, k, solved}]`` in task-id order (k = 0 for tasks without a chain length)."""
    rows = []
    for traj in trajectories:
        task = tasks.get(traj.task_id)
        k = int(task.data.get("k", 0)) if task is not None and isinstance(task.data, dict) else 0
        rows.append({"task_id": traj.task_id, "k": k, "solved": int(bool(traj.solved))})
    return sorted(rows, key=lambda r: r["task_id"])


def learning_curve(
    by_tag: Mapping[str, list[Any]], metrics: list[Mapping[str, Any]], tasks: Mapping[str, Any]
) -> dict[str, Any]:
    """Success (all tasks and per k) at every evaluation, keyed by optimizer step, and its area."""
    steps = {
        str(r.get("tag")): int(r.get("global_optimizer_step") or 0)
        for r in metrics
        if r.get("kind") == "eval"
    }
    points: list[dict[str, Any]] = []
    for tag, trajs in by_tag.items():
        if tag not in steps or not trajs:
            continue
        rows = task_outcomes(trajs, tasks)
        by_k: dict[str, list[int]] = {}
        for r in rows:
            by_k.setdefault(str(r["k"]), []).append(r["solved"])
        points.append(
            {
                "tag": tag,
                "step": steps[tag],
                "success": sum(r["solved"] for r in rows) / len(rows),
                "success_by_k": {k: sum(v) / len(v) for k, v in sorted(by_k.items())},
            }
        )
    points.sort(key=lambda p: (p["step"], p["tag"] != "baseline"))
    overall = [(p["step"], p["success"]) for p in points]
    aulc_by_k = {
        str(k): area_under_curve(
            [(p["step"], p["success_by_k"][str(k)]) for p in points if str(k) in p["success_by_k"]]
        )
        for k in PRIMARY_KS
    }
    return {
        "points": points,
        "aulc": area_under_curve(overall),
        "aulc_by_k": aulc_by_k,
        "dense_enough": curve_is_dense_enough(overall),
    }


def chain_endpoints(trajectories: list[Any], tasks: Mapping[str, Any]) -> dict[str, Any] | None:
    """:func:`summarize_episodes` of calc_chain episodes; None for other environments."""
    pairs = [(t, tasks.get(t.task_id)) for t in trajectories]
    if not pairs or not all(task is not None and _is_chain(task) for _, task in pairs):
        return None
    return summarize_episodes([analyze_trajectory(t, task.data) for t, task in pairs])


def _seconds(watch: Stopwatch) -> dict[str, float]:
    """What a measurement outside the cell's budget cost (the fixed states' pass)."""
    wall, cpu = watch.read()
    return {"wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2)}


def cold_fixed_states(cold: Mapping[str, Any]) -> dict[str, Any]:
    """The cold-start cell's record of its fixed states, refused when it stored none."""
    record = cold.get("fixed_states")
    if not record:
        raise CheckpointError(
            f"the cold start of seed {cold.get('seed')} stored no fixed states, and "
            "lab.fixed_state_recovery asks every arm to continue from them",
            hint="run the benchmark in a fresh --output directory with eval.fixed_state_recovery=true from the start",
        )
    return dict(record)


def gate_subject(trainer: Any, teacher: PreparedTeacher) -> GateSubject:
    """The gate's inputs from a finished ``OPDTrainer`` and the teacher the lab prepared for it
    (its live model when the lab holds one, else the run's): teacher, student, environment,
    ``eval`` split, config, run directory and event log."""
    return GateSubject(
        teacher=teacher.backend or trainer.teacher,
        student=trainer.student,
        environment=trainer.environment,
        eval_tasks=trainer.splits["eval"],
        config=trainer.config,
        directory=trainer.paths.root,
        events=trainer.events,
        fit_task_ids=(teacher.record or {}).get(
            "fit_task_ids", [t.task_id for t in trainer.splits["train"]]
        ),
    )


def _task_index(trainer: Any) -> dict[str, Any]:
    return {t.task_id: t for split in trainer.splits.values() for t in split}


def make_trainer_cell_runner(
    root: Path,
    plans: Mapping[int, tuple[RunConfig, dict[str, RunConfig]]],
    *,
    quiet: bool,
    compute_matched: str | None = None,
    score_exposure_endpoints: bool = True,
) -> RunCell:
    """``plans[seed] = (cold-start config, {arm: config at arm seed 0})``; see the module docstring."""
    from miniverl.lab.benchmark.cold_start import save_cold_start
    from miniverl.lab.benchmark.warmup import warmup_criterion
    from miniverl.lab.config import lab_of
    from miniverl.training.recipe import OPDTrainer

    def cold_start(cell: Cell) -> dict[str, Any]:
        seed_dir, run_dir = cell_dirs(root, cell)
        cold_dir = RunPaths(seed_dir).cold_start
        for stale in (run_dir, cold_dir):
            shutil.rmtree(stale, ignore_errors=True)
        config = plans[cell.seed][0]
        lab = lab_of(config)
        dagger = lab.toy_fit.dagger.enabled or lab.teacher_fit.dagger.enabled
        if dagger and lab.teacher_fit.enabled:
            from miniverl.lab.teachers.adapter_fit import init_sha256

            init_sha256(lab.teacher_fit)  # the fit runs after the warm-up: fail before it
        watch = Stopwatch()
        prepared = PreparedTeacher() if dagger else prepare_teacher(config, quiet=quiet)
        trainer = OPDTrainer(
            config,
            output_dir=run_dir,
            quiet=quiet,
            teacher=prepared.teacher,
            teacher_record=prepared.record,
            warmup_until=warmup_criterion(config),
        )
        trainer.setup()
        prepared.keep(run_dir, trainer.events)
        trainer.train()
        if dagger:  # the teacher labels the states of the student this run warmed up
            prepared = prepare_teacher(config, student=trainer.student, quiet=quiet)
            prepared.keep(run_dir, trainer.events)
        save_cold_start(
            cold_dir,
            config=config,
            student=trainer.student,
            teacher=prepared,
            parameter_version=trainer.state.parameter_version,
            global_step=trainer.state.global_step,
            evaluations=trainer.state.eval_results,
        )
        wall, cpu = watch.read()
        gate = cold_start_teacher_gate(gate_subject(trainer, prepared))
        if not gate.get("skipped"):
            shutil.copyfile(run_dir / TEACHER_GATE_FILE, cold_dir / TEACHER_GATE_FILE)
        fixed = None
        if lab.fixed_state_recovery:
            fixed_watch = Stopwatch()
            fixed = sample_fixed_states(
                trainer.student,
                trainer.environment,
                evaluation_tasks(trainer.config, trainer.splits),
                trainer.config,
                cold_dir,
            )
            fixed["cost"] = _seconds(fixed_watch)
        marker = read_json(cold_dir / COLD_START_MARKER)
        evaluations = marker.get("evaluations") or {}
        by_tag = _eval_trajectories(run_dir)
        tag = "after_warmup" if "after_warmup" in by_tag else "final"
        return {
            "seed": cell.seed,
            "dir": cold_dir.relative_to(root).as_posix(),
            "run_dir": run_dir.relative_to(root).as_posix(),
            "student_sha256": marker["student_sha256"],
            "toy_teacher_sha256": marker.get("toy_teacher_sha256"),
            "global_optimizer_step": marker.get("global_optimizer_step"),
            "baseline_success": (evaluations.get("baseline") or {}).get("success_rate"),
            "after_warmup_success": (evaluations.get("after_warmup") or {}).get("success_rate"),
            "teacher_gate": gate,
            "start_endpoints": chain_endpoints(by_tag.get(tag, []), _task_index(trainer)),
            "start_endpoints_tag": tag,
            "fixed_states": fixed,
            "wall_seconds": round(wall, 2),
            "cpu_seconds": round(cpu, 2),
        }

    def arm(cell: Cell, done: Mapping[Cell, Mapping[str, Any]]) -> dict[str, Any]:
        from miniverl.inspection.run_dir import read_metrics

        seed_dir, run_dir = cell_dirs(root, cell)
        cold_dir = RunPaths(seed_dir).cold_start
        cold = done[Cell(cell.seed, 0, COLD_START)]
        planned = arm_config_for_arm_seed(plans[cell.seed][1][cell.arm], cell.arm_seed)
        config = with_cold_start_teacher(planned, str(cold_dir))
        cap = expected_cap(
            cell.arm, done.get(Cell(cell.seed, cell.arm_seed, REFERENCE_ARM)), compute_matched
        )
        key = {
            "config_digest": config.digest(),
            "cold_start_student_sha256": cold["student_sha256"],
        }
        prior = None if cap is not None else resume_spend(run_dir, key)
        if prior is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        watch = Stopwatch()
        ledger = PieceLedger(run_dir, key=key, prior=prior or Spend(), watch=watch)
        prepared = prepare_teacher(config, cold_start=cold_dir, quiet=quiet)
        trainer = OPDTrainer(
            config,
            output_dir=run_dir,
            initial_weights=cold_dir,
            resume=prior is not None,
            quiet=quiet,
            teacher=prepared.teacher,
            teacher_record=prepared.record,
            stop_after_cycle=ledger if cap is None else CapMeter(cap),
        )
        trainer.setup()
        if prior is None:
            prepared.keep(run_dir, trainer.events)
        trainer.train()
        spent = ledger.total()
        wall, cpu = spent.wall_seconds, spent.cpu_seconds
        measured = measure_arm(run_dir)
        if (
            measured["cold_start_student_sha256"] != cold["student_sha256"]
            or sha256_file(cold_dir / COLD_START_STUDENT) != cold["student_sha256"]
        ):
            raise CheckpointError(
                f"arm {cell.arm} (seed {cell.seed}, arm seed {cell.arm_seed}) did not start from the shared cold start {cold_dir}",
                hint="the cold-start weights changed while the benchmark ran; start it again in a fresh directory",
            )
        budget = measure_budget(run_dir, wall_seconds=wall, cpu_seconds=cpu, device=trainer.device)
        tasks = _task_index(trainer)
        by_tag = _eval_trajectories(run_dir)
        final = by_tag.get("final", [])
        endpoints = chain_endpoints(final, tasks)
        exposure = None
        if endpoints is not None and score_exposure_endpoints and trainer.teacher is not None:
            oracle = [trainer.runner.oracle_rollout(tasks[t.task_id]) for t in final]
            exposure = score_exposure(trainer.student, trainer.teacher, final, oracle)
        fixed = None
        if lab_of(config).fixed_state_recovery:
            fixed_watch = Stopwatch()
            fixed = policy_recovery(
                trainer.student,
                trainer.environment,
                evaluation_tasks(trainer.config, trainer.splits),
                trainer.config.rollout,
                load_fixed_states(cold_dir, cold_fixed_states(cold)),
            )
            fixed["cost"] = _seconds(fixed_watch)
        return {
            "arm": cell.arm,
            "seed": cell.seed,
            "arm_seed": cell.arm_seed,
            "run_seed": config.run.seed,
            "run_dir": run_dir.relative_to(root).as_posix(),
            "wall_seconds": round(wall, 2),
            "pieces": spent.pieces,
            **measured,
            "arm_config_digest": planned.digest(),
            "budget": budget,
            "compute_cap": cap_outcome(cap, budget),
            "tasks": task_outcomes(final, tasks),
            "curve": learning_curve(by_tag, read_metrics(RunPaths(run_dir).metrics), tasks),
            "endpoints": endpoints,
            "exposure": exposure,
            "fixed_state_recovery": fixed,
        }

    def run_cell(cell: Cell, done: Mapping[Cell, Mapping[str, Any]]) -> dict[str, Any]:
        return cold_start(cell) if cell.is_cold_start else arm(cell, done)

    return run_cell


__all__ = [
    "cell_dirs",
    "chain_endpoints",
    "cold_fixed_states",
    "learning_curve",
    "make_trainer_cell_runner",
    "measure_arm",
    "resume_spend",
    "task_outcomes",
]
