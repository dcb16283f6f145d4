"""A finished tiny toy run shared by the hostile CLI tests (each test works on a copy)."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_RECIPE = """\
run: {name: hostile, seed: 1234}
models:
  backend: toy
  device: cpu
  student: {model_id: toy-student, lora: {enabled: false}}
  teacher: {model_id: toy-teacher}
  toy_fit: {max_steps: 2, check_every: 2, batch_size: 2, probe_tasks: 1}
environment: {name: calculator, train_tasks: 4, eval_tasks: 1}
rollout: {max_turns: 2, max_new_tokens_per_turn: 8, max_total_tokens: 120}
loss: {top_k: 4}
train: {cycles: 1, rollouts_per_cycle: 2, sft_warmup_cycles: 1, lr: 0.003}
"""


@pytest.fixture(scope="session")
def tiny_recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "tiny.yaml"
    path.write_text(TINY_RECIPE)
    return path


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory, tiny_recipe: Path) -> Path:
    from typer.testing import CliRunner

    from miniverl.cli.main import app

    out = tmp_path_factory.mktemp("hostile") / "run"
    result = CliRunner().invoke(
        app, ["train", str(tiny_recipe), "--output", str(out), "--quiet", "--no-report"]
    )
    assert result.exit_code == 0, result.output
    return out
