"""Plugin environments: entry points in ``miniverl.environments`` and ``validate`` resolving them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import SRC_DIR
from miniverl.cli.main import app
from miniverl.environments.registry import available_environments, make_environment
from miniverl.errors import ToolEnvironmentError

REPO = SRC_DIR.parent
EXAMPLE_DIR = REPO / "examples" / "letter_count"


def _fake_distribution(root: Path, entry: str, module_source: str | None = None) -> Path:
    """What ``pip install`` leaves on sys.path: a module and a dist-info with entry points."""
    dist = root / "fake_miniverl_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fake-miniverl-plugin\nVersion: 0.1\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(f"[miniverl.environments]\n{entry}\n", encoding="utf-8")
    if module_source is not None:
        (root / "fake_plugin_env.py").write_text(module_source, encoding="utf-8")
    return root


PLUGIN_SOURCE = textwrap.dedent(
    """
    from miniverl.environments.calculator import CalculatorEnvironment

    class PluginCalc(CalculatorEnvironment):
        name = "plugin_calc"
    """
)


def test_entry_point_is_listed_and_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _fake_distribution(tmp_path, "plugin_calc = fake_plugin_env:PluginCalc", PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(root))
    assert "plugin_calc" in available_environments()
    env = make_environment("plugin_calc", prompt_style="verbose")
    assert type(env).__name__ == "PluginCalc" and env.prompt_style == "verbose"
    monkeypatch.delitem(sys.modules, "fake_plugin_env", raising=False)


def test_entry_point_to_a_non_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _fake_distribution(tmp_path, "bad_plugin = os.path:join")
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(ToolEnvironmentError) as info:
        make_environment("bad_plugin")
    assert str(info.value) == (
        "environment 'bad_plugin' resolves to posixpath.join, which is not a ToolEnvironment subclass"
    )


def _validate(
    recipe: Path, *overrides: str, extra_path: Path | None = None
) -> subprocess.CompletedProcess:
    """``miniverl validate`` in a fresh process, as a user would run it."""
    path = [str(SRC_DIR)] + ([str(extra_path)] if extra_path else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-m", "miniverl.cli.main", "validate", str(recipe), *overrides],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )


def test_validate_resolves_an_installed_entry_point_in_a_new_process(tmp_path: Path) -> None:
    root = _fake_distribution(
        tmp_path / "site", "letter_count = miniverl_letter_count:LetterCountEnvironment"
    )
    (root / "miniverl_letter_count.py").write_text(
        (EXAMPLE_DIR / "miniverl_letter_count.py").read_text(encoding="utf-8"), encoding="utf-8"
    )
    recipe = EXAMPLE_DIR / "recipe.yaml"
    ok = _validate(recipe, "environment.name=letter_count", extra_path=root)
    assert ok.returncode == 0, ok.stderr
    assert (
        "# environment letter_count -> miniverl_letter_count.LetterCountEnvironment: "
        "tools ['count(text, letter)']; tasks sampled (mixed): train 24, eval 8, test 4"
    ) in ok.stdout
    missing = _validate(recipe, "environment.name=letter_count")
    assert missing.returncode == 1
    assert (
        "error: unknown environment 'letter_count'; available: calc_chain, calculator, shop"
        in missing.stderr
    )


def test_validate_rejects_an_unknown_environment_with_the_available_names(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("environment:\n  name: nope\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(recipe)])
    assert result.exit_code == 1
    assert (
        f"unknown environment 'nope'; available: {', '.join(available_environments())}"
        in result.stderr
    )
    assert "valid" not in result.stdout
