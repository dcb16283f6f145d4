"""The historical import path of the config: re-exports only.

``from miniverl.config.models import RunConfig`` keeps working everywhere. What lives where:

- ``config/sections.py``: one pydantic model per recipe section (fields, descriptions,
  single-field validators).
- ``config/recipe.py``: :class:`RunConfig`, which composes the sections, and the
  combination rules that relate them.
- ``config/loading.py``: safe YAML, dotted overrides, validation-error formatting.
- ``config/limits.py``: sanity bounds on numbers and the path-component rule for names.
"""

from __future__ import annotations

from miniverl.config.limits import (
    BOUND_HINT,
    MAX_LR,
    MAX_NAME_CHARS,
    MAX_SEED,
    MAX_STEPS,
    MAX_TASKS,
    MAX_TEMPERATURE,
    MAX_THREADS,
    MAX_TOKENS,
    MAX_WEIGHT,
    path_component_problem,
)
from miniverl.config.loading import (
    apply_overrides,
    format_validation_error,
    load_yaml_mapping,
    parse_override,
)
from miniverl.config.recipe import TOY_PRESET_IDS, RunConfig
from miniverl.config.recipe import _combination_problems as _combination_problems  # tests read it
from miniverl.config.sections import (
    ENVIRONMENT_NAME_PATTERN,
    ENVIRONMENT_REF_PATTERN,
    Auto,
    CacheConfig,
    CheckpointConfig,
    EnvironmentConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    LossConfig,
    MemoryConfig,
    ModelsConfig,
    ModelSpec,
    RolloutConfig,
    RunSection,
    SelectionConfig,
    TeacherConfig,
    TeacherFitConfig,
    ToyArchConfig,
    ToyFitConfig,
    TrainConfig,
)

__all__ = [
    "BOUND_HINT",
    "ENVIRONMENT_NAME_PATTERN",
    "ENVIRONMENT_REF_PATTERN",
    "MAX_LR",
    "MAX_NAME_CHARS",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_TASKS",
    "MAX_TEMPERATURE",
    "MAX_THREADS",
    "MAX_TOKENS",
    "MAX_WEIGHT",
    "TOY_PRESET_IDS",
    "Auto",
    "CacheConfig",
    "CheckpointConfig",
    "EnvironmentConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossConfig",
    "MemoryConfig",
    "ModelSpec",
    "ModelsConfig",
    "RolloutConfig",
    "RunConfig",
    "RunSection",
    "SelectionConfig",
    "TeacherConfig",
    "TeacherFitConfig",
    "ToyArchConfig",
    "ToyFitConfig",
    "TrainConfig",
    "apply_overrides",
    "format_validation_error",
    "load_yaml_mapping",
    "parse_override",
    "path_component_problem",
]
