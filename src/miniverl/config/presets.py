"""The packaged demo recipe, so ``miniverl demo`` works from a plain install."""

from __future__ import annotations

from importlib import resources

import yaml

from miniverl.config.models import RunConfig, apply_overrides
from miniverl.config.modes import DEFAULT_MODE, mode_of_kind

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


DEMO_MODE: str = DEFAULT_MODE
"""The demo recipe's ``run.mode``: on-policy distillation."""
DEMO_COMPARISON_MODE: str = mode_of_kind("teacher_pool").name
"""The run ``miniverl demo`` trains beside :data:`DEMO_MODE` (``offline_kd``): the same teacher,
steps and warm-up, trained on the teacher's own episodes instead of the student's."""


def demo_config(*, fast: bool = False, mode: str | None = None) -> RunConfig:
    """The demo recipe (``--fast``: :data:`FAST_OVERRIDES`); ``mode`` replaces ``run.mode``
    (the comparison arm, :data:`DEMO_COMPARISON_MODE`) and suffixes ``run.name`` with it."""
    data = yaml.safe_load(demo_recipe_bytes().decode("utf-8"))
    if fast:
        data = apply_overrides(data, FAST_OVERRIDES)
        data["run"]["name"] = "demo-fast"
    if mode is not None:
        data = apply_overrides(data, [f"run.mode={mode}"])
        data["run"]["name"] = f"{data['run']['name']}-{mode}"
    return RunConfig.from_mapping(data, source=f"miniverl/recipes/{DEMO_RECIPE}")
