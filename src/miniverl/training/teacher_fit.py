"""Making the teacher competent: the toy teacher fit, its noisy traces and reuse digest,
the HF teacher adapter fit, and the benchmark cold start.

Toy backend: the teacher starts as a freshly initialised
:class:`~miniverl.models.toy.ToyBackend` and becomes competent here:

1. fitting examples: one trace per task of the training split plus
   ``models.toy_fit.extra_tasks`` more, a ``noise_fraction`` of them noise-injected
   (:func:`toy_fit_traces`, below);
2. :func:`fit_toy_model`: cross-entropy on those traces (``models/fitting.py``, the student's
   own loss code), stopping once greedy success on a probe sample reaches
   ``models.toy_fit.target_success``;
3. the frozen weights go to ``<run>/toy-teacher.safetensors`` (hashed in every checkpoint)
   and, with ``models.toy_fit.reuse``, to a digest-keyed cache, so the next run with
   identical inputs loads them instead of refitting.

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

HF backend: with ``models.teacher_fit.enabled`` the shared base carries a second LoRA
adapter, ``teacher``, fitted by cross-entropy on oracle traces of the training tasks (plus
``extra_tasks``, never an evaluation task) and corrective traces of a
``corrective_fraction`` of them, then frozen and saved under ``cache_dir/<digest>/`` (base
identity, tokenizer, adapter shape, fit settings, environment, seeds).

Cold start: the benchmark trains one warmed-up student (and fitted toy teacher) per seed and
starts every arm from it. Only weights cross (``student.safetensors``,
``toy-teacher.safetensors``, ``cold_start.json`` with SHA-256 of both), so no optimizer
momentum leaks between arms.

Every function receives its collaborators (backend, runner, config, paths, event log)
explicitly; none sees the trainer.
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
from miniverl.agent.corrective import (
    noisy_oracle_trace,
    targets_outside,
)
from miniverl.agent.loop import EpisodeRequest, RolloutRunner
from miniverl.agent.protocol import format_final, format_tool_call
from miniverl.config.models import RolloutConfig, RunConfig
from miniverl.config.sections import DaggerConfig, ToyFitConfig
from miniverl.environments.base import Task, ToolEnvironment, sample_extra_tasks
from miniverl.environments.oracle_state import (
    OracleAction,
    oracle_tool_results,
)
from miniverl.errors import CheckpointError, ConfigError, TrajectoryError
from miniverl.models.base import CausalLMBackend
from miniverl.models.fitting import TurnState, fit_rows, rows_sha256, turn_states
from miniverl.schemas.trajectory import Trajectory
from miniverl.training.checkpoint import TOY_TEACHER_FILE, save_tensors
from miniverl.training.live import ProgressReporter
from miniverl.training.sources import oom_splitter
from miniverl.trajectory.masks import model_target_positions
from miniverl.utils.hashing import sha256_file, sha256_json
from miniverl.utils.io import publish_modes, read_json, write_json
from miniverl.utils.logging import EventLog, utc_now
from miniverl.utils.seeding import capture_rng_state, derive_seed, restore_rng_state

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
    "training/teacher_fit.py",
    "environments/oracle_state.py",
    "agent/corrective.py",
)
"""Source files whose text enters the digest: the fit, the probe rollouts, the loss.

``training/teacher_fit.py`` also holds the adapter fit and the cold start, so an edit there
refits too: conservative, never stale. The trainer is not among them: every input it hands
the fit (teacher,
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


def save_teacher(teacher: CausalLMBackend, path: Path) -> str:
    """Every teacher parameter to ``path`` (safetensors); the file's SHA-256."""
    return save_tensors(teacher.full_state_dict(), path)


def fit_traces(
    oracle_runner: RolloutRunner, pool: Sequence[Task], fit: ToyFitConfig, seed: int
) -> list[FitTrace]:
    """The teacher's fitting traces of ``pool`` as ``models.toy_fit`` asks (noise fraction,
    corruption kinds, follow-on calls), seeded by the run seed."""
    return toy_fit_traces(
        oracle_runner,
        pool,
        noise_fraction=fit.noise_fraction,
        seed=derive_seed(seed, "toy-teacher-noise"),
        kinds=dict(fit.noise_kinds),
        max_follow=fit.noise_max_follow,
    )


def render_action(action: OracleAction) -> str:
    """An oracle action as oracle traces write it (``format_tool_call`` / ``format_final``)."""
    if action.call is None:
        return format_final(action.answer or "")
    return format_tool_call(action.call)


def label_student_states(
    environment: ToolEnvironment,
    tasks_by_id: Mapping[str, Task],
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
) -> list[TurnState]:
    """Every assistant turn of ``trajectories`` with the oracle's next action from its state."""
    expected: dict[str, list[str]] = {}
    states: list[TurnState] = []
    for traj in trajectories:
        task = tasks_by_id[traj.task_id]
        if task.task_id not in expected:
            expected[task.task_id] = oracle_tool_results(environment, task)
        states.extend(
            turn_states(
                environment,
                task,
                traj,
                encode=tokenizer.encode,
                render=render_action,
                expected_results=expected[task.task_id],
            )
        )
    return states


def dagger_rollouts(
    student: CausalLMBackend,
    environment: ToolEnvironment,
    tasks: Sequence[Task],
    dagger: DaggerConfig,
    rollout: RolloutConfig,
    *,
    seed: int,
    batch_size: int | None,
    split: Any = None,
) -> list[Trajectory]:
    """The student's episodes on ``tasks`` that DAgger labels: ``rollouts_per_task`` each.

    Episode ``r`` of task ``i`` samples at ``temperatures[r % len(temperatures)]`` with seed
    ``derive_seed(seed, "dagger", r, i)``.
    """
    runner = RolloutRunner(student, environment, rollout)
    out: list[Trajectory] = []
    for r in range(dagger.rollouts_per_task):
        temperature = dagger.temperatures[r % len(dagger.temperatures)]
        requests = [
            EpisodeRequest(
                task, derive_seed(seed, "dagger", r, i), trajectory_id=f"{task.task_id}:dagger-{r}"
            )
            for i, task in enumerate(tasks)
        ]
        out.extend(
            runner.rollout_batch(
                requests, batch_size=batch_size, temperature=temperature, split=split
            )
        )
    return out


def dagger_examples(
    student: CausalLMBackend,
    environment: ToolEnvironment,
    train: Sequence[Task],
    dagger: DaggerConfig,
    rollout: RolloutConfig,
    *,
    seed: int,
    batch_size: int | None,
    split: Any = None,
) -> tuple[list[FitExample], dict[str, Any]]:
    """Labelled student states of the training tasks as fit rows, and what they hold.

    Only ``train`` (the first ``dagger.tasks`` of it) is rolled out: a held-out task never
    becomes a fitting state. Each turn gives one row, the oracle's action from the turn's
    state (:meth:`~miniverl.models.fitting.TurnState.fit_row`).
    """
    tasks = list(train)[: dagger.tasks] if dagger.tasks is not None else list(train)
    trajectories = dagger_rollouts(
        student, environment, tasks, dagger, rollout, seed=seed, batch_size=batch_size, split=split
    )
    by_id = {t.task_id: t for t in tasks}
    states = label_student_states(environment, by_id, trajectories, student.tokenizer)
    counts = {
        "dagger_tasks": len(tasks),
        "dagger_episodes": len(trajectories),
        "dagger_solved": sum(int(t.solved) for t in trajectories),
        "dagger_states": len(states),
        "dagger_off_path_states": sum(s.off_path for s in states),
        "dagger_deviated_turns": sum(s.deviated for s in states),
    }
    return [s.fit_row() for s in states], counts


def load_teacher(teacher: CausalLMBackend, path: Path, weights_sha256: str | None) -> None:
    """Load ``path`` into ``teacher`` after checking it against ``weights_sha256``."""
    if not path.is_file() or sha256_file(path) != weights_sha256:
        raise CheckpointError(
            f"{path} is missing or does not match its SHA-256 in the checkpoint",
            hint="start a new run",
        )
    teacher.load_full_state_dict(load_file(str(path)))


def prepare_toy_teacher(
    teacher: CausalLMBackend,
    *,
    config: RunConfig,
    environment: ToolEnvironment,
    splits: Mapping[str, list[Task]],
    oracle_runner: RolloutRunner,
    chunk_size: int,
    device: str,
    run_dir: Path,
    events: EventLog,
    progress: ProgressReporter,
    split: Any,
    publish: Callable[[dict[str, Any]], None],
    student: CausalLMBackend | None = None,
) -> dict[str, Any]:
    """Fit the toy teacher (or load an identical earlier fit) and save it into ``run_dir``.

    ``oracle_runner`` plays the fitting traces (any runner over ``environment``); ``split``
    is the out-of-memory splitter for probe and student rollouts. With
    ``models.toy_fit.dagger.enabled`` the rows also hold ``student``'s labelled states on the
    training tasks (:func:`dagger_examples`); their ids enter the digest with every other row.
    The report's ``cost`` holds the CPU and wall seconds of rows, fit and probes, the rows
    and the steps; ``fit_task_ids`` every task a row came from (the held-out gate checks
    its tasks are disjoint from them). ``publish(report)`` is called once the
    weights are in ``run_dir``, before the ``toy_teacher_fitted``/``toy_teacher_reused``
    event, so the caller can record the report (the manifest) first. The global RNG state is
    the same afterwards as before a fit, so a run's later draws do not depend on how long
    the fit took. Returns the report.
    """
    fit = config.models.toy_fit
    seed = config.run.seed
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
                "models.toy_fit.dagger.enabled needs the cold-start student, and none was given",
                hint="fit the DAgger teacher from a stored cold start "
                "(benchmarks/dagger_teacher_gate.py), or set models.toy_fit.dagger.enabled: false",
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
        fit=fit.model_dump(mode="json", exclude={"reuse"}),
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
            "weights_sha256": save_teacher(teacher, run_dir / TOY_TEACHER_FILE),
        }
        publish(report)
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
    weights_sha256 = save_teacher(teacher, run_dir / TOY_TEACHER_FILE)
    fitted = {
        "cost": {
            "wall_seconds": round(time.perf_counter() - wall_started, 2),
            "cpu_seconds": round(time.process_time() - cpu_started, 2),
            "examples": len(examples),
            "steps": fitted_run.steps_run,
        },
        **dagger_counts,
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
    publish(report)
    events.emit(
        "toy_teacher_fitted",
        echo=f"{fitted_run.steps_run} steps, greedy success train {train_success:.2f} / held-out {eval_success:.2f}",
        **report,
    )
    return report


COLD_START_STUDENT = "student.safetensors"
COLD_START_MARKER = "cold_start.json"
COLD_START_IDENTITY = "recipe_identity"
"""Marker key of :func:`cold_start_identity`: what the saved weights are valid for."""
COLD_START_HINT = (
    "start from a cold start exported under the same backend, student model, adapter settings "
    "and environment (a benchmark seed's cold-start directory of this recipe), or leave out "
    "--cold-start to warm up from scratch"
)


def _model_identity(model_id: str) -> dict[str, Any]:
    """The fetch marker's GGUF digest, else the resolved local directory, else the hub id.

    A relative and an absolute path to one directory are the same model.
    """
    identity = base_identity(model_id)
    path = Path(model_id).expanduser()
    if "model_id" in identity and path.is_dir():
        return {"model_dir": str(path.resolve())}
    return identity


def cold_start_identity(cfg: RunConfig) -> dict[str, Any]:
    """What a cold start's student weights only make sense under, as JSON-ready values.

    The backend, the student's base model (:func:`_model_identity`), revision, tokenizer,
    adapter shape and toy architecture decide which tensors the weights are and what they
    sit on; the environment and its params decide the protocol the warm-up taught.
    Objective, learning rates, cycles and seeds may differ (benchmark arms vary exactly those).
    """
    student = cfg.models.student
    return {
        "backend": cfg.models.backend,
        "student_model": _model_identity(student.model_id),
        "student_revision": student.revision,
        "student_tokenizer": student.tokenizer_id,
        "student_lora": student.lora.model_dump(mode="json"),
        "student_toy": None if student.toy is None else student.toy.model_dump(mode="json"),
        "environment": cfg.environment.name,
        "environment_params": json.loads(json.dumps(dict(cfg.environment.params))),
    }


def check_cold_start(directory: Path, cfg: RunConfig) -> dict[str, Any]:
    """The marker of the cold start in ``directory``, refused unless it fits ``cfg``.

    Reads only ``cold_start.json``, so a run can call it before writing anything. Raises
    :class:`CheckpointError` when the marker is missing or unreadable, or when its
    :func:`cold_start_identity` differs from ``cfg``'s (every differing field is named).
    A marker written without an identity is checked only by the name and shape checks of
    the weights load.
    """
    marker_path = directory / COLD_START_MARKER
    if not marker_path.is_file():
        raise CheckpointError(
            f"{marker_path} not found: {directory} is not a cold start",
            hint="pass a directory holding cold_start.json and student.safetensors, e.g. "
            "<benchmark output>/seed-<n>/cold-start",
        )
    marker = read_json(marker_path, error=CheckpointError)
    recorded = marker.get(COLD_START_IDENTITY)
    if recorded is None:
        return marker
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{marker_path}: {COLD_START_IDENTITY} is not a mapping")
    expected = cold_start_identity(cfg)
    differ = [
        f"{key}: cold start {recorded.get(key)!r}, this run {value!r}"
        for key, value in expected.items()
        if recorded.get(key) != value
    ]
    if differ:
        raise CheckpointError(
            f"cold start {directory} was made for another recipe or base model: "
            + "; ".join(differ),
            hint=COLD_START_HINT,
        )
    return marker


def save_cold_start(
    directory: Path,
    *,
    student: CausalLMBackend,
    toy_teacher: CausalLMBackend | None,
    parameter_version: int,
    global_step: int,
    config_digest: str,
    evaluations: dict[str, Any],
    toy_teacher_report: dict[str, Any] | None,
    identity: dict[str, Any] | None = None,
) -> Path:
    """Write the student's trainable weights (and ``toy_teacher``, when given) to ``directory``.

    ``identity`` (:func:`cold_start_identity` of the run) is what :func:`check_cold_start`
    compares a later run against.
    """
    directory.mkdir(parents=True, exist_ok=True)
    marker: dict[str, Any] = {
        "student_sha256": save_tensors(
            student.trainable_state_dict(), directory / COLD_START_STUDENT
        ),
        "parameter_version": parameter_version,
        "global_optimizer_step": global_step,
        "config_digest": config_digest,
        "evaluations": evaluations,
        "toy_teacher": toy_teacher_report,
    }
    if identity is not None:
        marker[COLD_START_IDENTITY] = identity
    if toy_teacher is not None:
        marker["toy_teacher_sha256"] = save_teacher(toy_teacher, directory / TOY_TEACHER_FILE)
    write_json(directory / COLD_START_MARKER, marker)
    return directory


@dataclass(frozen=True)
class LoadedColdStart:
    """What :func:`load_cold_start` read; ``toy_teacher_report`` is ``None`` without a toy teacher."""

    marker: dict[str, Any]
    toy_teacher_sha256: str | None
    toy_teacher_report: dict[str, Any] | None


def load_cold_start(
    directory: Path,
    *,
    student: CausalLMBackend,
    toy_teacher: CausalLMBackend | None,
    run_dir: Path,
    events: EventLog | None = None,
) -> LoadedColdStart:
    """Load a cold start weights-only into ``student`` (and ``toy_teacher``), verified.

    The toy teacher is also saved into ``run_dir`` so the run resumes from its own copy.
    Raises :class:`CheckpointError` when the marker or a weights file is missing or does
    not match its SHA-256. With ``events``, records ``benchmark_cold_start_loaded``.
    """
    loaded = _load_cold_start(directory, student=student, toy_teacher=toy_teacher, run_dir=run_dir)
    if events is not None:
        events.emit(
            "benchmark_cold_start_loaded",
            echo=f"weights-only cold start from {directory.name}",
            student_sha256=loaded.marker["student_sha256"],
            toy_teacher_sha256=loaded.toy_teacher_sha256,
            cold_start_parameter_version=loaded.marker.get("parameter_version"),
        )
    return loaded


def _load_cold_start(
    directory: Path,
    *,
    student: CausalLMBackend,
    toy_teacher: CausalLMBackend | None,
    run_dir: Path,
) -> LoadedColdStart:
    marker_path = directory / COLD_START_MARKER
    if not marker_path.is_file():
        raise CheckpointError(f"{marker_path} not found", hint="run the benchmark cold start first")
    marker = read_json(marker_path, error=CheckpointError)
    student_path = directory / COLD_START_STUDENT
    if not student_path.is_file() or sha256_file(student_path) != marker.get("student_sha256"):
        raise CheckpointError(f"{student_path} is missing or does not match {marker_path}")
    student.load_trainable_state_dict(
        {k: v.to(student.device) for k, v in load_file(str(student_path)).items()}
    )
    if toy_teacher is None:
        return LoadedColdStart(marker, None, None)
    teacher_path = directory / TOY_TEACHER_FILE
    teacher_sha = sha256_file(teacher_path) if teacher_path.is_file() else None
    if teacher_sha is None or teacher_sha != marker.get("toy_teacher_sha256"):
        raise CheckpointError(f"{teacher_path} is missing or does not match {marker_path}")
    toy_teacher.load_full_state_dict(load_file(str(teacher_path)))
    report = {
        **(marker.get("toy_teacher") or {}),
        "weights_sha256": save_teacher(toy_teacher, run_dir / TOY_TEACHER_FILE),
    }
    return LoadedColdStart(marker, teacher_sha, report)


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


HF_FIT_SOURCES = (
    "models/fitting.py",
    "models/hf.py",
    "models/hf_shared.py",
    "losses/chunked.py",
    "agent/loop.py",
    "agent/episode.py",
    "training/teacher_fit.py",
    "environments/oracle_state.py",
)
"""Source files of the adapter fit whose text enters its digest (see :data:`FIT_SOURCES`)."""


def fit_payload(
    cfg: RunConfig,
    tokenizer_fingerprint: str,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
) -> dict[str, Any]:
    """Everything the fitted adapter depends on; its SHA-256 names the saved adapter.

    The fitting code's own source is in it (``code_sha256`` of :data:`HF_FIT_SOURCES`), so an
    edit to the fit step refits instead of reusing an adapter the old code made; with
    ``examples`` (:func:`fit_examples`), so are the fitting rows' ids and targets.
    """
    return {
        "version": 1,
        "code_sha256": code_sha256(HF_FIT_SOURCES),
        "examples_sha256": None if examples is None else rows_sha256(examples),
        "base": base_identity(cfg.models.teacher.model_id),
        "revision": cfg.models.teacher.revision,
        "precision": cfg.models.teacher.precision,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "lora": cfg.models.teacher.lora.model_dump(),
        "fit": cfg.models.teacher_fit.model_dump(exclude={"cache_dir", "probe_tasks"}),
        "environment": cfg.environment.model_dump(),
        "seed": cfg.run.seed,
    }


def fit_digest(payload: dict[str, Any]) -> str:
    return sha256_json(payload)


def fit_examples(
    cfg: RunConfig,
    *,
    splits: dict[str, list[Task]],
    environment: ToolEnvironment,
    runner: RolloutRunner,
) -> tuple[list[tuple[list[int], list[int]]], dict[str, int]]:
    """``(token_ids, target_positions)`` of the oracle and corrective traces, and counts.

    The pool is the training split plus ``extra_tasks`` fresh tasks; ``runner`` only plays
    the oracle (its policy never acts), so any runner over ``environment`` will do.
    """
    fit = cfg.models.teacher_fit
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
    tokenizer_fingerprint: str,
    splits: dict[str, list[Task]],
    environment: ToolEnvironment,
    runner: RolloutRunner,
    chunk_size: int,
    events: EventLog,
    progress: ProgressReporter,
    student: CausalLMBackend | None = None,
    student_sha256: str | None = None,
) -> dict[str, Any] | None:
    """Load the adapter of this fit config if saved, else fit and save it; returns a report.

    ``view`` is the teacher backend (an adapter view of the shared base, or anything else,
    for which this is a no-op); ``runner`` plays the oracle traces of the fit;
    ``chunk_size`` is the loss projection chunk (rows) of the fit's cross-entropy. With
    ``models.teacher_fit.dagger.enabled``, ``student`` (the warmed-up student) is rolled out
    on training tasks and its labelled states join the rows (:func:`dagger_examples`, the
    toy teacher's path); the digest then holds the student's trainable weights
    (``student_sha256`` where the live student is no longer the labelled one, as in a
    resumed run), and the rollouts run only when the adapter is fitted, not when a saved
    one is reused.
    """
    cfg = config
    fit = cfg.models.teacher_fit
    if not fit.enabled or view is None or getattr(view, "adapter", None) is None:
        return None
    examples, counts = fit_examples(cfg, splits=splits, environment=environment, runner=runner)
    payload = fit_payload(cfg, tokenizer_fingerprint, examples)
    if fit.dagger.enabled:
        if student is None:
            raise ConfigError(
                "models.teacher_fit.dagger needs the student whose states it labels",
                hint="fit the adapter through OPDTrainer (after the SFT warm-up), or set "
                "models.teacher_fit.dagger.enabled: false",
            )
        live = tensors_sha256(student.trainable_state_dict())
        payload["dagger_student_sha256"] = student_sha256 or live
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
        report = {**report, "reused": True, "directory": str(directory)}
        events.emit(
            "teacher_adapter_loaded", echo=f"reusing teacher adapter {digest[:12]}", **report
        )
        return report

    started, cpu_started = time.perf_counter(), time.process_time()
    if fit.dagger.enabled:
        assert student is not None
        if payload["dagger_student_sha256"] != live:
            raise CheckpointError(
                f"the teacher adapter {digest[:12]} is not in {directory.parent}, and the student "
                "whose states it labels is no longer the live one (a resumed run)",
                hint="restore that adapter directory, or start the run again from its cold start",
            )
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
    try:
        save_file(_adapter_tensors(view), str(staging / ADAPTER_FILE))
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
    report = {**report, "reused": False, "directory": str(directory)}
    events.emit(
        "teacher_adapter_fitted",
        echo=f"{len(history)} steps, loss {report['first_loss']:.3f} -> {report['final_loss']:.3f}, "
        f"held-out greedy success {heldout:.2f} ({len(probe)} tasks)",
        **report,
    )
    return report


__all__ = [
    "CACHE_ENV",
    "COLD_START_IDENTITY",
    "COLD_START_MARKER",
    "COLD_START_STUDENT",
    "HF_FIT_SOURCES",
    "TOY_TEACHER_FILE",
    "FitTrace",
    "LoadedColdStart",
    "ToyFitReport",
    "cache_root",
    "check_cold_start",
    "code_sha256",
    "cold_start_identity",
    "dagger_examples",
    "dagger_rollouts",
    "fit_example",
    "fit_toy_model",
    "fit_traces",
    "freeze",
    "greedy_success",
    "label_student_states",
    "load_cached_teacher",
    "load_cold_start",
    "load_teacher",
    "noisy_indices",
    "prepare_toy_teacher",
    "render_action",
    "save_cold_start",
    "save_teacher",
    "store_teacher",
    "teacher_digest",
    "teacher_dir",
    "tensors_sha256",
    "token_sequences_sha256",
    "toy_fit_traces",
    "toy_teacher_digest_inputs",
]
