"""Resumable checkpoints: safetensors + JSON, with a completion marker written last.

Layout of ``checkpoints/<name>/``:

- ``adapter.safetensors``: trainable weights only (LoRA adapters, or every weight of a
  fully fine-tuned toy student);
- ``optimizer.safetensors``: optimizer moment tensors;
- ``state.json``: step, parameter/rollout versions, task cursor, schedule, RNG states,
  optimizer scalars, config digest;
- ``checkpoint.json``: the completion marker with SHA-256 of the three files.

The directory is assembled under a temporary name and renamed into place, and the marker
is written after everything it vouches for: a checkpoint without a valid marker is never
loaded. Nothing here unpickles: a received checkpoint is inert data.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniverl.errors import CheckpointError
from miniverl.schemas.records import CheckpointState, parse_state
from miniverl.utils.hashing import sha256_file
from miniverl.utils.io import (
    atomic_path,
    checked_failpoint,
    is_disk_full,
    read_json,
    storage_error,
    write_json,
)
from miniverl.utils.logging import utc_now
from miniverl.utils.safe_load import require_regular_file

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
