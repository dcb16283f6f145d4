"""Live metrics (console line, TensorBoard, offline wandb),
periodic held-out evaluation and checkpoint retention."""

from __future__ import annotations

import json
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from helpers import tiny_config
from miniverl.errors import ConfigError
from miniverl.training.checkpoint import prune_cycle_checkpoints
from miniverl.training.live import cycle_summary, format_live_line
from miniverl.training.recipe import OPDTrainer


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_live_line_names_loss_kl_and_success() -> None:
    steps = [{"loss": 1.0, "divergence_loss": 0.5}, {"loss": 0.5, "divergence_loss": 0.25}]
    summary = cycle_summary(steps, {"solved": 3, "tasks": 4, "success_rate": 0.75})
    assert summary["mean_loss"] == pytest.approx(0.75)
    assert summary["mean_divergence"] == pytest.approx(0.375)
    line = format_live_line(summary, {"solved": 1, "tasks": 2, "success_rate": 0.5})
    assert line == "loss 0.750 | KL 0.375 | rollouts 3/4 (75%) | held-out 1/2 (50%)"


def test_checkpoint_keep_removes_only_the_oldest_cycles(tmp_path: Path) -> None:
    for name in ("warmup", "cycle-0000", "cycle-0001", "cycle-0010", "final", ".cycle-0002.tmp"):
        (tmp_path / name).mkdir()
    assert prune_cycle_checkpoints(tmp_path, keep=2) == ["cycle-0000"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".cycle-0002.tmp", "cycle-0001", "cycle-0010", "final", "warmup"
    ]  # fmt: skip
    assert prune_cycle_checkpoints(tmp_path, keep=None) == []


def _tfrecords(path: Path) -> list[bytes]:
    """The raw records of a TensorBoard event file (TFRecord framing, CRCs skipped)."""
    data, out, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        out.append(data[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
    return out


def _tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for file in logdir.glob("events.out.tfevents.*"):
        for raw in _tfrecords(file):
            event = Event.FromString(raw)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


class _FakeWandbRun:
    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []
        self.finished = False

    def log(self, values: dict[str, float], step: int) -> None:
        self.logged.append((values, step))

    def finish(self) -> None:
        self.finished = True


@pytest.mark.slow
def test_one_run_writes_every_live_sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorboard + (stand-in) wandb + eval.every + checkpoint.keep in one tiny run."""
    pytest.importorskip("tensorboardX")
    init_calls: list[dict[str, Any]] = []
    run = _FakeWandbRun()

    def init(**kwargs: Any) -> _FakeWandbRun:
        init_calls.append(kwargs)
        return run

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    config = tiny_config(
        "train.cycles=3",
        "logging.tensorboard=true",
        "logging.wandb=true",
        "eval.every=1",
        "checkpoint.keep=2",
        "loss.sampled_token_nll_weight=0.5",
    )
    trainer = OPDTrainer(config, output_dir=tmp_path / "run", quiet=True)
    trainer.train()
    root = tmp_path / "run"

    metrics = _records(root / "metrics.jsonl")
    periodic = [r for r in metrics if r["kind"] == "eval" and r["tag"].startswith("cycle-")]
    assert [(r["tag"], r["cycle"]) for r in periodic] == [("cycle-0000", 0), ("cycle-0001", 1)]
    cycles = [r for r in metrics if r["kind"] == "cycle"]
    steps = [r for r in metrics if r["kind"] == "step" and r["cycle"] == 0]
    assert cycles[0]["mean_divergence"] == pytest.approx(
        sum(s["divergence_loss"] for s in steps) / len(steps)
    )

    ends = [e for e in _records(root / "events.jsonl") if e["event"] == "cycle_end"]
    assert [e["cycle"] for e in ends] == [0, 1, 2]
    assert ends[0]["rollout_solved"] == cycles[0]["rollouts"]["solved"]

    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == [
        "cycle-0001", "cycle-0002", "final", "warmup"
    ]  # fmt: skip

    scalars = _tensorboard_scalars(root / "tensorboard")
    last_cycle = cycles[-1]
    assert scalars["rollout/success_rate"][-1] == (
        last_cycle["parameter_version"],
        pytest.approx(last_cycle["rollouts"]["success_rate"]),
    )
    opd_steps = [r for r in metrics if r["kind"] == "step" and r["phase"] == "opd"]
    assert [s for s, _ in scalars["opd/divergence"]] == [
        r["global_optimizer_step"] for r in opd_steps
    ]
    assert [v for _, v in scalars["opd/divergence"]] == pytest.approx(
        [r["divergence_loss"] for r in opd_steps]
    )
    assert len(scalars["eval/eval_success_rate"]) == 4 + 1  # baseline, warm-up, 2 periodic, final

    assert init_calls[0]["mode"] == "offline"
    assert run.finished
    assert [v["opd/loss"] for v, _ in run.logged if "opd/loss" in v] == pytest.approx(
        [r["loss"] for r in opd_steps]
    )


def test_missing_tensorboard_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from miniverl.config.models import LoggingConfig
    from miniverl.training.live import LiveSinks

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match=r"logging\.tensorboard: true needs tensorboardX"):
        LiveSinks(LoggingConfig(tensorboard=True), Path("unused"), run_name="x")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"logging\.wandb: true needs the wandb package"):
        LiveSinks(LoggingConfig(wandb=True), Path("unused"), run_name="x")


def test_real_wandb_writes_an_offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With wandb installed: an offline run directory appears and nothing needs the network."""
    pytest.importorskip("wandb")
    from miniverl.config.models import LoggingConfig
    from miniverl.training.live import LiveSinks

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sinks = LiveSinks(LoggingConfig(wandb=True), tmp_path, run_name="offline-check")
    sinks.scalars(1, {"opd/loss": 0.5})
    sinks.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_eval_every_without_held_out_tasks_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"eval\.every needs held-out tasks"):
        tiny_config(
            "eval.every=2",
            "environment.eval_tasks=0",
            "eval.baseline=false",
            "eval.after_warmup=false",
        )
