"""One optimizer group's gradient: the chunked loss over length-bucketed micro-batches.

The group loss is L = (1/G) sum_r L_r over the G trajectories of the group. Rows of similar
length are padded into micro-batches of at most ``batch_rows`` trajectories, and each
micro-batch's loss is scaled by (rows / G) before its backward, so the accumulated gradient
does not depend on how the group was cut. The projection chunk size (rows of ``[chunk, V]``
logits alive at once) is exactly neutral for the loss too; that is why an out-of-memory can
be answered by halving the chunk, then the micro-batch, without changing what is learned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from miniverl.errors import GpuMemoryError
from miniverl.losses import (
    chunked_selected_position_loss,
    concat_providers,
    normalize_trajectory_weights,
)
from miniverl.models.base import CausalLMBackend
from miniverl.models.batching import build_padded_trajectory_batch, length_buckets
from miniverl.training.memory import run_with_oom_retry
from miniverl.training.samples import TrainingSample
from miniverl.utils.logging import EventLog


@dataclass
class GroupResult:
    """Sums over one group's micro-batches; the step record divides them by ``positions``.

    ``loss``, ``divergence_loss`` and ``sampled_token_nll`` are already the group mean (each
    micro-batch was scaled by rows / G). ``entropy_sum`` and ``high_entropy_sum`` are
    position-weighted over the ``entropy_positions`` that had teacher targets.
    """

    loss: float = 0.0
    divergence_loss: float = 0.0
    sampled_token_nll: float = 0.0
    positions: int = 0
    entropy_sum: float = 0.0
    entropy_positions: int = 0
    entropy_lower_bound: bool = False
    high_entropy_sum: float = 0.0
    loss_by_span_type: dict[str, float] = field(default_factory=dict)

    def step_fields(self) -> dict[str, Any]:
        """The loss fields of a ``StepRecord``; entropy means are None without teacher targets."""
        entropy = self.entropy_positions
        return {
            "loss": self.loss,
            "divergence_loss": self.divergence_loss,
            "sampled_token_nll": self.sampled_token_nll,
            "selected_positions": self.positions,
            "teacher_entropy_mean": self.entropy_sum / entropy if entropy else None,
            "teacher_entropy_is_lower_bound": self.entropy_lower_bound if entropy else None,
            "high_entropy_fraction": self.high_entropy_sum / entropy if entropy else None,
            "loss_by_span_type": self.loss_by_span_type,
        }


@dataclass(frozen=True)
class GroupGradients:
    """What computing a group's gradient needs, passed in rather than read off a trainer.

    ``optimizer`` owns the ``.grad`` buffers this fills (it is zeroed before each attempt);
    ``nll_weight`` is ``loss.sampled_token_nll_weight``, the cross-entropy weight next to
    teacher targets (without teacher targets the loss is plain cross-entropy, weight 1).
    """

    student: CausalLMBackend
    optimizer: torch.optim.Optimizer
    pad_token_id: int
    nll_weight: float
    min_chunk_size: int
    oom_retries: int
    events: EventLog

    def compute(
        self,
        group: Sequence[TrainingSample],
        *,
        chunk_size: int,
        batch_rows: int,
        teacher_targets: bool,
    ) -> GroupResult:
        """Accumulate the gradient of the group loss; ``chunk_size`` rows per projection."""
        self.optimizer.zero_grad(set_to_none=True)
        ce_weight = self.nll_weight if teacher_targets else 1.0
        out = GroupResult()
        for bucket in length_buckets([s.trajectory.length for s in group], int(batch_rows)):
            rows = [group[i] for i in bucket]
            batch = build_padded_trajectory_batch(
                token_ids=[r.trajectory.token_ids for r in rows],
                selected_positions=[r.alignment.student_prediction_positions for r in rows],
                pad_token_id=self.pad_token_id,
                device=self.student.device,
            )
            hidden = self.student.hidden_states_at_batch(batch, with_grad=True)
            weights = torch.cat(
                normalize_trajectory_weights([r.alignment.token_weights for r in rows])
            ).to(hidden.device)
            provider = concat_providers([r.provider for r in rows]) if teacher_targets else None
            targets = torch.tensor(
                [t for r in rows for t in r.alignment.target_token_ids],
                dtype=torch.long,
                device=hidden.device,
            )
            res = chunked_selected_position_loss(
                hidden_states=hidden,
                lm_head=self.student.project,
                weights=weights,
                weight_normalizer=float(len(rows)),
                provider=provider,
                target_token_ids=targets,
                ce_weight=ce_weight,
                chunk_size=chunk_size,
                backward=True,
                loss_scale=len(rows) / len(group),
                span_types=[t for r in rows for t in r.alignment.span_types],
            )
            out.loss += res.loss
            out.divergence_loss += res.divergence_loss
            out.sampled_token_nll += res.sampled_token_nll
            out.positions += res.num_positions
            if res.teacher_entropy_mean is not None:
                out.entropy_sum += res.teacher_entropy_mean * res.num_positions
                out.high_entropy_sum += (res.high_entropy_fraction or 0.0) * res.num_positions
                out.entropy_positions += res.num_positions
                out.entropy_lower_bound |= res.teacher_entropy_is_lower_bound
            for key, value in res.loss_by_span_type.items():
                out.loss_by_span_type[key] = out.loss_by_span_type.get(key, 0.0) + value
        return out

    def fitting_memory(
        self,
        group: Sequence[TrainingSample],
        *,
        chunk_size: int,
        batch_rows: int,
        teacher_targets: bool,
    ) -> tuple[GroupResult, int, int]:
        """``compute`` that survives out-of-memory: ``(result, chunk_used, batch_rows_used)``.

        The OOM retry halves the loss chunk; once it cannot, the trajectory batch is halved
        and the chunk starts again from ``chunk_size``. Every change is an event; the caller
        keeps both returned sizes for the rest of the run.
        """
        while True:
            try:
                result, chunk = run_with_oom_retry(
                    lambda chunk, rows=batch_rows: self.compute(
                        group,
                        chunk_size=chunk,
                        batch_rows=rows,
                        teacher_targets=teacher_targets,
                    ),
                    chunk_size=chunk_size,
                    min_chunk_size=self.min_chunk_size,
                    retries=self.oom_retries,
                    events=self.events,
                    on_retry=lambda: self.optimizer.zero_grad(set_to_none=True),
                )
                return result, chunk, batch_rows
            except GpuMemoryError:
                if batch_rows <= 1:
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                smaller = batch_rows // 2
                self.events.emit(
                    "oom_batch_split",
                    echo=f"trajectory batch {batch_rows} -> {smaller}",
                    what="trajectory batch",
                    batch_size=batch_rows,
                    split_into=[smaller, batch_rows - smaller],
                )
                batch_rows = smaller
