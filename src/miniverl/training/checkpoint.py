"""Checkpoints: the file format, what a training run stores, which one ``--resume`` loads,
which ones stay on disk, and recovery of a run that died before its first one.

Layout of ``checkpoints/<name>/``:

- ``adapter.safetensors``: trainable weights only (LoRA adapters, or every weight of a
  fully fine-tuned toy student);
- ``optimizer.safetensors``: optimizer moment tensors;
- ``state.json``: step, parameter/rollout versions, task cursor, schedule, RNG states,
  optimizer scalars, config digest, the sample source's position and the byte length of
  every append-only log;
- ``checkpoint.json``: the completion marker with SHA-256 of the three files.

The directory is assembled under a temporary name and renamed into place, and the marker
is written after everything it vouches for: a checkpoint without a valid marker is never
loaded. Nothing here unpickles: a received checkpoint is inert data. A resume cuts the logs
back to the recorded lengths, so the records a killed run wrote after its last checkpoint
are written again, identically, instead of twice. The logs are appended without an fsync
during a cycle, so :func:`write_training_checkpoint` fsyncs them before it measures them:
the lengths a committed checkpoint records are on disk even after a power loss, and
:func:`verify_logs` never finds a log shorter than its checkpoint because of one.

Which checkpoint ``--resume`` loads, all of it loud:

- ``--resume`` loads the *latest* checkpoint directory (``warmup`` < ``cycle-NNNN`` in
  cycle order < ``final``; the cycle comes from the verified marker, or from the name when
  the marker cannot be verified). If that directory is incomplete or tampered with, the
  resume fails with a :class:`~miniverl.errors.CheckpointError` that names the file and
  lists the complete checkpoints to choose from; it never falls back silently to an
  older one (which would rerun cycles, truncate the logs and then delete the damaged
  directory).
- ``--resume-from NAME`` loads exactly ``checkpoints/NAME`` (verified like any other).
  Newer checkpoint directories are then moved aside, not deleted, into
  ``checkpoints/.superseded-<UTC>/``, together with the log tails the resume truncates.
- Deleting checkpoints is left to the explicit ``checkpoint.keep`` setting
  (:func:`prune_cycle_checkpoints`: only ``cycle-NNNN`` directories are candidates;
  ``warmup``, ``final`` and hidden staging directories are always kept).

Everything a run writes before its first checkpoint (the toy-teacher fit, the baseline
evaluation, the SFT warm-up) is a deterministic function of the recipe, so the way to
recover it is to recompute it: ``--resume`` on such a directory deletes the artifacts the
dead run left and starts again (:func:`prepare_resume`). Only miniverl's own artifact names
are deleted, ``events.jsonl`` is kept (it records the crash), and a directory whose recipe
differs from the one passed now is refused rather than wiped.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import torch

from miniverl import __version__
from miniverl.config.models import RunConfig
from miniverl.config.modes import mode_of_kind
from miniverl.errors import CheckpointError, ConfigError, RunDirectoryError
from miniverl.models.base import CausalLMBackend
from miniverl.schemas.records import CheckpointState, parse_state
from miniverl.training.optim import Schedule, optimizer_state_tensors
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import (
    DurableLogs,
    atomic_path,
    checked_failpoint,
    is_disk_full,
    publish_modes,
    read_json,
    repair_jsonl_tail,
    storage_error,
    write_json,
)
from miniverl.utils.logging import EventLog, utc_now
from miniverl.utils.runlock import LOCK_NAME
from miniverl.utils.runs import RunPaths
from miniverl.utils.safe_load import load_yaml_file, require_regular_file
from miniverl.utils.seeding import capture_rng_state

CHECKPOINT_FORMAT = 1
ADAPTER_FILE = "adapter.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
MARKER_FILE = "checkpoint.json"


@dataclass
class LoadedCheckpoint:
    path: Path
    marker: dict[str, Any]
    state: dict[str, Any]
    trainable: dict[str, Any]
    optimizer: dict[str, Any]


def save_tensors(tensors: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """Write tensors with safetensors via a temp file and rename; return the file's SHA-256."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp))
    return sha256_file(path)


def save_checkpoint(
    directory: str | os.PathLike[str],
    *,
    trainable: dict[str, Any],
    optimizer_tensors: dict[str, Any],
    state: dict[str, Any],
    config_digest: str,
) -> Path:
    """Write a complete checkpoint at ``directory`` (replacing an older one atomically)."""
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_tensors(trainable, staging / ADAPTER_FILE)
        save_tensors(optimizer_tensors, staging / OPTIMIZER_FILE)
        record = CheckpointState.build(**{**state, "config_digest": config_digest})
        write_json(staging / STATE_FILE, record.to_json())
        marker = {
            "format": CHECKPOINT_FORMAT,
            "name": target.name,
            "created_at": utc_now(),
            "config_digest": config_digest,
            "cycle": state.get("cycle"),
            "global_step": state.get("global_step"),
            "files": {
                name: sha256_file(staging / name)
                for name in (ADAPTER_FILE, OPTIMIZER_FILE, STATE_FILE)
            },
        }
        write_json(staging / MARKER_FILE, marker)
        publish_modes(staging)
        checked_failpoint(f"checkpoint:{target.name}:staged", target)
        if target.exists():
            retired = target.with_name(f".{target.name}.old")
            shutil.rmtree(retired, ignore_errors=True)
            os.replace(target, retired)
            checked_failpoint(f"checkpoint:{target.name}:retired", target)
            os.replace(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(exc) and isinstance(exc, OSError):
            raise storage_error(target) from exc
        raise
    checked_failpoint(f"checkpoint:{target.name}:renamed", target)
    return target


def read_marker(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The verified completion marker, or :class:`CheckpointError`."""
    path = Path(directory)
    marker_path = path / MARKER_FILE
    if not path.is_dir():
        siblings = (
            sorted(
                p.name for p in path.parent.iterdir() if p.is_dir() and not p.name.startswith(".")
            )
            if path.parent.is_dir()
            else []
        )
        raise CheckpointError(
            f"checkpoint {path} is missing (no such directory)",
            hint=f"available checkpoints: {', '.join(siblings)}"
            if siblings
            else f"{path.parent} holds no checkpoints; the run never saved one",
        )
    if not marker_path.is_file():
        raise CheckpointError(
            f"{path} has no {MARKER_FILE}: the checkpoint is incomplete and will not be loaded",
            hint="resume from an earlier complete checkpoint or start a new run",
        )
    marker = read_json(marker_path, error=CheckpointError)
    if (
        not isinstance(marker, dict)
        or marker.get("format") != CHECKPOINT_FORMAT
        or not isinstance(marker.get("files"), dict)
    ):
        raise CheckpointError(
            f"{marker_path} is not a miniverl checkpoint marker (format {CHECKPOINT_FORMAT})"
        )
    for name in (ADAPTER_FILE, OPTIMIZER_FILE, STATE_FILE):
        expected = marker["files"].get(name)
        file = path / name
        if not file.exists() and not file.is_symlink():
            raise CheckpointError(f"checkpoint file missing: {file}")
        require_regular_file(file, error=CheckpointError)
        if expected != sha256_file(file):
            raise CheckpointError(
                f"checkpoint file {file} does not match its SHA-256 in {MARKER_FILE}",
                hint="the checkpoint was modified or corrupted; resume from another one",
            )
    return marker


def load_checkpoint(directory: str | os.PathLike[str], *, device: str = "cpu") -> LoadedCheckpoint:
    """Verify the marker and hashes, then load tensors with safetensors (no pickle)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(directory)
    marker = read_marker(path)
    state = read_json(path / STATE_FILE, error=CheckpointError)
    tensors = {}
    for name in (ADAPTER_FILE, OPTIMIZER_FILE):
        try:
            tensors[name] = load_file(str(path / name), device=device)
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"could not read checkpoint file {path / name}: {exc}") from None
        require_finite(tensors[name], path / name)
    trainable, optimizer = tensors[ADAPTER_FILE], tensors[OPTIMIZER_FILE]
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path / STATE_FILE} lacks {', '.join(missing)}")
    parse_state(state, str(path / STATE_FILE), error=CheckpointError)
    if state.get("config_digest") != marker.get("config_digest"):
        raise CheckpointError(
            f"{path}: state.json and {MARKER_FILE} disagree about the config digest"
        )
    return LoadedCheckpoint(
        path=path, marker=marker, state=state, trainable=trainable, optimizer=optimizer
    )


_STATE_KEYS = (
    "config_digest",
    "cycle",
    "global_step",
    "parameter_version",
    "task_cursor",
    "chunk_size",
    "rng",
    "optimizer",
)


def require_finite(tensors: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """:class:`CheckpointError` naming ``path`` and the tensor if any value is NaN or inf."""
    import torch

    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"{path} holds non-finite values (NaN or inf) in tensor {name!r}",
                hint="the run diverged or the file was tampered with; resume from an earlier checkpoint",
            )


def find_latest_checkpoint(checkpoints_dir: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest global step (ties: latest cycle).

    Directories being assembled or retired start with ``.`` and are ignored; a visible
    directory without a valid marker is skipped only when it has no marker at all (an
    interrupted write of an older format), while a marker that fails its checks is
    corruption and raises, so a damaged checkpoint is never silently passed over.
    """
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return None
    best: tuple[int, int, Path] | None = None
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        if not (child / MARKER_FILE).exists():
            continue
        marker = read_marker(child)
        with contextlib.suppress(TypeError, ValueError):
            key = (
                int(marker.get("global_step") or 0),
                int(marker.get("cycle") if marker.get("cycle") is not None else -1),
            )
            if best is None or key > best[:2]:
                best = (*key, child)
    return None if best is None else best[2]


_CYCLE_NAME = re.compile(r"^cycle-(\d+)$")


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint directory: where it sits in the run's order and whether it verifies."""

    path: Path
    order: tuple[float, int]
    error: CheckpointError | None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def valid(self) -> bool:
        return self.error is None


def _order_from_name(name: str) -> tuple[float, int]:
    """(cycle, tie-break) from a directory name; unknown names sort last (latest)."""
    if name == "warmup":
        return (-1.0, 0)
    if name == "final":
        return (math.inf, 1)
    match = _CYCLE_NAME.match(name)
    return (float(int(match.group(1))), 0) if match else (math.inf, 2)


def scan_checkpoints(checkpoints_dir: str | os.PathLike[str]) -> list[CheckpointEntry]:
    """Every visible checkpoint directory, verified, oldest first (hidden ones are staging)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    entries = []
    for child in root.iterdir():
        if not child.is_dir() or child.name.startswith("."):
            continue
        order = _order_from_name(child.name)
        try:
            marker = read_marker(child)
        except CheckpointError as exc:
            entries.append(CheckpointEntry(child, order, exc))
            continue
        if child.name != "final" and isinstance(marker.get("cycle"), int):
            order = (float(marker["cycle"]), order[1])
        entries.append(CheckpointEntry(child, order, None))
    return sorted(entries, key=lambda e: (e.order, e.name))


def select_resume_checkpoint(
    checkpoints_dir: str | os.PathLike[str], name: str | None = None
) -> Path | None:
    """The checkpoint to resume: ``name`` when given, else the latest, which must verify.

    Returns ``None`` when there is no checkpoint directory at all. Raises
    :class:`CheckpointError` when ``name`` does not exist or does not verify, or when the
    latest checkpoint is incomplete or tampered with.
    """
    root = Path(checkpoints_dir)
    entries = scan_checkpoints(root)
    valid = [e.name for e in entries if e.valid]
    if name is not None:
        path = root / name
        if not path.is_dir() or name.startswith(".") or Path(name).name != name:
            raise CheckpointError(
                f"--resume-from {name}: no checkpoint directory {path}",
                hint=f"complete checkpoints here: {', '.join(valid) or 'none'}",
            )
        read_marker(path)
        return path
    if not entries:
        return None
    latest = entries[-1]
    if latest.error is not None:
        older = [n for n in valid if n != latest.name]
        raise CheckpointError(
            f"the latest checkpoint {latest.path} cannot be resumed: {latest.error.message}",
            hint=(
                f"nothing was loaded or deleted; to continue from an older checkpoint, choose it "
                f"explicitly with --resume-from NAME (complete: {', '.join(older)})"
                if older
                else "no complete checkpoint remains; start the run again in a new --output directory"
            ),
        )
    return latest.path


def newer_than(checkpoints_dir: str | os.PathLike[str], chosen: Path) -> list[Path]:
    """Checkpoint directories that sort after ``chosen`` (what an explicit older resume supersedes)."""
    entries = scan_checkpoints(checkpoints_dir)
    key = next((e.order for e in entries if e.path == chosen), None)
    if key is None:
        return []
    return [e.path for e in entries if e.order > key]


def supersede_newer(
    checkpoints_dir: str | os.PathLike[str], chosen: Path, log_sizes: dict[Path, int]
) -> dict[str, object] | None:
    """An explicit older resume: set newer checkpoints and the log tails it cuts aside.

    ``log_sizes`` maps each append-only log to the size recorded in ``chosen``. Returns what
    was moved (for the event log), or ``None`` when nothing newer exists and no log grows
    past its recorded size.
    """
    newer = newer_than(checkpoints_dir, chosen)
    cut = [log for log, size in log_sizes.items() if log.exists() and log.stat().st_size > size]
    if not newer and not cut:
        return None
    folder = set_aside(newer, checkpoints_dir)
    for log in cut:
        save_log_tail(log, log_sizes[log], folder)
    return {
        "folder": folder.name,
        "checkpoints": [p.name for p in newer],
        "log_tails": [log.name for log in cut],
    }


def set_aside(paths: list[Path], checkpoints_dir: str | os.PathLike[str]) -> Path:
    """Move ``paths`` into a new ``checkpoints/.superseded-<UTC>/`` (never delete); return it."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = Path(checkpoints_dir) / f".superseded-{stamp}"
    target.mkdir(parents=True, exist_ok=False)
    for path in paths:
        os.replace(path, target / path.name)
    return target


def save_log_tail(log: Path, size: int, folder: Path) -> None:
    """Copy the bytes of ``log`` beyond ``size`` into ``folder`` before a resume truncates them."""
    if not log.exists() or log.stat().st_size <= size:
        return
    with open(log, "rb") as handle:
        handle.seek(size)
        tail = handle.read()
    (folder / f"{log.name}.tail").write_bytes(tail)


_CYCLE_RE = re.compile(r"^cycle-(\d+)$")


def prune_cycle_checkpoints(checkpoints_dir: Path, *, keep: int | None) -> list[str]:
    """Delete all but the ``keep`` newest ``cycle-*`` checkpoints; return the deleted names.

    ``keep=None`` keeps every checkpoint. Newest means highest cycle number, so the
    checkpoint a resume would pick is never the one removed.
    """
    if keep is None or not checkpoints_dir.is_dir():
        return []
    cycles = sorted(
        (int(m.group(1)), child)
        for child in checkpoints_dir.iterdir()
        if child.is_dir() and (m := _CYCLE_RE.match(child.name))
    )
    doomed = cycles[: max(0, len(cycles) - keep)]
    for _, child in doomed:
        shutil.rmtree(child, ignore_errors=True)
    return [child.name for _, child in doomed]


_STAGING = re.compile(r"\.[A-Za-z0-9][A-Za-z0-9_.-]*\.[A-Za-z0-9_]{8}")
"""``checkpoints/.<name>.<mkdtemp suffix>``: a checkpoint being assembled (checkpoint.py)."""


def restart_artifacts(paths: RunPaths) -> list[Path]:
    """Files and directories a run writes before (or beside) its first checkpoint."""
    fixed = [
        paths.config_submitted,
        paths.config_validated,
        paths.config_original,
        paths.config_resolved,
        paths.manifest,
        paths.environment,
        paths.metrics,
        paths.trajectories,
        paths.eval_trajectories,
        paths.token_analysis,
        paths.teacher_cache,
        paths.checkpoints,
        paths.eval_json,
        paths.report_html,
        paths.summary_md,
    ]
    temporaries = (
        [p for p in paths.root.glob(".*.tmp") if p.name != LOCK_NAME] if paths.root.is_dir() else []
    )
    return [p for p in fixed + temporaries if p.exists() or p.is_symlink()]


def has_run_traces(paths: RunPaths) -> bool:
    """Whether ``paths.root`` holds anything a miniverl run writes."""
    return bool(restart_artifacts(paths)) or paths.events.exists()


def prepare_clean_restart(paths: RunPaths, config: RunConfig) -> list[str]:
    """Delete a checkpoint-less run's artifacts so it can start again; names removed.

    Refuses when a visible checkpoint directory exists (it would be a damaged checkpoint,
    never silently discarded) or when the directory's validated recipe differs.
    """
    if paths.checkpoints.is_dir():
        visible = sorted(c for c in paths.checkpoints.iterdir() if not c.name.startswith("."))
        if visible:
            raise CheckpointError(
                f"{visible[0]} has no valid checkpoint.json, so there is nothing to resume from",
                hint=f"delete {visible[0]} to restart the run from the beginning",
            )
    if paths.config_validated.exists():
        try:
            previous = RunConfig.from_mapping(
                load_yaml_file(paths.config_validated, error=RunDirectoryError),
                source=str(paths.config_validated),
            )
        except ConfigError as exc:
            raise RunDirectoryError(
                f"{paths.config_validated} is not a valid recipe: {exc.message}"
            ) from None
        if previous.digest() != config.digest():
            raise CheckpointError(
                f"{paths.root} was started with a different recipe ({paths.config_validated})",
                hint="resume with exactly the recipe and overrides of the original run",
            )
    removed = []
    for artifact in restart_artifacts(paths):
        if artifact.is_dir() and not artifact.is_symlink():
            shutil.rmtree(artifact)
        else:
            artifact.unlink()
        removed.append(artifact.name)
    return removed


def remove_stale_temporaries(paths: RunPaths, cache_dir: Path | None = None) -> list[str]:
    """Undo what a write killed half-way leaves behind; the names removed or restored.

    - ``.<name>.<random>.tmp`` files beside run artifacts and in the cache (a write that
      never reached its rename: the artifact itself is untouched);
    - ``checkpoints/.<name>.<random>/`` staging directories (a checkpoint never renamed
      into place);
    - ``checkpoints/.<name>.old``: the previous checkpoint retired while its replacement
      was being renamed in. If the replacement is there the old one is deleted, otherwise
      it is renamed back, so a crash between the two renames loses nothing.
    """
    touched: list[str] = []
    for directory in (paths.root, cache_dir or paths.teacher_cache):
        if directory.is_dir():
            for tmp in directory.glob(".*.tmp"):
                if tmp.is_file():
                    tmp.unlink()
                    touched.append(tmp.name)
    if paths.checkpoints.is_dir():
        for child in sorted(paths.checkpoints.iterdir()):
            if not child.is_dir() or not (
                _STAGING.fullmatch(child.name) or child.name.endswith(".old")
            ):
                continue  # live checkpoints and --resume-from's .superseded-* are kept
            if child.name.endswith(".old"):
                live = paths.checkpoints / child.name[1:-4]
                if not live.exists():
                    child.rename(live)
                    touched.append(f"{child.name} -> {live.name}")
                    continue
            shutil.rmtree(child)
            touched.append(child.name)
    return touched


def prepare_resume(
    paths: RunPaths, config: RunConfig, *, resume_from: str | None, events: EventLog
) -> bool:
    """Tidy a directory for ``--resume``; ``False`` when it must restart from the beginning.

    The dead run's torn ``events.jsonl`` tail is repaired and its temporaries removed. With
    no complete checkpoint (and no ``--resume-from``) but traces of a run, that run is
    recomputed from scratch (:func:`prepare_clean_restart`); with neither, resuming is an error.
    """
    traces = has_run_traces(paths)  # before temporaries are cleaned up
    repair_jsonl_tail(paths.events)
    remove_stale_temporaries(paths, Path(config.cache.dir) if config.cache.dir else None)
    if resume_from is not None or select_resume_checkpoint(paths.checkpoints):
        return True
    if not traces:
        raise CheckpointError(
            f"no complete checkpoint under {paths.checkpoints} and no run to resume in {paths.root}",
            hint="start it without --resume",
        )
    removed = prepare_clean_restart(paths, config)
    events.emit(
        "restarted",
        echo="no checkpoint yet: restarting the run from the beginning",
        removed=removed,
    )
    return False


LOG_NAMES = ("metrics", "trajectories", "eval_trajectories", "token_analysis")
"""``RunPaths`` attributes of the append-only logs whose length a checkpoint records."""


def run_logs(paths: RunPaths) -> DurableLogs:
    """Every append-only log of a run: ``events.jsonl`` (kept across a resume, never cut
    back) and the :data:`LOG_NAMES` logs, fsynced together at each durability point."""
    return DurableLogs([paths.events, *(getattr(paths, name) for name in LOG_NAMES)])


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


def _prefix_sha256(path: Path, size: int) -> str:
    """SHA-256 of a log's first ``size`` bytes; a log not written yet has recorded size 0."""
    return sha256_file(path, limit=size) if size else hashlib.sha256().hexdigest()


def log_digests(paths: RunPaths, sizes: dict[str, int]) -> dict[str, str]:
    """SHA-256 of each append-only log's prefix of ``sizes[name]`` bytes, keyed by log name.

    A checkpoint records it beside ``jsonl_sizes`` so a resume can tell a log that was
    cut short or edited since the checkpoint from one that only grew (:func:`verify_logs`).
    """
    return {name: _prefix_sha256(getattr(paths, name), size) for name, size in sizes.items()}


def verify_logs(paths: RunPaths, state: dict[str, Any], where: Path) -> None:
    """Refuse to resume onto a log that no longer holds what the checkpoint vouched for.

    Each log must be at least its recorded length (a shorter one was truncated inside the
    checkpointed records, and appending would tear a line) and, where the checkpoint has a
    digest, its recorded prefix must hash to it (an edit inside it would resume with exit 0
    and break ``report`` later). Runs before anything on disk changes.
    """
    sizes = state.get("jsonl_sizes") or {}
    digests = state.get("jsonl_digests") or {}
    for name, recorded in sizes.items():
        path = getattr(paths, name)
        size = path.stat().st_size if path.exists() else 0
        hint = (
            f"{path.name} was cut short or edited after {where.name} was written; restore it "
            "from a copy of the run, or start the run again without --resume"
        )
        if size < int(recorded):
            raise CheckpointError(
                f"{path}: {size} bytes, shorter than the {recorded} bytes that checkpoint "
                f"{where.name} recorded (field 'jsonl_sizes.{name}')",
                hint=hint,
            )
        if name in digests and _prefix_sha256(path, int(recorded)) != digests[name]:
            raise CheckpointError(
                f"{path}: its first {recorded} bytes do not match the SHA-256 that checkpoint "
                f"{where.name} recorded (field 'jsonl_digests.{name}')",
                hint=hint,
            )


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
    teacher: dict[str, Any] | None,
    paths: RunPaths,
    config_digest: str,
    logs: DurableLogs | None = None,
) -> Path:
    """Trainable weights, optimizer moments and every counter needed to resume.

    ``state.json`` goes through ``CheckpointState.build`` (``checkpoint.save_checkpoint``);
    the sample source's position is under ``source``. First the run's logs are fsynced
    (``logs``, the trainer's :class:`DurableLogs`; by default :func:`run_logs`), so the
    lengths and digests ``state.json`` records describe bytes on disk before the
    checkpoint's rename commits it.
    """
    (logs if logs is not None else run_logs(paths)).sync()
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
        "jsonl_sizes": (sizes := log_sizes(paths)),
        "jsonl_digests": log_digests(paths, sizes),
        "source": source.state_dict(),
        "teacher": teacher,
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
    """The sample source's position (``SampleSource.state_dict``); a checkpoint may keep the
    offline pool's position under that mode's name instead of ``source``."""
    return state.get("source") or state.get(mode_of_kind("teacher_pool").name) or {}


__all__ = [
    "CheckpointEntry",
    "has_run_traces",
    "log_digests",
    "newer_than",
    "prepare_clean_restart",
    "prepare_resume",
    "prune_cycle_checkpoints",
    "remove_stale_temporaries",
    "restart_artifacts",
    "run_logs",
    "save_log_tail",
    "scan_checkpoints",
    "select_resume_checkpoint",
    "set_aside",
    "supersede_newer",
    "verify_logs",
]
