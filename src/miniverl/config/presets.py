"""The packaged demo recipe, so ``miniverl demo`` works from a plain install."""

from __future__ import annotations

from importlib import resources

import yaml

from miniverl.config.models import RunConfig, apply_overrides

DEMO_RECIPE = "toy_demo.yaml"

FAST_OVERRIDES: tuple[str, ...] = (
    "environment.train_tasks=16",
    "environment.eval_tasks=4",
    "train.cycles=2",
    "train.rollouts_per_cycle=4",
    "train.sft_warmup_cycles=2",
    "lab.toy_fit.max_steps=150",
    "lab.toy_fit.check_every=50",
    "lab.toy_fit.extra_tasks=0",
    "rollout.max_turns=2",
    "rollout.max_new_tokens_per_turn=24",
    "rollout.max_total_tokens=256",
)
"""``miniverl demo --fast``: every budget shrunk, the artifact set unchanged."""


def demo_recipe_bytes() -> bytes:
    return resources.files("miniverl.recipes").joinpath(DEMO_RECIPE).read_bytes()


def demo_config(*, fast: bool = False) -> RunConfig:
    data = yaml.safe_load(demo_recipe_bytes().decode("utf-8"))
    if fast:
        data = apply_overrides(data, FAST_OVERRIDES)
        data["run"]["name"] = "demo-fast"
    return RunConfig.from_mapping(data, source=f"miniverl/recipes/{DEMO_RECIPE}")
