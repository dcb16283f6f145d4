"""The toy teacher, made competent by the lab: its fitting traces, the fit, and the reuse cache.

Toy backend: the teacher starts as a freshly initialised
:class:`~miniverl.models.toy.ToyBackend` (or, with ``lab.toy_fit.init_from``, as a trained
toy teacher, refined here on a cold start's states) and becomes competent here, before the run
that distils from it starts (``lab/teachers/prepare.py`` hands it to the trainer):

1. fitting examples: one trace per task of the training split plus
   ``lab.toy_fit.extra_tasks`` more, a ``noise_fraction`` of them noise-injected
   (:func:`toy_fit_traces`, below), and with ``dagger`` the cold-start student's labelled
   states (``lab/teachers/dagger.py``);
2. :func:`fit_toy_model`: cross-entropy on those traces (``lab/teachers/fitting.py``, the
   student's own loss code), stopping once greedy success on a probe sample reaches
   ``lab.toy_fit.target_success``;
3. with ``lab.toy_fit.reuse`` the frozen weights go to a digest-keyed cache, so the next run
   with identical inputs loads them instead of refitting; the run keeps its own copy
   (``<run>/toy-teacher.safetensors``) and records its SHA-256.

Noise-injected traces teach the teacher to recover from a mistake it never makes: a teacher
fitted only on oracle traces has only seen states on the oracle's path, but a student's
rollouts leave that path, and on-policy distillation asks the teacher what to do *there*. A
fraction of the fitting traces get one tool-call step corrupted (``operand_digit``,
``random_operands``, ``malformed_json``, ``bad_expression``), played through the real rollout
loop so the corrupted step gets the environment's real response, then the oracle's
corrective re-call. With ``max_follow > 0`` a valid wrong call is followed for up to
``max_follow`` further calls on the wrong result before the correction. Corrupted and
follow-on steps are excluded from the fit targets: the teacher learns where to go back to,
never to make the mistake. Every noisy trace is checked to solve its task.

Reuse: fitting is deterministic, so a fitted teacher is stored once under
``$MINIVERL_CACHE_DIR/toy-teachers/<digest>/{teacher.safetensors, teacher.json}`` (default
``~/.cache/miniverl``). The digest covers the *materialised* inputs, not config fields: the
SHA-256 of the initial teacher weights, of the token ids of the fitting traces and probe
tasks, plus the hashed source files of the fitting code, so a stale teacher cannot be
reused. The JSON names the digest and the weights' SHA-256, both checked before use; writes
go to a temporary directory renamed into place.

Every function receives its collaborators (backend, runner, config, event log) explicitly.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from miniverl import __version__
from miniverl.agent.corrective import noisy_oracle_trace, targets_outside
from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.base import Task, ToolEnvironment, sample_extra_tasks
from miniverl.errors import CheckpointError, ConfigError, TrajectoryError
from miniverl.lab.config import ToyFitConfig
from miniverl.lab.teachers.dagger import dagger_examples
from miniverl.lab.teachers.fitting import fit_rows
from miniverl.models.base import CausalLMBackend
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.live import ProgressReporter
from miniverl.utils.hashing import sha256_bytes, sha256_file, sha256_json
from miniverl.utils.io import publish_modes, read_json, write_json
from miniverl.utils.logging import utc_now
from miniverl.utils.seeding import capture_rng_state, derive_seed, restore_rng_state

CACHE_ENV = "MINIVERL_CACHE_DIR"
FIT_CODE_VERSION = 1
"""Bump when the fitting procedure changes in a way the hashed sources below do not show."""
WEIGHTS_FILE = "teacher.safetensors"
META_FILE = "teacher.json"
TOY_TEACHER_FILE = "toy-teacher.safetensors"
"""The fitted toy teacher's weights, as a run and a cold start keep them."""
_PACKAGE = Path(__file__).resolve().parents[2]
FIT_SOURCES = (
    "models/toy.py",
    "models/toy_config.py",
    "lab/teachers/fitting.py",
    "models/sampling.py",
    "losses/chunked.py",
    "agent/loop.py",
    "agent/episode.py",
    "lab/teachers/toy_fit.py",
    "lab/teachers/dagger.py",
    "environments/oracle_state.py",
    "agent/corrective.py",
)
"""Source files whose text enters the digest: the fit, the probe rollouts, the loss. The
caller's inputs (teacher, splits, runner, chunk size, device, config) reach the digest through
their materialised values in :func:`toy_teacher_digest_inputs`."""


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
        publish_modes(staging)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


FitExample = tuple[list[int], list[int]]
"""``(token_ids, target_positions)``: what ``fit_toy_model`` trains on."""


@dataclass(frozen=True)
class FitTrace:
    """One fitting trace and its provenance.

    ``corrupted_turn`` is the first turn whose tokens are excluded from the targets (``None``
    for a clean oracle trace); ``corrupted_text`` is what that turn "generated"; ``followed``
    more turns after it carried on the wrong chain and are excluded too.
    """

    trajectory: Trajectory
    example: FitExample
    corrupted_turn: int | None = None
    kind: str | None = None
    corrupted_text: str | None = None
    followed: int = 0

    @property
    def excluded_turns(self) -> list[int]:
        if self.corrupted_turn is None:
            return []
        return list(range(self.corrupted_turn, self.corrupted_turn + 1 + self.followed))


# ------------------------------------------------------------------ pure corruptions


def noisy_indices(count: int, fraction: float, seed: int) -> set[int]:
    """Exactly ``round(fraction * count)`` of ``range(count)``, a seeded sample."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"noise_fraction must be in [0, 1], got {fraction}")
    return set(random.Random(f"noisy-traces/{seed}").sample(range(count), round(fraction * count)))


def fit_example(trajectory: Trajectory, excluded_turns: Sequence[int] = ()) -> FitExample:
    """Token ids and every model-generated target position outside ``excluded_turns``."""
    return list(trajectory.token_ids), targets_outside(trajectory, excluded_turns)


# ------------------------------------------------------------------ playing a trace


def toy_fit_traces(
    runner: RolloutRunner,
    tasks: Sequence[Task],
    *,
    noise_fraction: float,
    seed: int,
    kinds: dict[str, float] | None = None,
    max_follow: int = 0,
) -> list[FitTrace]:
    """One fitting trace per task: the oracle's, or for ``round(noise_fraction * n)`` seeded
    tasks a noise-injected one (``kinds`` weights, up to ``max_follow`` follow-on calls). With
    ``noise_fraction == 0`` these are exactly the oracle traces the toy teacher was always
    fitted on.
    """
    noisy = noisy_indices(len(tasks), noise_fraction, seed)
    out: list[FitTrace] = []
    for i, task in enumerate(tasks):
        if i in noisy:
            rng = random.Random(f"noisy-traces/{seed}/{i}")
            trace = noisy_oracle_trace(runner, task, rng, kinds=kinds, max_follow=max_follow)
            out.append(
                FitTrace(
                    trace.trajectory,
                    trace.example,
                    trace.corrupted_turn,
                    trace.kind,
                    trace.corrupted_text,
                    trace.followed,
                )
            )
        else:
            trajectory = runner.oracle_rollout(task)
            out.append(FitTrace(trajectory, fit_example(trajectory)))
    return out


# ------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class ToyFitReport:
    """What :func:`fit_toy_model` did."""

    steps_run: int
    loss_history: list[float] = field(repr=False)
    final_loss: float
    stopped_early: bool
    seconds: float


def fit_toy_model(
    backend: Any,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
    chunk_size: int = 64,
    stop_when: Callable[[int], bool] | None = None,
    check_every: int = 50,
    on_step: Callable[[int, float], None] | None = None,
) -> ToyFitReport:
    """Train every decoder parameter of a ``ToyBackend`` on ``(token_ids, target_positions)``.

    Target ``j`` is the supervised token, predicted from position ``j - 1``; each example
    weighs the same whatever its length (weights sum to one per row). Batches walk a
    seeded shuffle of the examples epoch by epoch. The loss is the project's
    ``chunked_selected_position_loss`` in pure cross-entropy form (``provider=None``), so
    the teacher is fitted by the same code path that later trains the student.
    ``stop_when(step)`` is asked every ``check_every`` steps; ``True`` ends the fit early.
    ``on_step(step, loss)`` is told about every step (a progress bar listens).
    Parameters frozen for LoRA are unfrozen for the fit and frozen again afterwards.
    """
    if steps < 0 or batch_size < 1 or check_every < 1 or chunk_size < 1:
        raise ConfigError(
            "fit_toy_model needs steps >= 0 and batch_size, check_every, chunk_size >= 1"
        )
    rows = [_checked_example(ids, targets, k) for k, (ids, targets) in enumerate(examples)]
    if not rows:
        raise ConfigError(
            "fit_toy_model needs at least one example",
            hint="pass oracle traces of the training tasks",
        )

    module = backend.module
    params = list(module.parameters())
    frozen = [p for p in params if not p.requires_grad]
    was_training = module.training
    for p in frozen:
        p.requires_grad_(True)
    started = time.perf_counter()
    backend.set_train(True)
    try:
        history, stopped = fit_rows(
            backend,
            rows,
            params,
            steps=steps,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            chunk_size=chunk_size,
            on_step=on_step,
            stop_when=stop_when,
            check_every=check_every,
        )
    finally:
        for p in frozen:
            p.requires_grad_(False)
            p.grad = None
        backend.set_train(was_training)
    return ToyFitReport(
        steps_run=len(history),
        loss_history=history,
        final_loss=history[-1] if history else float("nan"),
        stopped_early=stopped,
        seconds=time.perf_counter() - started,
    )


def _checked_example(
    ids: Sequence[int], targets: Sequence[int], k: int
) -> tuple[list[int], list[int]]:
    ids, targets = [int(i) for i in ids], [int(j) for j in targets]
    if not targets:
        raise TrajectoryError(f"fit example {k} has no target positions")
    for j in targets:
        if j == 0:
            raise TrajectoryError("position 0 can never be a training target")
        if not 0 < j < len(ids):
            raise TrajectoryError(
                f"fit example {k}: target position {j} is outside [0, {len(ids)})"
            )
    return ids, targets


# ------------------------------------------------------------------------------- the teacher


def greedy_success(
    runner: RolloutRunner, tasks: Sequence[Task], *, seed: int, batch_size: int, split: Any
) -> float:
    """Fraction of ``tasks`` solved by greedy rollouts (probe seeds derived from ``seed``)."""
    if not tasks:
        return 0.0
    requests = [EpisodeRequest(task, derive_seed(seed, "probe", i)) for i, task in enumerate(tasks)]
    trajectories = runner.rollout_batch(
        requests, batch_size=batch_size, temperature=0.0, split=split
    )
    return sum(int(t.solved) for t in trajectories) / len(tasks)


def freeze(teacher: CausalLMBackend) -> None:
    """No gradients and eval mode: from here on the teacher only scores."""
    for p in teacher.trainable_parameters():
        p.requires_grad_(False)
    teacher.set_train(False)


def teacher_bytes(teacher: CausalLMBackend) -> bytes:
    """Every teacher parameter as one safetensors file's bytes (what a run keeps and hashes)."""
    from safetensors.torch import save

    return save(
        {k: v.detach().to("cpu").contiguous() for k, v in teacher.full_state_dict().items()}
    )


def fit_traces(
    oracle_runner: RolloutRunner, pool: Sequence[Task], fit: ToyFitConfig, seed: int
) -> list[FitTrace]:
    """The teacher's fitting traces of ``pool`` as ``lab.toy_fit`` asks (noise fraction,
    corruption kinds, follow-on calls), seeded by the run seed."""
    return toy_fit_traces(
        oracle_runner,
        pool,
        noise_fraction=fit.noise_fraction,
        seed=derive_seed(seed, "toy-teacher-noise"),
        kinds=dict(fit.noise_kinds),
        max_follow=fit.noise_max_follow,
    )


def load_teacher(teacher: CausalLMBackend, path: Path, weights_sha256: str | None) -> None:
    """Load ``path`` into ``teacher`` after checking it against ``weights_sha256``."""
    if not path.is_file() or sha256_file(path) != weights_sha256:
        raise CheckpointError(
            f"{path} is missing or does not match the SHA-256 recorded beside it",
            hint="use an intact cold start, or fit the teacher again",
        )
    teacher.load_full_state_dict(load_file(str(path)))


def start_toy_from(teacher: CausalLMBackend, path: str) -> dict[str, Any]:
    """Load the trained toy model at ``path`` (``lab.toy_fit.init_from``) into ``teacher``, the
    fit's starting point; its record (path, SHA-256, tensor count). A fit from a trained
    teacher refines it on new rows (a cold start's labelled states) instead of learning the
    task again from scratch; its weights' SHA-256 enters the reuse digest as the initial
    weights, so its path does not."""
    from miniverl.training.teacher_checkpoint import load_teacher_checkpoint

    try:
        return load_teacher_checkpoint(teacher, path, backend="toy")
    except CheckpointError as error:
        raise CheckpointError(
            f"lab.toy_fit.init_from: {error.message}",
            hint="point lab.toy_fit.init_from at a toy run directory written by 'miniverl "
            "train' (a student trained without LoRA, of models.teacher's shape), one of its "
            f"checkpoints, a cold start or a .safetensors file of that model ({path} is not one)",
        ) from error


def fit_toy_teacher(
    teacher: CausalLMBackend,
    *,
    config: RunConfig,
    fit: ToyFitConfig,
    environment: ToolEnvironment,
    splits: Mapping[str, list[Task]],
    oracle_runner: RolloutRunner,
    chunk_size: int,
    device: str,
    events: Any,
    progress: ProgressReporter,
    split: Any,
    student: CausalLMBackend | None = None,
) -> dict[str, Any]:
    """Fit the toy teacher (or load an identical earlier fit); its report.

    ``oracle_runner`` plays the fitting traces (any runner over ``environment``); ``split``
    is the out-of-memory splitter for probe and student rollouts. With ``fit.dagger.enabled``
    the rows also hold ``student``'s labelled states on the training tasks
    (``lab/teachers/dagger.py``); their ids enter the digest with every other row. The
    report's ``cost`` holds the CPU and wall seconds of rows, fit and probes, the rows and
    the steps; ``fit_task_ids`` every task a row came from (the held-out gate checks its
    tasks are disjoint from them); ``weights_sha256`` the SHA-256 of the teacher's
    safetensors file (:func:`teacher_bytes`). ``events`` gets ``toy_teacher_fitted`` or
    ``toy_teacher_reused``. The global RNG state is the same afterwards as before a fit.
    """
    seed = config.run.seed
    started_from = start_toy_from(teacher, fit.init_from) if fit.init_from is not None else None
    train = splits["train"]
    extra = sample_extra_tasks(
        environment,
        fit.extra_tasks,
        derive_seed(config.environment.split_seed, "toy-teacher-pool"),
        config.environment.difficulty,
        exclude=[t for tasks in splits.values() for t in tasks],
    )
    pool = train + extra
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    examples = [trace.example for trace in fit_traces(oracle_runner, pool, fit, seed)]
    dagger_counts: dict[str, Any] = {}
    if fit.dagger.enabled:
        if student is None:
            raise ConfigError(
                "lab.toy_fit.dagger.enabled needs the warmed-up student whose states it labels",
                hint="fit it in a benchmark's cold start ('miniverl benchmark'), or set "
                "lab.toy_fit.dagger.enabled: false",
            )
        rows, dagger_counts = dagger_examples(
            student,
            environment,
            train,
            fit.dagger,
            config.rollout,
            seed=derive_seed(seed, "toy-teacher-dagger"),
            batch_size=config.eval.batch_size,
            split=split,
        )
        examples.extend(rows)
    runner = RolloutRunner(teacher, environment, config.rollout)
    probe = random.Random(derive_seed(seed, "toy-teacher-probe")).sample(
        pool, min(len(pool), fit.probe_tasks)
    )
    eval_tasks = splits[config.eval.split][: config.eval.max_tasks]

    def success(tasks: Sequence[Task]) -> float:
        return greedy_success(
            runner, tasks, seed=seed, batch_size=config.eval.batch_size, split=split
        )

    inputs = toy_teacher_digest_inputs(
        teacher,
        examples=examples,
        probe=probe,
        train=train,
        eval_tasks=eval_tasks,
        fit=fit.model_dump(mode="json", exclude={"reuse", "init_from"}),
        rollout=config.rollout.model_dump(mode="json"),
        chunk_size=chunk_size,
        seed=seed,
        device=device,
    )
    digest = teacher_digest(inputs)
    cached = load_cached_teacher(digest) if fit.reuse else None
    if cached is not None:
        teacher.load_full_state_dict(cached[0])
        freeze(teacher)
        report = {
            **cached[1],
            "reused": True,
            "cache_digest": digest,
            "weights_sha256": sha256_bytes(teacher_bytes(teacher)),
        }
        events.emit(
            "toy_teacher_reused",
            echo=f"cached fit {digest[:12]} from {cache_root()} (saved {cached[1].get('seconds', 0):.0f}s of fitting)",
            **report,
        )
        return report
    checks: list[dict[str, float]] = []
    rng_before = capture_rng_state()

    with progress.task("fitting toy teacher", max(1, fit.max_steps)) as advance:
        last = {"probe": None}

        def solved_enough(step: int) -> bool:
            rate = success(probe)
            checks.append({"step": step, "probe_success": rate})
            last["probe"] = rate
            return rate >= fit.target_success

        def on_step(step: int, loss: float) -> None:
            probe_text = "" if last["probe"] is None else f" | probe accuracy {last['probe']:.0%}"
            advance(stats=f"step {step} | loss {loss:.3f}{probe_text}")

        fitted_run = fit_toy_model(
            teacher,
            examples,
            steps=fit.max_steps,
            lr=fit.lr,
            batch_size=fit.batch_size,
            seed=derive_seed(seed, "toy-teacher-fit"),
            chunk_size=max(1, chunk_size),
            stop_when=solved_enough,
            check_every=fit.check_every,
            on_step=on_step,
        )
    freeze(teacher)
    train_success = success(train)
    eval_success = success(eval_tasks)
    restore_rng_state(rng_before)
    weights_sha256 = sha256_bytes(teacher_bytes(teacher))
    fitted = {
        "cost": {
            "wall_seconds": round(time.perf_counter() - wall_started, 2),
            "cpu_seconds": round(time.process_time() - cpu_started, 2),
            "examples": len(examples),
            "steps": fitted_run.steps_run,
            "torch_threads": torch.get_num_threads(),
        },
        **dagger_counts,
        **({"init_from": started_from} if started_from is not None else {}),
        "fit_task_ids": sorted(t.task_id for t in pool),
        "steps": fitted_run.steps_run,
        "final_loss": fitted_run.final_loss,
        "stopped_early": fitted_run.stopped_early,
        "seconds": round(fitted_run.seconds, 2),
        "fit_tasks": len(pool),
        "extra_tasks": len(extra),
        "train_success": train_success,
        "heldout_success": eval_success,
        "checks": checks,
    }
    if fit.reuse:
        store_teacher(digest, teacher.full_state_dict(), fitted, inputs)
    report = {**fitted, "reused": False, "cache_digest": digest, "weights_sha256": weights_sha256}
    events.emit(
        "toy_teacher_fitted",
        echo=f"{fitted_run.steps_run} steps, greedy success train {train_success:.2f} / held-out {eval_success:.2f}",
        **report,
    )
    return report


__all__ = [
    "CACHE_ENV",
    "FIT_SOURCES",
    "TOY_TEACHER_FILE",
    "FitTrace",
    "ToyFitReport",
    "cache_root",
    "code_sha256",
    "fit_example",
    "fit_toy_model",
    "fit_toy_teacher",
    "fit_traces",
    "freeze",
    "greedy_success",
    "load_cached_teacher",
    "load_teacher",
    "noisy_indices",
    "start_toy_from",
    "store_teacher",
    "teacher_bytes",
    "teacher_digest",
    "teacher_dir",
    "tensors_sha256",
    "token_sequences_sha256",
    "toy_fit_traces",
    "toy_teacher_digest_inputs",
]
