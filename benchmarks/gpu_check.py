"""One prepared GPU check of the target configuration, written as one JSON file.

The target configuration is a Qwen3-0.6B student and a Qwen3-1.7B teacher on one GPU. No model
hub is reachable from a lent GPU machine and real weights are too large to travel there, so
this script builds both models at their real shapes (vocabulary 151,936) with random weights
from ``transformers`` configs, plus a small byte-level BPE tokenizer trained locally (as
``miniverl.models.tiny_hf`` does; 512 tokens, fewer than the 151,936 embedding rows, as with
the real Qwen3 tokenizer), and measures through miniverl's own code:

  build        the two checkpoints (``save_pretrained`` into a temporary directory);
  opd_resident one OPD cycle (rollouts, teacher scoring, one update, then the one-task final
               evaluation and checkpoint every run ends with) of
               ``recipes/qwen_consumer_gpu_calc_raw_teacher.yaml`` through ``OPDTrainer``,
               bf16 student (LoRA) + bf16 teacher, ``memory.strategy: resident``; peak CUDA
               allocated / reserved over the whole run against the 4.251 / 4.762 GiB the
               design quotes for the NF4 student on an RTX 4080;
  opd_swap     the same with ``memory.strategy: swap``;
  opd_nf4      the same with the recipe's NF4 student (resident; swap cannot move bitsandbytes
               weights), when ``bitsandbytes`` imports;
  decode       the student's batched greedy decode (``HFBackend.generate_batch``) against
               ``model.generate()`` on the same left-padded batches at batch 1, 16 and 64,
               in bf16 and float32, with the ids compared row by row; and a 14-token prefill
               against one cached single-token step (the design quotes 37.0 vs 30.9 ms on an
               RTX 4080) for student and teacher;
  loss_memory  ``benchmarks/loss_memory.py::run_arm`` at V = 151,936 on the device: full
               logits vs the chunked loss, peak allocated and time;
  gpu_tests    ``python -m pytest -m gpu -q`` (the CUDA-marked tests), its summary line.

Random weights make rollouts end at the first turn's token budget (no tool call parses), so
sequence lengths match the recipe's per-turn budget, not a trained model's transcripts: the
memory figures are those of the shapes and the code path, not of a trained run.

Each section runs in its own interpreter with its own time budget (``BUDGET_S``; the total
stays under ``--budget-s``, 480 s by default), so CUDA peaks never mix, a stuck section cannot
eat the others' time, and what a section had finished survives its timeout. The JSON is
rewritten (atomically) after every section.

Without CUDA the script prints ``no CUDA device`` and exits 0, writing nothing. ``--tiny``
runs every section at tiny shapes (hidden 64, 2 layers, vocabulary 640) on whatever device
there is, and the JSON says ``"tiny": true``: that is the test suite's smoke run, not a figure.

    PYTHONPATH=src python benchmarks/gpu_check.py                      # -> results/gpu/DATE-GPU.json
    PYTHONPATH=src python benchmarks/gpu_check.py --tiny --output /tmp/gpu.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "qwen_consumer_gpu_calc_raw_teacher.yaml"
SCHEMA = "miniverl.gpu_check/1"
NO_CUDA = "no CUDA device"
GIB = float(1 << 30)

SEED_REFERENCE = {
    "device": "RTX 4080 (16 GB)",
    "config": "Qwen3-0.6B NF4 QLoRA student + Qwen3-1.7B bf16 teacher, one OPD cycle",
    "peak_allocated_gib": 4.251,
    "peak_reserved_gib": 4.762,
    "prefill_14_tokens_ms": 37.0,
    "cached_step_ms": 30.9,
}
"""What docs/design.md quotes for the target configuration (never measured in this project)."""

SECTIONS = (
    "build",
    "opd_resident",
    "opd_swap",
    "opd_nf4",
    "decode",
    "loss_memory",
    "gpu_tests",
)
BUDGET_S = {
    "build": 80,
    "opd_resident": 60,
    "opd_swap": 60,
    "opd_nf4": 75,
    "decode": 95,
    "loss_memory": 40,
    "gpu_tests": 70,
}
"""Seconds each section may run (its interpreter's start included); they sum to 480."""
MIN_START_S = 10
"""A section is not started with less than this left of the whole budget."""

QWEN3_SHAPES = {
    "student": {
        "name": "Qwen3-0.6B",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151_936,
        "max_position_embeddings": 40_960,
    },
    "teacher": {
        "name": "Qwen3-1.7B",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151_936,
        "max_position_embeddings": 40_960,
    },
}
TINY_SHAPES = {
    "student": {
        "name": "tiny-qwen3-student",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 640,
        "max_position_embeddings": 2048,
    },
    "teacher": {
        "name": "tiny-qwen3-teacher",
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "vocab_size": 640,
        "max_position_embeddings": 2048,
    },
}
ROPE_THETA = 1_000_000.0

SETTINGS = {
    "full": {
        "opd_overrides": [],
        "decode": {"batches": [1, 16, 64], "new_tokens": 64, "reps": 2, "prefill_reps": 20},
        "loss": {
            "vocab": 151_936,
            "hidden": 1024,
            "positions": [1024, 2048],
            "chunks": [256, 1024],
        },
    },
    "tiny": {
        "opd_overrides": ["rollout.max_new_tokens_per_turn=16", "rollout.max_total_tokens=256"],
        "decode": {"batches": [1, 16, 64], "new_tokens": 16, "reps": 1, "prefill_reps": 3},
        "loss": {"vocab": 640, "hidden": 32, "positions": [64, 128], "chunks": [16, 64]},
    },
}
PREFILL_TOKENS = 14
DECODE_PRECISIONS = ("bfloat16", "float32")

BNB_WHEEL_NOTE = (
    "the bitsandbytes 0.50.2 py3-none-manylinux_2_24_x86_64 wheel (works with Python 3.12) is "
    "43.1 MB (41.1 MiB), under the 64 MiB that travels with the working tree: carry it and "
    "`pip install --no-deps` it before running this script"
)

# ---------------------------------------------------------------------------- helpers


def _gib(num_bytes: float) -> float:
    return round(num_bytes / GIB, 4)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    from miniverl.utils.io import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, payload)


REQUIRED = ("transformers", "peft", "tokenizers", "safetensors", "pydantic", "yaml")
"""Besides torch: what the hf backend and the trainer import (``yaml`` is PyYAML)."""


def _missing_dependencies() -> list[str]:
    """torch and ``REQUIRED``, as far as this interpreter can import them."""
    missing = []
    try:
        import torch  # noqa: F401
    except Exception:
        missing.append("torch")
    return missing + [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


class CudaPeak:
    """Peak CUDA allocated / reserved bytes over a whole ``with`` block.

    The trainer resets the peak counters before every optimizer step (to report each step's
    own peak in ``metrics.jsonl``); inside this block each reset first folds the current
    peak into a running maximum, so the block's peak survives them. Behaviour is otherwise
    unchanged: the reset still happens.
    """

    def __init__(self, torch: Any, device: str) -> None:
        self.torch, self.device = torch, device
        self.allocated = self.reserved = 0

    def _fold(self) -> None:
        cuda = self.torch.cuda
        self.allocated = max(self.allocated, cuda.max_memory_allocated(self.device))
        self.reserved = max(self.reserved, cuda.max_memory_reserved(self.device))

    def __enter__(self) -> CudaPeak:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        cuda.empty_cache()
        self._reset = cuda.reset_peak_memory_stats
        self._reset(self.device)

        def folding_reset(device: Any = None) -> None:
            self._fold()
            self._reset(device)

        cuda.reset_peak_memory_stats = folding_reset
        return self

    def __exit__(self, *exc: object) -> None:
        self.torch.cuda.synchronize(self.device)
        self._fold()
        self.torch.cuda.reset_peak_memory_stats = self._reset


# --------------------------------------------------------------------------- sections
# Each runs in a child interpreter: ctx is the parent's state, emit(partial) saves what is
# done so far (kept if the section runs out of time); the return value is the section.


def section_build(ctx: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    """Random-weight Qwen3-shaped student and teacher (bf16 safetensors) sharing one tokenizer.

    The weights are initialised on the run's device: ``transformers``' initialisation of
    2.3 billion parameters takes about a minute on a few CPU cores, well under a second on a GPU.
    """
    import torch
    import transformers

    from miniverl.models.tiny_hf import build_tiny_hf_checkpoint

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    work = Path(ctx["workdir"])
    source = build_tiny_hf_checkpoint(work / "tokenizer-source", hidden_size=16, num_layers=1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    built: dict[str, Any] = {"tokenizer_tokens": len(tokenizer)}
    for role, shape in ctx["shapes"].items():
        start = time.perf_counter()
        fields = {k: v for k, v in shape.items() if k != "name"}
        config = transformers.Qwen3Config(
            **fields,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
            tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
        )
        torch.manual_seed(0 if role == "student" else 1)
        with torch.device(ctx["device"]):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.generation_config = transformers.GenerationConfig(
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
            do_sample=False,
        )
        path = work / role
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        built[role] = {
            **shape,
            "parameters": sum(p.numel() for p in model.parameters()),
            "safetensors_bytes": sum(f.stat().st_size for f in path.glob("*.safetensors")),
            "seconds": round(time.perf_counter() - start, 2),
        }
        del model
        if ctx["device"].startswith("cuda"):
            torch.cuda.empty_cache()
        emit(built)
    return built


def _opd(ctx: dict[str, Any], strategy: str, quantization: str) -> dict[str, Any]:
    """One OPD cycle of the consumer-GPU recipe on the built models; whole-run CUDA peak."""
    import torch

    from miniverl.config.models import RunConfig
    from miniverl.training.recipe import OPDTrainer

    device = ctx["device"]
    overrides = [
        f"models.device={device}",
        f"models.student.model_id={ctx['models']['student']}",
        f"models.teacher.model_id={ctx['models']['teacher']}",
        "models.student.precision=bfloat16",
        "models.teacher.precision=bfloat16",
        f"models.student.quantization={quantization}",
        f"memory.strategy={strategy}",
        "train.cycles=1",
        "train.sft_warmup_cycles=0",
        "eval.baseline=false",
        "eval.after_warmup=false",
        "eval.max_tasks=1",
        *ctx["settings"]["opd_overrides"],
    ]
    config = RunConfig.from_yaml(RECIPE).with_overrides(overrides)
    run_dir = Path(ctx["workdir"]) / f"run-{strategy}-{quantization}"
    trainer = OPDTrainer(config, output_dir=run_dir, quiet=True, progress=False)
    start = time.perf_counter()
    if device.startswith("cuda"):
        with CudaPeak(torch, device) as peak:
            summary = trainer.train()
        memory: dict[str, Any] = {
            "status": "measured",
            "peak_allocated_gib": _gib(peak.allocated),
            "peak_reserved_gib": _gib(peak.reserved),
            "allocated_vs_seed": round(
                peak.allocated / GIB / SEED_REFERENCE["peak_allocated_gib"], 3
            ),
            "reserved_vs_seed": round(peak.reserved / GIB / SEED_REFERENCE["peak_reserved_gib"], 3),
        }
    else:
        summary = trainer.train()
        memory = {"status": "not_run_no_cuda"}
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    cycle = next(r for r in records if r.get("kind") == "cycle")
    steps = [r for r in records if r.get("kind") == "step" and r.get("phase") == "opd"]
    run_start = next(
        json.loads(line)
        for line in (run_dir / "events.jsonl").read_text().splitlines()
        if json.loads(line).get("event") == "run_start"
    )
    return {
        "overrides": overrides,
        "memory_plan": run_start.get("memory_plan"),
        "whole_run_memory": memory,
        "step_memory": [s.get("gpu") for s in steps],
        "train_seconds": round(seconds, 2),
        "cycle_seconds": cycle.get("seconds"),
        "rollout_generated_tokens": cycle["rollouts"]["generated_tokens"],
        "rollouts": cycle["rollouts"]["tasks"],
        "optimizer_steps": summary["global_optimizer_step"],
        "selected_positions": sum(s.get("selected_positions", 0) for s in steps),
    }


def section_opd_resident(ctx: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    return _opd(ctx, "resident", "none")


def section_opd_swap(ctx: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    return _opd(ctx, "swap", "none")


def section_opd_nf4(ctx: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    return _opd(ctx, "resident", "nf4")


def _until_eos(rows: list[list[int]], eos: int, limit: int) -> list[list[int]]:
    """Each row cut after its first ``eos`` (kept) and at ``limit`` tokens."""
    return [row[: row.index(eos) + 1] if eos in row else row[:limit] for row in rows]


def _batched_decode(ctx: dict[str, Any], emit: Callable[[dict], None], out: dict) -> None:
    """Ours vs ``model.generate()`` at each batch size and precision; ids compared per row."""
    from miniverl.environments.base import make_splits
    from miniverl.environments.registry import make_environment
    from miniverl.models.hf import HFBackend

    count = max(ctx["settings"]["decode"]["batches"])
    env = make_environment("calculator")
    tasks = make_splits(env, {"train": count, "eval": 0, "test": 0}, seed=7)["train"]
    texts = [f"<|im_start|>user\n{t.prompt}<|im_end|>\n<|im_start|>assistant\n" for t in tasks]
    out["rows"] = []
    for precision in DECODE_PRECISIONS:
        backend = HFBackend(ctx["models"]["student"], device=ctx["device"], precision=precision)
        for size in ctx["settings"]["decode"]["batches"]:
            out["rows"].append(_decode_row(backend, texts[:size], ctx))
            out["rows"][-1]["precision"] = precision
            emit(out)
        backend.release()
    float32 = [r for r in out["rows"] if r["precision"] == "float32"]
    out["greedy_ids_equal_float32"] = bool(float32) and all(r["ids_equal"] for r in float32)
    out["greedy_ids_equal_bfloat16"] = all(
        r["ids_equal"] for r in out["rows"] if r["precision"] == "bfloat16"
    )


def _decode_row(backend: Any, texts: list[str], ctx: dict[str, Any]) -> dict[str, Any]:
    """One batch: our greedy ids and tokens/s against ``model.generate()``'s, same batch."""
    import torch

    from generation import timed

    settings, device = ctx["settings"]["decode"], ctx["device"]
    new_tokens, reps = settings["new_tokens"], settings["reps"]
    tok, model = backend.tokenizer, backend.model
    pad, eos = tok.pad_token_id, tok.eos_token_id
    batch = [tok.encode(text) for text in texts]
    width = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)

    def ours() -> list[list[int]]:
        results = backend.generate_batch(
            batch, max_new_tokens=[new_tokens] * len(batch), seeds=[0] * len(batch), temperature=0.0
        )
        return _until_eos([r.token_ids for r in results], eos, new_tokens)

    def reference() -> list[list[int]]:
        with torch.no_grad():
            generated = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new_tokens,
                pad_token_id=pad,
                eos_token_id=eos,
            )
        return _until_eos(generated[:, ids.shape[1] :].tolist(), eos, new_tokens)

    arms = {"ours": ours, "generate": reference}
    first = {name: fn() for name, fn in arms.items()}  # the warm-up; its ids are compared
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(reps):
        for name, fn in arms.items():
            elapsed, again = timed(fn)
            seconds[name].append(elapsed)
            if again != first[name]:
                raise AssertionError(f"{name} greedy decode is not deterministic")
    tokens = {name: sum(len(r) for r in first[name]) for name in arms}
    rate = {name: tokens[name] / statistics.median(seconds[name]) for name in arms}
    pairs = list(zip(first["ours"], first["generate"], strict=True))
    prefix = min(
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        for a, b in pairs
    )
    return {
        "batch": len(batch),
        "new_tokens": new_tokens,
        "timed_reps": reps,
        "ours_tokens": tokens["ours"],
        "ours_tokens_per_s": round(rate["ours"], 1),
        "generate_tokens_per_s": round(rate["generate"], 1),
        "ours_over_generate": round(rate["ours"] / rate["generate"], 3),
        "ids_equal": first["ours"] == first["generate"],
        "rows_equal": sum(a == b for a, b in pairs),
        "shortest_matching_prefix": prefix,
    }


def _prefill_vs_step(ctx: dict[str, Any], emit: Callable[[dict], None], out: dict) -> None:
    """Median ms of a 14-token prefill and of one cached single-token step, bf16, batch 1."""
    import torch

    from generation import PROMPT
    from miniverl.models.hf import HFBackend

    device, reps = ctx["device"], ctx["settings"]["decode"]["prefill_reps"]

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    out["prefill_vs_step"] = {}
    for role in ("student", "teacher"):
        backend = HFBackend(ctx["models"][role], device=device, precision="bfloat16")
        model = backend.model
        ids = torch.tensor([backend.tokenizer.encode(PROMPT)[:PREFILL_TOKENS]], device=device)
        prefill_s, step_s = [], []
        with torch.no_grad():
            for rep in range(reps + 1):
                sync()
                start = time.perf_counter()
                first = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                sync()
                mid = time.perf_counter()
                nxt = first.logits[:, -1].argmax(-1, keepdim=True)
                model(input_ids=nxt, past_key_values=first.past_key_values, use_cache=True,
                      logits_to_keep=1)  # fmt: skip
                sync()
                if rep:  # the first pass is the warm-up
                    prefill_s.append(mid - start)
                    step_s.append(time.perf_counter() - mid)
        prefill_ms = 1000 * statistics.median(prefill_s)
        step_ms = 1000 * statistics.median(step_s)
        out["prefill_vs_step"][role] = {
            "precision": "bfloat16",
            "prefill_tokens": int(ids.shape[1]),
            "reps": reps,
            "prefill_ms": round(prefill_ms, 3),
            "cached_step_ms": round(step_ms, 3),
            "prefill_over_step": round(prefill_ms / step_ms, 3),
        }
        emit(out)
        del model, first
        backend.release()


def section_decode(ctx: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"batched_decode_model": "student", "lora": False}
    _batched_decode(ctx, emit, out)
    _prefill_vs_step(ctx, emit, out)
    return out


def section_loss_memory(ctx: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    """Full logits vs the chunked loss, one forward+backward, through ``run_arm``."""
    from loss_memory import run_arm

    settings, device = ctx["settings"]["loss"], ctx["device"]
    on_cuda = device.startswith("cuda")
    out: dict[str, Any] = {
        "vocab": settings["vocab"],
        "hidden": settings["hidden"],
        "dtype": "float32",
        "divergence": "reverse_kl",
        "memory_metric": (
            "torch.cuda.max_memory_allocated above setup, reset per arm"
            if on_cuda
            else "ru_maxrss of one process across arms (only grows): not an arm's figure"
        ),
        "arms": [],
    }
    arms = ["full"] + [f"chunk{c}" for c in settings["chunks"]]
    for positions in settings["positions"]:
        for arm in arms:
            result = run_arm(
                arm,
                settings["vocab"],
                settings["hidden"],
                positions,
                "reverse_kl",
                1.0,
                2 if on_cuda else 1,
                0 if on_cuda else 1,
                device=device,
            )
            row = {
                "arm": arm,
                "positions": positions,
                "best_wall_s": round(min(result["wall"]), 5),
                "loss": result["loss"],
                "grad_norm": result["grad_norm"],
            }
            if on_cuda:
                above = result["cuda_peak_allocated"] - result["cuda_setup_allocated"]
                row |= {
                    "peak_allocated_gib": _gib(result["cuda_peak_allocated"]),
                    "peak_above_setup_gib": _gib(above),
                    "peak_reserved_gib": _gib(result["cuda_peak_reserved"]),
                }
            out["arms"].append(row)
            emit(out)
    for positions in settings["positions"]:
        by_arm = {r["arm"]: r for r in out["arms"] if r["positions"] == positions}
        full = by_arm["full"]
        for arm in arms[1:]:
            chunked = by_arm[arm]
            ratio: dict[str, Any] = {
                "positions": positions,
                "arm": arm,
                "time_chunked_over_full": round(chunked["best_wall_s"] / full["best_wall_s"], 3),
                "loss_relative_gap": abs(full["loss"] - chunked["loss"]) / abs(full["loss"]),
            }
            if on_cuda:
                ratio["memory_full_over_chunked"] = round(
                    full["peak_above_setup_gib"] / max(chunked["peak_above_setup_gib"], 1e-9), 3
                )
            out.setdefault("ratios", []).append(ratio)
    return out


SECTION_FUNCTIONS: dict[str, Callable[[dict[str, Any], Callable[[dict], None]], dict]] = {
    "build": section_build,
    "opd_resident": section_opd_resident,
    "opd_swap": section_opd_swap,
    "opd_nf4": section_opd_nf4,
    "decode": section_decode,
    "loss_memory": section_loss_memory,
}


def run_child(name: str, state_path: Path) -> int:
    """Run one section in this interpreter; its result goes to ``<workdir>/<name>.json``."""
    ctx = json.loads(state_path.read_text())
    result_path = Path(ctx["workdir"]) / f"{name}.json"
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ modules by name
    import torch

    if not ctx["device"].startswith("cuda"):
        torch.set_num_threads(1)

    def emit(partial: dict) -> None:
        _write_json(result_path, {"status": "partial", **partial})

    start = time.perf_counter()
    try:
        result = SECTION_FUNCTIONS[name](ctx, emit)
    except Exception as exc:
        _write_json(
            result_path,
            {
                "status": "failed",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback_tail": traceback.format_exc().splitlines()[-12:],
                "seconds": round(time.perf_counter() - start, 2),
            },
        )
        return 1
    _write_json(
        result_path, {"status": "ran", **result, "seconds": round(time.perf_counter() - start, 2)}
    )
    return 0


# ----------------------------------------------------------------------------- parent


def _child_env() -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _tail(path: Path, lines: int = 12) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []


def _spawn_section(name: str, state_path: Path, workdir: Path, timeout: float) -> dict[str, Any]:
    """Run one section in a child interpreter with a hard time limit."""
    result_path = workdir / f"{name}.json"
    log_path = workdir / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name]
    command += ["--state", str(state_path)]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=_child_env(), timeout=timeout
            )
            returncode: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    seconds = round(time.perf_counter() - start, 2)
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if returncode is None:
        done = {k: v for k, v in result.items() if k != "status"}
        return {
            "status": "timed_out",
            "reason": f"ran past its {timeout:.0f} s budget; what it had finished is kept",
            **done,
            "seconds": seconds,
        }
    if returncode != 0 or result.get("status") != "ran":
        return {
            "status": "failed",
            "returncode": returncode,
            **{k: v for k, v in result.items() if k != "status"},
            "log_tail": _tail(log_path),
            "seconds": seconds,
        }
    return result


def _gpu_tests(paths: list[str], timeout: float) -> dict[str, Any]:
    """``pytest -m gpu -q`` over ``paths``; its summary line and exit status."""
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    command += paths
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command, cwd=ROOT, env=_child_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"status": "timed_out", "reason": f"ran past its {timeout:.0f} s budget"}
    lines = [line.strip("= ").strip() for line in proc.stdout.splitlines() if line.strip()]
    summary = next(
        (
            line
            for line in reversed(lines)
            if re.search(r"\b(passed|failed|skipped|deselected|error|errors|no tests ran)\b", line)
            and " in " in line
        ),
        lines[-1] if lines else "",
    )
    return {
        "status": "ran" if proc.returncode == 0 else "failed",
        "command": " ".join(["python", *command[1:]]),
        "returncode": proc.returncode,
        "summary": summary,
        "skip_reasons": [line for line in lines if line.startswith("SKIPPED")],
        "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))],
        "seconds": round(time.perf_counter() - start, 2),
    }


def _skip_reason(name: str, ctx: dict[str, Any], results: dict[str, Any]) -> str | None:
    """Why ``name`` cannot run here, or None."""
    needs_models = name.startswith("opd_") or name == "decode"
    if needs_models and results.get("build", {}).get("status") != "ran":
        return "the models were not built (see section build)"
    if name == "opd_nf4":
        if not ctx["device"].startswith("cuda"):
            return "NF4 needs CUDA: bitsandbytes 4-bit weights exist only on a CUDA device"
        if importlib.util.find_spec("bitsandbytes") is None:
            return f"bitsandbytes is not importable here; {BNB_WHEEL_NOTE}"
        if importlib.util.find_spec("accelerate") is None:
            return "accelerate is not importable here (transformers needs it to load NF4 weights)"
    return None


def _default_output(device_name: str) -> Path:
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    return ROOT / "results" / "gpu" / f"{date}-{_slug(device_name)}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, any device (a smoke run)")
    parser.add_argument(
        "--output", type=Path, help="JSON path (default results/gpu/DATE-DEVICE.json on CUDA)"
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole run's budget")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}"
    )
    parser.add_argument(
        "--gpu-tests",
        default="tests",
        help="comma list of test paths the gpu_tests section collects (default: tests)",
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep models and run dirs")
    parser.add_argument("--child", choices=SECTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        return run_child(args.child, args.state)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    if args.tiny and args.output is None:
        parser.error("--tiny needs --output: a tiny run's JSON does not belong in results/gpu/")

    missing = _missing_dependencies()
    if missing:
        print(
            f"gpu_check needs torch, {', '.join(REQUIRED)}; missing here: {', '.join(missing)}. "
            "Install them (pip install torch 'miniverl[hf]', or the packages by name; yaml is "
            "PyYAML) and run with this repository's src on PYTHONPATH.",
            file=sys.stderr,
        )
        return 2
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print(NO_CUDA)
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    from miniverl.utils import gpu

    device = "cuda:0" if cuda else "cpu"
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    output = args.output or _default_output(device_name)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="miniverl-gpu-check-"))
    shapes = TINY_SHAPES if args.tiny else QWEN3_SHAPES
    ctx: dict[str, Any] = {
        "device": device,
        "tiny": args.tiny,
        "workdir": str(workdir),
        "shapes": shapes,
        "settings": SETTINGS["tiny" if args.tiny else "full"],
        "models": {role: str(workdir / role) for role in shapes},
    }
    state_path = workdir / "state.json"
    _write_json(state_path, ctx)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "device": "cuda" if cuda else "cpu",
        "device_name": device_name,
        "tiny": args.tiny,
        "note": (
            "tiny shapes: a smoke run of this script, not a measurement"
            if args.tiny
            else "random weights at the real Qwen3 shapes; see the script's docstring"
        ),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "complete": False,
        "budget_s": args.budget_s,
        "section_budget_s": BUDGET_S,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            **{name: _version(name) for name in ("transformers", "peft", "bitsandbytes")},
        },
        "gpu": gpu.describe_gpu(),
        "seed_reference": SEED_REFERENCE,
        "recipe": str(RECIPE.relative_to(ROOT)),
        "settings": ctx["settings"],
        "sections": {},
    }
    results: dict[str, Any] = report["sections"]
    try:
        for name in SECTIONS:
            left = args.budget_s - (time.perf_counter() - started)
            if name not in chosen:
                results[name] = {"status": "skipped", "reason": "not in --sections"}
            elif (reason := _skip_reason(name, ctx, results)) is not None:
                results[name] = {"status": "skipped", "reason": reason}
            elif left < MIN_START_S:
                results[name] = {
                    "status": "skipped",
                    "reason": f"only {left:.0f} s of the {args.budget_s:.0f} s budget were left",
                }
            elif name == "gpu_tests":
                paths = [p.strip() for p in args.gpu_tests.split(",") if p.strip()]
                results[name] = _gpu_tests(paths, min(BUDGET_S[name], left))
            else:
                results[name] = _spawn_section(name, state_path, workdir, min(BUDGET_S[name], left))
            status = results[name]["status"]
            print(f"[gpu_check] {name}: {status} {results[name].get('reason', '')}".rstrip())
            report["wall_s"] = round(time.perf_counter() - started, 2)
            _write_json(output, report)
        report["complete"] = True
        _write_json(output, report)
    finally:
        if not args.keep_workdir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    print(f"[gpu_check] wrote {output}")
    bad = [n for n, r in results.items() if r["status"] not in ("ran", "skipped")]
    if bad:
        print(f"[gpu_check] not completed: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
