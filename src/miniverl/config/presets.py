"""The packaged demo recipe, so ``miniverl demo`` works from a plain install."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from miniverl.config.models import RunConfig, apply_overrides
from miniverl.config.modes import DEFAULT_MODE, mode_of_kind

DEMO_RECIPE = "toy_demo.yaml"
DEMO_TEACHER = "toy_demo_teacher.safetensors"
"""The demo's teacher, shipped beside its recipe: a toy model of the student's size that
``recipes/toy_teacher_checked.yaml`` trains (about 12 minutes on one core, longer than the whole
demo), stored as safetensors (tensors only, nothing executed on load)."""
DEMO_COLD_START = "toy_demo_cold_start"
"""The demo's shared start, shipped beside its recipe (a benchmark cold start directory:
``cold_start.json``, ``student.safetensors``, ``fixed-states.jsonl``): the recipe's own SFT
warm-up at its seed on AVX-512 kernels, which the positive control's learning-rate grid also
started from. Shipped because where the toy student's warm-up crosses its threshold depends on
the CPU's float kernels (on AVX2 kernels it had not after 1,500 cycles), and so that every
machine continues from the same student errors."""

FAST_OVERRIDES: tuple[str, ...] = (
    "environment.train_tasks=16",
    "environment.eval_tasks=4",
    "environment.test_tasks=0",
    "train.cycles=2",
    "train.rollouts_per_cycle=4",
    "train.checkpoint_every=1",
    "eval.every=1",
    "rollout.max_new_tokens_per_turn=24",
    "rollout.max_total_tokens=400",
)
"""``miniverl demo --fast``: every budget shrunk, the artifact set unchanged."""


def demo_recipe_bytes() -> bytes:
    return resources.files("miniverl.recipes").joinpath(DEMO_RECIPE).read_bytes()


def demo_teacher_path() -> Path:
    """Where the installed package holds :data:`DEMO_TEACHER` (a plain file in every install
    pip makes: wheel, sdist or editable)."""
    return Path(str(resources.files("miniverl.recipes").joinpath(DEMO_TEACHER)))


def demo_cold_start_path() -> Path:
    """Where the installed package holds :data:`DEMO_COLD_START` (a plain directory)."""
    return Path(str(resources.files("miniverl.recipes").joinpath(DEMO_COLD_START)))


DEMO_MODE: str = DEFAULT_MODE
"""The demo recipe's ``run.mode``: on-policy distillation."""
DEMO_COMPARISON_MODE: str = mode_of_kind("teacher_pool").name
"""The run ``miniverl demo`` trains beside :data:`DEMO_MODE` (``offline_kd``): the same teacher,
steps and warm-up, trained on the teacher's own episodes instead of the student's."""


def demo_config(*, fast: bool = False, mode: str | None = None) -> RunConfig:
    """The demo recipe (``--fast``: :data:`FAST_OVERRIDES`); ``mode`` replaces ``run.mode``
    (the comparison arm, :data:`DEMO_COMPARISON_MODE`) and suffixes ``run.name`` with it."""
    data = yaml.safe_load(demo_recipe_bytes().decode("utf-8"))
    data["models"]["teacher"]["checkpoint"] = str(demo_teacher_path())
    if fast:
        data = apply_overrides(data, FAST_OVERRIDES)
        data["run"]["name"] = "demo-fast"
    if mode is not None:
        data = apply_overrides(data, [f"run.mode={mode}"])
        data["run"]["name"] = f"{data['run']['name']}-{mode}"
    return RunConfig.from_mapping(data, source=f"miniverl/recipes/{DEMO_RECIPE}")
