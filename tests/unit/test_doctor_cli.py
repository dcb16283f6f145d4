"""``miniverl doctor``: describes the machine and never fails just because torch is absent."""

from __future__ import annotations

import json
import platform

from typer.testing import CliRunner

from miniverl import __version__
from miniverl.cli import main as cli


def test_doctor_table() -> None:
    result = CliRunner().invoke(cli.app, ["doctor", "--no-torch-probe"])
    assert result.exit_code == 0, result.output
    assert f"miniverl {__version__} doctor" in result.stdout
    assert platform.python_version() in result.stdout
    assert "calculator" in result.stdout
    assert "torch-free commands: doctor, validate, inspect, report, export, cache" in result.stdout


def test_doctor_json_with_torch_probe() -> None:
    result = CliRunner().invoke(cli.app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["miniverl"] == __version__
    assert report["python"] == platform.python_version()
    assert "calculator" in report["environments"]
    assert report["free_disk_gib"] >= 0
    assert set(report["packages"]) >= {"pydantic", "typer", "rich", "torch"}
    torch = report["torch"]
    assert torch["status"] in {"ok", "absent", "error"}
    if torch["status"] == "ok":
        assert torch["torch"] and isinstance(torch["cuda_available"], bool)


def test_doctor_json_skip_probe() -> None:
    result = CliRunner().invoke(cli.app, ["doctor", "--json", "--no-torch-probe"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["torch"] == {"status": "skipped"}


def test_version() -> None:
    result = CliRunner().invoke(cli.app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"miniverl {__version__}"
