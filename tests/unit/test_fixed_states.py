"""Recovery at fixed states: the cold start's deviated episodes, stored once, answered by
each policy from the state after its first deviation; and their contrast, paired by state."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from helpers import ScriptedBackend, chain_call, final_text, miscopied_step, tool_call_text
from miniverl.config.models import RolloutConfig
from miniverl.environments.base import Task
from miniverl.environments.calc_chain import generate_tasks
from miniverl.environments.registry import make_environment
from miniverl.errors import CheckpointError
from miniverl.lab.benchmark.cell_runner import cold_fixed_states
from miniverl.lab.benchmark.contrasts import FIXED_RECOVERY, contrast, outcome_table
from miniverl.lab.benchmark.fixed_states import (
    FIXED_STATES_FILE,
    evaluation_tasks,
    load_fixed_states,
    policy_recovery,
    sample_fixed_states,
)
from miniverl.lab.benchmark.protocol import primary_endpoints, validate_protocol
from miniverl.trajectory.io import read_trajectories

ROLLOUT = RolloutConfig(
    max_turns=9, max_new_tokens_per_turn=40, max_total_tokens=900, max_parse_errors=3
)


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    chains = [
        t
        for t in generate_tasks("eval", 60, 5, (3,))
        if all(op != "multiply" for op, _ in t.data["steps"][1:])
    ]
    return chains[:3]


def _config(max_tasks: int) -> Any:
    """The keys the fixed states read of a run config."""
    return SimpleNamespace(
        eval=SimpleNamespace(split="eval", max_tasks=max_tasks, batch_size=1),
        rollout=ROLLOUT,
        run=SimpleNamespace(seed=3),
    )


def _policy(script: list[str]) -> ScriptedBackend:
    return ScriptedBackend(script, default=final_text("0"))


ENV = make_environment("calc_chain", checked=True)


def test_the_states_are_the_cold_starts_deviations_and_each_policy_continues_from_them(
    tasks: list[Task], tmp_path: Path
) -> None:
    a, b, _ = tasks
    cold_script = [
        *[
            chain_call(a, 0),
            tool_call_text(miscopied_step(a, 1)),
            final_text("0"),
        ],  # deviates at turn 1
        *[
            chain_call(b, 0),
            chain_call(b, 1),
            chain_call(b, 2),
            final_text(b.answer),
        ],  # on the path
        final_text("7"),  # a wrong answer at once: the episode ends, no state after it
    ]
    config = _config(3)
    assert evaluation_tasks(config, {"eval": tasks, "test": []}) == tasks
    record = sample_fixed_states(_policy(cold_script), ENV, tasks, config, tmp_path)
    stored = list(read_trajectories(tmp_path / FIXED_STATES_FILE))
    assert [t.task_id for t in stored] == [a.task_id]
    assert (record["tasks"], record["episodes"], record["states"]) == (3, 3, 1)
    assert record["split"] == "eval" and record["file"] == FIXED_STATES_FILE
    # the cold start, answering "0" after its own error, does not recover
    assert record["cold_start"]["outcomes"] == [
        {"trajectory_id": stored[0].trajectory_id, "from_turn": 2, "solved": 0}
    ]
    states = load_fixed_states(tmp_path, record)
    # a policy that re-calls the step the tool refused, then finishes, recovers
    fixer = _policy([chain_call(a, 1), chain_call(a, 2), final_text(a.answer)])
    got = policy_recovery(fixer, ENV, tasks, ROLLOUT, states)
    assert (got["states"], got["recovered"], got["rate"]) == (1, 1, 1.0)
    calls = fixer.calls
    assert len(calls) == 3  # the first two turns are the cold start's, replayed
    seen = fixer.tokenizer.decode(calls[0].prompt_ids)
    assert tool_call_text(miscopied_step(a, 1)) in seen and '"ok": false' in seen
    assert seen.count("<|im_start|>assistant") == 3  # two replayed turns, then its own
    assert seen.rstrip().endswith("<|im_start|>assistant")
    lost = policy_recovery(_policy([]), ENV, tasks, ROLLOUT, states)
    assert (lost["states"], lost["recovered"]) == (1, 0)


def test_states_come_from_the_evaluation_tasks_only(tasks: list[Task]) -> None:
    config = _config(1)
    assert evaluation_tasks(config, {"eval": tasks, "test": []}) == tasks[:1]
    config.eval.split = "test"
    assert evaluation_tasks(config, {"eval": tasks, "test": tasks[1:]}) == tasks[1:2]


def test_changed_or_missing_states_are_refused(tasks: list[Task], tmp_path: Path) -> None:
    a = tasks[0]
    cold = _policy([chain_call(a, 0), tool_call_text(miscopied_step(a, 1))])
    record = sample_fixed_states(cold, ENV, tasks[:1], _config(1), tmp_path)
    assert record["states"] == 1
    path = tmp_path / FIXED_STATES_FILE
    path.write_text(path.read_text().replace(a.task_id, a.task_id + "x"))
    with pytest.raises(CheckpointError, match="fixed states are missing or changed"):
        load_fixed_states(tmp_path, record)
    path.unlink()
    with pytest.raises(CheckpointError, match="fixed states are missing or changed"):
        load_fixed_states(tmp_path, record)
    with pytest.raises(CheckpointError, match="stored no fixed states") as info:
        cold_fixed_states({"seed": 4, "fixed_states": None})
    assert "eval.fixed_state_recovery=true" in info.value.hint


def _cell(arm: str, seed: int, solved: dict[str, int]) -> dict[str, Any]:
    outcomes = [{"trajectory_id": t, "from_turn": 1, "solved": s} for t, s in solved.items()]
    return {"arm": arm, "seed": seed, "tasks": [], "fixed_state_recovery": {"outcomes": outcomes}}


def test_the_fixed_recovery_contrast_pairs_the_states_of_each_seed() -> None:
    cells = [
        _cell("opd", 1, {"x:gate": 1, "y:gate": 1, "z:gate": 0}),
        _cell("offline_kd", 1, {"x:gate": 0, "y:gate": 1, "z:gate": 0}),
        _cell("opd", 2, {"x:gate": 1, "w:gate": 1}),
        _cell("offline_kd", 2, {"x:gate": 0, "w:gate": 0}),
        _cell("opd", 3, {"v:gate": 1}),
        _cell("offline_kd", 3, {"v:gate": 0}),
        {"arm": "offline_kd", "seed": 9, "tasks": [], "fixed_state_recovery": None},
    ]
    table = outcome_table(cells, "opd", FIXED_RECOVERY)
    assert table == {
        "1": {"x:gate": 1.0, "y:gate": 1.0, "z:gate": 0.0},
        "2": {"x:gate": 1.0, "w:gate": 1.0},
        "3": {"v:gate": 1.0},
    }
    row = contrast(cells, "opd", "offline_kd", FIXED_RECOVERY, resamples=200, bootstrap_seed=0)
    assert row["endpoint"] == FIXED_RECOVERY
    # per seed, the mean over its states of opd's outcome minus offline_kd's
    assert row["seeds"] == ["1", "2", "3"]
    assert row["mean_difference"] == pytest.approx((1 / 3 + 1 + 1) / 3)


def test_a_protocol_may_name_fixed_recovery_as_a_primary_endpoint() -> None:
    content = {
        "endpoints": ["fixed_recovery", "all"],
        "primary_contrasts": [["opd", "offline_kd"]],
        "seeds": [1, 2],
        "arms": ["opd", "offline_kd"],
        "thresholds": {"alpha": 0.05},
        "lr_grid": {"grid": [0.001], "split": "eval"},
    }
    run = {"where": "protocol.yaml", "seeds": [1, 2], "arms": ["opd", "offline_kd"]}
    assert validate_protocol(content, **run) == []
    assert primary_endpoints(content) == [FIXED_RECOVERY, None]
    assert validate_protocol({**content, "endpoints": ["fixed"]}, **run) == [
        "protocol.yaml: endpoints must be a non-empty list of 'all', 'recovery', 'fixed_recovery' or 'k=<n>', got ['fixed']"
    ]


def test_the_per_seed_summary_counts_each_policys_recoveries() -> None:
    from miniverl.lab.benchmark.fixed_states import recovery_by_seed, recovery_lines

    colds = [
        {"seed": 4, "fixed_states": {"split": "test", "states": 3, "cold_start": {"recovered": 0}}},
        {"seed": 5, "fixed_states": None},
    ]
    rows = [
        {"arm": "opd", "seed": 4, "fixed_state_recovery": {"recovered": 2}},
        {"arm": "offline_kd", "seed": 4, "fixed_state_recovery": {"recovered": 1}},
        {"arm": "opd", "seed": 4, "fixed_state_recovery": {"recovered": 3}},
        {"arm": "opd", "seed": 5, "fixed_state_recovery": {"recovered": 3}},
    ]
    table = recovery_by_seed(colds, rows)
    assert table == [
        {
            "seed": 4,
            "split": "test",
            "states": 3,
            "cold_start": 0,
            "arms": {"opd": [2, 3], "offline_kd": [1]},
        }
    ]
    assert recovery_lines(table) == [
        "seed 4: of the cold start's 3 own deviations on the test split, recovered by the cold "
        "start 0, opd 2 / 3, offline_kd 1"
    ]


def test_each_arm_is_also_read_against_the_cold_start_at_the_same_states() -> None:
    """The negative control's reading: the cold start's own continuation is the reference."""
    from miniverl.lab.benchmark.contrasts import COLD_START_POLICY, against_the_cold_start

    colds = [
        {"seed": s, "fixed_states": {"cold_start": {"outcomes": outcomes}}}
        for s, outcomes in (
            (1, [{"trajectory_id": "x", "solved": 0}, {"trajectory_id": "y", "solved": 1}]),
            (2, [{"trajectory_id": "x", "solved": 0}]),
            (3, [{"trajectory_id": "v", "solved": 0}]),
        )
    ]
    cells = [
        _cell("opd_self", 1, {"x": 0, "y": 0}),
        _cell("opd_self", 2, {"x": 0}),
        _cell("opd_self", 3, {"v": 1}),
    ]
    (row,) = against_the_cold_start(colds, cells, ["opd_self"], resamples=100, bootstrap_seed=0)
    assert (row["arm"], row["reference"], row["endpoint"]) == (
        "opd_self",
        COLD_START_POLICY,
        FIXED_RECOVERY,
    )
    assert row["seed_differences"] == [-0.5, 0.0, 1.0] and row["p_holm"] is None
    assert not row["primary"] and not row["holm_family"]
    assert (
        against_the_cold_start([{"seed": 1}], cells, ["opd_self"], resamples=1, bootstrap_seed=0)
        == []
    )
