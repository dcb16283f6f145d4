"""Live metrics while a run trains: the console line, TensorBoard and offline wandb.

``metrics.jsonl`` stays the record of truth; the sinks here only mirror scalars from it
so a researcher can watch a run. Both sinks are optional extras, imported only when the
recipe asks for them (``logging.tensorboard``, ``logging.wandb``); asking for one that is
not installed is a :class:`ConfigError` at setup, before any compute is spent.

wandb is started with ``mode="offline"``: it writes under ``<run>/wandb`` and never opens
a connection (``wandb sync`` uploads later, if the user wants).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from miniverl.config.models import LoggingConfig
from miniverl.errors import ConfigError

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"


def _tensorboard_writer_class() -> Any:
    """tensorboardX (light) first, then torch's writer (needs the tensorboard package)."""
    for module, attr in (
        ("tensorboardX", "SummaryWriter"),
        ("torch.utils.tensorboard", "SummaryWriter"),
    ):
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError:
            continue
    raise ConfigError(
        "logging.tensorboard: true needs tensorboardX (or tensorboard) installed",
        hint="pip install 'miniverl[tensorboard]', or set logging.tensorboard: false",
    )


def _import_wandb() -> Any:
    try:
        return importlib.import_module("wandb")
    except ImportError:
        raise ConfigError(
            "logging.wandb: true needs the wandb package installed",
            hint="pip install wandb (it runs offline here), or set logging.wandb: false",
        ) from None


class LiveSinks:
    """Scalar sinks opened for one run; ``scalars`` is a no-op when none is enabled."""

    def __init__(
        self,
        config: LoggingConfig,
        run_dir: Path,
        *,
        run_name: str,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.tensorboard: Any = None
        self.wandb_run: Any = None
        if config.tensorboard:
            writer_class = _tensorboard_writer_class()
            self.tensorboard = writer_class(str(run_dir / TENSORBOARD_DIR))
        if config.wandb:
            wandb = _import_wandb()
            (run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
            self.wandb_run = wandb.init(
                project=config.wandb_project,
                name=run_name,
                dir=str(run_dir),
                mode="offline",
                config=dict(run_config or {}),
            )

    @property
    def enabled(self) -> bool:
        return self.tensorboard is not None or self.wandb_run is not None

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """Log the finite numbers of ``values`` at optimizer step ``step``."""
        clean = {
            k: float(v)
            for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if not clean:
            return
        if self.tensorboard is not None:
            for key, value in clean.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(clean, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def step_scalars(record: Mapping[str, Any]) -> dict[str, Any]:
    """The per-step scalars of one ``kind: step`` metrics record, named by phase."""
    phase = record.get("phase", "train")
    return {
        f"{phase}/loss": record.get("loss"),
        f"{phase}/divergence": record.get("divergence_loss"),
        f"{phase}/sampled_token_nll": record.get("sampled_token_nll"),
        f"{phase}/grad_norm": record.get("grad_norm"),
        "lr": record.get("lr"),
    }


def cycle_summary(
    steps: Sequence[Mapping[str, Any]], rollouts: Mapping[str, Any]
) -> dict[str, Any]:
    """Loss and KL of a cycle (means over its optimizer steps) and its rollout success."""
    losses = [float(s["loss"]) for s in steps if isinstance(s.get("loss"), int | float)]
    kls = [
        float(s["divergence_loss"])
        for s in steps
        if isinstance(s.get("divergence_loss"), int | float)
    ]
    return {
        "mean_loss": sum(losses) / len(losses) if losses else None,
        "mean_divergence": sum(kls) / len(kls) if kls else None,
        "rollout_success_rate": rollouts.get("success_rate") if rollouts else None,
        "rollout_solved": rollouts.get("solved") if rollouts else None,
        "rollout_tasks": rollouts.get("tasks") if rollouts else None,
    }


def cycle_scalars(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The per-cycle scalars of a :func:`cycle_summary`."""
    return {
        "cycle/mean_loss": summary["mean_loss"],
        "cycle/mean_divergence": summary["mean_divergence"],
        "rollout/success_rate": summary["rollout_success_rate"],
    }


def format_live_line(summary: Mapping[str, Any], held_out: Mapping[str, Any] | None = None) -> str:
    """``loss 0.412 | KL 0.118 | rollouts 5/8 (62%) | held-out 3/4 (75%)``; absent parts omitted."""
    parts = []
    if summary.get("mean_loss") is not None:
        parts.append(f"loss {summary['mean_loss']:.3f}")
    if summary.get("mean_divergence") is not None:
        parts.append(f"KL {summary['mean_divergence']:.3f}")
    if summary.get("rollout_tasks"):
        parts.append(
            f"rollouts {summary['rollout_solved']}/{summary['rollout_tasks']} "
            f"({100 * summary['rollout_success_rate']:.0f}%)"
        )
    if held_out and held_out.get("tasks"):
        parts.append(
            f"held-out {held_out['solved']}/{held_out['tasks']} ({100 * held_out['success_rate']:.0f}%)"
        )
    return " | ".join(parts)


__all__ = ["LiveSinks", "cycle_scalars", "cycle_summary", "format_live_line", "step_scalars"]
