"""Environment resolution: a registered name, an entry point, or ``module:Class``.

``environment.name`` in a recipe is resolved in this order:

1. a name in the in-process registry (``calculator``, ``shop``, or anything code in this
   process passed to :func:`register`);
2. an installed entry point in the group ``miniverl.environments`` (so ``pip install
   my-env`` is enough: its ``pyproject.toml`` declares
   ``[project.entry-points."miniverl.environments"] my_env = "my_env:MyEnvironment"``);
3. ``package.module:ClassName``: the module is imported and the attribute looked up.

Forms 2 and 3 import Python code, exactly as running a training script would: a recipe is
code-equivalent input, unlike a checkpoint, a cache or a trajectory file, which are inert
data and never import anything. Only importable module names are accepted (no file paths),
and the torch-free commands that read run directories (``report``, ``inspect``,
``export``) never resolve environments. Names are checked against
:data:`~miniverl.config.sections.ENVIRONMENT_REF_PATTERN` before anything is imported.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from miniverl.config.sections import ENVIRONMENT_NAME_PATTERN, ENVIRONMENT_REF_PATTERN
from miniverl.environments.base import ToolEnvironment
from miniverl.environments.calc_chain import CalcChainEnvironment
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.environments.shop import ShopEnvironment
from miniverl.errors import ToolEnvironmentError

EnvironmentFactory = Callable[..., ToolEnvironment]
ENTRY_POINT_GROUP = "miniverl.environments"

_REGISTRY: dict[str, EnvironmentFactory] = {
    "calculator": CalculatorEnvironment,
    "shop": ShopEnvironment,
    "calc_chain": CalcChainEnvironment,
}


def register(name: str, factory: EnvironmentFactory, *, replace: bool = False) -> None:
    """Register an environment factory in this process (used by examples and tests).

    A name registered here exists only in this process: ``miniverl eval`` and
    ``benchmark`` in a new process cannot find it. Publish an entry point or use
    ``module:Class`` for runs other processes must rebuild.
    """
    if not re.fullmatch(ENVIRONMENT_NAME_PATTERN.strip("^$"), name):
        raise ToolEnvironmentError(
            f"environment name {name!r} must match {ENVIRONMENT_NAME_PATTERN}"
        )
    if name in _REGISTRY and not replace:
        raise ToolEnvironmentError(
            f"environment {name!r} is already registered; pass replace=True to override"
        )
    _REGISTRY[name] = factory


def _entry_points() -> dict[str, Any]:
    """Installed ``miniverl.environments`` entry points by name (first one wins)."""
    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def available_environments() -> list[str]:
    """Registered names and installed entry-point names, sorted."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def _unknown(name: str, detail: str = "") -> ToolEnvironmentError:
    return ToolEnvironmentError(
        f"unknown environment {name!r}{detail}; available: {', '.join(available_environments())}",
        hint=(
            "use a registered name, install a package declaring an entry point in the "
            f"'{ENTRY_POINT_GROUP}' group, or write package.module:ClassName "
            "(run 'miniverl doctor' to list environments)"
        ),
    )


def _check_class(name: str, target: Any) -> EnvironmentFactory:
    """Entry points and ``module:Class`` must name a ToolEnvironment subclass, nothing else."""
    if not (isinstance(target, type) and issubclass(target, ToolEnvironment)):
        what = (
            f"{target.__module__}.{target.__qualname__}"
            if hasattr(target, "__qualname__")
            else type(target).__name__
        )
        raise ToolEnvironmentError(
            f"environment {name!r} resolves to {what}, which is not a ToolEnvironment subclass",
            hint="point at a subclass of miniverl.environments.base.ToolEnvironment (docs/environments.md)",
        )
    return target


def resolve_environment(name: str) -> EnvironmentFactory:
    """The factory ``name`` refers to, or a :class:`ToolEnvironmentError` listing the choices."""
    if not isinstance(name, str) or not re.fullmatch(ENVIRONMENT_REF_PATTERN.strip("^$"), name):
        raise _unknown(name, " (not a name or package.module:ClassName)")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        ep = _entry_points().get(name)
        if ep is None:
            raise _unknown(name)
        try:
            return _check_class(name, ep.load())
        except ToolEnvironmentError:
            raise
        except Exception as exc:
            raise ToolEnvironmentError(
                f"entry point {name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}",
                hint="reinstall the package that declares it, or check its import errors",
            ) from None
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _unknown(name, f" (cannot import module {module_name!r}: {exc})") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise _unknown(name, f" (module {module_name!r} has no attribute {attr!r})")
    return _check_class(name, factory)


def make_environment(name: str, **params: Any) -> ToolEnvironment:
    """Build the environment ``name`` refers to with keyword ``params`` from the recipe."""
    factory = resolve_environment(name)
    try:
        env = factory(**params)
    except TypeError as exc:
        raise ToolEnvironmentError(
            f"environment {name!r} rejected its params {sorted(params)}: {exc}"
        ) from None
    if not isinstance(env, ToolEnvironment):
        raise ToolEnvironmentError(
            f"environment {name!r} built a {type(env).__name__}, not a ToolEnvironment"
        )
    env.name = env.name or re.sub(r"[^a-z0-9_]", "_", name.rsplit(":", 1)[-1].lower())
    return env
