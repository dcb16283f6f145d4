"""The trainer's student and teacher gathers are j − 1 aligned.

The per-position divergences the trainer feeds its optimizer (captured inside the real
update, ``OPDTrainer.loss_step``) are compared with an independent float64 brute force:
full forward passes of copies of both models over the whole trajectory, and for every
model-generated target token j > 0 the divergence between the distributions at row
j − 1. Shifting either gather to j (or anything else) breaks the equality.
"""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import tiny_config
from miniverl.losses.providers import BucketedTargetProvider, ExactTargetProvider
from miniverl.training.recipe import OPDTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _full_log_probs(backend, token_ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """log softmax of every row ``[T, V]`` of a float64 copy of the model."""
    module = copy.deepcopy(backend.module).double().eval()
    with torch.no_grad():
        hidden, _ = module(torch.tensor([token_ids]))
        return torch.log_softmax(module.project(hidden[0]), dim=-1)


def _brute_force(s: torch.Tensor, t: torch.Tensor, k: int | None) -> torch.Tensor:
    """Forward KL(p_T ‖ p_S) per row; over K + 1 buckets (teacher top-k + tail) when ``k``."""
    if k is not None:
        ids = torch.topk(t, k, dim=-1).indices

        def buckets(x: torch.Tensor) -> torch.Tensor:
            rest = torch.logsumexp(x.scatter(-1, ids, float("-inf")), -1, keepdim=True)
            return torch.cat([x.gather(-1, ids), rest], -1)

        s, t = buckets(s), buckets(t)
    return (t.exp() * (t - s)).sum(-1)


@pytest.mark.parametrize(
    "overrides", [(), ("loss.mode=exact_full_vocab", "loss.top_k=null", "cache.enabled=false")],
    ids=["bucketed-cached", "exact-resident"],
)  # fmt: skip
def test_trainer_student_and_teacher_gathers_are_j_minus_1_aligned(
    tmp_path, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    trainer = OPDTrainer(
        tiny_config("loss.divergence=forward_kl", *overrides),
        output_dir=tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    task = trainer.splits["train"][0]
    trajectory = trainer.runner.oracle_rollout(task, policy_version=0)
    [sample] = trainer.teacher_targets.score([trajectory], cycle=0, version=0, expect_version=0)
    sample.rollout_fingerprint = sample.target_fingerprint = trainer.state.policy_fingerprint

    captured: list[torch.Tensor] = []
    for cls in (BucketedTargetProvider, ExactTargetProvider):
        original = cls.divergence

        def capture(self, student_logits, start, end, _original=original):  # type: ignore[no-untyped-def]
            out = _original(self, student_logits, start, end)
            captured.append(out.divergence.detach().double())
            return out

        monkeypatch.setattr(cls, "divergence", capture)
    trainer.student.set_train(False)
    trainer.state.trajectory_batch_size = 1
    trainer.loss_step([sample], teacher_targets=True)
    trainer_divergence = torch.cat(captured)

    ids = trajectory.token_ids
    targets = [j for j in range(1, len(ids)) if trajectory.model_generated_mask[j]]
    assert len(targets) >= 10 and trainer_divergence.shape == (len(targets),)
    rows = torch.tensor([j - 1 for j in targets])
    student = _full_log_probs(trainer.student, ids)[rows]
    teacher = _full_log_probs(trainer.teacher, ids)[rows]
    k = None if trainer.config.loss.mode == "exact_full_vocab" else trainer.resolved.top_k
    expected = _brute_force(student, teacher, k)
    assert float(expected.min()) > 1e-3, "the models must disagree, or alignment is invisible"
    torch.testing.assert_close(trainer_divergence, expected, rtol=1e-4, atol=1e-5)
