"""``recipes/smollm2_smoke.yaml``: it validates as written, and its one cycle runs end to end
through ``miniverl train`` on a tiny random hf checkpoint shaped by it (seconds, no real model).

What the real model costs with it (wall time, peak RSS) is measured by hand and recorded in
docs/performance.md; the suite only checks that every phase the recipe names runs and prints.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.lab.config import LabRunConfig as RunConfig
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smollm2_smoke.yaml"


def test_the_smoke_recipe_validates_as_one_short_cycle_of_the_real_model() -> None:
    config = RunConfig.from_yaml(RECIPE)
    models = config.models
    assert models.backend == "hf" and models.runtime == "shared_backbone"
    assert models.student.model_id == models.teacher.model_id == "models/smollm2-135m-instruct"
    assert config.memory.activation_checkpointing
    assert config.run.mode == "opd" and config.train.cycles == 1
    assert 0 < config.train.sft_warmup_cycles <= 5 and config.lab.warmup_until is None
    assert config.lab.teacher_fit.enabled and config.lab.teacher_fit.steps <= 5
    assert config.eval.max_tasks is not None and config.eval.max_tasks <= 5


def test_the_smoke_recipe_runs_its_cycle_on_a_tiny_checkpoint(tmp_path: Path) -> None:
    model = build_tiny_hf_checkpoint(tmp_path / "tiny", arch="llama", seed=2)
    out = tmp_path / "run"
    overrides = [
        f"models.student.model_id={model}",
        f"models.teacher.model_id={model}",
        f"models.teacher_fit.cache_dir={tmp_path / 'adapters'}",
        "models.student.lora.r=2",
        "models.teacher.lora.r=2",
        "rollout.max_new_tokens_per_turn=4",
    ]
    result = CliRunner().invoke(app, ["train", str(RECIPE), *overrides, "--output", str(out)])
    assert result.exit_code == 0, result.output
    config = RunConfig.from_yaml(RECIPE)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("sft_warmup_cycle") == config.train.sft_warmup_cycles
    assert kinds.count("teacher_adapter_fitted") == 1 and kinds.count("cycle_end") == 1
    fitted = next(e for e in events if e["event"] == "teacher_adapter_fitted")
    assert fitted["steps"] == config.lab.teacher_fit.steps
    final = json.loads((out / "eval.json").read_text())["final"]
    assert final["tasks"] == config.eval.max_tasks
    # what the recipe's comment says it prints
    for line in (
        "run_start",
        "sft_warmup_start",
        "teacher_adapter_fitted",
        "eval final",
        "run_end",
    ):
        assert line in result.output
    assert "held-out success" in result.output and "final" in result.output
    assert "no held-out probe (lab.teacher_fit.probe_tasks: 0)" in " ".join(result.output.split())
    resolved = RunConfig.from_yaml(out / "config.validated.yaml")
    assert resolved.memory.activation_checkpointing
