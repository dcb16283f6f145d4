"""The lab's commands: ``benchmark``, ``lr-grid`` and ``teacher-audit`` (the "Lab" panel of
``miniverl --help``).

Each parses its command line, refuses bad input before the run lock creates the output
directory, hands the work to the lab (``miniverl.lab``: the harness, the learning-rate grid's
selection rule, the teacher audit) and prints the result. The lab is imported inside the
commands, so ``miniverl --help`` and the torch-free commands never load it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from miniverl.cli.common import Overrides, Quiet, console, fail, handles_errors, split_list
from miniverl.config.modes import arm_role, default_arms
from miniverl.utils.lazy import import_torch
from miniverl.utils.runlock import run_lock

ARMS_HELP = (
    f"Comma-separated arms (default: {','.join(default_arms())}; opd_privileged, "
    "sft_corrective and opd_self run only when named; sft_only is a deprecated alias of "
    f"{arm_role('reference_ceiling')})."
)
COMPUTE_MATCHED_HELP = (
    f"Give every arm {arm_role('compute_reference')}'s spend of this resource (wall_seconds, "
    "cpu_seconds, teacher_scored_tokens, student_generated_tokens)."
)


@handles_errors
def lr_grid_command(
    recipe: Annotated[Path, typer.Argument(help="Base YAML recipe shared by every arm.")],
    overrides: Overrides = None,
    grid: Annotated[
        str,
        typer.Option(
            "--grid",
            help="Comma-separated learning rates every arm runs at, e.g. 0.0003,0.001,0.003.",
        ),
    ] = "",
    arms: Annotated[
        str | None,
        typer.Option("--arms", help="Comma-separated arms (default: every benchmark arm)."),
    ] = None,
    seeds: Annotated[
        str,
        typer.Option("--seeds", help="Comma-separated seeds; one shared SFT cold start per seed."),
    ] = "1",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Grid directory (default runs/lr-grid-<run.name>)."),
    ] = None,
    arm_seeds: Annotated[
        int, typer.Option("--arm-seeds", help="Arm phases per cold start (seed).")
    ] = 1,
    quiet: Quiet = False,
) -> None:
    """Run every arm at every rate of ONE shared learning-rate grid on the validation split and select each arm's rate; rerun to resume."""
    import_torch("miniverl lr-grid")
    from miniverl.lab.benchmark.arms import resolve_arms
    from miniverl.lab.benchmark.lr_grid import (
        GRID_FILE,
        grid_arm_definitions,
        parse_grid,
        run_lr_grid,
        validation_overrides,
    )

    try:
        rates = [float(v) for v in split_list(grid, "--grid")]
        seed_list = [int(s) for s in split_list(seeds, "--seeds")]
    except ValueError:
        raise fail(
            f"--grid must be comma-separated numbers and --seeds integers, got {grid!r} and {seeds!r}",
            code=2,
        ) from None
    arm_list = split_list(arms, "--arms") if arms is not None else None
    grid_arm_definitions(resolve_arms(arm_list), parse_grid(rates))  # refuse before the lock
    validation_overrides(overrides or [])
    from miniverl.lab.config import load_recipe

    if output is None:
        output = Path("runs") / f"lr-grid-{load_recipe(recipe, overrides or []).run.name}"
    with run_lock(output):
        record = run_lr_grid(
            recipe,
            arms=arm_list,
            grid=rates,
            seeds=seed_list,
            output_dir=output,
            overrides=overrides or [],
            arm_seeds=arm_seeds,
            quiet=quiet,
        )
    from rich.table import Table

    table = Table(
        title=f"validation final success (mean over {len(record['seeds'])} seed(s) x {arm_seeds} arm seed(s))"
    )
    table.add_column("arm")
    for lr in record["grid"]:
        table.add_column(f"lr={lr:g}", justify="right")
    table.add_column("selected", justify="right")
    for arm, entries in record["table"].items():
        table.add_row(arm, *(f"{e['mean']:.3f}" for e in entries), f"{record['selected'][arm]:g}")
    console.print(table)
    console.print(f"rule: {record['rule']}")
    console.print(
        f"grid: {output / GRID_FILE}  next: miniverl benchmark RECIPE ... --lr-from {output}"
    )


@handles_errors
def benchmark_command(
    recipe: Annotated[Path, typer.Argument(help="Base YAML recipe shared by every arm.")],
    overrides: Overrides = None,
    arms: Annotated[
        str | None,
        typer.Option(
            "--arms",
            help=ARMS_HELP,
        ),
    ] = None,
    seeds: Annotated[
        str,
        typer.Option("--seeds", help="Comma-separated seeds; one shared SFT cold start per seed."),
    ] = "1",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Benchmark directory (default runs/benchmark-<run.name>)."
        ),
    ] = None,
    arm_seeds: Annotated[
        int,
        typer.Option(
            "--arm-seeds",
            help="Arm phases per cold start (seed); averaged per task inside the seed.",
        ),
    ] = 1,
    compute_matched: Annotated[
        str | None,
        typer.Option(
            "--compute-matched",
            help=COMPUTE_MATCHED_HELP,
        ),
    ] = None,
    lr_from: Annotated[
        Path | None,
        typer.Option(
            "--lr-from",
            help="lr_grid.json (or its directory) from `miniverl lr-grid`: run each arm at the learning rate selected for it on the validation split.",
        ),
    ] = None,
    protocol: Annotated[
        Path | None,
        typer.Option(
            "--protocol",
            help="Pre-registered protocol (YAML/JSON: endpoints, primary_contrasts, seeds, arms, thresholds, lr_grid); frozen by SHA-256 into the output directory before any cell runs. Required to run cells on eval.split=test.",
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Compare objectives from one shared SFT cold start per seed, holding splits, steps and evaluation fixed; rerun to resume."""
    import_torch("miniverl benchmark")
    from miniverl.lab.benchmark.arms import resolve_arms
    from miniverl.lab.benchmark.harness import print_benchmark, run_benchmark
    from miniverl.lab.config import load_recipe
    from miniverl.utils.runs import RunPaths

    try:
        seed_list = [int(s) for s in split_list(seeds, "--seeds")]
    except ValueError:
        raise fail(f"--seeds must be comma-separated integers, got {seeds!r}", code=2) from None
    arm_list = split_list(arms, "--arms") if arms is not None else None
    if output is None:
        output = Path("runs") / f"benchmark-{load_recipe(recipe, overrides or []).run.name}"
    resolve_arms(arm_list)  # refuse a bad arm before the lock creates the directory
    arm_definitions = learning_rates = None
    if lr_from is not None:
        from miniverl.lab.benchmark.lr_grid import benchmark_arms_from_grid

        base = load_recipe(recipe, overrides or [])
        arm_definitions, learning_rates = benchmark_arms_from_grid(arm_list, lr_from, base)
        arm_list = list(arm_definitions)
    from miniverl.lab.benchmark.budgets import MATCHABLE

    if compute_matched is not None and compute_matched not in MATCHABLE:
        raise fail(
            f"--compute-matched must be one of {', '.join(MATCHABLE)}, got {compute_matched!r}",
            code=2,
        )
    with run_lock(output):
        result = run_benchmark(
            recipe,
            arms=arm_list,
            seeds=seed_list,
            output_dir=output,
            overrides=overrides or [],
            quiet=quiet,
            arm_seeds=arm_seeds,
            compute_matched=compute_matched,
            arm_definitions=arm_definitions,
            learning_rates=learning_rates,
            protocol=protocol,
        )
    print_benchmark(result, console)
    paths = RunPaths(output)
    console.print(f"benchmark: {paths.benchmark_json}  report: {paths.report_html}")


@handles_errors
def teacher_audit_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by 'miniverl train'.")],
    cycles: Annotated[
        str | None,
        typer.Option("--cycles", help="Only the rollouts of these cycles: 7 or 150-199."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Only the last N student rollouts.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the audit as JSON.")] = False,
) -> None:
    """Re-score a run's stored student rollouts with its teacher (oracle, toy or HF) and print
    what it targets on the oracle's path, after a flagged tool error and inside deviated blocks."""
    import_torch("miniverl teacher-audit")
    from miniverl.lab.teachers.audit import audit_run, render_audit

    audit = audit_run(run_dir, cycles=cycles, limit=limit)
    if as_json:
        typer.echo(json.dumps(audit.to_dict(), indent=2))
        return
    for line in render_audit(audit):
        console.print(line, markup=False, highlight=False)


__all__ = ["benchmark_command", "lr_grid_command", "teacher_audit_command"]
