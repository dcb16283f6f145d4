"""Integration fixtures: end-to-end runs on the embedded toy backend (CPU, seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_fast_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``miniverl demo --fast`` run (with its report) shared by every test that reads it."""
    from typer.testing import CliRunner

    from miniverl.cli.main import app

    out = tmp_path_factory.mktemp("demo") / "run"
    result = CliRunner().invoke(app, ["demo", "--fast", "--output", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return out
