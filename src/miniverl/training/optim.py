"""AdamW, the learning-rate schedule and optimizer state as tensors.

Optimizer state is stored with safetensors (tensors) + JSON (hyper-parameters), never
with ``torch.save``: a checkpoint from someone else is inert data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from miniverl.config.models import TrainConfig
from miniverl.errors import CheckpointError


@dataclass(frozen=True)
class Schedule:
    """Learning rate as a pure function of the optimizer step (0-based).

    Stateless on purpose: a resumed run only needs ``global_step`` to continue the
    schedule exactly.
    """

    peak_lr: float
    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.1

    @classmethod
    def for_train(cls, train: TrainConfig, planned_steps: int) -> Schedule:
        """The recipe's schedule over the run's planned optimizer steps (``ResolvedRun.planned_steps``)."""
        return cls(
            peak_lr=train.lr,
            kind=train.schedule,
            warmup_steps=train.warmup_steps,
            total_steps=max(1, planned_steps),
            min_lr_ratio=train.min_lr_ratio,
        )

    def lr_at(self, step: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return self.peak_lr
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        floor = self.peak_lr * self.min_lr_ratio
        if self.kind == "linear":
            return floor + (self.peak_lr - floor) * (1.0 - progress)
        if self.kind == "cosine":
            return floor + (self.peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        raise ValueError(f"unknown schedule {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_lr": self.peak_lr,
            "kind": self.kind,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "min_lr_ratio": self.min_lr_ratio,
        }


def scheduled_lr(
    schedule: Schedule,
    train: TrainConfig,
    *,
    global_step: int,
    main_start_step: int,
    in_warmup: bool,
) -> float:
    """Warm-up: constant ``train.sft_lr`` (default ``train.lr``); then the schedule.

    The schedule counts optimizer steps since the main phase began (``main_start_step``), so
    a longer or shorter warm-up does not shift the KD/OPD learning-rate curve.
    """
    if in_warmup:
        return train.sft_lr or train.lr
    return schedule.lr_at(global_step - main_start_step)


def build_optimizer(params: list[torch.nn.Parameter], train: TrainConfig) -> torch.optim.AdamW:
    if not params:
        raise CheckpointError(
            "the student has no trainable parameters", hint="enable LoRA or full fine-tuning"
        )
    return torch.optim.AdamW(
        params,
        lr=train.lr,
        betas=tuple(train.betas),
        weight_decay=train.weight_decay,
        foreach=True,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def optimizer_state_tensors(
    optimizer: torch.optim.Optimizer,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, json-meta) of an optimizer's per-parameter state, keyed by param index."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {"scalars": {}}
    state = optimizer.state_dict()
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                tensors[f"{index}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                meta["scalars"][f"{index}.{key}"] = float(
                    value.item() if isinstance(value, torch.Tensor) else value
                )
    meta["param_groups"] = [
        {k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]
    ]
    meta["num_params"] = sum(len(g["params"]) for g in state["param_groups"])
    return tensors, meta


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    """Inverse of :func:`optimizer_state_tensors`; shapes are checked against the params."""
    current = optimizer.state_dict()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if meta.get("num_params") != len(params):
        raise CheckpointError(
            f"optimizer state has {meta.get('num_params')} parameters, the model has {len(params)}",
            hint="resume with the recipe that wrote the checkpoint",
        )
    state: dict[int, dict[str, Any]] = {}
    try:
        for name, tensor in tensors.items():
            index, key = name.split(".", 1)
            i = int(index)
            if not 0 <= i < len(params) or tensor.shape != params[i].shape:
                raise CheckpointError(f"optimizer tensor {name!r} does not match parameter {i}")
            state.setdefault(i, {})[key] = tensor.to(params[i].device)
        for name, value in meta.get("scalars", {}).items():
            index, key = name.split(".", 1)
            state.setdefault(int(index), {})[key] = torch.tensor(value, dtype=torch.float32)
        for i, entry in state.items():
            missing = sorted(_ADAMW_STATE_KEYS - set(entry))
            if missing:
                raise CheckpointError(
                    f"optimizer state of parameter {i} lacks {', '.join(missing)}",
                    hint="the checkpoint's optimizer state is incomplete; resume from another checkpoint",
                )
        groups = []
        for group, saved in zip(current["param_groups"], meta["param_groups"], strict=True):
            groups.append({**saved, "params": group["params"]})
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(
            f"optimizer state does not fit this optimizer: {type(exc).__name__}: {exc}"
        ) from None


_ADAMW_STATE_KEYS = frozenset({"exp_avg", "exp_avg_sq", "step"})


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: str) -> None:
    """Move every state tensor (AdamW moments) to ``device``; used by the swap strategy."""
    for entry in optimizer.state.values():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                entry[key] = value.to(device)
