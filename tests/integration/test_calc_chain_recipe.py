"""recipes/toy_calc_chain.yaml validates and trains a few OPD cycles on the toy backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.config.models import RunConfig
from miniverl.environments.calc_chain import parse_prompt, partition_of
from miniverl.trajectory.io import read_trajectories
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "toy_calc_chain.yaml"
SHRINK = [
    "models.toy_fit.max_steps=10",
    "models.toy_fit.check_every=10",
    "models.toy_fit.extra_tasks=4",
    "models.toy_fit.probe_tasks=2",
    "models.toy_fit.batch_size=4",
    "environment.train_tasks=6",
    "environment.eval_tasks=2",
    "environment.test_tasks=12",
    "train.sft_warmup_until.max_cycles=1",
    "train.cycles=3",
    "train.rollouts_per_cycle=2",
]


def test_the_recipe_is_the_documented_protocol_shape() -> None:
    config = RunConfig.from_yaml(RECIPE)
    assert config.environment.name == "calc_chain" and config.environment.difficulty == "mixed"
    assert config.environment.params == {
        "train_k": [1, 2, 3],
        "eval_k": [1, 2, 3],
        "test_k": [1, 2, 3, 4, 5, 6],
        "spare_turns": 2,
    }
    assert config.environment.test_tasks == 600 * 6
    assert config.rollout.max_turns == 6 + 1 + 2 and config.rollout.max_parse_errors == 3


def test_a_few_cycles_train_on_calc_chain(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["train", str(RECIPE), *SHRINK, "--output", str(out), "--no-report", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    paths = RunPaths(out)
    manifest = json.loads(paths.manifest.read_text())
    env = manifest["environment"]
    assert env["name"] == "calc_chain" and env["max_turn_budget"] == 9
    assert env["split_sizes"] == {"train": 6, "eval": 2, "test": 12}
    assert manifest["teacher"]["fit_tasks"] == 6 + 4
    cycles = [
        json.loads(line)
        for line in paths.metrics.read_text().splitlines()
        if json.loads(line).get("kind") == "cycle"
    ]
    assert len(cycles) == 3
    trajectories = read_trajectories(paths.trajectories)
    policy = [t for t in trajectories if t.metadata["source"] == "policy"]
    assert len(policy) == 3 * 2
    for traj in trajectories:
        assert traj.environment == "calc_chain" and traj.task_id.startswith("chain-train-")
    for traj in policy:
        assert len(traj.turns) <= traj_k(traj) + 3
    oracle = [t for t in trajectories if t.metadata["source"] == "oracle"]
    assert oracle and all(t.solved for t in oracle)
    final = json.loads(paths.eval_json.read_text())["final"]
    assert final["tasks"] == 2


def traj_k(traj: object) -> int:
    """Chain length of a trajectory's task, read back from its prompt span."""
    user = traj.spans_of("user")[0].text  # type: ignore[attr-defined]
    prompt = next(line for line in user.splitlines() if line.startswith("Start with "))
    prompt = prompt.split("<|im_end|>")[0]
    assert partition_of(prompt) == "train"
    return len(parse_prompt(prompt)[1])
