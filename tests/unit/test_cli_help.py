"""``miniverl --help`` and ``--version``: commands in workflow order, devices named, no ``<bool>``."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from miniverl import __version__
from miniverl.cli import common
from miniverl.cli import main as cli


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(common.console, "_width", 200)


def _help(*args: str) -> str:
    result = CliRunner().invoke(cli.app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_version_prints_the_version() -> None:
    result = CliRunner().invoke(cli.app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"miniverl {__version__}"


def test_commands_are_listed_in_workflow_panels_in_order() -> None:
    out = _help()
    panels = re.findall(r"╭─ (\w+) ─", out)
    assert panels == ["Options", "Run", "Inspect", "Lab", "Export", "Maintain"]
    listed = re.findall(r"^│ ([a-z][a-z-]+) {2,}", out, flags=re.MULTILINE)
    expected = [name for names in cli.WORKFLOW.values() for name in names]
    assert listed == expected
    import typer

    registered = set(typer.main.get_group(cli.app).commands)
    assert registered == set(expected), "a command is missing from WORKFLOW"


def test_help_names_the_device_of_every_command() -> None:
    out = _help()
    assert "one GPU" not in out and "single-GPU" not in out
    assert "CPU" in out.split("╭─ Options")[0]  # the description says a newcomer needs no GPU
    for name in [n for names in cli.WORKFLOW.values() for n in names]:
        row = re.search(rf"^│ {re.escape(name)} {{2,}}(.*?)(?=^│ [a-z]|^╰)", out, re.M | re.S)
        assert row is not None, name
        assert "CPU" in row.group(1), f"{name}: {row.group(1)!r} names no device"


@pytest.mark.parametrize("args", [(), ("demo",), ("inspect",), ("validate",), ("cache", "prune")])
def test_flags_show_no_bool_type(args: tuple[str, ...]) -> None:
    out = _help(*args)
    assert "<bool>" not in out
    assert "--help" in out
