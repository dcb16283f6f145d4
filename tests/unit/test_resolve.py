"""Resolve once (training/resolve.py): every ``auto`` decided by one pure function.

The resolution table below is the contract: for given host and model capabilities (no
hardware involved) each ``auto`` value has exactly one decision, and
``config.resolved.yaml`` is a fixed point (resolving a resolved config changes nothing,
which is what ``miniverl eval --run`` relies on).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers import tiny_config
from miniverl.config.models import RunConfig
from miniverl.errors import GpuMemoryError
from miniverl.losses import DivergenceSpec
from miniverl.models.base import BackendCapabilities
from miniverl.training.resolve import (
    DEFAULT_TOP_K,
    HostCapabilities,
    MemoryPlan,
    ResolvedRun,
    place_teacher,
    resolve_device,
    resolve_run,
)

GIB = 1 << 30


def caps(
    *,
    vocab: int = 64,
    hidden: int = 32,
    layers: int = 2,
    params: int = 1000,
    device: str = "cpu",
    precision: str = "float32",
    backend: str = "toy",
) -> BackendCapabilities:
    return BackendCapabilities(
        backend=backend,
        model_id="m",
        revision=None,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_parameters=params,
        num_trainable_parameters=params,
        precision=precision,
        quantization="none",
        lora=False,
        kv_cache=True,
        can_offload=True,
        device=device,
    )


CPU_HOST = HostCapabilities(cuda_available=False, torch_threads=8)


def _hf(*overrides: str) -> RunConfig:
    """An hf recipe (nothing is loaded: resolution only reads the config)."""
    return tiny_config(
        "models.backend=hf",
        "models.student.model_id=some/student",
        "models.teacher.model_id=some/teacher",
        *overrides,
    )


# (id, config overrides, hf?, device, host, student caps, teacher caps, expected fields)
TABLE: list[tuple[str, tuple[str, ...], bool, str, HostCapabilities, dict, dict | None, dict]] = [
    (
        "toy-cpu-all-auto",
        ("train.rollouts_per_cycle=4", "loss.top_k=auto"),
        False,
        "cpu",
        CPU_HOST,
        {"vocab": 64},
        {"vocab": 64},
        {
            "cpu_threads": 1,
            "chunk_size": 1024,
            "top_k": 64,
            "group_size": 4,
            "trajectory_batch_size": 4,
            "memory": ("resident", True),
        },
    ),
    (
        "hf-cpu-threads-from-torch",
        ("loss.top_k=auto",),
        True,
        "cpu",
        CPU_HOST,
        {"vocab": 151_936, "backend": "hf"},
        {"vocab": 151_936, "backend": "hf"},
        {
            "cpu_threads": 8,
            "chunk_size": 441,  # 64 Mi float32 elements / V
            "top_k": DEFAULT_TOP_K,
            "memory": ("resident", True),
        },
    ),
    (
        "top-k-capped-by-vocab",
        ("loss.top_k=500",),
        False,
        "cpu",
        CPU_HOST,
        {"vocab": 100},
        {"vocab": 100},
        {"top_k": 100},
    ),
    (
        "exact-full-vocab-top-k-is-V",
        ("loss.mode=exact_full_vocab", "loss.top_k=null"),
        False,
        "cpu",
        CPU_HOST,
        {"vocab": 64},
        {"vocab": 64},
        {"top_k": 64},
    ),
    (
        "explicit-values-pass-through",
        (
            "run.cpu_threads=3",
            "loss.chunk_size=48",
            "loss.top_k=7",
            "train.gradient_accumulation_steps=2",
            "train.trajectory_batch_size=1",
            "memory.strategy=swap",
        ),
        False,
        "cpu",
        CPU_HOST,
        {},
        {},
        {
            "cpu_threads": 3,
            "chunk_size": 48,
            "top_k": 7,
            "group_size": 2,
            "trajectory_batch_size": 1,
            "memory": ("swap", False),
        },
    ),
    (
        "cuda-roomy-resident-teacher-memory-taken-off-the-trajectory-budget",
        ("train.rollouts_per_cycle=8",),
        True,
        "cuda",
        HostCapabilities(cuda_available=True, torch_threads=8, free_vram_gib=4.0),
        {"vocab": 1000, "hidden": 1024, "layers": 16, "params": 10, "device": "cuda"},
        # a 1 GiB float32 teacher loaded on the host: resident leaves 3 GiB, half of it for
        # activations of ~300 MiB per trajectory -> 5 rows (6 if the teacher were forgotten)
        {"vocab": 1000, "params": GIB // 4, "device": "cpu"},
        {"memory": ("resident", True), "trajectory_batch_size": 5},
    ),
    (
        "cuda-tight-swap",
        (),
        True,
        "cuda",
        HostCapabilities(cuda_available=True, torch_threads=8, free_vram_gib=2.5),
        {"vocab": 1000, "params": GIB // 8, "device": "cuda"},
        {"vocab": 1000, "params": GIB // 4, "device": "cpu"},
        {"memory": ("swap", False)},
    ),
    (
        "cuda-unmeasured-free-memory",
        (),
        True,
        "cuda",
        HostCapabilities(cuda_available=True, torch_threads=8, free_vram_gib=None),
        {"vocab": 1000, "device": "cuda"},
        {"vocab": 1000, "device": "cpu"},
        {"memory": ("resident", True), "trajectory_batch_size": 2},
    ),
]


def _resolve(overrides: tuple[str, ...], hf: bool, device: str, host, student, teacher):
    config = _hf(*overrides) if hf else tiny_config(*overrides)
    resolved = resolve_run(
        config,
        device=device,
        host=host,
        student=caps(**student),
        teacher=None if teacher is None else caps(**teacher),
    )
    return config, resolved


@pytest.mark.parametrize(
    ("overrides", "hf", "device", "host", "student", "teacher", "expected"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_the_resolution_table(
    overrides: tuple[str, ...],
    hf: bool,
    device: str,
    host: HostCapabilities,
    student: dict,
    teacher: dict | None,
    expected: dict[str, Any],
) -> None:
    config, resolved = _resolve(overrides, hf, device, host, student, teacher)
    assert resolved.device == device
    for key, value in expected.items():
        if key == "memory":
            plan = resolved.memory_plan
            assert (plan.strategy, plan.teacher_resident) == value, plan.reason
        else:
            assert getattr(resolved, key) == value, key
    assert resolved.divergence == DivergenceSpec(**config.loss.divergence_kwargs())


@pytest.mark.parametrize(
    ("requested", "cuda", "expected"), [("auto", True, "cuda"), ("auto", False, "cpu")]
)
def test_the_device_is_resolved_from_the_host(requested: str, cuda: bool, expected: str) -> None:
    assert (
        resolve_device(tiny_config(f"models.device={requested}"), cuda_available=cuda) == expected
    )
    assert resolve_device(tiny_config("models.device=cpu"), cuda_available=True) == "cpu"


def test_no_auto_survives_in_the_resolved_config() -> None:
    config = tiny_config("loss.chunk_size=auto", "loss.top_k=auto", "run.cpu_threads=auto")
    resolved = resolve_run(config, device="cpu", host=CPU_HOST, student=caps(), teacher=caps())
    data = resolved.to_config(config).to_dict()
    assert data["models"]["device"] == "cpu"
    assert data["run"]["cpu_threads"] == 1
    assert data["memory"]["strategy"] == "resident"
    assert data["loss"]["chunk_size"] == resolved.chunk_size
    assert data["loss"]["top_k"] == resolved.top_k
    assert data["train"]["gradient_accumulation_steps"] == resolved.group_size
    assert data["train"]["trajectory_batch_size"] == resolved.trajectory_batch_size
    text = resolved.resolved_yaml(config)
    assert text.startswith("# every 'auto' replaced by its decision\n# memory plan: auto -> ")
    assert "# trajectory batch: auto -> " in text


@pytest.mark.parametrize("row", TABLE, ids=[row[0] for row in TABLE])
def test_resolving_a_resolved_config_changes_nothing(row: tuple) -> None:
    _, overrides, hf, device, host, student, teacher, _ = row
    config, resolved = _resolve(overrides, hf, device, host, student, teacher)
    again = resolve_run(
        resolved.to_config(config),
        device=device,
        host=host,
        student=caps(**student),
        teacher=None if teacher is None else caps(**teacher),
    )
    reasons = {
        "trajectory_batch_reason": "",
        "cpu_threads_reason": "",
        "rollout_dtype_reason": "",
        "memory_plan": None,
    }
    assert dataclasses.replace(again, **reasons) == dataclasses.replace(resolved, **reasons)
    assert again.memory_plan.strategy == resolved.memory_plan.strategy


def test_the_resolved_run_is_frozen() -> None:
    resolved = resolve_run(tiny_config(), device="cpu", host=CPU_HOST, student=caps(), teacher=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.chunk_size = 1  # type: ignore[misc]


class _Teacher:
    """A teacher whose move onto the device runs out of memory (or fails otherwise)."""

    def __init__(self, error: Exception | None) -> None:
        self.device = "cpu"
        self.error = error
        self.moves: list[str] = []

    def to_device(self, device: str) -> None:
        self.moves.append(device)
        if device != "cpu" and self.error is not None:
            raise self.error
        self.device = device


def test_place_teacher_moves_a_resident_teacher_and_keeps_the_plan() -> None:
    plan = MemoryPlan("resident", "auto", "auto -> resident: roomy", True)
    teacher = _Teacher(None)
    assert place_teacher(teacher, plan, "cuda") is plan  # type: ignore[arg-type]
    assert teacher.device == "cuda"
    swap = MemoryPlan("swap", "swap", "requested: swap", False)
    assert place_teacher(_Teacher(None), swap, "cuda") is swap  # type: ignore[arg-type]


def test_place_teacher_falls_back_to_swap_only_under_auto() -> None:
    import torch

    oom = torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
    auto = MemoryPlan("resident", "auto", "auto -> resident: roomy", True)
    teacher = _Teacher(oom)
    fallback = place_teacher(teacher, auto, "cuda")  # type: ignore[arg-type]
    assert (fallback.strategy, fallback.teacher_resident) == ("swap", False)
    assert "ran out of memory (auto -> resident: roomy)" in fallback.reason
    assert teacher.device == "cpu"
    requested = MemoryPlan("resident", "resident", "requested: resident", True)
    with pytest.raises(GpuMemoryError, match="does not fit"):
        place_teacher(_Teacher(oom), requested, "cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not memory"):
        place_teacher(_Teacher(ValueError("not memory")), auto, "cuda")  # type: ignore[arg-type]


def test_with_memory_plan_replaces_only_the_plan() -> None:
    resolved = resolve_run(tiny_config(), device="cpu", host=CPU_HOST, student=caps(), teacher=None)
    plan = MemoryPlan("swap", "auto", "fell back", False)
    moved = resolved.with_memory_plan(plan)
    assert isinstance(moved, ResolvedRun) and moved.memory_plan is plan
    assert dataclasses.replace(moved, memory_plan=resolved.memory_plan) == resolved
