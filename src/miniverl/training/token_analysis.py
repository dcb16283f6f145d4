"""``token_analysis.jsonl``: per-token divergence of the last cycle, measured after its update.

One record per selected position: the token the policy emitted there, the student's
log-probability of it and, with teacher targets, the divergence the loss saw. The file is
rewritten every cycle (only the latest cycle is kept), so a report can show which tokens the
student still disagrees with the teacher on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from miniverl.models.base import CausalLMBackend
from miniverl.schemas.text import TokenizerLike
from miniverl.training.samples import TrainingSample
from miniverl.utils.io import append_jsonl
from miniverl.utils.logging import EventLog


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
    """Replace ``path`` with this cycle's records and emit ``token_analysis_written``."""
    records = token_analysis_records(student, tokenizer, samples, cycle=cycle)
    path.unlink(missing_ok=True)
    append_jsonl(path, records)
    events.emit("token_analysis_written", cycle=cycle, positions=len(records))
