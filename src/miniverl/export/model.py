"""``miniverl export-model``: take the trained student out of miniverl.

What is written depends on the run's backend:

- **hf with LoRA** (default): a peft adapter directory, ``adapter_config.json`` +
  ``adapter_model.safetensors``, that ``PeftModel.from_pretrained(base, DIR)`` loads onto the
  base model named in ``adapter_config.json`` (``models.student.model_id``);
- **hf with LoRA and ``merge=True``**: the adapters folded into the base weights
  (``merge_and_unload``), written with ``save_pretrained`` (safetensors) together with the
  tokenizer, so ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it alone;
- **hf without LoRA**: the fully fine-tuned model, as the merged case;
- **toy**: ``model.safetensors`` (every weight; LoRA factors folded in with ``merge=True``)
  and ``config.json`` (the :class:`~miniverl.models.toy.ToyModelConfig` fields and the
  tokenizer fingerprint); :func:`load_exported_toy` rebuilds the decoder from them.

Every export also carries ``miniverl_export.json`` (run, checkpoint, config digest, files
with SHA-256). The directory is assembled under a temporary name and renamed into place,
so a failed export never leaves a directory that looks complete. Only the student is
exported; the export runs on the CPU unless the base model is quantized (bitsandbytes
needs its CUDA device).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file, save_file

from miniverl import __version__
from miniverl.config.loading import load_resolved_config
from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError, ConfigError, RunDirectoryError
from miniverl.models.factory import build_tokenizer
from miniverl.models.runtime import build_runtime
from miniverl.training.checkpoint import load_checkpoint
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import publish_modes, read_json, write_json
from miniverl.utils.logging import utc_now
from miniverl.utils.runs import RunPaths

EXPORT_MARKER = "miniverl_export.json"
TOY_WEIGHTS = "model.safetensors"
TOY_CONFIG = "config.json"
TOY_FORMAT = "miniverl-toy-decoder"


def merged_toy_state(state: dict[str, torch.Tensor], cfg: Any) -> dict[str, torch.Tensor]:
    """Fold every ``lora_A``/``lora_B`` pair into its weight: ``W + (alpha / r) * B @ A``.

    Shapes: ``W [out, in]``, ``A [r, in]``, ``B [out, r]``. The result is the state of the
    same decoder with ``lora_rank=0``; computed in float64, stored in ``W``'s dtype.
    """
    scaling = cfg.lora_alpha / cfg.lora_rank
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith((".lora_A", ".lora_B")):
            continue
        if name.endswith(".weight") and f"{name[: -len('weight')]}lora_A" in state:
            prefix = name[: -len("weight")]
            a = state[f"{prefix}lora_A"].double()
            b = state[f"{prefix}lora_B"].double()
            tensor = (tensor.double() + scaling * (b @ a)).to(tensor.dtype)
        merged[name] = tensor.contiguous()
    return merged


def load_exported_toy(directory: str | Path) -> tuple[Any, dict[str, Any]]:
    """Rebuild a toy decoder from an export (safetensors + JSON only); return (decoder, config JSON)."""
    from miniverl.models.toy import ToyDecoder, ToyModelConfig

    directory = Path(directory)
    meta = read_json(directory / TOY_CONFIG)
    if not isinstance(meta, dict) or meta.get("format") != TOY_FORMAT:
        raise CheckpointError(f"{directory / TOY_CONFIG} is not a {TOY_FORMAT} config")
    cfg = ToyModelConfig(**meta["config"])
    decoder = ToyDecoder(cfg)
    state = load_file(str(directory / TOY_WEIGHTS))
    missing, unexpected = decoder.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if not m.endswith("inv_freq")]:
        raise CheckpointError(
            f"{directory / TOY_WEIGHTS} does not match its config: missing {missing}, unexpected {unexpected}"
        )
    decoder.eval()
    return decoder, meta


def _check_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunDirectoryError(
            f"{out} already exists and is not empty",
            hint="choose a new --out directory (an export never overwrites files)",
        )


def _export_toy(student: Any, staging: Path, *, merge: bool) -> str:
    cfg = student.config
    state = student.full_state_dict()
    if merge and cfg.lora_enabled:
        state = merged_toy_state(state, cfg)
        cfg = cfg.with_lora(0)
    save_file(state, str(staging / TOY_WEIGHTS))
    write_json(
        staging / TOY_CONFIG,
        {
            "format": TOY_FORMAT,
            "config": dataclasses.asdict(cfg),
            "tokenizer": "miniverl toy tokenizer",
            "tokenizer_fingerprint": student.tokenizer.fingerprint,
        },
    )
    return "toy_merged" if merge and student.config.lora_enabled else "toy"


def _export_hf(student: Any, staging: Path, *, merge: bool, quantization: str) -> str:
    model = student.model
    if student.lora is None:
        model.save_pretrained(staging, safe_serialization=True)
        student.tokenizer.hf_tokenizer.save_pretrained(staging)
        return "hf_full"
    if merge:
        if quantization != "none":
            raise ConfigError(
                f"--merge cannot fold adapters into a {quantization}-quantized base",
                hint="export the adapter (without --merge) and merge it onto an unquantized copy of the base",
            )
        merged = model.merge_and_unload()
        merged.save_pretrained(staging, safe_serialization=True)
        student.tokenizer.hf_tokenizer.save_pretrained(staging)
        return "hf_merged"
    from peft import get_peft_model_state_dict

    name = student.adapter_name
    config = dataclasses.replace(model.peft_config[name], inference_mode=True)
    config.save_pretrained(str(staging))
    state = get_peft_model_state_dict(model, adapter_name=name)
    save_file(
        {k: v.detach().to("cpu").contiguous() for k, v in state.items()},
        str(staging / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    return "peft_adapter"


def export_model(
    run_dir: str | Path, out: str | Path, *, merge: bool = False, checkpoint: str = "final"
) -> dict[str, Any]:
    """Export the student of ``run_dir`` at ``checkpoint`` into the new directory ``out``."""
    paths = RunPaths(run_dir)
    out = Path(out)
    _check_target(out)
    config = load_resolved_config(run_dir)
    validated = RunConfig.from_mapping(
        yaml.safe_load(paths.config_validated.read_text(encoding="utf-8")),
        source=str(paths.config_validated),
    )
    loaded = load_checkpoint(paths.checkpoint(checkpoint))
    if loaded.state["config_digest"] != validated.digest():
        raise CheckpointError(
            f"checkpoint {checkpoint} does not belong to {paths.config_validated} (config digest differs)",
            hint="the run directory was edited; re-run training",
        )
    spec = config.models.student
    device = "cpu" if spec.quantization == "none" else config.models.device
    tokenizer = build_tokenizer(config)
    student = build_runtime(config, tokenizer, device, with_teacher=False).student
    student.load_trainable_state_dict(
        {k: v.to(student.device) for k, v in loaded.trainable.items()}
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if config.models.backend == "toy":
            kind = _export_toy(student, staging, merge=merge)
        else:
            kind = _export_hf(student, staging, merge=merge, quantization=spec.quantization)
        files = {
            p.relative_to(staging).as_posix(): sha256_file(p)
            for p in sorted(staging.rglob("*"))
            if p.is_file()
        }
        marker = {
            "kind": kind,
            "miniverl_version": __version__,
            "created_at": utc_now(),
            "run_id": paths.root.name,
            "checkpoint": checkpoint,
            "global_step": loaded.state.get("global_step"),
            "config_digest": validated.digest(),
            "backend": config.models.backend,
            "base_model": spec.model_id,
            "files": files,
        }
        write_json(staging / EXPORT_MARKER, marker)
        publish_modes(staging)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        student.release()
    return {**marker, "path": str(out)}


__all__ = ["export_model", "load_exported_toy", "merged_toy_state"]
