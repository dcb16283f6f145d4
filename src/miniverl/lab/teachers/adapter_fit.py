"""The HF teacher adapter: a frozen LoRA adapter on the student's shared base, fitted by the lab.

With ``lab.teacher_fit.enabled`` (``models.runtime: shared_backbone``) the teacher is the
base plus a second adapter, ``teacher``, fitted by cross-entropy on oracle traces of the
training tasks (plus ``extra_tasks``, never an evaluation task) and corrective traces of a
``corrective_fraction`` of them, and with ``dagger`` on the warmed-up student's labelled
states; from zeros, or with ``init_from`` from a trained teacher's adapter. It is saved under
``cache_dir/<digest>/`` (base identity, tokenizer, adapter shape, fit settings, environment,
seeds, the starting adapter's bytes, the fitting code's source), reused by every later run with
the same inputs, and handed to the run as a teacher checkpoint: the saved file says its
shape in its safetensors metadata (``training/teacher_checkpoint.py``).
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task, ToolEnvironment, sample_extra_tasks
from miniverl.errors import CheckpointError, ConfigError
from miniverl.lab.config import TeacherFitConfig
from miniverl.lab.teachers.dagger import dagger_examples
from miniverl.lab.teachers.fitting import fit_rows, rows_sha256
from miniverl.lab.teachers.toy_fit import code_sha256, greedy_success, tensors_sha256
from miniverl.models.base import CausalLMBackend
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.cold_start import base_identity
from miniverl.training.live import ProgressReporter
from miniverl.training.sources import oom_splitter
from miniverl.training.teacher_checkpoint import (
    STUDENT_METADATA,
    load_teacher_checkpoint,
    resolve_teacher_weights,
)
from miniverl.trajectory.masks import model_target_positions
from miniverl.utils.hashing import sha256_file, sha256_json
from miniverl.utils.io import publish_modes
from miniverl.utils.seeding import derive_seed

ADAPTER_FILE = "teacher-adapter.safetensors"
REPORT_FILE = "fit.json"
NOISE_KINDS = ("malformed", "wrong_tool")


HF_FIT_SOURCES = (
    "lab/teachers/fitting.py",
    "models/hf.py",
    "models/hf_shared.py",
    "losses/chunked.py",
    "agent/loop.py",
    "agent/episode.py",
    "lab/teachers/adapter_fit.py",
    "lab/teachers/dagger.py",
    "environments/oracle_state.py",
)
"""Source files of the adapter fit whose text enters its digest (see ``toy_fit.FIT_SOURCES``)."""


def fit_payload(
    cfg: RunConfig,
    fit: TeacherFitConfig,
    tokenizer_fingerprint: str,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
) -> dict[str, Any]:
    """Everything the fitted adapter depends on; its SHA-256 names the saved adapter.

    The fitting code's own source is in it (``code_sha256`` of :data:`HF_FIT_SOURCES`), so an
    edit to the fit step refits instead of reusing an adapter the old code made; with
    ``examples`` (:func:`fit_examples`), so are the fitting rows' ids and targets. With
    ``init_from``, the starting adapter's SHA-256 is in it, not its path.
    """
    payload = {
        "version": 1,
        "code_sha256": code_sha256(HF_FIT_SOURCES),
        "examples_sha256": None if examples is None else rows_sha256(examples),
        "base": base_identity(cfg.models.teacher.model_id),
        "revision": cfg.models.teacher.revision,
        "precision": cfg.models.teacher.precision,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "lora": fit.lora.model_dump(),
        "fit": fit.model_dump(exclude={"cache_dir", "probe_tasks", "lora", "init_from"}),
        "environment": cfg.environment.model_dump(),
        "seed": cfg.run.seed,
    }
    if fit.init_from is not None:
        payload["init_sha256"] = init_sha256(fit)
    return payload


def init_sha256(fit: TeacherFitConfig) -> str | None:
    """SHA-256 of the adapter ``fit.init_from`` names, verified against its writer's record;
    ``None`` without one. A benchmark's cold start calls it before it trains, so a wrong path
    fails before the warm-up rather than at the fit after it."""
    if fit.init_from is None:
        return None
    with _about_init_from(fit.init_from):
        return resolve_teacher_weights(fit.init_from)[1]


def fit_digest(payload: dict[str, Any]) -> str:
    return sha256_json(payload)


def fit_examples(
    cfg: RunConfig,
    fit: TeacherFitConfig,
    *,
    splits: dict[str, list[Task]],
    environment: ToolEnvironment,
    runner: RolloutRunner,
) -> tuple[list[tuple[list[int], list[int]]], dict[str, int]]:
    """``(token_ids, target_positions)`` of the oracle and corrective traces, and counts.

    The pool is the training split plus ``extra_tasks`` fresh tasks; ``runner`` only plays
    the oracle (its policy never acts), so any runner over ``environment`` will do.
    """
    env_cfg = cfg.environment
    held_out = [t for name in ("eval", "test") for t in splits[name]]
    extra = sample_extra_tasks(
        environment,
        fit.extra_tasks,
        derive_seed(env_cfg.split_seed, "teacher-adapter-pool"),
        env_cfg.difficulty,
        exclude=[t for split in splits.values() for t in split],
    )
    pool: list[Task] = list(splits["train"]) + extra
    held_ids = {t.task_id for t in held_out}
    if any(t.task_id in held_ids for t in pool):
        raise AssertionError("teacher fit pool overlaps the held-out splits")
    examples: list[tuple[list[int], list[int]]] = []
    for task in pool:
        traj = runner.oracle_rollout(task)
        examples.append((traj.token_ids, model_target_positions(traj.model_generated_mask)))
    rng = random.Random(derive_seed(cfg.run.seed, "teacher-adapter-noise"))
    noisy = rng.sample(pool, round(fit.corrective_fraction * len(pool)))
    for k, task in enumerate(noisy):
        traj = runner.corrective_rollout(task, NOISE_KINDS[k % len(NOISE_KINDS)])
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
    owner = view.owner
    was_training = owner.model.training
    owner.set_train(True)
    try:
        with view.held():  # the backward of each step recomputes layers under this adapter
            history, _ = fit_rows(
                view,
                examples,
                params,
                steps=steps,
                lr=lr,
                batch_size=batch_size,
                seed=seed,
                chunk_size=chunk_size,
                on_step=None if advance is None else lambda _step, _loss: advance(),
            )
    finally:
        for p in params:
            p.requires_grad_(False)
            p.grad = None
        owner.set_train(was_training)
    return history


@contextmanager
def _about_init_from(path: str) -> Iterator[None]:
    """A :class:`CheckpointError` about ``lab.teacher_fit.init_from`` names that key."""
    try:
        yield
    except CheckpointError as error:
        raise CheckpointError(
            f"lab.teacher_fit.init_from: {error.message}",
            hint="point lab.teacher_fit.init_from at a run directory, one of its checkpoints, a "
            "cold start or an adapter .safetensors file, trained with the adapter shape "
            f"lab.teacher_fit.lora (or models.teacher.lora) gives ({path} is not one)",
        ) from error


def start_from(view: Any, path: str) -> dict[str, Any]:
    """Copy the trained adapter at ``path`` into ``view``'s adapter, the fit's starting point;
    its record (``load_teacher_checkpoint``)."""
    with _about_init_from(path):
        return load_teacher_checkpoint(view, path, backend="hf")


def _adapter_tensors(view: Any) -> dict[str, torch.Tensor]:
    tag = f".{view.adapter}."
    return {
        k: p.detach().to("cpu", copy=True).contiguous()
        for k, p in view.owner.model.named_parameters()
        if tag in k
    }


IDENTITY_FIELDS = ("base", "revision", "precision", "tokenizer_fingerprint", "lora")
"""The fields of a saved fit's payload that say which base, tokenizer and adapter shape it fits."""


def check_fit_identity(saved: Mapping[str, Any], payload: Mapping[str, Any], where: Path) -> None:
    """Refuse a saved adapter whose fit names another base model, tokenizer or adapter shape.

    The cache directory is named by the digest of the whole payload, so a lookup never
    lands on another base's adapter by itself; a directory copied or renamed by hand can,
    and its tensors may even have the right shapes (a fine-tune of the same architecture).
    """
    now = json.loads(json.dumps(dict(payload)))  # as fit.json stores it (tuples become lists)
    differing = [k for k in IDENTITY_FIELDS if saved.get(k) != now.get(k)]
    if differing:
        detail = "; ".join(f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}" for k in differing)
        raise CheckpointError(
            f"the teacher adapter in {where} was fitted for another base model or tokenizer ({detail})",
            hint=f"delete {where}: the adapter is refitted for this base on the next run",
        )


def _load_adapter(view: Any, path: Path) -> None:
    state = load_file(str(path))
    live = dict(view.owner.model.named_parameters())
    expected = {k for k in live if f".{view.adapter}." in k}
    if set(state) != expected:
        raise CheckpointError(
            f"{path} does not hold exactly the teacher adapter's tensors",
            hint="delete that directory; the adapter is refitted on the next run",
        )
    wrong = [k for k, v in state.items() if tuple(v.shape) != tuple(live[k].shape)]
    if wrong:
        raise CheckpointError(
            f"{path} holds adapter tensors of other shapes than this model's "
            f"({wrong[0]}: {tuple(state[wrong[0]].shape)} against {tuple(live[wrong[0]].shape)})",
            hint="it was fitted for another base model or adapter rank; delete that directory "
            "and the adapter is refitted on the next run",
        )
    with torch.no_grad():
        for key, value in state.items():
            live[key].copy_(value.to(live[key].device, live[key].dtype))


def prepare_teacher_adapter(
    view: Any,
    *,
    config: RunConfig,
    fit: TeacherFitConfig,
    tokenizer_fingerprint: str,
    splits: Mapping[str, list[Task]],
    environment: ToolEnvironment,
    runner: RolloutRunner,
    chunk_size: int,
    events: Any,
    progress: ProgressReporter,
    student: CausalLMBackend | None = None,
) -> dict[str, Any]:
    """Load the adapter of this fit into ``view`` if saved, else fit and save it; a report
    whose ``adapter`` is the saved file (its :data:`STUDENT_METADATA` says its shape, so a run
    loads it as a teacher checkpoint).

    ``view`` is an adapter view of the shared base (``HFRoleView`` with the frozen
    ``teacher`` adapter); ``runner`` plays the oracle traces of the fit; ``chunk_size`` is the
    loss projection chunk (rows) of the fit's cross-entropy. With ``fit.dagger.enabled``,
    ``student`` (the warmed-up student of a cold start) is rolled out on training tasks and
    its labelled states join the rows (``lab/teachers/dagger.py``); the digest then holds the
    student's trainable weights, and the rollouts run only when the adapter is fitted.
    """
    cfg = config
    examples, counts = fit_examples(cfg, fit, splits=splits, environment=environment, runner=runner)
    payload = fit_payload(cfg, fit, tokenizer_fingerprint, examples)
    if fit.dagger.enabled:
        if student is None:
            raise ConfigError(
                "lab.teacher_fit.dagger needs the warmed-up student whose states it labels",
                hint="fit it in a benchmark's cold start ('miniverl benchmark'), or set "
                "lab.teacher_fit.dagger.enabled: false",
            )
        payload["dagger_student_sha256"] = tensors_sha256(student.trainable_state_dict())
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
        check_fit_identity(report.get("payload") or {}, payload, directory)
        _load_adapter(view, adapter_path)
        report = {
            **report,
            "reused": True,
            "directory": str(directory),
            "adapter": str(adapter_path),
        }
        events.emit(
            "teacher_adapter_loaded", echo=f"reusing teacher adapter {digest[:12]}", **report
        )
        return report

    started, cpu_started = time.perf_counter(), time.process_time()
    if fit.dagger.enabled:
        assert student is not None
        with progress.task("rolling out the student for the adapter fit", 1):
            rows, dagger_counts = dagger_examples(
                student,
                environment,
                splits["train"],
                fit.dagger,
                cfg.rollout,
                seed=derive_seed(cfg.run.seed, "teacher-adapter-dagger"),
                batch_size=cfg.eval.batch_size,
                split=oom_splitter(events, "dagger rollout"),
            )
        examples = examples + rows
        counts = {**counts, **dagger_counts}
    if fit.init_from is not None:
        counts = {**counts, "init_from": start_from(view, fit.init_from)}
    with progress.task("fitting teacher adapter", fit.steps) as advance:
        history = fit_adapter(
            view,
            examples,
            steps=fit.steps,
            lr=fit.lr,
            batch_size=fit.batch_size,
            seed=derive_seed(cfg.run.seed, "teacher-adapter-fit"),
            chunk_size=max(1, chunk_size),
            advance=advance,
        )
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    probe = splits[cfg.eval.split][: fit.probe_tasks]
    with progress.task("probing teacher adapter", 1):
        probe_runner = RolloutRunner(view, environment, cfg.rollout)
        split = oom_splitter(events, "probe rollout")
        heldout = greedy_success(
            probe_runner, probe, seed=cfg.run.seed, batch_size=cfg.eval.batch_size, split=split
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}.tmp-", dir=directory.parent))
    student_record = {"model_id": cfg.models.student.model_id, "lora": fit.lora.model_dump()}
    try:
        save_file(
            _adapter_tensors(view),
            str(staging / ADAPTER_FILE),
            metadata={STUDENT_METADATA: json.dumps(student_record, sort_keys=True)},
        )
        report = {
            "digest": digest,
            "payload": payload,
            "steps": len(history),
            "first_loss": history[0] if history else None,
            "final_loss": history[-1] if history else None,
            "seconds": round(seconds, 2),
            "cost": {
                "wall_seconds": round(seconds, 2),
                "cpu_seconds": round(cpu_seconds, 2),
                "examples": len(examples),
                "steps": len(history),
            },
            "heldout_probe_tasks": len(probe),
            "heldout_success": heldout,
            "adapter_sha256": sha256_file(staging / ADAPTER_FILE),
            **counts,
        }
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
        publish_modes(staging)
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report = {**report, "reused": False, "directory": str(directory), "adapter": str(adapter_path)}
    events.emit(
        "teacher_adapter_fitted",
        echo=(
            f"{len(history)} steps, loss {history[0]:.3f} -> {history[-1]:.3f}, "
            if history
            else "no fitting steps (lab.teacher_fit.steps: 0), "
        )
        + (
            f"held-out greedy success {heldout:.2f} ({len(probe)} tasks)"
            if probe
            else "no held-out probe (lab.teacher_fit.probe_tasks: 0)"
        ),
        **report,
    )
    return report


__all__ = [
    "ADAPTER_FILE",
    "HF_FIT_SOURCES",
    "REPORT_FILE",
    "check_fit_identity",
    "corrective_targets",
    "fit_adapter",
    "fit_digest",
    "fit_examples",
    "fit_payload",
    "init_sha256",
    "prepare_teacher_adapter",
    "start_from",
]
