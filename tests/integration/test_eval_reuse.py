"""A run whose weights did not change since its last evaluation records that one again as
``final`` (a cold start: the warm-up, its evaluation, no cycle) instead of rolling out twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import tiny_config
from miniverl.inspection.run_dir import read_jsonl as _rows
from miniverl.lab.run import start_run
from miniverl.training.evaluate import evaluate_policy

COLD_START = ("train.sft_warmup_cycles=2", "train.cycles=0", "eval.baseline=false")


def _episodes(path: Path, tag: str) -> list[dict[str, Any]]:
    return [t for t in _rows(path) if t["metadata"].get("eval_tag") == tag]


def _content(episode: dict[str, Any]) -> dict[str, Any]:
    """The episode without its name: id and evaluation tag."""
    meta = {k: v for k, v in episode["metadata"].items() if k != "eval_tag"}
    return {**episode, "trajectory_id": None, "metadata": meta}


def test_a_cold_start_records_its_after_warmup_evaluation_as_final(tmp_path: Path) -> None:
    trainer = start_run(tiny_config(*COLD_START), output_dir=tmp_path / "run")
    trainer.train()
    events = _rows(trainer.paths.events)
    evals = [e for e in events if e["event"] == "eval"]
    [reused] = [e for e in events if e["event"] == "eval_reused"]
    assert [e["tag"] for e in evals] == ["after_warmup", "final"]
    assert (reused["tag"], reused["from_tag"]) == ("final", "after_warmup")
    assert reused["parameter_version"] == evals[0]["parameter_version"] == 2
    assert {k: v for k, v in evals[1].items() if k not in ("tag", "time", "monotonic_s")} == {
        k: v for k, v in evals[0].items() if k not in ("tag", "time", "monotonic_s")
    }
    warm = _episodes(trainer.paths.eval_trajectories, "after_warmup")
    final = _episodes(trainer.paths.eval_trajectories, "final")
    assert [_content(e) for e in final] == [_content(e) for e in warm]
    assert [e["trajectory_id"] for e in final] == [f"{e['task_id']}:eval-final:v2" for e in warm]
    assert len({e["trajectory_id"] for e in warm + final}) == len(warm) * 2
    summary = json.loads(trainer.paths.eval_json.read_text())
    assert summary["final"]["solved"] == summary["after_warmup"]["solved"]

    # what it stands in for: rolling the split out again on these weights gives the same episodes
    cfg = trainer.config
    again, episodes = evaluate_policy(
        trainer.runner,
        trainer.splits[cfg.eval.split][: cfg.eval.max_tasks],
        tag="final",
        split=cfg.eval.split,
        seed=cfg.run.seed,
        temperature=0.0,
        batch_size=cfg.eval.batch_size,
        parameter_version=trainer.state.parameter_version,
        global_step=trainer.state.global_step,
        progress=trainer.progress,
    )
    assert [e.model_dump(mode="json") for e in episodes] == final
    assert again["solved"] == evals[1]["solved"]


def test_a_run_that_updated_since_its_last_evaluation_evaluates_again(tmp_path: Path) -> None:
    trainer = start_run(
        tiny_config("train.sft_warmup_cycles=2", "train.cycles=1", "eval.baseline=false"),
        output_dir=tmp_path / "run",
    )
    trainer.train()
    events = _rows(trainer.paths.events)
    assert not [e for e in events if e["event"] == "eval_reused"]
    evals = [e for e in events if e["event"] == "eval"]
    assert [(e["tag"], e["parameter_version"]) for e in evals] == [
        ("after_warmup", 2),
        ("final", 3),
    ]


def test_only_the_final_evaluation_reuses(tmp_path: Path) -> None:
    """An evaluation asked for by name (``eval --run``, a study's probe) always rolls out."""
    trainer = start_run(tiny_config(*COLD_START), output_dir=tmp_path / "run")
    trainer.train()
    before = len(_rows(trainer.paths.events))
    trainer.evaluate("probe", temperature=0.0)
    added = _rows(trainer.paths.events)[before:]
    assert [e["event"] for e in added] == ["eval"]
