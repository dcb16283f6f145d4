"""Fit, save and reuse the teacher's LoRA adapter on a shared Hugging Face backbone.

The HF analogue of the toy teacher fit (``training/toy_teacher.py``): with
``models.teacher_fit.enabled`` the shared base carries a second adapter, ``teacher``,
which is fitted here by cross-entropy on

- oracle traces of the training tasks plus ``extra_tasks`` further tasks (never an
  evaluation or test task), and
- noise-injected corrective traces of a ``corrective_fraction`` of those tasks (a bad
  first call, the environment's error, then the oracle; only the correction is
  supervised, see :meth:`RolloutRunner.corrective_rollout`),

then frozen. The fitted tensors are saved under ``cache_dir/<digest>/`` where the digest
covers everything that determines them (base weights' identity, tokenizer fingerprint,
adapter shape, fit settings, environment and split seed, run seed), so later runs with the
same fit config load it in a second instead of refitting. The loss is the project's
``chunked_selected_position_loss`` in cross-entropy form, as in the toy fit.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task, ToolEnvironment, sample_extra_tasks
from miniverl.errors import CheckpointError
from miniverl.models.fitting import cross_entropy_fit_step, draw_rows
from miniverl.schemas.text import TokenizerLike
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.progress import ProgressReporter
from miniverl.training.run_state import RunState
from miniverl.training.sources import oom_splitter
from miniverl.training.toy_teacher import greedy_success
from miniverl.trajectory.masks import model_target_positions
from miniverl.utils.hashing import sha256_file, sha256_json
from miniverl.utils.logging import EventLog
from miniverl.utils.seeding import derive_seed


class AdapterFitHost(Protocol):
    """Exactly what the adapter fit reads from the run that hosts it (``OPDTrainer`` after
    ``setup()`` satisfies it structurally; this module never imports the trainer)."""

    config: RunConfig
    tokenizer: TokenizerLike
    splits: dict[str, list[Task]]
    environment: ToolEnvironment
    runner: RolloutRunner
    teacher: Any
    progress: ProgressReporter
    events: EventLog
    state: RunState


ADAPTER_FILE = "teacher-adapter.safetensors"
REPORT_FILE = "fit.json"
NOISE_KINDS = ("malformed", "wrong_tool")


def base_identity(model_id: str) -> dict[str, Any]:
    """What identifies the base weights: the fetch marker's GGUF digest, else the id."""
    marker = Path(model_id).expanduser() / "miniverl_source.json"
    if marker.is_file():
        data = json.loads(marker.read_text(encoding="utf-8"))
        return {"gguf_sha256": data.get("gguf_sha256"), "model": data.get("model")}
    return {"model_id": model_id}


def fit_payload(trainer: AdapterFitHost) -> dict[str, Any]:
    """Everything the fitted adapter depends on; its SHA-256 names the saved adapter."""
    cfg = trainer.config
    return {
        "version": 1,
        "base": base_identity(cfg.models.teacher.model_id),
        "revision": cfg.models.teacher.revision,
        "precision": cfg.models.teacher.precision,
        "tokenizer_fingerprint": trainer.tokenizer.fingerprint,
        "lora": cfg.models.teacher.lora.model_dump(),
        "fit": cfg.models.teacher_fit.model_dump(exclude={"cache_dir", "probe_tasks"}),
        "environment": cfg.environment.model_dump(),
        "seed": cfg.run.seed,
    }


def fit_digest(payload: dict[str, Any]) -> str:
    return sha256_json(payload)


def fit_examples(
    trainer: AdapterFitHost,
) -> tuple[list[tuple[list[int], list[int]]], dict[str, int]]:
    """``(token_ids, target_positions)`` of the oracle and corrective traces, and counts."""
    cfg = trainer.config
    fit = cfg.models.teacher_fit
    env_cfg = cfg.environment
    held_out = [t for name in ("eval", "test") for t in trainer.splits[name]]
    extra = sample_extra_tasks(
        trainer.environment,
        fit.extra_tasks,
        derive_seed(env_cfg.split_seed, "teacher-adapter-pool"),
        env_cfg.difficulty,
        exclude=[t for split in trainer.splits.values() for t in split],
    )
    pool: list[Task] = list(trainer.splits["train"]) + extra
    held_ids = {t.task_id for t in held_out}
    if any(t.task_id in held_ids for t in pool):
        raise AssertionError("teacher fit pool overlaps the held-out splits")
    examples: list[tuple[list[int], list[int]]] = []
    for task in pool:
        traj = trainer.runner.oracle_rollout(task)
        examples.append((traj.token_ids, model_target_positions(traj.model_generated_mask)))
    rng = random.Random(derive_seed(cfg.run.seed, "teacher-adapter-noise"))
    noisy = rng.sample(pool, round(fit.corrective_fraction * len(pool)))
    for k, task in enumerate(noisy):
        traj = trainer.runner.corrective_rollout(task, NOISE_KINDS[k % len(NOISE_KINDS)])
        examples.append((traj.token_ids, corrective_targets(traj)))
    counts = {
        "oracle_traces": len(pool),
        "corrective_traces": len(noisy),
        "extra_tasks": len(extra),
    }
    return examples, counts


def corrective_targets(traj: Trajectory) -> list[int]:
    """Model-generated positions at or after ``metadata['supervise_from']``."""
    start = int(traj.metadata["supervise_from"])
    return [j for j in model_target_positions(traj.model_generated_mask) if j >= start]


def fit_adapter(
    view: Any,
    examples: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    chunk_size: int,
    advance: Any = None,
) -> list[float]:
    """Cross-entropy fit of ``view``'s adapter; every other parameter keeps its flag.

    Target ``j`` is predicted from position ``j - 1``; each example weighs the same
    whatever its length. Returns the loss per step.
    """
    params = view.unfrozen_adapter_parameters()
    if not params:
        raise CheckpointError("the teacher view has no adapter to fit")
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    history: list[float] = []
    owner = view.owner
    was_training = owner.model.training
    owner.set_train(True)
    try:
        for _ in range(steps):
            picked = draw_rows(examples, batch_size, order, rng)
            history.append(
                cross_entropy_fit_step(view, picked, params, optimizer, chunk_size=chunk_size)
            )
            if advance is not None:
                advance()
    finally:
        for p in params:
            p.requires_grad_(False)
            p.grad = None
        owner.set_train(was_training)
    return history


def _adapter_tensors(view: Any) -> dict[str, torch.Tensor]:
    tag = f".{view.adapter}."
    return {
        k: p.detach().to("cpu", copy=True).contiguous()
        for k, p in view.owner.model.named_parameters()
        if tag in k
    }


def _load_adapter(view: Any, path: Path) -> None:
    state = load_file(str(path))
    live = dict(view.owner.model.named_parameters())
    expected = {k for k in live if f".{view.adapter}." in k}
    if set(state) != expected:
        raise CheckpointError(
            f"{path} does not hold exactly the teacher adapter's tensors",
            hint="delete that directory; the adapter is refitted on the next run",
        )
    with torch.no_grad():
        for key, value in state.items():
            live[key].copy_(value.to(live[key].device, live[key].dtype))


def prepare_teacher_adapter(trainer: AdapterFitHost) -> dict[str, Any] | None:
    """Load the adapter of this fit config if saved, else fit and save it; returns a report."""
    cfg = trainer.config
    fit = cfg.models.teacher_fit
    view = trainer.teacher
    if not fit.enabled or view is None or getattr(view, "adapter", None) is None:
        return None
    payload = fit_payload(trainer)
    digest = fit_digest(payload)
    directory = Path(fit.cache_dir).expanduser() / digest
    adapter_path, report_path = directory / ADAPTER_FILE, directory / REPORT_FILE
    if adapter_path.is_file() and report_path.is_file():
        report = json.loads(report_path.read_text(encoding="utf-8"))
        if sha256_file(adapter_path) != report.get("adapter_sha256"):
            raise CheckpointError(
                f"{adapter_path} does not match the SHA-256 in {report_path}",
                hint=f"delete {directory}; the adapter is refitted on the next run",
            )
        _load_adapter(view, adapter_path)
        report = {**report, "reused": True, "directory": str(directory)}
        trainer.events.emit(
            "teacher_adapter_loaded", echo=f"reusing teacher adapter {digest[:12]}", **report
        )
        return report

    examples, counts = fit_examples(trainer)
    started = time.perf_counter()
    with trainer.progress.task("fitting teacher adapter", fit.steps) as advance:
        history = fit_adapter(
            view,
            examples,
            steps=fit.steps,
            lr=fit.lr,
            batch_size=fit.batch_size,
            seed=derive_seed(cfg.run.seed, "teacher-adapter-fit"),
            chunk_size=max(1, trainer.state.chunk_size),
            advance=advance,
        )
    seconds = time.perf_counter() - started
    probe = trainer.splits[cfg.eval.split][: fit.probe_tasks]
    with trainer.progress.task("probing teacher adapter", 1):
        runner = RolloutRunner(view, trainer.environment, cfg.rollout)
        split = oom_splitter(trainer.events, "probe rollout")
        heldout = greedy_success(
            runner, probe, seed=cfg.run.seed, batch_size=cfg.eval.batch_size, split=split
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}.tmp-", dir=directory.parent))
    try:
        save_file(_adapter_tensors(view), str(staging / ADAPTER_FILE))
        report = {
            "digest": digest,
            "payload": payload,
            "steps": len(history),
            "first_loss": history[0] if history else None,
            "final_loss": history[-1] if history else None,
            "seconds": round(seconds, 2),
            "heldout_probe_tasks": len(probe),
            "heldout_success": heldout,
            "adapter_sha256": sha256_file(staging / ADAPTER_FILE),
            **counts,
        }
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report = {**report, "reused": False, "directory": str(directory)}
    trainer.events.emit(
        "teacher_adapter_fitted",
        echo=f"{len(history)} steps, loss {report['first_loss']:.3f} -> {report['final_loss']:.3f}, "
        f"held-out greedy success {heldout:.2f} ({len(probe)} tasks)",
        **report,
    )
    return report
