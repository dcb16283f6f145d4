"""A training run's checkpoint contents, and putting them back on resume.

``checkpoint.py`` owns the file format (safetensors + ``state.json`` + completion marker);
this module decides what a *training run* stores in it: the trainable weights, the optimizer
moments, the counters of :class:`ResumeCounters`, the RNG states, the sample source's
position and the byte length of every append-only log. A resume cuts those logs back to the
recorded lengths, so the records a killed run wrote after its last checkpoint are written
again, identically, instead of twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from miniverl import __version__
from miniverl.errors import CheckpointError
from miniverl.models.base import CausalLMBackend
from miniverl.training.checkpoint import LoadedCheckpoint, load_checkpoint, save_checkpoint
from miniverl.training.checkpoint_select import select_resume_checkpoint, supersede_newer
from miniverl.training.optim import Schedule, optimizer_state_tensors
from miniverl.utils.logging import EventLog
from miniverl.utils.runs import RunPaths
from miniverl.utils.seeding import capture_rng_state

LOG_NAMES = ("metrics", "trajectories", "eval_trajectories", "token_analysis")
"""``RunPaths`` attributes of the append-only logs whose length a checkpoint records."""


class StatefulSource(Protocol):
    """The part of a sample source a checkpoint needs (``training.sources.SampleSource``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class ResumeCounters:
    """The trainer's counters in ``state.json``; the run continues at ``cycle + 1``.

    ``cycle`` is -1 for the checkpoint after the SFT warm-up. ``main_start_step`` is the
    optimizer step the main phase began at (the learning-rate schedule counts from it).
    """

    cycle: int
    global_step: int
    parameter_version: int
    rollout_policy_version: int | None
    task_cursor: int
    chunk_size: int
    main_start_step: int
    eval_results: dict[str, Any]

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ResumeCounters:
        """Read back; fields added after the first checkpoint format have defaults."""
        return cls(
            cycle=int(state["cycle"]),
            global_step=int(state["global_step"]),
            parameter_version=int(state["parameter_version"]),
            rollout_policy_version=state.get("rollout_policy_version"),
            task_cursor=int(state["task_cursor"]),
            chunk_size=int(state["chunk_size"]),
            main_start_step=int(state.get("main_start_step", 0)),
            eval_results=dict(state.get("eval_results") or {}),
        )


def log_sizes(paths: RunPaths) -> dict[str, int]:
    """Bytes of each append-only log now (0 for one not written yet), keyed by log name."""
    sizes = {}
    for name in LOG_NAMES:
        path = getattr(paths, name)
        sizes[name] = path.stat().st_size if path.exists() else 0
    return sizes


def truncate_log(path: Path, size: int) -> None:
    """Cut an append-only log back to the length recorded at the checkpoint."""
    if path.exists() and path.stat().st_size > size:
        with open(path, "r+b") as handle:
            handle.truncate(size)


def write_training_checkpoint(
    directory: Path,
    *,
    counters: ResumeCounters,
    student: CausalLMBackend,
    optimizer: torch.optim.Optimizer,
    schedule: Schedule,
    source: StatefulSource,
    toy_teacher: dict[str, Any] | None,
    paths: RunPaths,
    config_digest: str,
) -> Path:
    """Trainable weights, optimizer moments and every counter needed to resume.

    ``state.json`` goes through ``CheckpointState.build`` (``checkpoint.save_checkpoint``);
    the sample source's position is under ``source``.
    """
    tensors, optimizer_meta = optimizer_state_tensors(optimizer)
    state = {
        "cycle": counters.cycle,
        "global_step": counters.global_step,
        "parameter_version": counters.parameter_version,
        "rollout_policy_version": counters.rollout_policy_version,
        "task_cursor": counters.task_cursor,
        "chunk_size": counters.chunk_size,
        "schedule": schedule.to_dict(),
        "main_start_step": counters.main_start_step,
        "rng": capture_rng_state(),
        "optimizer": optimizer_meta,
        "eval_results": counters.eval_results,
        "jsonl_sizes": log_sizes(paths),
        "source": source.state_dict(),
        "toy_teacher": toy_teacher,
        "miniverl_version": __version__,
    }
    return save_checkpoint(
        directory,
        trainable=student.trainable_state_dict(),
        optimizer_tensors=tensors,
        state=state,
        config_digest=config_digest,
    )


def choose_resume_checkpoint(
    paths: RunPaths, resume_from: str | None, path: str | Path | None = None
) -> Path:
    """``path``; else ``checkpoints/<resume_from>``; else the latest verified checkpoint.

    A finished run (``final`` plus ``eval.json``) is refused: there is nothing to resume.
    """
    if path is None:
        path = select_resume_checkpoint(paths.checkpoints, resume_from)
    if path is None:
        raise CheckpointError(
            f"no complete checkpoint under {paths.checkpoints}",
            hint="the run stopped before its first checkpoint; start it again without --resume",
        )
    path = Path(path)
    if path.name == "final" and paths.eval_json.exists():
        raise CheckpointError(
            f"{paths.root} already finished (checkpoints/final and eval.json exist)",
            hint="nothing to resume; use 'miniverl eval --run' to re-evaluate",
        )
    return path


def load_training_checkpoint(path: Path, *, device: str, config_digest: str) -> LoadedCheckpoint:
    """``load_checkpoint`` that also refuses a checkpoint written by another recipe."""
    loaded = load_checkpoint(path, device=device)
    if loaded.state["config_digest"] != config_digest:
        raise CheckpointError(
            f"checkpoint {path} was written by a different config (digest {loaded.state['config_digest'][:12]} vs {config_digest[:12]})",
            hint="resume with exactly the recipe and overrides of the original run (see config.validated.yaml)",
        )
    return loaded


def restore_logs(
    paths: RunPaths,
    state: dict[str, Any],
    chosen: Path,
    *,
    explicit: bool,
    events: EventLog,
) -> None:
    """Cut every append-only log back to its length in ``state``.

    ``explicit`` (``--resume-from`` an older checkpoint): newer checkpoints and the log tails
    are first moved aside (``checkpoints_superseded`` event) rather than deleted.
    """
    sizes = {getattr(paths, n): int(v) for n, v in (state.get("jsonl_sizes") or {}).items()}
    if explicit:
        moved = supersede_newer(paths.checkpoints, chosen, sizes)
        if moved:
            events.emit(
                "checkpoints_superseded",
                echo=f"--resume-from {chosen.name}: newer checkpoints and log tails moved to checkpoints/{moved['folder']}",
                **moved,
            )
    for log, size in sizes.items():
        truncate_log(log, size)


def source_state(state: dict[str, Any]) -> dict[str, Any]:
    """The sample source's position; checkpoints before sample sources kept the offline pool
    under ``offline_kd``."""
    return state.get("source") or state.get("offline_kd") or {}
