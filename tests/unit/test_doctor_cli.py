"""``miniverl doctor``: describes the machine, never fails just because torch is absent, and
gives the same install line as the README and every other hint."""

from __future__ import annotations

import json
import platform
import re

import pytest
from typer.testing import CliRunner

from helpers import REPO_ROOT, SRC_DIR
from miniverl import __version__
from miniverl.cli import main as cli
from miniverl.utils.lazy import EXTRAS_INSTALL, INSTALL_HINT, TORCH_INSTALL, install_hint


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


def _readme_quick_start() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", readme[readme.index("## Quick start") :], re.S)
    assert block is not None
    return block.group(1).splitlines()


def test_the_install_hint_is_the_readme_quick_start() -> None:
    """One install line for torch and the hf extra, and it is the README's."""
    setup = _readme_quick_start()
    assert setup[1:3] == [TORCH_INSTALL, EXTRAS_INSTALL], setup
    assert f"{TORCH_INSTALL} (" in INSTALL_HINT and f"then {EXTRAS_INSTALL} " in INSTALL_HINT
    assert install_hint("torch") == install_hint("hf") == INSTALL_HINT
    for extra in ("quant", "tensorboard", "verl-export"):
        assert f'pip install -e ".[{extra}]"' in install_hint(extra)


def test_doctor_without_torch_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "is_available", lambda module: module != "torch")
    result = CliRunner().invoke(cli.app, ["doctor", "--no-torch-probe"])
    assert result.exit_code == 0, result.output
    assert f"Training needs torch: {INSTALL_HINT}" in " ".join(result.stdout.split())
    probe = cli.probe_torch()
    assert probe == {"status": "absent", "hint": INSTALL_HINT}
    result = CliRunner().invoke(cli.app, ["doctor", "--json"])
    assert json.loads(result.stdout)["torch"]["hint"] == INSTALL_HINT


def test_no_other_install_spelling_in_the_source() -> None:
    """``pip install 'miniverl[...]'`` does not work from a clone (miniverl is not on an index);
    every hint goes through :func:`install_hint`."""
    offenders = [
        str(path.relative_to(SRC_DIR))
        for path in SRC_DIR.rglob("*.py")
        if "miniverl[" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []
