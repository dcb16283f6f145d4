"""The explicit environment registry: a dict and ``register()``, no import-by-name."""

from __future__ import annotations

import ast
import inspect

import pytest

from miniverl.environments import registry
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.environments.registry import available_environments, make_environment, register
from miniverl.errors import ToolEnvironmentError


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    snapshot = dict(registry._REGISTRY)
    monkeypatch.setattr(registry, "_REGISTRY", snapshot)
    return snapshot


def test_calculator_is_registered() -> None:
    assert "calculator" in available_environments()
    env = make_environment("calculator")
    assert isinstance(env, CalculatorEnvironment) and env.name == "calculator"
    assert make_environment("calculator", prompt_style="verbose").prompt_style == "verbose"


@pytest.mark.parametrize(
    "name",
    [
        "nope",
        "miniverl.environments.calculator.CalculatorEnvironment",
        "os.path",
        "../calculator",
        "Calculator",
    ],
)
def test_unknown_names_are_not_imported(name: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        make_environment(name)
    assert (
        str(info.value)
        == f"unknown environment {name!r}; registered: {', '.join(available_environments())}"
    )
    assert "doctor" in info.value.hint


def test_bad_params() -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        make_environment("calculator", bogus=1)
    assert str(info.value).startswith("environment 'calculator' rejected its params ['bogus']: ")
    with pytest.raises(
        ToolEnvironmentError,
        match=r"^calculator: unknown prompt_style 'x'; expected one of \['compact', 'verbose'\]$",
    ):
        make_environment("calculator", prompt_style="x")


def test_register(clean_registry: dict) -> None:
    class Echo(CalculatorEnvironment):
        name = ""

    register("echo_env", Echo)
    assert "echo_env" in available_environments()
    env = make_environment("echo_env")
    assert isinstance(env, Echo) and env.name == "echo_env"
    with pytest.raises(ToolEnvironmentError) as info:
        register("echo_env", Echo)
    assert (
        str(info.value)
        == "environment 'echo_env' is already registered; pass replace=True to override"
    )
    register("echo_env", CalculatorEnvironment, replace=True)
    assert type(make_environment("echo_env")) is CalculatorEnvironment


@pytest.mark.parametrize("name", ["os.path", "../x", "Echo", "my-env", ""])
def test_register_rejects_non_identifiers(clean_registry: dict, name: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        register(name, CalculatorEnvironment)
    assert str(info.value) == f"environment name {name!r} must match ^[a-z][a-z0-9_]{{0,63}}$"
    assert name not in clean_registry


def test_registry_module_has_no_dynamic_imports() -> None:
    tree = ast.parse(inspect.getsource(registry))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert not imported & {"importlib", "importlib.metadata", "pkg_resources", "importlib.util"}
    calls = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert not calls & {"__import__", "eval", "exec", "getattr", "import_module"}
