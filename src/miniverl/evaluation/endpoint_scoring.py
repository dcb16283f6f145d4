"""The model-scored calc_chain endpoints: teacher NLL of student samples, student NLL of oracle traces.

Both are per-token means (nats per token) over the model-generated positions ``j > 0`` of
each trajectory, scored with the usual ``j -> j - 1`` alignment: the distribution at
position ``j - 1`` predicts token ``j`` (``trajectory.alignment.build_alignment_map``).
Scored with the same token ids for both models: the teacher sees the student's context as
the student saw it (no privileged rendering), because the endpoint asks how plausible the
student's own actions are in the student's own states. torch is imported inside the
functions so the module can be imported from a plain install.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miniverl.evaluation.endpoints import exposure_gap


def token_nll_sum(backend: Any, trajectories: Sequence[Any]) -> tuple[float, int]:
    """``(sum of -log p(token_j | ids_<j), number of tokens)`` over model-generated ``j > 0``."""
    import torch

    from miniverl.trajectory.alignment import build_alignment_map
    from miniverl.trajectory.masks import model_target_positions

    total, count = 0.0, 0
    backend.set_train(False)
    with torch.no_grad():
        for traj in trajectories:
            targets = model_target_positions(traj.model_generated_mask)
            if not targets:
                continue
            alignment = build_alignment_map(traj, targets)
            hidden = backend.hidden_states_at(
                traj.token_ids, alignment.student_prediction_positions
            )
            log_probs = torch.log_softmax(backend.project(hidden).double(), dim=-1)
            ids = torch.tensor(
                alignment.target_token_ids, dtype=torch.long, device=log_probs.device
            )
            total -= float(log_probs.gather(1, ids[:, None]).sum())
            count += len(ids)
    return total, count


def mean_token_nll(backend: Any, trajectories: Sequence[Any]) -> float | None:
    total, count = token_nll_sum(backend, trajectories)
    return total / count if count else None


def score_exposure(
    student: Any, teacher: Any, student_greedy: Sequence[Any], oracle: Sequence[Any]
) -> dict[str, float | None]:
    """The three exposure endpoints: teacher log-prob per token of the student's greedy
    samples, student NLL per token of oracle traces, and :func:`exposure_gap` of the two."""
    teacher_nll = mean_token_nll(teacher, student_greedy)
    student_nll = mean_token_nll(student, oracle)
    return {
        "teacher_logprob_on_student": None if teacher_nll is None else -teacher_nll,
        "student_nll_on_oracle": student_nll,
        "exposure_gap": exposure_gap(teacher_nll, student_nll),
    }


__all__ = ["mean_token_nll", "score_exposure", "token_nll_sum"]
