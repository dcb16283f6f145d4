"""The demo's outcome lines: the refused-call counts come from the held-out episodes, the
recovery counts from each arm's own checkpoint, and the sentence states only what one run's
counts say, whichever way the arms fall."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from miniverl.errors import CheckpointError
from miniverl.lab.demo import (
    check_shared_start,
    comparison_run_dir,
    demo_sentence,
)
from miniverl.utils.runs import RunPaths

WARM = {"solved": 2, "tasks": 24, "success_rate": 2 / 24}


RECOVERY = {
    "tasks": 24,
    "states": 10,
    "recovered": {"start": 0, "opd": 4, "offline_kd": 1, "teacher": 9},
    "teacher_solved": 23,
}


def test_the_sentence_compares_the_arms_whichever_way_they_fall() -> None:
    ahead = demo_sentence(
        WARM, {"opd": {**WARM, "solved": 13}, "offline_kd": {**WARM, "solved": 4}}, RECOVERY
    )
    assert ahead == (
        "From the same SFT warm-up (2/24 held-out tasks solved), the same teacher and the same "
        "number of updates, training on the student's own episodes (OPD) reached 13/24 and "
        "training on the teacher's episodes (offline_kd) reached 4/24; continued from the "
        "warm-up student's own 10 errors, where the warm-up itself recovers 0, OPD's student "
        "recovers 4 and offline_kd's 1: OPD learned more recovery from its own mistakes than "
        "offline_kd (the teacher recovers 9 and solves 23/24 tasks). One seed shows what "
        "happened here, not a difference the lab claims."
    )
    fewer = {**RECOVERY, "recovered": {**RECOVERY["recovered"], "opd": 0}}
    behind = demo_sentence(WARM, {"opd": WARM, "offline_kd": {**WARM, "solved": 5}}, fewer)
    assert behind is not None and "reached 2/24" in behind and "reached 5/24" in behind
    assert "OPD's student recovers 0 and offline_kd's 1: OPD learned less recovery" in behind
    level = {**RECOVERY, "recovered": {**RECOVERY["recovered"], "opd": 1}}
    same = demo_sentence(WARM, {"opd": WARM, "offline_kd": WARM}, level)
    assert same is not None and "OPD and offline_kd recovered equally often" in same
    # without recovery states the sentence falls back on held-out success alone
    none = demo_sentence(WARM, {"opd": WARM, "offline_kd": {**WARM, "solved": 5}}, None)
    assert none is not None and none.endswith(
        "reached 5/24: OPD ended behind offline_kd. One seed shows what happened here, not a "
        "difference the lab claims."
    )
    assert "ended level" in str(demo_sentence(WARM, {"opd": WARM, "offline_kd": WARM}, None))
    assert demo_sentence(None, {"opd": WARM, "offline_kd": WARM}, RECOVERY) is None
    assert demo_sentence(WARM, {"opd": WARM}, RECOVERY) is None


def test_the_comparison_arm_goes_beside_the_opd_run() -> None:
    assert comparison_run_dir(Path("runs/demo")) == Path("runs/demo-offline_kd")
    assert comparison_run_dir(Path("/x/my-run")) == Path("/x/my-run-offline_kd")


def test_arms_from_different_warm_up_weights_are_refused() -> None:
    dirs = {"opd": Path("a"), "offline_kd": Path("b")}
    same = {Path("a"): "f" * 64, Path("b"): "f" * 64}
    assert check_shared_start(dirs, same.get) == "f" * 64
    with pytest.raises(CheckpointError, match="did not start from the same weights") as info:
        check_shared_start(dirs, {Path("a"): "f" * 64, Path("b"): "e" * 64}.get)
    assert "opd ffffffffffff, offline_kd eeeeeeeeeeee" in info.value.message
    with pytest.raises(CheckpointError, match="offline_kd None"):
        check_shared_start(dirs, {Path("a"): "f" * 64}.get)


def test_the_demo_runs_its_recipe_and_the_same_recipe_as_offline_kd() -> None:
    from miniverl.config.presets import DEMO_COMPARISON_MODE, DEMO_MODE, demo_config

    assert (DEMO_MODE, DEMO_COMPARISON_MODE) == ("opd", "offline_kd")
    own, other = demo_config(), demo_config(mode=DEMO_COMPARISON_MODE)
    assert own.run.mode == DEMO_MODE and other.run.mode == DEMO_COMPARISON_MODE
    assert (own.run.name, other.run.name) == ("demo", "demo-offline_kd")
    # nothing else differs: the same seed, budgets, teacher and warm-up
    mine, theirs = own.to_dict(), other.to_dict()
    for config in (mine, theirs):
        config["run"].pop("mode"), config["run"].pop("name")
    assert mine == theirs
    assert demo_config(fast=True, mode=DEMO_COMPARISON_MODE).run.name == "demo-fast-offline_kd"


class _Policy:
    """Remembers which weights it holds: the checkpoint path it was last loaded from."""

    tokenizer = None

    def __init__(self) -> None:
        self.loaded = "random"

    def load_trainable_state_dict(self, state: dict[str, str]) -> None:
        self.loaded = state["from"]

    def load_full_state_dict(self, state: dict[str, str]) -> None:
        self.loaded = state["from"]


def test_recovery_continues_the_shared_starts_states_with_each_arms_own_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The states are the cold start's stored ones; the start's count comes from the cold
    start's weights, each arm's from that arm's final checkpoint, the teacher's from the
    teacher file (its own greedy success too)."""
    from miniverl.config import loading
    from miniverl.environments import registry, tasks_file
    from miniverl.lab.benchmark import fixed_states
    from miniverl.lab.demo import start_error_recovery
    from miniverl.lab.teachers import gate
    from miniverl.models import factory, runtime
    from miniverl.training import checkpoint, cold_start
    from miniverl.trajectory import io as trajectory_io

    runs = {"opd": tmp_path / "demo", "offline_kd": tmp_path / "demo-offline_kd"}
    start, teacher = tmp_path / "cold-start", tmp_path / "teacher.safetensors"
    policy = _Policy()
    by_weights = {
        str(start): 1,
        str(RunPaths(runs["opd"]).final_checkpoint): 7,
        str(RunPaths(runs["offline_kd"]).final_checkpoint): 2,
        str(teacher): 9,
    }
    config = SimpleNamespace(
        environment=SimpleNamespace(name="calc_chain", params={}),
        rollout=None,
        run=SimpleNamespace(seed=3),
    )
    monkeypatch.setattr(loading, "load_resolved_config", lambda run: config)
    monkeypatch.setattr(registry, "make_environment", lambda name, **kw: "env")
    monkeypatch.setattr(tasks_file, "build_splits", lambda env, cfg: {})
    tasks = [SimpleNamespace(task_id=f"t{i}") for i in range(24)]
    monkeypatch.setattr(fixed_states, "evaluation_tasks", lambda cfg, splits: tasks)
    monkeypatch.setattr(factory, "build_tokenizer", lambda cfg: None)
    monkeypatch.setattr(runtime, "build_runtime", lambda *a, **k: SimpleNamespace(student=policy))
    monkeypatch.setattr(
        checkpoint, "load_checkpoint", lambda p: SimpleNamespace(trainable={"from": str(p)})
    )
    monkeypatch.setattr(
        cold_start,
        "load_cold_start",
        lambda d, student: student.load_trainable_state_dict({"from": str(d)}),
    )
    monkeypatch.setattr("safetensors.torch.load_file", lambda p: {"from": str(p)})
    read: list[Path] = []
    monkeypatch.setattr(
        trajectory_io,
        "read_trajectories",
        lambda path: (
            read.append(path)
            or [SimpleNamespace(task_id=f"t{i}") for i in range(10)]
            + [SimpleNamespace(task_id="x")]
        ),
    )
    monkeypatch.setattr(
        fixed_states,
        "policy_recovery",
        lambda p, env, tasks, rollout, states: {
            "recovered": by_weights[p.loaded] if len(states) == 10 else -1
        },
    )
    monkeypatch.setattr(
        gate,
        "gate_episodes",
        lambda p, env, tasks, rollout, **kw: (
            [SimpleNamespace(solved=p.loaded == str(teacher))] * 23
        ),
    )
    got = start_error_recovery(runs, start, teacher)
    assert read == [start / "fixed-states.jsonl"]
    assert got == {
        "tasks": 24,
        "states": 10,
        "recovered": {"start": 1, "opd": 7, "offline_kd": 2, "teacher": 9},
        "teacher_solved": 23,
    }


def test_an_arms_error_reaches_the_user_as_its_typed_error_from_either_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In its own process an arm returns a MiniverlError as (class, message, hint), which the
    parent raises again as that class; in-process it raises; the CLI prints message and hint
    and exits 1."""
    from typer.testing import CliRunner

    from miniverl.cli.main import app
    from miniverl.lab import demo

    def refuse(*args: object, **kwargs: object) -> None:
        raise CheckpointError("the cold start does not match", hint="reinstall miniverl")

    monkeypatch.setattr("miniverl.lab.run.start_run", refuse)
    options = {"fast": True, "overwrite": False, "quiet": True, "verbose": False}
    got = demo.train_demo_arm("opd", tmp_path / "run", **options, in_child=True)
    assert got == {
        "error": ("CheckpointError", "the cold start does not match", "reinstall miniverl")
    }
    with pytest.raises(CheckpointError, match="the cold start does not match") as raised:
        demo.raise_arm_error({"opd": {"solved": 1}, "offline_kd": got})
    assert raised.value.hint == "reinstall miniverl"
    demo.raise_arm_error({"opd": {"solved": 1}})  # no error, nothing raised
    with pytest.raises(CheckpointError, match="the cold start does not match"):
        demo.train_demo_arm("opd", tmp_path / "run2", **options, in_child=False)

    def arms_fail(*args: object, **kwargs: object) -> None:
        demo.raise_arm_error({"offline_kd": {"error": ("CheckpointError", "arm failed", "a hint")}})

    monkeypatch.setattr(demo, "train_demo_arms", arms_fail)
    result = CliRunner().invoke(app, ["demo", "--output", str(tmp_path / "d"), "--quiet"])
    assert result.exit_code == 1
    assert "arm failed" in result.output and "a hint" in result.output


def test_the_arms_train_one_after_the_other_on_one_core_or_when_verbose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer usable cores than arms, or --verbose, trains every arm in this process (in_child
    False: errors raise here), in the order the arms are given."""
    from rich.console import Console

    from miniverl.lab import demo

    calls: list[tuple[str, bool]] = []

    def arm(name: str, directory: Path, **options: object) -> dict[str, object]:
        calls.append((name, bool(options["in_child"])))
        return {"final": name}

    monkeypatch.setattr(demo, "train_demo_arm", arm)
    runs = {"opd": tmp_path / "a", "offline_kd": tmp_path / "b"}
    options = {"fast": True, "overwrite": False, "quiet": True, "console": Console()}
    monkeypatch.setattr(demo.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    got = demo.train_demo_arms(runs, **options, verbose=False)
    assert got == {"opd": {"final": "opd"}, "offline_kd": {"final": "offline_kd"}}
    monkeypatch.setattr(demo.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    demo.train_demo_arms(runs, **options, verbose=True)
    assert calls == [("opd", False), ("offline_kd", False)] * 2
