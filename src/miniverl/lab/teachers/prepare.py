"""The teacher a recipe's lab section asks for, made before the run that distils from it.

The core trains against whatever teacher it is given (``OPDTrainer(teacher=...,
teacher_record=...)``) and fits nothing. :func:`prepare_teacher` is where the lab decides
what to give it, in this order:

1. no teacher at all for a mode without one, and none for ``models.teacher.checkpoint``
   (the core loads that trained student itself);
2. the oracle teacher (``lab.oracle_teacher``): built over every task of the splits;
3. a resumed run's own toy teacher (``toy-teacher.safetensors`` in its directory), verified
   against the record its manifest keeps;
4. a cold start's own teacher (``--cold-start DIR`` holding ``toy-teacher.safetensors`` or
   ``teacher-adapter.safetensors``, written by the benchmark), verified against its marker;
5. a toy teacher fitted (or reused from the digest cache) per ``lab.toy_fit``;
6. an HF teacher adapter fitted (or reused) per ``lab.teacher_fit``, handed over as a
   teacher checkpoint file;
7. otherwise the base model the recipe names (the core builds it).

A DAgger fit labels the warmed-up student's states, so it needs that ``student``: only a
benchmark's cold start has one; without it the fit is refused with that hint.

The fit runs on the host plan the run will use (device, deterministic algorithms, the run's
seed and projection chunk; torch threads too, but for a toy fit, see :func:`fit_threads`), so a
fitted teacher is the one the run would have fitted itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl.agent.loop import RolloutRunner
from miniverl.config.models import RunConfig
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.errors import CheckpointError, ConfigError, RunDirectoryError
from miniverl.lab.config import LabConfig, lab_of
from miniverl.models.base import CausalLMBackend
from miniverl.training.cold_start import COLD_START_MARKER
from miniverl.training.live import ProgressReporter
from miniverl.training.resolve import resolve_chunk_size, resolve_cpu_threads, resolve_device
from miniverl.training.sources import oom_splitter
from miniverl.utils.hashing import sha256_bytes, sha256_file
from miniverl.utils.io import atomic_write_bytes, read_json
from miniverl.utils.logging import EventLog, make_console
from miniverl.utils.runs import RunPaths
from miniverl.utils.seeding import seed_everything

COLD_START_ADAPTER = "teacher-adapter.safetensors"
"""A cold start's fitted HF teacher adapter (a teacher checkpoint file)."""


class PendingEvents:
    """Events of a teacher's preparation, held until the run's event log exists."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.items.append((event, fields))

    def replay(self, log: EventLog) -> None:
        for event, fields in self.items:
            log.emit(event, **fields)
        self.items.clear()


@dataclass
class PreparedTeacher:
    """What :func:`prepare_teacher` made.

    - ``teacher``: ``OPDTrainer(teacher=...)``: a ready backend, a teacher checkpoint file, or
      ``None`` (the core builds the recipe's);
    - ``record``: ``OPDTrainer(teacher_record=...)``, the fit report the run keeps;
    - ``backend``: the live teacher model, for the lab's gate and audit (``None`` when the run
      builds it);
    - ``weights``: the toy teacher's safetensors bytes, kept in the run directory;
    - ``events``: the fit's events, added to the run's log by :meth:`keep`.
    """

    teacher: CausalLMBackend | Path | None = None
    record: dict[str, Any] | None = None
    backend: CausalLMBackend | None = None
    weights: bytes | None = None
    events: PendingEvents = field(default_factory=PendingEvents)

    def keep(self, run_dir: Path, log: EventLog) -> None:
        """Once the run's setup accepted ``run_dir``: its copy of the toy teacher
        (``toy-teacher.safetensors``, the file ``teacher-audit`` reads) and the fit's events."""
        from miniverl.lab.teachers.toy_fit import TOY_TEACHER_FILE

        if self.weights is not None:
            atomic_write_bytes(run_dir / TOY_TEACHER_FILE, self.weights)
        self.events.replay(log)


def fit_threads(config: RunConfig, device: str, torch_threads: int) -> int:
    """Torch threads for a teacher fit: the run's (:func:`resolve_cpu_threads`), except a toy
    fit on the CPU under ``run.cpu_threads: auto``, which takes torch's count.

    The toy run keeps one thread because its student's matrices are too small to gain from
    more; the toy teacher fit is the one toy workload that does gain (a wider model, batches
    of whole traces): 1,100 steps of the demo's fit took 96.5 s with one thread and 61.9 s
    with two on a 2-core EPYC, with bit-identical weights (``results/demo/LOG.md``). The run
    then goes back to its own count.
    """
    if config.models.backend == "toy" and device == "cpu" and config.run.cpu_threads == "auto":
        return max(1, int(torch_threads))
    threads, _ = resolve_cpu_threads(config, device=device, torch_threads=torch_threads)
    return threads


@dataclass
class FitContext:
    """What a teacher fit runs on: the run's tokenizer, environment, splits and host plan."""

    config: RunConfig
    lab: LabConfig
    tokenizer: Any
    environment: Any
    splits: dict[str, list[Any]]
    device: str
    chunk_size: int
    progress: ProgressReporter

    @classmethod
    def of(cls, config: RunConfig, *, quiet: bool = True) -> FitContext:
        """Seeded, deterministic, on the device the run will resolve (threads: :func:`fit_threads`)."""
        import torch

        from miniverl.models.factory import build_tokenizer

        device = resolve_device(config, cuda_available=torch.cuda.is_available())
        torch.set_num_threads(fit_threads(config, device, torch.get_num_threads()))
        seed_everything(config.run.seed)
        tokenizer = build_tokenizer(config)
        environment = make_environment(config.environment.name, **config.environment.params)
        return cls(
            config=config,
            lab=lab_of(config),
            tokenizer=tokenizer,
            environment=environment,
            splits=build_splits(environment, config.environment),
            device=device,
            chunk_size=resolve_chunk_size(config.loss.chunk_size, tokenizer.vocab_size),
            progress=ProgressReporter(make_console(quiet)),
        )


def prepare_teacher(
    config: RunConfig,
    *,
    cold_start: str | Path | None = None,
    resumed_run: str | Path | None = None,
    student: CausalLMBackend | None = None,
    quiet: bool = True,
) -> PreparedTeacher:
    """The teacher ``config``'s lab section asks for (see the module docstring for the order).

    ``resumed_run``: the directory of the run being resumed. ``student``: the warmed-up
    student of a benchmark's cold start, whose states a DAgger fit labels (and on whose
    shared base an HF adapter is fitted).
    """
    if not config.mode().uses_teacher or config.models.teacher.checkpoint is not None:
        return PreparedTeacher()
    lab = lab_of(config)
    if lab.oracle_teacher is not None:
        return _oracle(FitContext.of(config, quiet=quiet))
    if resumed_run is not None and (found := _from_run(config, Path(resumed_run))):
        return found
    if cold_start is not None and (found := _from_cold_start(config, Path(cold_start))):
        return found
    dagger = (
        lab.toy_fit.dagger.enabled
        if config.models.backend == "toy"
        else lab.teacher_fit.enabled and lab.teacher_fit.dagger.enabled
    )
    if dagger and student is None:
        raise ConfigError(
            "the recipe fits a DAgger teacher, which labels the states of a warmed-up student: "
            "only a benchmark's cold start has one",
            hint="run it with 'miniverl benchmark' (each seed's cold start fits the teacher and "
            "its arms distil from it), or start 'miniverl train' from that cold start with "
            "--cold-start DIR",
        )
    if config.models.backend == "toy":
        return _toy_fit(FitContext.of(config, quiet=quiet), student)
    if lab.teacher_fit.enabled:
        return _adapter_fit(FitContext.of(config, quiet=quiet), student)
    return PreparedTeacher()


def _oracle(ctx: FitContext) -> PreparedTeacher:
    from miniverl.lab.teachers.oracle import build_oracle_teacher

    tasks = [task for split in ctx.splits.values() for task in split]
    teacher = build_oracle_teacher(ctx.config, ctx.tokenizer, tasks, ctx.device)
    return PreparedTeacher(teacher=teacher, backend=teacher)


def _toy_fit(ctx: FitContext, student: CausalLMBackend | None) -> PreparedTeacher:
    from miniverl.lab.teachers.toy_fit import fit_toy_teacher, teacher_bytes
    from miniverl.models.factory import build_teacher

    teacher = build_teacher(ctx.config, ctx.tokenizer, ctx.device)
    events = PendingEvents()
    report = fit_toy_teacher(
        teacher,
        config=ctx.config,
        fit=ctx.lab.toy_fit,
        environment=ctx.environment,
        splits=ctx.splits,
        oracle_runner=RolloutRunner(teacher, ctx.environment, ctx.config.rollout),
        chunk_size=ctx.chunk_size,
        device=ctx.device,
        events=events,
        progress=ctx.progress,
        split=oom_splitter(events, "probe rollout"),  # type: ignore[arg-type]
        student=student,
    )
    return PreparedTeacher(
        teacher=teacher,
        record=report,
        backend=teacher,
        weights=teacher_bytes(teacher),
        events=events,
    )


def _adapter_fit(ctx: FitContext, student: CausalLMBackend | None) -> PreparedTeacher:
    """Fit the adapter on ``student``'s base (a cold start's) or on a shared base built here."""
    from miniverl.lab.teachers.adapter_fit import prepare_teacher_adapter
    from miniverl.models.hf import TEACHER_ADAPTER, LoraSettings
    from miniverl.models.hf_shared import HFRoleView, build_shared_backbone

    fit = ctx.lab.teacher_fit
    if student is not None:
        owner = student
        owner.add_frozen_adapter(
            TEACHER_ADAPTER, LoraSettings.from_mapping(fit.lora) or LoraSettings()
        )  # type: ignore[attr-defined]
        view = HFRoleView(owner, role="teacher", adapter=TEACHER_ADAPTER)  # type: ignore[arg-type]
    else:
        owner, view = build_shared_backbone(
            ctx.config, ctx.tokenizer, ctx.device, teacher_adapter=fit.lora
        )
    events = PendingEvents()
    report = prepare_teacher_adapter(
        view,
        config=ctx.config,
        fit=fit,
        tokenizer_fingerprint=ctx.tokenizer.fingerprint,
        splits=ctx.splits,
        environment=ctx.environment,
        runner=RolloutRunner(owner, ctx.environment, ctx.config.rollout),
        chunk_size=ctx.chunk_size,
        events=events,
        progress=ctx.progress,
        student=student,
    )
    report["weights_sha256"] = report.get("adapter_sha256")
    return PreparedTeacher(
        teacher=Path(report["adapter"]),
        record=report,
        backend=view if student is not None else None,
        events=events,
    )


def _from_run(config: RunConfig, run_dir: Path) -> PreparedTeacher | None:
    """The toy teacher a run keeps in its directory, verified against its manifest's record;
    ``None`` when the run keeps none."""
    from miniverl.lab.teachers.toy_fit import TOY_TEACHER_FILE, load_teacher
    from miniverl.models.factory import build_teacher

    paths = RunPaths(run_dir)
    weights = paths.root / TOY_TEACHER_FILE
    if config.models.backend != "toy" or not weights.exists() or not paths.manifest.is_file():
        return None
    record = read_json(paths.manifest, error=RunDirectoryError).get("teacher") or {}
    ctx = FitContext.of(config)
    teacher = build_teacher(config, ctx.tokenizer, ctx.device)
    load_teacher(teacher, weights, record.get("weights_sha256"))
    for param in teacher.trainable_parameters():
        param.requires_grad_(False)
    return PreparedTeacher(teacher=teacher, record=record, backend=teacher)


def _from_cold_start(config: RunConfig, directory: Path) -> PreparedTeacher | None:
    """The teacher a cold start keeps beside its student, verified; ``None`` when it has none."""
    from miniverl.lab.teachers.toy_fit import TOY_TEACHER_FILE, load_teacher
    from miniverl.models.factory import build_teacher

    marker_path = directory / COLD_START_MARKER
    if not marker_path.is_file():
        return None
    marker = read_json(marker_path, error=CheckpointError)
    adapter = directory / COLD_START_ADAPTER
    if adapter.is_file():
        record = dict(marker.get("teacher_adapter") or {})
        if sha256_file(adapter) != record.get("adapter_sha256"):
            raise CheckpointError(f"{adapter} does not match its SHA-256 in {marker_path}")
        return PreparedTeacher(
            teacher=adapter, record={**record, "weights_sha256": sha256_file(adapter)}
        )
    weights = directory / TOY_TEACHER_FILE
    if not weights.is_file():
        return None
    ctx = FitContext.of(config)
    teacher = build_teacher(config, ctx.tokenizer, ctx.device)
    load_teacher(teacher, weights, marker.get("toy_teacher_sha256"))
    for param in teacher.trainable_parameters():
        param.requires_grad_(False)
    data = weights.read_bytes()
    record = {**(marker.get("toy_teacher") or {}), "weights_sha256": sha256_bytes(data)}
    return PreparedTeacher(teacher=teacher, record=record, backend=teacher, weights=data)


__all__ = [
    "COLD_START_ADAPTER",
    "FitContext",
    "PendingEvents",
    "PreparedTeacher",
    "prepare_teacher",
]
