"""The parts :meth:`OPDTrainer.setup` assembles, each built from explicit inputs.

``training/recipe.py`` reads as the recipe; how each collaborator is built lives here:

- :func:`build_run_runtime`: the student and the teacher (the one the caller gave, the
  trained student at a teacher checkpoint, or the base model the recipe names);
- :func:`plan_run`: every ``auto`` decided once (``training/resolve.py``, with the decode
  probe of ``models/probe.py`` where an ``auto`` needs it), torch's thread count and the
  student's rollout weights set, the teacher placed per the memory plan;
- :func:`build_supervision`: the teacher scorer and, for bucketed targets, the teacher cache
  (the only converter to the storage dtype, ``cache/targets.py``);
- :func:`teacher_targets`: the scorer/cache pair the sources score through;
- :func:`teacher_on_device`: the ``swap`` memory strategy;
- :func:`write_config_files` and :func:`announce_run`: what a run writes before it trains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from miniverl.cache.store import TeacherCache
from miniverl.config.loading import load_resolved_config
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task
from miniverl.errors import RunDirectoryError
from miniverl.models.base import CausalLMBackend
from miniverl.models.probe import probe_decode_step
from miniverl.models.runtime import ModelRuntime, build_runtime
from miniverl.schemas.text import TokenizerLike
from miniverl.teachers.local import LocalTeacherScorer
from miniverl.training.optim import move_optimizer_state
from miniverl.training.resolve import (
    HostCapabilities,
    ResolvedRun,
    decode_rows,
    needs_decode_probe,
    place_teacher,
    resolve_run,
    rollout_dtype_applies,
)
from miniverl.training.sources import TeacherTargets, make_select_and_align, temperature_mismatch
from miniverl.training.teacher_checkpoint import load_teacher_checkpoint, recorded_student
from miniverl.utils.io import atomic_write_bytes, atomic_write_text
from miniverl.utils.logging import EventLog
from miniverl.utils.runs import RunPaths


def refuse_existing_run(paths: RunPaths) -> None:
    """A fresh run never writes into a directory that already holds one."""
    if paths.manifest.exists():
        raise RunDirectoryError(
            f"{paths.root} already holds a run",
            hint="pass --resume to continue it, or choose another --output directory",
        )


def build_run_runtime(
    config: RunConfig,
    tokenizer: TokenizerLike,
    device: str,
    *,
    with_teacher: bool,
    teacher: CausalLMBackend | str | Path | None = None,
) -> ModelRuntime:
    """The run's backends (``models/runtime.py``) and its teacher.

    ``teacher``: a ready backend the caller built (the lab's oracle or fitted teacher) is
    used as given; a path is a teacher checkpoint, loaded like ``models.teacher.checkpoint``
    (which it takes precedence over): the trained student there, its shape read from what
    the checkpoint records (:func:`~miniverl.training.teacher_checkpoint.recorded_student`),
    loaded and frozen. Without either, the teacher is the base model ``models.teacher`` names.
    """
    given = teacher if with_teacher and not isinstance(teacher, str | Path) else None
    checkpoint = teacher if isinstance(teacher, str | Path) else config.models.teacher.checkpoint
    student_spec = (
        recorded_student(checkpoint, config) if with_teacher and checkpoint is not None else None
    )
    runtime = build_runtime(
        config,
        tokenizer,
        device,
        with_teacher=with_teacher and given is None,
        teacher_spec=student_spec,
    )
    if given is not None:
        runtime.teacher = given
    elif runtime.teacher is not None and checkpoint is not None:
        runtime.teacher_checkpoint = load_teacher_checkpoint(
            runtime.teacher, checkpoint, backend=config.models.backend
        )
    return runtime


def plan_run(
    config: RunConfig, *, device: str, student: CausalLMBackend, teacher: CausalLMBackend | None
) -> ResolvedRun:
    """Resolve the run for this host, set torch's threads and the student's rollout weights,
    place the teacher; the final plan."""
    planned = resolve_run(
        config,
        device=device,
        host=probe_host(config, device, student),
        student=student.capabilities,
        teacher=None if teacher is None else teacher.capabilities,
    )
    apply_host_plan(planned, student)
    return planned.with_memory_plan(place_teacher(teacher, planned.memory_plan, device))


def recorded_host_decisions(config: RunConfig, paths: RunPaths) -> RunConfig:
    """``config`` with the decisions a timing probe made when the run started
    (``run.cpu_threads`` and ``models.rollout_dtype`` left at ``auto``, read back from
    ``config.resolved.yaml``): the plan a resumed run resolves from. Why: on a machine busier
    or idler than at the start the probe can decide otherwise, and bf16 rollout weights (or
    another thread count) sample other episodes, so the resumed run would not continue the
    run that was interrupted."""
    pending = [key for key, value in _probe_decisions(config).items() if value == "auto"]
    if not pending or not paths.config_resolved.exists():
        return config
    recorded = _probe_decisions(load_resolved_config(paths.root))
    return config.with_overrides(
        f"{key}={recorded[key]}" for key in pending if recorded[key] != "auto"
    )


def _probe_decisions(config: RunConfig) -> dict[str, Any]:
    """The keys a host probe may decide under ``auto``, with ``config``'s values."""
    return {
        "run.cpu_threads": config.run.cpu_threads,
        "models.rollout_dtype": config.models.rollout_dtype,
    }


def probe_host(config: RunConfig, device: str, student: CausalLMBackend) -> HostCapabilities:
    """The host's facts, with the student's decode-step probe when an ``auto`` needs it."""
    host = HostCapabilities.probe(device)
    if not needs_decode_probe(config, device=device):
        return host
    threads = sorted({1, host.torch_threads})
    dtypes = ("float32", "bfloat16") if rollout_dtype_applies(config, device) else ("float32",)
    module = getattr(student, "model", None)
    if not isinstance(module, torch.nn.Module):
        return host
    probe = probe_decode_step(
        module, rows=decode_rows(config), thread_counts=threads, dtypes=dtypes
    )
    return dataclasses.replace(host, decode_probe=probe)


def apply_host_plan(resolved: ResolvedRun, student: CausalLMBackend) -> None:
    """torch's thread count, and bf16 rollout weights where :func:`resolve_rollout_dtype` chose them."""
    torch.set_num_threads(resolved.cpu_threads)
    set_dtype = getattr(student, "set_rollout_dtype", None)
    if callable(set_dtype):
        set_dtype(resolved.rollout_dtype)


def build_supervision(
    config: RunConfig,
    resolved: ResolvedRun,
    *,
    teacher: CausalLMBackend | None,
    tokenizer_fingerprint: str,
    paths: RunPaths,
) -> tuple[LocalTeacherScorer | None, TeacherCache | None]:
    """The teacher scorer (``None`` without a teacher: sft) and its cache (``None`` unless
    enabled and the targets are bucketed)."""
    if teacher is None:
        return None, None
    scorer = LocalTeacherScorer(
        teacher,
        spec=resolved.divergence,
        loss_mode=config.loss.mode,
        top_k=resolved.top_k,
        teacher_resident=resolved.memory_plan.teacher_resident,
        student_fingerprint=tokenizer_fingerprint,
        chunk_size=resolved.chunk_size,
        teacher_model_id=config.models.teacher.model_id,
    )
    if not (config.cache.enabled and scorer.shape == "bucketed"):
        return scorer, None
    cache = TeacherCache(
        Path(config.cache.dir) if config.cache.dir else paths.teacher_cache,
        scorer.cache_provenance(dtype=config.cache.dtype, teacher_mode=config.teacher.mode),
        strict_policy_version=config.cache.strict_policy_version,
        reuse_across_policy_versions=config.cache.reuse_across_policy_versions,
    )
    return scorer, cache


def teacher_targets(
    config: RunConfig,
    resolved: ResolvedRun,
    *,
    scorer: LocalTeacherScorer | None,
    cache: TeacherCache | None,
    runner: Any,
    tasks_by_id: dict[str, Task],
    events: EventLog,
    swap: Callable[[], Any],
) -> TeacherTargets:
    """How sources get teacher targets; privileged-context teachers see the rendered task.

    A teacher that has no target at some positions says so through the scorer protocol's
    optional ``target_mask`` (:attr:`LocalTeacherScorer.target_mask`).
    """
    render = None
    if config.teacher.mode == "privileged_context":

        def render(traj: Any) -> Any:
            return runner.privileged_render(traj, tasks_by_id[traj.task_id])

    mask = scorer.target_mask if scorer is not None else None
    return TeacherTargets(
        scorer=scorer,
        cache=cache,
        spec=resolved.divergence,
        select_and_align=make_select_and_align(config, render, mask),
        batch_size=config.teacher.batch_size,
        events=events,
        swap=None if resolved.memory_plan.teacher_resident else swap,
    )


@contextmanager
def teacher_on_device(
    student: CausalLMBackend,
    teacher: CausalLMBackend | None,
    optimizer: torch.optim.Optimizer,
    device: str,
) -> Iterator[None]:
    """``swap`` strategy: student and its optimizer moments to host, teacher on; then back."""
    student.to_device("cpu")
    move_optimizer_state(optimizer, "cpu")
    if teacher is not None:
        teacher.to_device(device)
    yield
    if teacher is not None:
        teacher.to_device("cpu")
    student.to_device(device)
    move_optimizer_state(optimizer, device)


def write_config_files(
    paths: RunPaths, config: RunConfig, resolved: ResolvedRun, submitted: bytes | None
) -> None:
    """The submitted bytes, the validated recipe (and its copy ``config.original.yaml``) and
    ``config.resolved.yaml``."""
    if submitted is not None:
        atomic_write_bytes(paths.config_submitted, submitted)
    validated = config.to_yaml()
    atomic_write_text(paths.config_validated, validated)
    atomic_write_text(
        paths.config_original,
        "# a copy of config.validated.yaml (a recipe to rerun); not the submitted bytes\n"
        + validated,
    )
    atomic_write_text(paths.config_resolved, resolved.resolved_yaml(config))


def announce_run(
    events: EventLog,
    config: RunConfig,
    resolved: ResolvedRun,
    *,
    run_dir: Path,
    resume: bool,
    targets: TeacherTargets | None,
) -> None:
    """``run_start``, the teacher-targets path decision, and any temperature mismatch."""
    events.emit(
        "run_start",
        echo=f"{config.run.mode} -> {run_dir}",
        mode=config.run.mode,
        run_dir=run_dir.name,
        resume=resume,
        device=resolved.device,
        memory_plan=resolved.memory_plan.to_dict(),
    )
    if targets is not None:
        events.emit(
            "teacher_targets_path",
            **targets.describe(teacher_resident=resolved.memory_plan.teacher_resident),
        )
    if (mismatch := temperature_mismatch(config)) is not None:
        events.emit(
            "temperature_mismatch", echo=mismatch["explanation"], level="warning", **mismatch
        )


__all__ = [
    "announce_run",
    "build_supervision",
    "plan_run",
    "refuse_existing_run",
    "teacher_on_device",
    "teacher_targets",
    "write_config_files",
]
