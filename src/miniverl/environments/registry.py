"""An explicit environment registry: a dict, populated by imports.

No entry-point scan and no import-by-name: a recipe can only name an environment that
this module (or in-process code calling :func:`register`) put in the dict, and
``environment.name`` is additionally constrained by a regex in ``config.models``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from miniverl.config.models import ENVIRONMENT_NAME_PATTERN
from miniverl.environments.base import ToolEnvironment
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.errors import ToolEnvironmentError

EnvironmentFactory = Callable[..., ToolEnvironment]

_REGISTRY: dict[str, EnvironmentFactory] = {"calculator": CalculatorEnvironment}


def register(name: str, factory: EnvironmentFactory, *, replace: bool = False) -> None:
    """Register an environment factory in this process (used by examples and tests)."""
    if not re.match(ENVIRONMENT_NAME_PATTERN, name):
        raise ToolEnvironmentError(
            f"environment name {name!r} must match {ENVIRONMENT_NAME_PATTERN}"
        )
    if name in _REGISTRY and not replace:
        raise ToolEnvironmentError(
            f"environment {name!r} is already registered; pass replace=True to override"
        )
    _REGISTRY[name] = factory


def available_environments() -> list[str]:
    return sorted(_REGISTRY)


def make_environment(name: str, **params: Any) -> ToolEnvironment:
    """Build a registered environment with keyword ``params`` from the recipe."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ToolEnvironmentError(
            f"unknown environment {name!r}; registered: {', '.join(available_environments())}"
        )
    try:
        env = factory(**params)
    except TypeError as exc:
        raise ToolEnvironmentError(
            f"environment {name!r} rejected its params {sorted(params)}: {exc}"
        ) from None
    env.name = env.name or name
    return env
