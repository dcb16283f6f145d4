"""``miniverl export-verl``: write a verl 0.9.1 experiment (parquet, tools, overrides, ledger).

Torch-free: it validates the recipe, draws the same splits miniverl trains on, and writes
files. Refusals (a toy backend, an objective verl cannot express) exit 1 with every
offending key listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miniverl.cli.common import console, handles_errors
from miniverl.config.modes import mode_of_kind


@handles_errors
def export_verl(
    recipe: Annotated[
        Path,
        typer.Argument(
            help=f"Recipe YAML (models.backend: hf, run.mode: {mode_of_kind('student').name})."
        ),
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Dotted recipe overrides, e.g. models.student.quantization=none."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write.")] = Path(
        "verl-export"
    ),
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing non-empty --out directory.")
    ] = False,
    max_prompt_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-prompt-tokens",
            help="Prompt token budget (default: a safe character bound of the longest prompt + tool schemas).",
        ),
    ] = None,
) -> None:
    """Export a validated OPD recipe to verl: data/*.parquet, tools.yaml, run_verl.sh, MAPPING.md."""
    from miniverl.config.models import RunConfig
    from miniverl.lab.verl.export import export_verl as do_export
    from miniverl.lab.verl.ledger import VERL_VERSION

    cfg = RunConfig.from_yaml(recipe, overrides or [])
    plan = do_export(cfg, out, recipe=recipe.name, force=force, max_prompt_tokens=max_prompt_tokens)
    console.print(
        f"exported {recipe} -> {out} for verl=={VERL_VERSION}: "
        f"{len(plan.splits['train'])} train / "
        f"{len(plan.splits[cfg.eval.split])} val tasks, {len(plan.overrides)} overrides"
    )
    dropped = plan.dropped()
    if dropped:
        console.print(f"dropped ({len(dropped)} keys with no verl equivalent; see MAPPING.md):")
        for fate in dropped:
            console.print(
                f"  - {fate.key} = {fate.value!r}: {fate.note}", soft_wrap=True, markup=False
            )
    console.print(f"run it with: bash {out}/run_verl.sh", markup=False)
