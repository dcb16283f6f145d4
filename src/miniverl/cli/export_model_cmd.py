"""``miniverl export-model <run> --out DIR [--merge]``: the student as peft / transformers / safetensors files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miniverl.cli.common import console, handles_errors
from miniverl.utils.lazy import import_torch

_NEXT_STEP = {
    "peft_adapter": "load: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out)",
    "hf_merged": "load: AutoModelForCausalLM.from_pretrained(out)",
    "hf_full": "load: AutoModelForCausalLM.from_pretrained(out)",
    "toy": "load: miniverl.export.model.load_exported_toy(out)",
    "toy_merged": "load: miniverl.export.model.load_exported_toy(out)",
}


@handles_errors
def export_model_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by 'miniverl train'.")],
    out: Annotated[Path, typer.Option("--out", help="New directory to write the model into.")],
    merge: Annotated[
        bool,
        typer.Option(
            "--merge", help="Fold LoRA adapters into the base weights (a standalone model)."
        ),
    ] = False,
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="Checkpoint name under checkpoints/.")
    ] = "final",
) -> None:
    """Export the trained student: a peft adapter, a merged transformers model, or toy safetensors."""
    import_torch("miniverl export-model")
    from miniverl.export.model import export_model

    result = export_model(run_dir, out, merge=merge, checkpoint=checkpoint)
    console.print(
        f"exported {result['kind']} ({result['checkpoint']}, step {result['global_step']}) -> {out}"
    )
    console.print(f"base model: {result['base_model']}; {_NEXT_STEP[result['kind']]}", markup=False)
