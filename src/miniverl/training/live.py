"""What a researcher watches while a run trains: progress bars, the console line,
TensorBoard / offline wandb, and the last cycle's per-token analysis.

``metrics.jsonl`` stays the record of truth; the sinks here only mirror scalars from it.
Progress bars are silent when quiet or not on a terminal. Both sinks are optional extras,
imported only when the recipe asks for them (``logging.tensorboard``, ``logging.wandb``);
asking for one that is not installed is a :class:`ConfigError` at setup, before any compute
is spent. wandb is started with ``mode="offline"``: it writes under ``<run>/wandb`` and never
opens a connection.

``token_analysis.jsonl`` holds one record per selected position of the last cycle, measured
after its update: the token the policy emitted, the student's log-probability of it and, with
teacher targets, the divergence the loss saw. It is rewritten every cycle, so a report can
show which tokens the student still disagrees with the teacher on.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from miniverl.config.models import LoggingConfig
from miniverl.errors import ConfigError
from miniverl.models.base import CausalLMBackend
from miniverl.schemas.text import TokenizerLike
from miniverl.training.sources import TrainingSample
from miniverl.utils.io import append_jsonl
from miniverl.utils.lazy import install_hint
from miniverl.utils.logging import EventLog


class ProgressReporter:
    """One rich ``Progress`` shared by every phase; a no-op when disabled."""

    def __init__(self, console: Console | None, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = console is not None and console.is_terminal and not console.quiet
        self.enabled = bool(enabled and console is not None)
        self._progress: Progress | None = None
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[stats]}"),
                console=console,
                transient=True,
            )

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[..., None]]:
        """Yield ``advance(n=1, stats=None)`` for a phase of ``total`` units.

        ``stats`` replaces the text after the bar (e.g. loss, KL and success so far).
        """
        if self._progress is None:
            yield lambda n=1, stats=None: None
            return
        started = not self._progress.live.is_started
        if started:
            self._progress.start()
        progress = self._progress
        task_id = progress.add_task(description, total=total, stats="")

        def advance(n: int = 1, stats: str | None = None) -> None:
            if stats is not None:
                progress.update(task_id, stats=stats)
            progress.advance(task_id, n)

        try:
            yield advance
        finally:
            self._progress.remove_task(task_id)
            if started:
                self._progress.stop()


TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
WANDB_PROJECT = "miniverl"
"""The Weights & Biases project every run logs to (offline)."""


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
        hint=f"{install_hint('tensorboard')}, or set logging.tensorboard: false",
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
                project=WANDB_PROJECT,
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


@torch.no_grad()
def token_analysis_records(
    student: CausalLMBackend,
    tokenizer: TokenizerLike,
    samples: Sequence[TrainingSample],
    *,
    cycle: int,
) -> list[dict[str, Any]]:
    """One record per selected position of ``samples``, scored by ``student`` in eval mode.

    ``target_position`` j is the token, ``prediction_position`` j - 1 the row whose logits
    predict it (trajectory/masks.py); ``divergence`` is None without teacher targets.
    """
    records = []
    student.set_train(False)
    for sample in samples:
        al = sample.alignment
        if not al.num_positions:
            continue
        hidden = student.hidden_states_at(
            sample.trajectory.token_ids, al.student_prediction_positions
        )
        logits = student.project(hidden).float()
        log_probs = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor(al.target_token_ids, dtype=torch.long, device=logits.device)
        student_lp = log_probs.gather(1, targets[:, None])[:, 0].tolist()
        divergence: list[float | None] = [None] * al.num_positions
        if sample.provider is not None:
            divergence = sample.provider.divergence(logits, 0, al.num_positions).divergence.tolist()
        for i, pred in enumerate(al.student_prediction_positions):
            records.append(
                {
                    "trajectory_id": sample.trajectory.trajectory_id,
                    "cycle": cycle,
                    "measured": "after_update",
                    "target_position": pred + 1,
                    "prediction_position": pred,
                    "token_id": al.target_token_ids[i],
                    "token_text": tokenizer.decode([al.target_token_ids[i]]),
                    "span_type": al.span_types[i],
                    "weight": al.token_weights[i],
                    "divergence": divergence[i],
                    "student_log_prob": student_lp[i],
                    "teacher_entropy": sample.teacher_entropy[i]
                    if i < len(sample.teacher_entropy)
                    else None,
                    "teacher_entropy_is_lower_bound": sample.entropy_is_lower_bound
                    if i < len(sample.teacher_entropy)
                    else None,
                }
            )
    return records


def write_token_analysis(
    path: Path,
    student: CausalLMBackend,
    tokenizer: TokenizerLike,
    samples: Sequence[TrainingSample],
    *,
    cycle: int,
    events: EventLog,
) -> None:
    """Replace ``path`` with this cycle's records and emit ``token_analysis_written``.

    Not fsynced here: it is written inside the last cycle, whose end is one of the trainer's
    durability points (``utils.io.DurableLogs``, which also fsyncs the directory entry of
    the new file)."""
    records = token_analysis_records(student, tokenizer, samples, cycle=cycle)
    path.unlink(missing_ok=True)
    append_jsonl(path, records, sync=False)
    events.emit("token_analysis_written", cycle=cycle, positions=len(records))


__all__ = ["LiveSinks", "cycle_scalars", "cycle_summary", "format_live_line", "step_scalars"]
