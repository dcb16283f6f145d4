"""The mode registry: one row per ``run.mode``, and everything else about a mode derives from it.

The cycle is the same for every mode (tasks -> samples -> loss -> step); a mode says only
*where one cycle's trajectories come from* and *whether the teacher scores them*. Those two
facts decide the rest, so they are the row, and the rest is read from it:

- the values ``run.mode`` accepts and their description (``config/sections.py``);
- the objective label a run records (:meth:`~miniverl.config.models.RunConfig.objective_label`);
- the on-policy rules (``config/models.py``): a mode with student rollouts needs the strict
  cache check and one optimizer step per rollout batch;
- which sample source a cycle draws from (``training/sources.py`` maps ``trajectories``
  to its class);
- the benchmark's default arms (``miniverl.lab.benchmark.arms``) and the CLI's help.

Adding a mode is one row here plus one source class in ``training/sources.py``
(``tests/unit/test_modes.py`` checks that no other module spells a mode's name).
Torch-free: the config layer and ``miniverl validate`` read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Trajectories = Literal["oracle", "teacher_samples", "teacher_pool", "student", "mixed"]
"""Where one cycle's trajectories come from: the environment's oracle, fresh teacher samples,
one fixed pool of teacher samples, fresh student rollouts, or a mix of the last two."""

ArmRole = Literal["reference_ceiling", "compute_reference"]


@dataclass(frozen=True)
class Arm:
    """A benchmark arm of a mode: the override keys it adds to ``run.mode=<mode>``.

    ``role``: ``reference_ceiling`` (copies a perfect oracle; contrasts are read against it,
    never like for like) or ``compute_reference`` (the arm whose spend a compute-matched
    benchmark gives every other arm).
    """

    name: str
    overrides: tuple[str, ...]
    description: str
    role: ArmRole | None = None


@dataclass(frozen=True)
class Mode:
    """Every fact that depends on ``run.mode``."""

    name: str
    trajectories: Trajectories
    teacher_targets: bool
    """The loss is a divergence from teacher targets at ``loss.temperature``; otherwise it is
    cross-entropy on the trajectory's own tokens (hard labels, temperature 1)."""
    objective: str
    """What a run of this mode optimizes, as its records name it."""
    description: str
    """One sentence for ``run.mode``'s documentation and the CLI help."""
    arms: tuple[Arm, ...] = ()
    """The benchmark's default arms of this mode, in order."""
    color: str | None = None
    """The colour a report draws this mode's phase in (``None``: the report's default)."""

    @property
    def samples(self) -> bool:
        """Trajectories are sampled (by student or teacher) at ``rollout.temperature``."""
        return self.trajectories != "oracle"

    @property
    def on_policy(self) -> bool:
        """Some rollouts come from the student being trained: they are checked against its
        fingerprint, their targets need the strict cache check, and a sampling / loss
        temperature mismatch is warned about."""
        return self.trajectories in ("student", "mixed")

    @property
    def uses_teacher(self) -> bool:
        """A teacher is built (to sample or to score); pure SFT needs none."""
        return self.samples or self.teacher_targets

    @property
    def warmup(self) -> bool:
        """An SFT warm-up on oracle traces may precede the cycles (oracle SFT is SFT throughout)."""
        return self.uses_teacher

    @property
    def oracle_sft(self) -> bool:
        """Cross-entropy on the environment's oracle traces (the warm-up's supervision)."""
        return self.trajectories == "oracle" and not self.teacher_targets


_FORWARD = ("loss.divergence=forward_kl",)
MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode(
            "sft",
            "oracle",
            teacher_targets=False,
            objective="supervised_fine_tuning_on_oracle_traces",
            description="cross-entropy on oracle traces",
            color="#8d6cab",
            arms=(
                Arm(
                    "sft_oracle",
                    (),
                    "reference ceiling: continues oracle-trace SFT for the same number of optimizer steps",
                    role="reference_ceiling",
                ),
            ),
        ),
        Mode(
            "offline_kd",
            "teacher_pool",
            teacher_targets=True,
            objective="offline_knowledge_distillation",
            description="one fixed trajectory set and one frozen teacher cache",
            color="#e9c46a",
            arms=(
                Arm(
                    "offline_kd",
                    _FORWARD,
                    "one fixed set of teacher rollouts and one frozen teacher cache (forward KL)",
                ),
                Arm(
                    "offline_kd_reverse_kl",
                    ("loss.divergence=reverse_kl",),
                    "offline_kd with reverse KL",
                ),
            ),
        ),
        Mode(
            "opd",
            "student",
            teacher_targets=True,
            objective="on_policy_distillation",
            description="fresh student rollouts scored by the teacher every cycle",
            color="#2a9d8f",
            arms=(
                Arm(
                    "opd",
                    _FORWARD,
                    "on-policy distillation, forward KL",
                    role="compute_reference",
                ),
                Arm(
                    "opd_reverse_kl",
                    ("loss.divergence=reverse_kl",),
                    "on-policy distillation, reverse KL",
                ),
                Arm(
                    "opd_entropy_aware",
                    ("loss.divergence=entropy_aware",),
                    "on-policy distillation, entropy-aware forward/reverse KL",
                ),
            ),
        ),
        Mode(
            "seqkd",
            "teacher_samples",
            teacher_targets=False,
            objective="sequence_level_knowledge_distillation",
            description="cross-entropy on fresh teacher samples every cycle",
            arms=(
                Arm(
                    "seqkd",
                    (),
                    "sequence-level KD: cross-entropy on fresh teacher samples every cycle",
                ),
            ),
        ),
        Mode(
            "kd_oracle",
            "oracle",
            teacher_targets=True,
            objective="knowledge_distillation_at_oracle_states",
            description="teacher targets at the oracle's states",
            arms=(
                Arm(
                    "kd_oracle",
                    _FORWARD,
                    "teacher forward-KL targets at the oracle's states (oracle prefixes)",
                ),
            ),
        ),
        Mode(
            "gkd_mix",
            "mixed",
            teacher_targets=True,
            objective="generalized_knowledge_distillation_mixed_prefixes",
            description="per batch, train.gkd_student_fraction student rollouts and the rest "
            "fresh teacher samples, all scored by the teacher",
            arms=(
                Arm(
                    "gkd_mix",
                    _FORWARD,
                    "per batch a fraction λ of student rollouts and the rest teacher samples, forward KL",
                ),
            ),
        ),
    )
}
"""One row per ``run.mode``, in the order the documentation lists them."""

ModeName = Literal[tuple(MODES)]  # type: ignore[valid-type]
"""The ``run.mode`` type: exactly the names of :data:`MODES`."""

DEFAULT_MODE: str = next(m.name for m in MODES.values() if m.trajectories == "student")
"""``run.mode`` when a recipe names none: on-policy distillation."""

WARMUP_MODE: Mode = next(m for m in MODES.values() if m.oracle_sft)
"""The SFT warm-up's supervision (and the phase its step records carry)."""

REPLAY_OBJECTIVE = "online_distillation_with_replay"
"""The objective of a student-rollout mode that replays one rollout batch several times
(``train.opd_freshness: replay`` with ``replay_passes > 1``): not genuine on-policy anymore."""


def mode_of_kind(trajectories: Trajectories) -> Mode:
    """The (first) mode whose trajectories are of kind ``trajectories``."""
    return next(m for m in MODES.values() if m.trajectories == trajectories)


def mode_help() -> str:
    """``run.mode``'s description: every mode and what its cycle trains on."""
    return "; ".join(f"{m.name}: {m.description}" for m in MODES.values()) + "."


def default_arms() -> dict[str, tuple[str, ...]]:
    """Arm name -> its override keys, every mode's arms in registry order."""
    return {
        arm.name: (f"run.mode={mode.name}", *arm.overrides)
        for mode in MODES.values()
        for arm in mode.arms
    }


def arm_role(role: ArmRole) -> str:
    """The name of the one default arm with ``role``."""
    [name] = [a.name for m in MODES.values() for a in m.arms if a.role == role]
    return name


__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "REPLAY_OBJECTIVE",
    "WARMUP_MODE",
    "Arm",
    "Mode",
    "ModeName",
    "Trajectories",
    "arm_role",
    "default_arms",
    "mode_help",
    "mode_of_kind",
]
