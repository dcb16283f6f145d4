"""Resolve once: every ``auto`` of a recipe, the memory plan and out-of-memory retries
(docs/design.md §3.9, §3.10).

A recipe may leave the device, CPU threads, projection chunk, bucketed top-k, memory
strategy, optimizer group and trajectory batch at ``auto``. :func:`resolve_run` turns
``(config, device, capabilities)`` into one frozen :class:`ResolvedRun`; the trainer,
the teacher scorer, the manifest and ``config.resolved.yaml`` all read that object, so a
decision is made exactly once and written down with its reason.

Those decisions are pure functions of their arguments. The facts of the machine
(CUDA present, torch's thread count, free accelerator memory) arrive as a
:class:`HostCapabilities` value and the facts of the built models as their
:class:`~miniverl.models.base.BackendCapabilities`, so every decision is testable
without hardware. :func:`place_teacher` carries a resident plan out and may fall back to
swap (the one decision that needs a real attempt). The device is the one value resolved
before the models exist (they are built on it), hence :func:`resolve_device` is separate.

When memory still runs out, :func:`after_oom` gives the loss step its next sizes (the
projection chunk halved, then the trajectory batch; the chunked loss is exactly invariant to
both) and :func:`split_on_oom` halves a batch of independent items; both record an event per
change.

Nothing here imports torch at module level: ``validate`` and ``inspect`` read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from miniverl.config.limits import MIN_CHUNK_SIZE
from miniverl.config.models import RunConfig
from miniverl.errors import ConfigError, GpuMemoryError
from miniverl.losses import DivergenceSpec
from miniverl.models.base import BackendCapabilities, CausalLMBackend
from miniverl.utils import gpu
from miniverl.utils.gpu import is_oom_error
from miniverl.utils.lazy import import_torch
from miniverl.utils.logging import EventLog

if TYPE_CHECKING:
    from miniverl.models.probe import DecodeProbe

DEFAULT_TOP_K = 64
"""``loss.top_k: auto`` -> ``min(64, V)`` buckets of teacher mass plus the tail."""

DEFAULT_CHUNK_BUDGET_ELEMENTS = 64 * 1024 * 1024
"""auto chunk size: about this many ``[chunk, V]`` float32 elements per live buffer (256 MiB)."""

MAX_AUTO_CHUNK = 1024
"""Largest ``auto`` projection chunk (rows); more rows buy no speed on the toy or 1B models."""

TRAJECTORY_ACTIVATION_FACTOR = 24
"""Rough live activation floats per token, layer and hidden unit of a backward pass (with the
attention/MLP intermediates); only used to cap ``train.trajectory_batch_size: auto``."""

THREAD_GAIN_REQUIRED = 1.15
"""``run.cpu_threads: auto`` takes more threads only when the probe's decode step runs at
least this many times faster with them: on a shared machine extra threads spin-wait behind
other jobs, so a marginal gain measured once is not worth that risk."""

BF16_GAIN_REQUIRED = 1.05
"""``models.rollout_dtype: auto`` takes bf16 rollout weights only when the probe's decode step
runs at least this many times faster in bf16 (bf16 rounding changes sampled ids)."""

SWAP_QUANTIZED_MESSAGE = (
    "memory.strategy: swap is unavailable with a quantized model: bitsandbytes 4-bit and 8-bit "
    "parameters are pinned to the device they were quantized on; use memory.strategy: resident"
)
AUTO_QUANTIZED_REASON = "auto -> resident: a quantized model cannot be moved off the accelerator, so swap is unavailable"

AUTO_SWAP_HEADROOM_GIB = 2.0
"""``memory.strategy: auto`` keeps both models resident only with this much accelerator
memory (GiB) still free after loading them."""

OOM_RETRIES = 3
"""Times an out-of-memory loss step halves the projection chunk before it halves the
trajectory batch instead (:func:`after_oom`)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Where the models live during a cycle, and why."""

    strategy: str
    requested: str
    reason: str
    teacher_resident: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HostCapabilities:
    """The facts of this machine that ``auto`` values depend on.

    - ``cuda_available``: a CUDA device can be used.
    - ``torch_threads``: torch's intra-op thread count before miniverl sets it.
    - ``free_vram_gib``: free accelerator memory (GiB) on the run's device with the models
      loaded where :func:`~miniverl.models.runtime.build_runtime` put them; ``None`` on
      the CPU or when it cannot be measured.
    """

    cuda_available: bool
    torch_threads: int
    free_vram_gib: float | None = None
    decode_probe: DecodeProbe | None = None
    """Timings of the student's decode step (:func:`~miniverl.models.probe.probe_decode_step`)
    when :func:`needs_decode_probe` asked for them; ``None`` otherwise."""

    @classmethod
    def probe(cls, device: str | None = None) -> HostCapabilities:
        """Measure this process's machine (``device``: where free memory is read, if CUDA)."""
        torch = import_torch("device resolution")
        free = gpu.free_vram_gib(device) if device and device.startswith("cuda") else None
        return cls(
            cuda_available=bool(torch.cuda.is_available()),
            torch_threads=int(torch.get_num_threads()),
            free_vram_gib=free,
        )


# ---------------------------------------------------------------- one decision each


def resolve_device(config: RunConfig, *, cuda_available: bool) -> str:
    """``models.device``; ``auto`` -> ``cuda`` when available, else ``cpu``."""
    requested = config.models.device
    if requested != "auto":
        return requested
    return "cuda" if cuda_available else "cpu"


def needs_decode_probe(config: RunConfig, *, device: str) -> bool:
    """Whether :func:`resolve_cpu_threads` or :func:`resolve_rollout_dtype` will read a probe:
    an ``auto`` of either on the CPU with the hf backend (the toy never probes)."""
    if config.models.backend != "hf" or device != "cpu":
        return False
    dtype_auto = config.models.rollout_dtype == "auto" and rollout_dtype_applies(config, device)
    return config.run.cpu_threads == "auto" or dtype_auto


def decode_rows(config: RunConfig) -> int:
    """Rows of one rollout decode step: the rollout batch, at most the cycle's rollouts."""
    rollouts = config.train.rollouts_per_cycle
    return min(config.rollout.batch_size or rollouts, rollouts)


def resolve_cpu_threads(
    config: RunConfig, *, device: str, torch_threads: int, probe: DecodeProbe | None = None
) -> tuple[int, str]:
    """``run.cpu_threads`` and why: ``(threads, reason)``.

    ``auto``: 1 for the toy backend on the CPU: its matrices (hidden 64) are too small to
    gain from intra-op threads, and one thread keeps its numerics independent of the
    machine. The hf backend on the CPU: ``torch_threads`` only when ``probe`` times the
    decode step at least :data:`THREAD_GAIN_REQUIRED` times faster with them than with one
    thread, else 1. An accelerator (or no probe): ``torch_threads``.
    """
    threads = config.run.cpu_threads
    if threads != "auto":
        return int(threads), f"{threads}: set by run.cpu_threads"
    if device != "cpu":
        return int(torch_threads), f"auto -> {torch_threads}: torch's count (device {device})"
    if config.models.backend == "toy":
        return 1, "auto -> 1: toy backend on the CPU (tiny matrices; machine-independent numerics)"
    if torch_threads <= 1:
        return 1, "auto -> 1: torch sees one thread"
    one = None if probe is None else probe.seconds.get((1, "float32"))
    many = None if probe is None else probe.seconds.get((int(torch_threads), "float32"))
    if one is None or many is None:
        return int(torch_threads), f"auto -> {torch_threads}: torch's count (no decode probe)"
    gain = one / many
    chosen = int(torch_threads) if gain >= THREAD_GAIN_REQUIRED else 1
    return chosen, (
        f"auto -> {chosen}: the decode-step probe ({probe.shape}) ran {gain:.2f}x as fast with "
        f"{torch_threads} threads as with 1 (needs >= {THREAD_GAIN_REQUIRED}x): {probe.describe()}"
    )


def rollout_dtype_applies(config: RunConfig, device: str) -> bool:
    """bf16 rollout weights exist only for an hf dual-model student in float32 on the CPU."""
    precision = config.models.student.precision
    return (
        config.models.backend == "hf"
        and config.models.runtime == "dual_model"
        and config.models.student.quantization == "none"
        and (precision == "float32" or (precision == "auto" and device == "cpu"))
    )


def resolve_rollout_dtype(
    config: RunConfig, *, device: str, threads: int, probe: DecodeProbe | None = None
) -> tuple[str, str]:
    """``models.rollout_dtype`` and why: ``(dtype, reason)``; ``"model"`` means no copy.

    ``auto``: ``bfloat16`` only for a float32 hf dual-model student on the CPU whose decode
    step ``probe`` times at least :data:`BF16_GAIN_REQUIRED` times faster in bf16 at
    ``threads`` threads; otherwise the model's own precision (``"model"``).
    """
    requested = config.models.rollout_dtype
    if requested != "auto":
        if requested == "bfloat16" and rollout_dtype_applies(config, device):
            return "bfloat16", "bfloat16: set by models.rollout_dtype"
        return "model", f"{requested}: set by models.rollout_dtype (the model's precision)"
    if not rollout_dtype_applies(config, device):
        return (
            "model",
            "auto -> the model's precision (bf16 rollout weights: hf float32 dual-model on the CPU only)",
        )
    f32 = None if probe is None else probe.seconds.get((threads, "float32"))
    bf16 = None if probe is None else probe.seconds.get((threads, "bfloat16"))
    if f32 is None or bf16 is None:
        return "model", "auto -> float32: no decode probe"
    gain = f32 / bf16
    chosen = "bfloat16" if gain >= BF16_GAIN_REQUIRED else "model"
    return chosen, (
        f"auto -> {'bfloat16' if chosen == 'bfloat16' else 'float32'}: the decode-step probe "
        f"({probe.shape}) ran {gain:.2f}x as fast in bf16 as in float32 at {threads} "
        f"thread(s) (needs >= {BF16_GAIN_REQUIRED}x): {probe.describe()}"
    )


def resolve_chunk_size(requested: int | str, vocab_size: int) -> int:
    """``auto`` -> rows such that one ``[chunk, V]`` float32 buffer stays near 256 MiB.

    An explicit value was already checked by the config rules (``>= 1``,
    ``>=`` :data:`~miniverl.config.limits.MIN_CHUNK_SIZE`); this is the only place a chunk
    size is decided.
    """
    if requested != "auto":
        return int(requested)
    rows = DEFAULT_CHUNK_BUDGET_ELEMENTS // max(1, vocab_size)
    return max(MIN_CHUNK_SIZE, min(MAX_AUTO_CHUNK, rows))


def resolve_top_k(config: RunConfig, vocab_size: int) -> int:
    """Buckets K: ``V`` for ``exact_full_vocab``; ``auto`` -> ``min(64, V)``; else ``min(K, V)``."""
    top_k = config.loss.top_k
    if config.loss.mode == "exact_full_vocab":
        return vocab_size
    if top_k in ("auto", None):
        return min(vocab_size, DEFAULT_TOP_K)
    return min(vocab_size, int(top_k))


def weight_bytes(*models: BackendCapabilities | None) -> int:
    """Bytes of the models' weights (2 per bf16/fp16 parameter, 1 for nf4, else 4)."""
    total = 0
    for caps in models:
        if caps is None:
            continue
        bytes_per = 2 if caps.precision in ("bfloat16", "float16") else 4
        if caps.quantization == "nf4":
            bytes_per = 1
        total += caps.num_parameters * bytes_per
    return total


def resolve_strategy(
    config: RunConfig,
    *,
    device: str,
    model_bytes: int | None = None,
    free_gib: float | None = None,
) -> MemoryPlan:
    """Decide resident vs swap.

    ``auto``: quantized models force resident (they cannot move); on CPU there is no
    accelerator memory to save, so resident; on CUDA, resident when the free VRAM
    (``free_gib``) minus the teacher+student weight bytes keeps
    :data:`AUTO_SWAP_HEADROOM_GIB`, else swap. :func:`place_teacher` then actually
    loads the teacher and falls back to swap on OOM.
    """
    requested = config.memory.strategy
    quantized = any(
        getattr(config.models, r).quantization != "none" for r in ("student", "teacher")
    )
    if requested == "swap" and quantized:
        raise ConfigError(SWAP_QUANTIZED_MESSAGE)
    if requested == "resident":
        return MemoryPlan("resident", requested, "requested: resident", True)
    if requested == "swap":
        return MemoryPlan(
            "swap", requested, "requested: swap (teacher targets pass through the cache)", False
        )
    if quantized:
        return MemoryPlan("resident", requested, AUTO_QUANTIZED_REASON, True)
    if not device.startswith("cuda"):
        return MemoryPlan(
            "resident",
            requested,
            f"auto -> resident: device {device} has no accelerator memory to save",
            True,
        )
    if free_gib is None:
        return MemoryPlan(
            "resident", requested, "auto -> resident: free VRAM could not be measured", True
        )
    need = (model_bytes or 0) / (1 << 30)
    headroom = AUTO_SWAP_HEADROOM_GIB
    if free_gib - need >= headroom:
        return MemoryPlan(
            "resident",
            requested,
            f"auto -> resident: {free_gib:.2f} GiB free, models need {need:.2f} GiB, headroom {headroom} GiB kept",
            True,
        )
    return MemoryPlan(
        "swap",
        requested,
        f"auto -> swap: {free_gib:.2f} GiB free, models need {need:.2f} GiB, headroom {headroom} GiB would not be kept",
        False,
    )


def resolve_trajectory_batch_size(
    requested: int | str,
    *,
    group_size: int,
    device: str,
    max_total_tokens: int,
    hidden_size: int,
    num_layers: int,
    free_gib: float | None = None,
) -> tuple[int, str]:
    """``auto`` -> ``(rows, reason)``: the whole optimizer group where it fits the memory plan.

    On CPU there is no accelerator budget, so ``auto`` is the group. On CUDA the rows are
    capped so that ``rows x max_total_tokens x layers x hidden x 24`` float32 activations use
    at most half of ``free_gib`` (a rough, conservative estimate; a batch that still does
    not fit is split at run time). The reason is recorded.
    """
    if requested != "auto":
        return int(requested), f"requested: {requested}"
    if not device.startswith("cuda"):
        return group_size, f"auto -> {group_size}: the optimizer group (device {device})"
    if free_gib is None:
        return group_size, f"auto -> {group_size}: free VRAM could not be measured"
    per_row = 4 * max_total_tokens * num_layers * hidden_size * TRAJECTORY_ACTIVATION_FACTOR
    rows = max(1, min(group_size, int(free_gib * (1 << 30) / 2 // max(1, per_row))))
    return rows, (
        f"auto -> {rows}: {free_gib:.2f} GiB free, ~{per_row / (1 << 20):.1f} MiB of activations "
        f"per trajectory, half the free memory kept"
    )


def planned_steps(config: RunConfig) -> int:
    """Optimizer steps of the main phase (the schedule's length; warm-up not counted).

    ``steps_per_rollout_batch`` counts replay passes, which only ``opd`` may set (the recipe
    refuses ``train.opd_freshness: replay`` elsewhere), so one formula serves every mode.
    """
    return config.train.cycles * config.train.steps_per_rollout_batch()


# ---------------------------------------------------------------- the resolved run


@dataclass(frozen=True)
class ResolvedRun:
    """Every ``auto`` of one run, decided (read by the trainer, scorer, manifest and YAML).

    ``chunk_size`` and ``trajectory_batch_size`` are the *planned* values: the OOM retry
    may shrink the live ones during the run, which the trainer records per step.
    """

    device: str
    cpu_threads: int
    vocab_size: int
    chunk_size: int
    top_k: int
    memory_plan: MemoryPlan
    trajectory_batch_size: int
    trajectory_batch_reason: str
    group_size: int
    planned_steps: int
    divergence: DivergenceSpec
    tasks_path: str | None
    cpu_threads_reason: str = ""
    rollout_dtype: str = "model"
    """``"bfloat16"``: the student decodes from a bf16 copy; ``"model"``: its own weights."""
    rollout_dtype_reason: str = ""

    def with_memory_plan(self, plan: MemoryPlan) -> ResolvedRun:
        """The same run after :func:`place_teacher` fell back to ``plan``."""
        return dataclasses.replace(self, memory_plan=plan)

    def to_config(self, config: RunConfig) -> RunConfig:
        """``config`` with every ``auto`` replaced by its decision (``config.resolved.yaml``)."""
        data = config.to_dict()
        data["models"]["device"] = self.device
        data["run"]["cpu_threads"] = self.cpu_threads
        if config.models.rollout_dtype == "auto":
            data["models"]["rollout_dtype"] = (
                "bfloat16" if self.rollout_dtype == "bfloat16" else "float32"
            )
        data["memory"]["strategy"] = self.memory_plan.strategy
        data["loss"]["chunk_size"] = self.chunk_size
        if self.tasks_path is not None:
            data["environment"]["tasks"] = self.tasks_path
        if config.loss.mode == "bucketed":
            data["loss"]["top_k"] = self.top_k
        tr = data["train"]
        tr["gradient_accumulation_steps"] = self.group_size
        tr["trajectory_batch_size"] = self.trajectory_batch_size
        return RunConfig.from_mapping(data, source="<resolved>")

    def resolved_yaml(self, config: RunConfig) -> str:
        """The text of ``config.resolved.yaml``: the decisions and, as comments, why."""
        header = (
            f"# every 'auto' replaced by its decision\n# memory plan: {self.memory_plan.reason}\n"
            f"# trajectory batch: {self.trajectory_batch_reason}\n"
            f"# cpu threads: {self.cpu_threads_reason}\n"
            f"# rollout dtype: {self.rollout_dtype_reason}\n"
        )
        return header + self.to_config(config).to_yaml()


def resolve_run(
    config: RunConfig,
    *,
    device: str,
    host: HostCapabilities,
    student: BackendCapabilities,
    teacher: BackendCapabilities | None,
) -> ResolvedRun:
    """Decide every ``auto`` of ``config`` for these models on this machine.

    ``device`` comes from :func:`resolve_device`; ``student`` / ``teacher`` are the built
    backends' capabilities (``teacher`` is ``None`` when no teacher was built). With a
    resident plan on CUDA and a teacher loaded on the host, the teacher's weight bytes are
    taken off ``host.free_vram_gib`` before sizing the trajectory batch: that is the
    memory left once the teacher has moved over.
    """
    vocab = student.vocab_size
    bytes_needed = weight_bytes(student, teacher)
    plan = resolve_strategy(
        config, device=device, model_bytes=bytes_needed, free_gib=host.free_vram_gib
    )
    free_after_placement = host.free_vram_gib
    if (
        free_after_placement is not None
        and plan.teacher_resident
        and teacher is not None
        and teacher.device != device
    ):
        free_after_placement -= weight_bytes(teacher) / (1 << 30)
    group = config.train.group_size()
    rows, reason = resolve_trajectory_batch_size(
        config.train.trajectory_batch_size,
        group_size=group,
        device=device,
        max_total_tokens=config.rollout.max_total_tokens,
        hidden_size=student.hidden_size,
        num_layers=student.num_layers,
        free_gib=free_after_placement,
    )
    tasks = config.environment.tasks
    threads, threads_reason = resolve_cpu_threads(
        config, device=device, torch_threads=host.torch_threads, probe=host.decode_probe
    )
    rollout_dtype, dtype_reason = resolve_rollout_dtype(
        config, device=device, threads=threads, probe=host.decode_probe
    )
    return ResolvedRun(
        device=device,
        cpu_threads=threads,
        cpu_threads_reason=threads_reason,
        rollout_dtype=rollout_dtype,
        rollout_dtype_reason=dtype_reason,
        vocab_size=vocab,
        chunk_size=resolve_chunk_size(config.loss.chunk_size, vocab),
        top_k=resolve_top_k(config, vocab),
        memory_plan=plan,
        trajectory_batch_size=rows,
        trajectory_batch_reason=reason,
        group_size=group,
        planned_steps=planned_steps(config),
        divergence=DivergenceSpec(**config.loss.divergence_kwargs()),
        tasks_path=str(Path(tasks).resolve()) if tasks is not None else None,
    )


def place_teacher(teacher: CausalLMBackend | None, plan: MemoryPlan, device: str) -> MemoryPlan:
    """Carry a resident plan out: move a host-loaded teacher onto ``device``.

    Returns the plan in force afterwards. Only ``auto`` may fall back to swap on
    out-of-memory, and the new plan's reason says so; a requested ``resident`` that does
    not fit is a :class:`GpuMemoryError`.
    """
    if teacher is None or not plan.teacher_resident or teacher.device == device:
        return plan
    try:
        teacher.to_device(device)
    except Exception as exc:
        if not gpu.is_oom_error(exc):
            raise
        teacher.to_device("cpu")
        if plan.requested != "auto":
            raise GpuMemoryError(
                f"the teacher does not fit on {device} next to the student (memory.strategy: resident)",
                hint="use memory.strategy: swap or auto, or quantize the student",
            ) from exc
        return MemoryPlan(
            "swap",
            "auto",
            f"auto -> swap: loading the teacher onto {device} ran out of memory ({plan.reason})",
            False,
        )
    return plan


T = TypeVar("T")

OOM_KNOBS = (
    "loss.chunk_size (smaller [chunk, V] projections)",
    "train.trajectory_batch_size (fewer trajectories per padded forward)",
    "rollout.max_total_tokens (shorter sequences)",
    "memory.strategy: swap (one model on the device at a time)",
    "models.student.quantization / models.teacher.quantization: nf4 (smaller weights)",
)


def after_oom(
    exc: BaseException,
    *,
    halvings: int,
    chunk_size: int,
    batch_rows: int,
    step_chunk_size: int,
    events: EventLog | None = None,
) -> tuple[int, int, int]:
    """The sizes a loss step retries with after running out of memory, recorded as an event.

    Returns ``(halvings, chunk_size, batch_rows)``: the projection chunk halved (at most
    :data:`OOM_RETRIES` times per batch size, never below
    :data:`~miniverl.config.limits.MIN_CHUNK_SIZE`); once it cannot be, the trajectory batch
    halved and the chunk back at ``step_chunk_size`` (its size when the step began). Neither
    changes the loss or the gradient (``tests/unit/test_chunked_equivalence.py``). When
    neither can shrink: :class:`GpuMemoryError` naming the knobs that save memory.
    """
    smaller = max(MIN_CHUNK_SIZE, chunk_size // 2)
    if halvings < OOM_RETRIES and smaller < chunk_size:
        if events is not None:
            events.emit(
                "oom_chunk_retry",
                echo=f"chunk {chunk_size} -> {smaller}",
                previous_chunk_size=chunk_size,
                chunk_size=smaller,
                attempt=halvings + 1,
            )
        _empty_cuda_cache()
        return halvings + 1, smaller, batch_rows
    if batch_rows > 1:
        half = batch_rows // 2
        if events is not None:
            events.emit(
                "oom_batch_split",
                echo=f"trajectory batch {batch_rows} -> {half}",
                what="trajectory batch",
                batch_size=batch_rows,
                split_into=[half, batch_rows - half],
            )
        _empty_cuda_cache()
        return 0, step_chunk_size, half
    raise GpuMemoryError(
        f"out of memory at projection chunk size {chunk_size} with one trajectory per batch "
        f"after {halvings} retr{'y' if halvings == 1 else 'ies'}",
        hint="turn one of these knobs: " + "; ".join(OOM_KNOBS),
    ) from exc


def _empty_cuda_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def split_on_oom(
    fn: Callable[[list[Any]], list[T]],
    items: list[Any],
    *,
    what: str,
    events: EventLog | None = None,
) -> list[T]:
    """``fn(items)``; on out-of-memory split the batch in halves and run each, recursively.

    ``fn`` must be a pure function of its batch (one result per item, in order), which is
    what lets a split batch give the same results. Every split is recorded as an
    ``oom_batch_split`` event; a single item that does not fit raises :class:`GpuMemoryError`.
    """
    try:
        return fn(items)
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        if len(items) <= 1:
            raise GpuMemoryError(
                f"out of memory on a single {what}",
                hint="turn one of these knobs: " + "; ".join(OOM_KNOBS),
            ) from exc
    _empty_cuda_cache()
    half = len(items) // 2
    if events is not None:
        events.emit(
            "oom_batch_split",
            echo=f"{what} batch {len(items)} -> {half} + {len(items) - half}",
            what=what,
            batch_size=len(items),
            split_into=[half, len(items) - half],
        )
    return split_on_oom(fn, items[:half], what=what, events=events) + split_on_oom(
        fn, items[half:], what=what, events=events
    )


__all__ = [
    "AUTO_SWAP_HEADROOM_GIB",
    "DEFAULT_TOP_K",
    "OOM_RETRIES",
    "HostCapabilities",
    "MemoryPlan",
    "ResolvedRun",
    "after_oom",
    "decode_rows",
    "needs_decode_probe",
    "place_teacher",
    "planned_steps",
    "resolve_chunk_size",
    "resolve_cpu_threads",
    "resolve_device",
    "resolve_rollout_dtype",
    "resolve_run",
    "resolve_strategy",
    "resolve_top_k",
    "resolve_trajectory_batch_size",
    "rollout_dtype_applies",
    "weight_bytes",
]
