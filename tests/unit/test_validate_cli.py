"""``miniverl validate``: prints the validated config, or every error with its key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from miniverl.cli import common
from miniverl.cli import main as cli
from miniverl.config.models import RunConfig
from miniverl.config.sections import ENVIRONMENT_REF_PATTERN


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.console, "_width", 250)
    monkeypatch.setattr(common.err_console, "_width", 250)


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli.app, list(args))


GOOD = """
run:
  name: unit
  mode: opd
loss:
  divergence: reverse_kl
train:
  cycles: 2
environment:
  params:
    prompt_style: compact
"""


def _verdict(recipe: Path, config: RunConfig) -> str:
    return f"valid {recipe} (digest {config.digest()[:16]}, mode opd, objective on_policy_distillation)"


def test_good_recipe_prints_the_verdict_first_then_what_differs(tmp_path: Path) -> None:
    recipe = tmp_path / "good.yaml"
    recipe.write_text(GOOD, encoding="utf-8")
    result = _invoke("validate", str(recipe))
    assert result.exit_code == 0, result.output
    config = RunConfig.from_yaml(recipe)
    lines = result.stdout.splitlines()
    assert lines[0] == _verdict(recipe, config)
    assert lines[1].startswith("# environment calculator -> ")
    assert lines[2] == (
        "# 4 setting(s) differ from the defaults (--full for the whole resolved config):"
    )
    assert yaml.safe_load("\n".join(lines[3:])) == {
        "run": {"name": "unit"},
        "environment": {"params": {"prompt_style": "compact"}},
        "loss": {"divergence": "reverse_kl"},
        "train": {"cycles": 2},
    }


def test_full_prints_the_whole_resolved_config(tmp_path: Path) -> None:
    recipe = tmp_path / "good.yaml"
    recipe.write_text(GOOD, encoding="utf-8")
    result = _invoke("validate", str(recipe), "--full")
    assert result.exit_code == 0, result.output
    config = RunConfig.from_yaml(recipe)
    lines = result.stdout.splitlines()
    assert lines[0] == _verdict(recipe, config)
    assert lines[2] == "# the whole resolved config:"
    assert yaml.safe_load("\n".join(lines[3:])) == config.to_dict()


def test_a_default_recipe_differs_in_nothing(tmp_path: Path) -> None:
    recipe = tmp_path / "empty.yaml"
    recipe.write_text("run: {}\n", encoding="utf-8")
    result = _invoke("validate", str(recipe))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].startswith("# 0 setting(s) differ")
    assert len(result.stdout.splitlines()) == 3


def test_overrides_and_quiet(tmp_path: Path) -> None:
    recipe = tmp_path / "good.yaml"
    recipe.write_text(GOOD, encoding="utf-8")
    result = _invoke(
        "validate", str(recipe), "train.cycles=4", "loss.divergence=forward_kl", "--quiet"
    )
    assert result.exit_code == 0, result.output
    expected = RunConfig.from_yaml(recipe, ["train.cycles=4", "loss.divergence=forward_kl"])
    assert expected.train.cycles == 4
    assert (
        result.stdout.strip()
        == f"valid {recipe} (digest {expected.digest()[:16]}, mode opd, objective on_policy_distillation)"
    )


BAD = """
bogus_section: 1
models:
  student:
    model_id: toy-student
    lora:
      rank: 4
loss:
  divergence: kl
train:
  cycles: -1
"""


def test_bad_recipe_lists_every_error_with_its_key_path(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(BAD, encoding="utf-8")
    result = _invoke("validate", str(recipe))
    assert result.exit_code == 1
    err = result.stderr
    assert f"{recipe}: 4 configuration error(s)" in err
    assert "bogus_section: unknown key (Extra inputs are not permitted)" in err
    assert "models.student.lora.rank: unknown key (Extra inputs are not permitted)" in err
    assert (
        "loss.divergence: Input should be 'forward_kl', 'reverse_kl', 'jsd' or 'entropy_aware'"
        in err
    )
    assert "train.cycles: Input should be greater than or equal to 0" in err
    assert "hint: run 'miniverl validate <recipe.yaml>'" in err
    assert "Traceback" not in result.output


def test_combination_error(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("loss:\n  divergence: jsd\n  jsd_beta: 1.0\n", encoding="utf-8")
    result = _invoke("validate", str(recipe))
    assert result.exit_code == 1
    assert (
        "loss.divergence: jsd needs 0 < loss.jsd_beta < 1, got 1.0; use loss.divergence: reverse_kl instead"
        in result.stderr
    )


def test_bad_override(tmp_path: Path) -> None:
    recipe = tmp_path / "good.yaml"
    recipe.write_text(GOOD, encoding="utf-8")
    result = _invoke("validate", str(recipe), "train.cycles")
    assert result.exit_code == 1
    assert "override 'train.cycles' is not of the form section.key=value" in result.stderr


def test_missing_recipe(tmp_path: Path) -> None:
    result = _invoke("validate", str(tmp_path / "none.yaml"))
    assert result.exit_code == 1
    assert f"recipe not found: {tmp_path / 'none.yaml'}" in result.stderr


def test_error_text_is_printed_verbatim(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("environment:\n  name: os.path\n", encoding="utf-8")
    result = _invoke("validate", str(recipe))
    assert result.exit_code == 1
    assert (
        f"environment.name: String should match pattern '{ENVIRONMENT_REF_PATTERN}'"
        in result.stderr
    )
