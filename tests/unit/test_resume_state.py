"""What a training checkpoint stores, and how a resume puts the run directory back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from miniverl.config.models import RunConfig
from miniverl.errors import CheckpointError
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend, ToyModelConfig
from miniverl.training.checkpoint import (
    LOG_NAMES,
    ResumeCounters,
    choose_resume_checkpoint,
    load_training_checkpoint,
    log_sizes,
    restore_logs,
    source_state,
    write_training_checkpoint,
)
from miniverl.training.optim import Schedule, build_optimizer
from miniverl.utils.logging import EventLog
from miniverl.utils.runs import RunPaths

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ToyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
COUNTERS = ResumeCounters(
    cycle=2,
    global_step=9,
    parameter_version=8,
    rollout_policy_version=7,
    task_cursor=12,
    chunk_size=32,
    main_start_step=3,
    eval_results={"baseline": {"success": 0.25}},
)


class _Source:
    def __init__(self, state: dict[str, object]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, object]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.state = dict(state)


def _append(path: Path, *rows: dict[str, object]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def _checkpoint(paths: RunPaths, name: str = "cycle-0002", cycle: int = 2) -> Path:
    student = ToyBackend(SMALL, ToyTokenizer(), model_id="toy-student", seed=1)
    optimizer = build_optimizer(student.trainable_parameters(), RunConfig.from_mapping({}).train)
    for p in student.trainable_parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    return write_training_checkpoint(
        paths.checkpoint(name),
        counters=dataclasses.replace(COUNTERS, cycle=cycle),
        student=student,
        optimizer=optimizer,
        schedule=Schedule(peak_lr=1e-3),
        source=_Source({"cursor": 5}),
        teacher=None,
        paths=paths,
        config_digest="d" * 64,
    )


def test_the_counters_and_log_lengths_round_trip(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    _append(paths.metrics, {"kind": "step", "loss": 1.0})
    _append(paths.trajectories, {"trajectory_id": "a"})
    sizes = log_sizes(paths)
    assert sizes == {
        "metrics": paths.metrics.stat().st_size,
        "trajectories": paths.trajectories.stat().st_size,
        "eval_trajectories": 0,
        "token_analysis": 0,
    }
    assert tuple(sizes) == LOG_NAMES
    path = _checkpoint(paths)
    loaded = load_training_checkpoint(path, device="cpu", config_digest="d" * 64)
    assert ResumeCounters.from_state(loaded.state) == COUNTERS
    assert loaded.state["jsonl_sizes"] == sizes
    assert source_state(loaded.state) == {"cursor": 5}
    assert source_state({"offline_kd": {"cursor": 1}}) == {"cursor": 1}
    assert loaded.optimizer, "optimizer moments must be stored"


def test_a_resume_cuts_every_log_back_to_its_checkpointed_length(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    _append(paths.metrics, {"kind": "step", "loss": 1.0})
    _append(paths.token_analysis, {"cycle": 0})
    at_checkpoint = {name: getattr(paths, name).read_bytes() if getattr(paths, name).exists() else b"" for name in LOG_NAMES}  # fmt: skip
    path = _checkpoint(paths)
    _append(paths.metrics, {"kind": "step", "loss": 2.0})
    _append(paths.trajectories, {"trajectory_id": "written after the checkpoint"})
    _append(paths.token_analysis, {"cycle": 1})
    state = load_training_checkpoint(path, device="cpu", config_digest="d" * 64).state

    events = EventLog(None)
    restore_logs(paths, state, path, explicit=False, events=events)
    for name in LOG_NAMES:
        log = getattr(paths, name)
        assert (log.read_bytes() if log.exists() else b"") == at_checkpoint[name], name
    assert events.events == []


def test_an_explicit_older_resume_sets_the_newer_tail_aside(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    _append(paths.metrics, {"kind": "step", "loss": 1.0})
    older = _checkpoint(paths, "cycle-0001", cycle=1)
    _append(paths.metrics, {"kind": "step", "loss": 2.0})
    _checkpoint(paths, "cycle-0002")
    state = load_training_checkpoint(older, device="cpu", config_digest="d" * 64).state

    events = EventLog(None)
    restore_logs(paths, state, older, explicit=True, events=events)
    assert [json.loads(x)["loss"] for x in paths.metrics.read_text().splitlines()] == [1.0]
    assert [e["event"] for e in events.events] == ["checkpoints_superseded"]
    assert not paths.checkpoint("cycle-0002").exists()


def test_a_checkpoint_of_another_recipe_or_a_finished_run_is_refused(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        choose_resume_checkpoint(paths, None)
    path = _checkpoint(paths)
    assert choose_resume_checkpoint(paths, None) == path
    with pytest.raises(CheckpointError, match="different config"):
        load_training_checkpoint(path, device="cpu", config_digest="e" * 64)
    final = _checkpoint(paths, "final")
    paths.eval_json.write_text("{}")
    with pytest.raises(CheckpointError, match="already finished"):
        choose_resume_checkpoint(paths, None, final)
