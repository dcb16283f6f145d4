"""A cold start from another recipe or another base model is refused before anything is written.

One tiny toy cold start is exported (SFT warm-up of the conftest recipe, no cycles); then
``miniverl train --cold-start`` is run with it under the same recipe (accepted: the weights
are loaded, no warm-up runs) and under recipes that change the student's base model, its
adapter shape or the environment (each a ``CheckpointError`` naming the differing fields, with
a hint, exit code 1, no run directory, the cold start untouched).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import export_cold_start
from miniverl.cli.main import app
from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError
from miniverl.training.cold_start import COLD_START_IDENTITY, COLD_START_MARKER
from miniverl.training.recipe import OPDTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _snapshot(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory, tiny_recipe: Path) -> Path:
    root = tmp_path_factory.mktemp("cold")
    config = RunConfig.from_yaml(tiny_recipe, ["train.cycles=0"])
    trainer = OPDTrainer(config, output_dir=root / "run", quiet=True)
    trainer.train()
    return export_cold_start(trainer, root / "cold-start")


def _train(recipe: Path, out: Path, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(
        app, ["train", str(recipe), "--output", str(out), "--quiet", "--no-report", *args]
    )


def test_the_marker_records_what_the_weights_are_for(cold: Path) -> None:
    identity = json.loads((cold / COLD_START_MARKER).read_text())[COLD_START_IDENTITY]
    assert identity["backend"] == "toy" and identity["environment"] == "calculator"
    assert identity["student_model"] == {"model_id": "toy-student"}
    assert identity["student_lora"]["enabled"] is False


def test_the_same_recipe_starts_from_the_cold_start(
    cold: Path, tiny_recipe: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    result = _train(tiny_recipe, out, "--cold-start", str(cold), "train.lr=0.001")
    assert result.exit_code == 0, result.output
    events = [json.loads(line)["event"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert "benchmark_cold_start_loaded" in events and "sft_warmup_start" not in events


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("models.student.model_id=toy-teacher", "student_model"),
        ("models.student.lora.enabled=true", "student_lora"),
        ("models.student.revision=v2", "student_revision"),
        ("environment.params.prompt_style=compact", "environment_params"),
    ],
    ids=["base-model", "adapter", "revision", "environment"],
)
def test_another_recipe_or_base_model_is_refused_and_nothing_is_written(
    cold: Path, tiny_recipe: Path, tmp_path: Path, override: str, field: str
) -> None:
    before = _snapshot(cold)
    config = RunConfig.from_yaml(tiny_recipe, [override])
    with pytest.raises(CheckpointError, match="made for another recipe or base model") as info:
        OPDTrainer(config, output_dir=tmp_path / "direct", initial_weights=cold, quiet=True)
    assert f"{field}: cold start" in str(info.value)
    assert "--cold-start" in info.value.hint
    out = tmp_path / "run"
    result = _train(tiny_recipe, out, "--cold-start", str(cold), override)
    assert result.exit_code == 1, result.output
    assert "made for another recipe or base model" in result.output and field in result.output
    assert "leave out --cold-start" in " ".join(result.output.split())
    assert not out.exists() and not (tmp_path / "direct").exists()
    assert _snapshot(cold) == before


def test_a_directory_that_is_not_a_cold_start_is_refused(
    cold: Path, tiny_recipe: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    result = _train(tiny_recipe, out, "--cold-start", str(cold.parent / "run"))
    assert result.exit_code == 1 and "is not a cold start" in result.output
    assert not out.exists()
    result = _train(tiny_recipe, out, "--cold-start", str(cold), "--resume")
    assert result.exit_code == 1 and "pass one of them" in result.output
    assert not out.exists()


def test_load_initial_weights_loads_the_cold_start_and_takes_its_fingerprint(
    cold: Path, tiny_recipe: Path, tmp_path: Path
) -> None:
    """A study that drives the recipe's pieces itself (no ``train()``) loads the cold start
    with the weights' own policy fingerprint, so the strict on-policy check sees them."""
    from safetensors.torch import load_file

    config = RunConfig.from_yaml(tiny_recipe)
    trainer = OPDTrainer(config, output_dir=tmp_path / "run", quiet=True, initial_weights=cold)
    trainer.setup()
    before = trainer.state.policy_fingerprint
    trainer.load_initial_weights()
    weights = load_file(str(cold / "student.safetensors"))
    loaded = trainer.student.full_state_dict()
    assert all(bool((loaded[k] == v).all()) for k, v in weights.items())
    after = trainer.state.policy_fingerprint
    assert after != before
    trainer.state.refresh_fingerprint(trainer.student)
    assert trainer.state.policy_fingerprint == after  # the fingerprint of the loaded weights
    with pytest.raises(CheckpointError, match="given no cold start"):
        OPDTrainer(config, output_dir=tmp_path / "other", quiet=True).load_initial_weights()
