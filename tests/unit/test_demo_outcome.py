"""The demo's outcome lines: the teacher's held-out success is read from the run's own
teacher event, the refused-call counts from the held-out episodes, and the sentence states
only what one run's counts say, whichever way the arms fall."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from miniverl.errors import CheckpointError
from miniverl.lab.demo import (
    check_shared_start,
    comparison_run_dir,
    demo_sentence,
    refused_call_episodes,
    teacher_heldout,
)
from miniverl.trajectory import io
from miniverl.utils.runs import RunPaths

WARM = {"solved": 2, "tasks": 24, "success_rate": 2 / 24}


def _events(run: Path, *records: dict[str, object]) -> Path:
    run.mkdir()
    (run / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_the_teacher_row_comes_from_the_last_teacher_event(tmp_path: Path) -> None:
    run = _events(
        tmp_path / "run",
        {"event": "run_start"},
        {"event": "toy_teacher_fitted", "heldout_success": 0.5},
        {"event": "toy_teacher_reused", "heldout_success": 0.958},
    )
    assert teacher_heldout(run) == 0.958
    assert teacher_heldout(_events(tmp_path / "none", {"event": "run_start"})) is None
    assert teacher_heldout(tmp_path / "missing") is None


def test_the_sentence_compares_the_arms_whichever_way_they_fall() -> None:
    ahead = demo_sentence(
        WARM, {"opd": {**WARM, "solved": 13}, "offline_kd": {**WARM, "solved": 4}}, 0.958
    )
    assert ahead == (
        "From the same SFT warm-up (2/24 held-out tasks solved), the same teacher and the same "
        "number of updates, training on the student's own episodes (OPD) reached 13/24 and "
        "training on the teacher's episodes (offline_kd) reached 4/24: OPD ended ahead of "
        "offline_kd in this one run; the teacher solves 96% of the same tasks. One seed shows "
        "what happened here, not a difference the lab claims."
    )
    behind = demo_sentence(WARM, {"opd": WARM, "offline_kd": {**WARM, "solved": 5}}, None)
    assert behind is not None and "reached 2/24" in behind and "reached 5/24" in behind
    assert "OPD ended behind offline_kd in this one run." in behind
    level = demo_sentence(WARM, {"opd": WARM, "offline_kd": WARM}, None)
    assert level is not None and "OPD and offline_kd ended level" in level
    assert demo_sentence(None, {"opd": WARM, "offline_kd": WARM}, 0.9) is None
    assert demo_sentence(WARM, {"opd": WARM}, 0.9) is None


def _episode(tag: str, refused: int, solved: bool) -> SimpleNamespace:
    return SimpleNamespace(metadata={"eval_tag": tag}, invalid_tool_calls=refused, solved=solved)


def test_refused_call_episodes_counts_ok_false_observations_of_one_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only episodes of the asked evaluation with a refused call (an ``ok: false`` answer or
    an unparseable call: ``invalid_tool_calls``) count, and of those only the solved ones are
    "solved of those"."""
    episodes = [
        _episode("final", 0, solved=True),  # no refusal
        _episode("final", 1, solved=True),  # refused, recovered
        _episode("final", 2, solved=False),  # refused, not recovered
        _episode("after_warmup", 1, solved=True),  # another evaluation
    ]
    run = tmp_path / "run"
    RunPaths(run).eval_trajectories.parent.mkdir(parents=True)
    RunPaths(run).eval_trajectories.write_text("")
    monkeypatch.setattr(io, "iter_trajectories", lambda path: iter(episodes))
    assert refused_call_episodes(run, "final") == (2, 1)
    assert refused_call_episodes(run, "after_warmup") == (1, 1)
    assert refused_call_episodes(tmp_path / "missing", "final") == (0, 0)


def test_the_comparison_arm_goes_beside_the_opd_run() -> None:
    assert comparison_run_dir(Path("runs/demo")) == Path("runs/demo-offline_kd")
    assert comparison_run_dir(Path("/x/my-run")) == Path("/x/my-run-offline_kd")


def test_arms_from_different_warm_up_weights_are_refused() -> None:
    dirs = {"opd": Path("a"), "offline_kd": Path("b")}
    same = {Path("a"): "f" * 64, Path("b"): "f" * 64}
    assert check_shared_start(dirs, same.get) == "f" * 64
    with pytest.raises(CheckpointError, match="did not start from the same SFT warm-up") as info:
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
