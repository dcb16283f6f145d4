"""``miniverl lr-grid``: every arm at every rate of one shared learning-rate grid, on validation.

The selection rule and its checks live in ``evaluation/lr_grid.py``; this module only parses
the command line, refuses bad input before the run lock creates the output directory, and
prints the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miniverl.cli.common import Overrides, Quiet, console, fail, handles_errors, split_list
from miniverl.utils.lazy import import_torch
from miniverl.utils.runlock import run_lock


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
    from miniverl.config.models import RunConfig
    from miniverl.evaluation.arms import resolve_arms
    from miniverl.evaluation.lr_grid import (
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
    if output is None:
        output = Path("runs") / f"lr-grid-{RunConfig.from_yaml(recipe, overrides or []).run.name}"
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
