"""A fitted toy teacher is cached by digest and reused."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import tiny_config
from miniverl.lab.config import lab_of
from miniverl.lab.run import start_run
from miniverl.lab.teachers import toy_fit as teacher_fit
from miniverl.training.live import ProgressReporter
from miniverl.training.recipe import OPDTrainer
from miniverl.utils.hashing import sha256_file

VOLATILE = {"seconds", "train_selected_tokens_per_second", "gpu", "time", "monotonic_s"}

pytestmark = pytest.mark.slow


def _events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def _stable_metrics(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def _train(run: Path, *overrides: str) -> OPDTrainer:
    """A run as ``miniverl train`` starts it: the lab fits (or reuses) its toy teacher."""
    trainer = start_run(tiny_config(*overrides), output_dir=run)
    trainer.train()
    return trainer


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(teacher_fit.CACHE_ENV, str(root))
    return root


def test_second_run_reuses_the_teacher_and_trains_identically(
    tmp_path: Path, cache_dir: Path
) -> None:
    _train(tmp_path / "first")
    _train(tmp_path / "second")
    first, second = _events(tmp_path / "first"), _events(tmp_path / "second")
    fitted = [e for e in first if e["event"] == "toy_teacher_fitted"]
    reused = [e for e in second if e["event"] == "toy_teacher_reused"]
    assert len(fitted) == 1 and len(reused) == 1
    assert not any(e["event"] == "toy_teacher_fitted" for e in second)
    digest = fitted[0]["cache_digest"]
    assert reused[0]["cache_digest"] == digest
    assert reused[0]["steps"] == fitted[0]["steps"] and reused[0]["reused"] is True
    entry = cache_dir / "toy-teachers" / digest
    assert sorted(p.name for p in entry.iterdir()) == ["teacher.json", "teacher.safetensors"]
    assert sha256_file(tmp_path / "first" / "toy-teacher.safetensors") == sha256_file(
        tmp_path / "second" / "toy-teacher.safetensors"
    )
    # Reuse is invisible to training: every loss, rollout and evaluation is the same.
    assert _stable_metrics(tmp_path / "first") == _stable_metrics(tmp_path / "second")


def test_digest_covers_fit_settings_and_tasks_and_verifies_weights(
    tmp_path: Path, cache_dir: Path
) -> None:
    base = _train(tmp_path / "base").teacher_record
    assert base is not None
    for name, override in (
        ("lr", "models.toy_fit.lr=0.003"),
        ("split-seed", "environment.split_seed=99"),
        ("seed", "run.seed=7"),
    ):
        report = _train(tmp_path / name, override).teacher_record
        assert report is not None and report["reused"] is False, name
        assert report["cache_digest"] != base["cache_digest"], name
    # a cache entry whose weights no longer match its recorded SHA-256 is refitted, not used
    weights = cache_dir / "toy-teachers" / base["cache_digest"] / "teacher.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    again = _train(tmp_path / "tampered").teacher_record
    assert again is not None and again["reused"] is False
    assert again["weights_sha256"] == base["weights_sha256"]
    assert _train(tmp_path / "healed").teacher_record["reused"] is True


def test_reuse_false_always_fits_and_stores_nothing(tmp_path: Path, cache_dir: Path) -> None:
    report = _train(tmp_path / "run", "models.toy_fit.reuse=false").teacher_record
    assert report is not None and report["reused"] is False
    assert not cache_dir.exists() or not any(cache_dir.rglob("teacher.json"))


def test_fit_progress_reports_steps_loss_and_probe_accuracy(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, list[Any]] = {}

    @contextlib.contextmanager
    def task(self: Any, description: str, total: int) -> Iterator[Any]:
        calls = seen.setdefault(description, [total])

        def advance(n: int = 1, stats: str | None = None) -> None:
            calls.append(stats)

        yield advance

    monkeypatch.setattr(ProgressReporter, "task", task)
    trainer = start_run(tiny_config("models.toy_fit.check_every=5"), output_dir=tmp_path / "run")
    trainer.train()
    fit = seen["fitting toy teacher"]
    report = trainer.teacher_record
    assert report is not None
    assert fit[0] == lab_of(trainer.config).toy_fit.max_steps
    assert len(fit) - 1 == report["steps"]
    assert fit[1].startswith("step 1 | loss ")
    assert f"step {report['steps']} | loss {report['final_loss']:.3f}" in fit[-1]
    last_check = report["checks"][-1]
    if report["steps"] > last_check["step"]:
        assert f"probe accuracy {last_check['probe_success']:.0%}" in fit[-1]
    assert any("probe accuracy" in s for s in fit[1:])


def test_the_noise_settings_enter_the_digest(tmp_path: Path, cache_dir: Path) -> None:
    """A teacher fitted without noise-injected traces is never reused for a noisy fit."""
    # a spare turn, a parse error the episode survives, and room for a whole call per turn
    room = (
        "rollout.max_turns=4",
        "rollout.max_parse_errors=2",
        "rollout.max_new_tokens_per_turn=40",
        "rollout.max_total_tokens=600",
    )
    clean = _train(tmp_path / "clean", *room).teacher_record
    noisy = _train(tmp_path / "noisy", *room, "models.toy_fit.noise_fraction=0.5").teacher_record
    assert clean is not None and noisy is not None
    assert noisy["reused"] is False and noisy["cache_digest"] != clean["cache_digest"]
    stored = json.loads(
        (cache_dir / "toy-teachers" / noisy["cache_digest"] / "teacher.json").read_text()
    )
    assert stored["inputs"]["fit"]["noise_fraction"] == 0.5
    assert (
        stored["inputs"]["fit_targets_sha256"]
        != json.loads(
            (cache_dir / "toy-teachers" / clean["cache_digest"] / "teacher.json").read_text()
        )["inputs"]["fit_targets_sha256"]
    )
    again = _train(tmp_path / "again", *room, "models.toy_fit.noise_fraction=0.5").teacher_record
    assert again is not None and again["reused"] is True
    assert again["cache_digest"] == noisy["cache_digest"]
