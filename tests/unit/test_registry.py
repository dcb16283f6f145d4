"""Environment resolution: registered names, entry points and ``module:Class``."""

from __future__ import annotations

import pytest

from miniverl.environments import registry
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.environments.registry import available_environments, make_environment, register
from miniverl.environments.shop import ShopEnvironment
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
    ("name", "detail"),
    [
        ("nope", ""),
        (
            "miniverl.environments.calculator.CalculatorEnvironment",
            " (not a name or package.module:ClassName)",
        ),
        ("os.path", " (not a name or package.module:ClassName)"),
        ("../calculator", " (not a name or package.module:ClassName)"),
        ("Calculator", " (not a name or package.module:ClassName)"),
        ("calculator\n", " (not a name or package.module:ClassName)"),
        (
            "no_such_module_xyz:Env",
            " (cannot import module 'no_such_module_xyz': No module named 'no_such_module_xyz')",
        ),
        (
            "miniverl.environments.calculator:Nope",
            " (module 'miniverl.environments.calculator' has no attribute 'Nope')",
        ),
    ],
)
def test_unknown_names_list_the_available_ones(name: str, detail: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        make_environment(name)
    assert str(info.value) == (
        f"unknown environment {name!r}{detail}; available: {', '.join(available_environments())}"
    )
    assert "miniverl.environments" in info.value.hint and "doctor" in info.value.hint


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


def test_module_class_form_builds_the_class() -> None:
    env = make_environment("miniverl.environments.shop:ShopEnvironment", prices={"tea": 2})
    assert type(env) is ShopEnvironment and env.prices == {"tea": 2} and env.name == "shop"


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("os.path:join", "posixpath.join"),
        ("miniverl.environments.base:ToolCall", "miniverl.environments.base.ToolCall"),
        ("miniverl.environments.shop:DEFAULT_PRICES", "dict"),
    ],
)
def test_module_class_form_needs_a_tool_environment(name: str, what: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        make_environment(name)
    assert str(info.value) == (
        f"environment {name!r} resolves to {what}, which is not a ToolEnvironment subclass"
    )


def test_only_the_named_resolution_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registered name never imports anything; ``module:Class`` imports only that module."""
    imported: list[str] = []
    real = registry.importlib.import_module
    monkeypatch.setattr(
        registry.importlib, "import_module", lambda n: imported.append(n) or real(n)
    )
    make_environment("calculator")
    assert imported == []
    make_environment("miniverl.environments.shop:ShopEnvironment")
    assert imported == ["miniverl.environments.shop"]
