"""``recipes/smollm2_calc_chain.yaml`` validates on CPU and with ``models.device=cuda``, and
holds the settings its header promises (k ranges, LoRA shapes, teacher fit, cold start)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from miniverl.cli import main as cli
from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.lab.config import lab_of, load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smollm2_calc_chain.yaml"
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("overrides", [(), ("models.device=cuda",)], ids=["cpu", "cuda"])
def test_the_recipe_validates(overrides: tuple[str, ...]) -> None:
    config = RunConfig.from_yaml(RECIPE, overrides)
    assert config.models.device == ("cuda" if overrides else "cpu")
    result = CliRunner().invoke(cli.app, ["validate", str(RECIPE), *overrides, "-q"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("valid ")


def test_the_recipe_holds_what_its_header_says() -> None:
    config = load_recipe(RECIPE)
    models, lab = config.models, lab_of(config)
    assert models.backend == "hf" and models.runtime == "shared_backbone"
    student, teacher = models.student, models.teacher
    assert student.model_id == teacher.model_id == "models/smollm2-135m-instruct"
    assert (student.lora.enabled, student.lora.r, student.lora.alpha) == (True, 16, 32)
    adapter = lab.teacher_fit.lora
    assert (adapter.r, adapter.alpha) == (32, 64)
    assert student.lora.target_modules == adapter.target_modules == PROJECTIONS
    assert lab.teacher_fit.enabled and lab.teacher_fit.steps > 0
    params = config.environment.params
    assert config.environment.name == "calc_chain"
    assert (params["train_k"], params["eval_k"]) == ([1, 2, 3], [1, 2, 3])
    assert params["test_k"] == [1, 2, 3, 4, 5]
    env = make_environment("calc_chain", **params)
    assert env.max_turn_budget() == config.rollout.max_turns == 7
    until = lab.warmup_until
    assert config.train.sft_warmup_cycles == 0 and until is not None
    assert (until.metric, until.k) == ("success_at_k", 1)
    dagger = lab.teacher_fit.dagger
    assert dagger.enabled and dagger.tasks == 64
    gate = lab.teacher_gate
    assert gate.tasks == 32 and gate.required
    thresholds = (gate.on_path, gate.off_path, gate.recovery)
    assert thresholds == (0.95, 0.9, 0.8)
