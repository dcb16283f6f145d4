"""A fitted toy teacher, cached by a digest of everything that determines it.

Fitting the toy teacher is deterministic: the same initial weights, fitting examples,
probe tasks, fit hyperparameters, device, torch version and fitting code give the same
weights. So a fitted teacher is stored once under

    $MINIVERL_CACHE_DIR/toy-teachers/<digest>/{teacher.safetensors, teacher.json}

(default ``~/.cache/miniverl``) and every later ``train``, ``demo`` or ``benchmark`` whose
digest matches loads it instead of refitting. The digest inputs are deliberately the
*materialised* inputs, not config fields: the SHA-256 of the initial teacher weights
(which captures seed, architecture and initialisation order), of the token ids of the
oracle fitting traces and probe tasks (which capture the environment, its tasks, the
split seed and the tokenizer), plus the hashed source files of the fitting code. A
change anywhere upstream changes one of these, so a stale teacher cannot be reused.

Only safetensors and JSON are read; the JSON names the digest and the weights' SHA-256,
and both are checked before a cached teacher is used. Writes go to a temporary
directory that is renamed into place, so a crash never leaves an entry that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from miniverl import __version__
from miniverl.utils.hashing import sha256_file, sha256_json
from miniverl.utils.io import read_json, write_json
from miniverl.utils.logging import utc_now

CACHE_ENV = "MINIVERL_CACHE_DIR"
FIT_CODE_VERSION = 1
"""Bump when the fitting procedure changes in a way the hashed sources below do not show."""
WEIGHTS_FILE = "teacher.safetensors"
META_FILE = "teacher.json"
_PACKAGE = Path(__file__).resolve().parents[1]
FIT_SOURCES = (
    "models/toy.py",
    "models/toy_config.py",
    "models/fitting.py",
    "models/sampling.py",
    "losses/chunked.py",
    "agent/loop.py",
    "agent/episode.py",
    "training/toy_teacher.py",
    "training/teacher_reuse.py",
    "training/noisy_traces.py",
    "environments/oracle_state.py",
)
"""Source files whose text enters the digest: the fit, the probe rollouts, the loss.

The trainer is not among them: every input it hands ``training/toy_teacher.py`` (teacher,
splits, runner, chunk size, device, config) reaches the digest through its materialised
values in :func:`toy_teacher_digest_inputs`.
"""


def cache_root() -> Path:
    """``$MINIVERL_CACHE_DIR`` if set, else ``~/.cache/miniverl``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "miniverl"


def teacher_dir(digest: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "toy-teachers" / digest


def tensors_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """Order-independent SHA-256 of named tensors (name, dtype, shape and bytes)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def token_sequences_sha256(sequences: Sequence[Sequence[int]]) -> str:
    h = hashlib.sha256()
    for seq in sequences:
        h.update(json.dumps([int(i) for i in seq]).encode())
        h.update(b"\n")
    return h.hexdigest()


def code_sha256(files: Sequence[str] = FIT_SOURCES) -> str:
    h = hashlib.sha256(f"fit-code-v{FIT_CODE_VERSION}".encode())
    for rel in files:
        h.update(rel.encode())
        h.update((_PACKAGE / rel).read_bytes())
    return h.hexdigest()


def teacher_digest(inputs: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the digest inputs."""
    return sha256_json(inputs, compact=False)


def _tasks_sha256(tasks: Sequence[Any]) -> str:
    rows = [
        {"task_id": t.task_id, "prompt": t.prompt, "answer": t.answer, "data": dict(t.data)}
        for t in tasks
    ]
    return sha256_json(rows, compact=False, default=str)


def toy_teacher_digest_inputs(
    teacher: Any,
    *,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    probe: Sequence[Any],
    train: Sequence[Any],
    eval_tasks: Sequence[Any],
    fit: Mapping[str, Any],
    rollout: Mapping[str, Any],
    chunk_size: int,
    seed: int,
    device: str,
) -> dict[str, Any]:
    """Everything the fitted weights (and the fit report stored beside them) depend on.

    ``teacher`` is the freshly initialised backend, before any fitting.
    """
    return {
        "initial_weights_sha256": tensors_sha256(teacher.full_state_dict()),
        "fit_examples_sha256": token_sequences_sha256([ids for ids, _ in examples]),
        "fit_targets_sha256": token_sequences_sha256([targets for _, targets in examples]),
        "probe_tasks_sha256": _tasks_sha256(probe),
        "train_tasks_sha256": _tasks_sha256(train),
        "eval_tasks_sha256": _tasks_sha256(eval_tasks),
        "tokenizer_fingerprint": teacher.tokenizer.fingerprint,
        "fit": dict(fit),
        "rollout": dict(rollout),
        "chunk_size": int(chunk_size),
        "seed": int(seed),
        "device": str(device),
        "torch": torch.__version__,
        "code_sha256": code_sha256(),
    }


def load_cached_teacher(
    digest: str, root: Path | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The cached weights and fit report, or ``None`` when absent or failing verification."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = teacher_dir(digest, root)
    meta_path, weights = directory / META_FILE, directory / WEIGHTS_FILE
    if not meta_path.is_file() or not weights.is_file():
        return None
    try:
        meta = read_json(meta_path)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    if (
        not isinstance(meta, dict)
        or meta.get("digest") != digest
        or meta.get("weights_sha256") != sha256_file(weights)
    ):
        return None
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError):
        return None
    return state, dict(meta.get("report") or {})


def store_teacher(
    digest: str,
    state: Mapping[str, torch.Tensor],
    report: Mapping[str, Any],
    inputs: Mapping[str, Any],
    root: Path | None = None,
) -> Path:
    """Write one cache entry atomically (temp directory, then rename); return its path."""
    from safetensors.torch import save_file

    target = teacher_dir(digest, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}.", dir=target.parent))
    try:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in state.items()},
            str(staging / WEIGHTS_FILE),
        )
        write_json(
            staging / META_FILE,
            {
                "digest": digest,
                "weights_sha256": sha256_file(staging / WEIGHTS_FILE),
                "inputs": dict(inputs),
                "report": dict(report),
                "created_at": utc_now(),
                "miniverl_version": __version__,
            },
        )
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


__all__ = [
    "CACHE_ENV",
    "cache_root",
    "code_sha256",
    "load_cached_teacher",
    "store_teacher",
    "teacher_digest",
    "teacher_dir",
    "tensors_sha256",
    "token_sequences_sha256",
    "toy_teacher_digest_inputs",
]
