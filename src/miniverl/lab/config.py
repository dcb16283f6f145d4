"""The lab's section of a recipe (``lab:``), validated with the core sections.

A training run reads only the core sections (``miniverl.config``); these keys are read by the
lab's studies alone: how a teacher is fitted (``toy_fit``, ``teacher_fit``), the oracle
teacher (``oracle_teacher``), the benchmark's teacher gate (``teacher_gate``) and the
warm-up criterion of a cold start (``warmup_until``). A recipe keeps one file: it writes them
under ``lab:`` or at the places among the core sections the stored studies used
(``models.toy_fit``, ``eval.teacher_gate_threshold``, ...; ``config/layout.py``).

:class:`LabRunConfig` is a ``RunConfig`` whose ``lab`` is a :class:`LabConfig`: one
validation reports the problems of both layers at once, and its dump holds the lab's
section complete (each part the recipe sets, with its defaults filled in), which is what
``RunConfig.digest`` hashes. Every lab entry point and ``miniverl validate`` load recipes
through it. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from miniverl.config.limits import MAX_LR, MAX_STEPS, MAX_TASKS, MAX_TEMPERATURE
from miniverl.config.models import RunConfig
from miniverl.config.sections import LoraConfig, Section

PrivilegedRule = Literal["any_new_number", "teacher_departs"]
"""The held-out state gate's rule for privileged predictions (``lab/teachers/gate.py``)."""

NoiseKind = Literal[
    "operand_digit",
    "random_operands",
    "malformed_json",
    "bad_expression",
    "wrong_key",
    "extra_call",
]
DEFAULT_NOISE_KINDS: dict[str, float] = {
    "operand_digit": 0.5,
    "malformed_json": 0.25,
    "bad_expression": 0.25,
    "random_operands": 0.0,
}
"""Default ``lab.toy_fit.noise_kinds``: corruption kind -> relative weight (the toy teachers'
fits and their cached digests rest on these four; ``agent.corrective.CORRUPTION_KINDS`` lists
every kind)."""


class DaggerConfig(Section):
    """Student-state fitting data for a fitted teacher: the toy teacher (``lab.toy_fit.dagger``,
    ``lab/teachers/toy_fit.py``) or the hf teacher adapter (``lab.teacher_fit.dagger``,
    ``lab/teachers/adapter_fit.py``); ``lab/teachers/dagger.py`` labels the states.

    The cold-start student is rolled out on training tasks; every assistant turn it played
    is labelled with the oracle's next action from that state (after an error: the
    corrective re-call, ``environments/oracle_state.py``), and the teacher is fitted on
    those rows beside the oracle traces.
    """

    enabled: bool = Field(
        False,
        description="Add labelled student states to the teacher's fitting rows: the benchmark's cold start fits the teacher after the SFT warm-up, on the warmed-up student's episodes ('miniverl train' refuses it: a plain run has no cold start to label).",
    )
    rollouts_per_task: int = Field(
        1,
        ge=1,
        le=64,
        description="Student episodes per training task; episode i samples at temperatures[i % len(temperatures)].",
    )
    temperatures: list[float] = Field(
        default_factory=lambda: [1.0],
        min_length=1,
        max_length=16,
        description="Sampling temperatures of the student episodes: above 1 injects more errors, so more off-path states get labelled.",
    )
    tasks: int | None = Field(
        None,
        ge=1,
        le=MAX_TASKS,
        description="Roll out only the first N training tasks (None: every training task). Never an eval or test task.",
    )

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, value: list[float]) -> list[float]:
        bad = [t for t in value if not 0 <= t <= MAX_TEMPERATURE]
        if bad:
            raise ValueError(f"temperatures must lie in [0, {MAX_TEMPERATURE}], got {bad}")
        return value


class ToyFitConfig(Section):
    omitted_at_default: ClassVar[tuple[str, ...]] = ("dagger", "init_from")

    max_steps: int = Field(
        1500,
        ge=0,
        le=1_000_000,
        description="Upper bound on optimizer steps when fitting the toy teacher on oracle traces.",
    )
    lr: float = Field(
        2e-3, gt=0, le=MAX_LR, description="AdamW learning rate for the toy teacher fit."
    )
    batch_size: int = Field(8, ge=1, le=4096, description="Oracle traces per toy-teacher fit step.")
    check_every: int = Field(
        100,
        ge=1,
        le=1_000_000,
        description="Greedy-solve check interval (steps) for early stopping.",
    )
    target_success: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Stop fitting once the teacher greedily solves this fraction of a probe drawn from its fitting tasks.",
    )
    extra_tasks: int = Field(
        0,
        ge=0,
        le=MAX_TASKS,
        description="Further oracle tasks (disjoint from eval/test) in the teacher's fitting data, standing in for the broader training a real teacher has.",
    )
    noise_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Fraction of the fitting traces that get one tool call corrupted (noise_kinds), the tool's real response, then the oracle's correction; the corrupted step is not supervised (lab/teachers/toy_fit.py).",
    )
    noise_kinds: dict[NoiseKind, float] = Field(
        default_factory=lambda: dict(DEFAULT_NOISE_KINDS),
        description="Relative weights of the corruption kinds drawn for a noisy trace: operand_digit (one digit of one number changed), random_operands (every number of the call replaced by an unrelated one), malformed_json, bad_expression, wrong_key (the call's name key or argument key misnamed), extra_call (the last call again after the chain is done; corrected by the answer) (agent/corrective.py).",
    )
    noise_max_follow: int = Field(
        0,
        ge=0,
        le=8,
        description="A noisy trace whose corrupted call is valid carries on the wrong chain for 0..noise_max_follow further calls (each from the previous wrong result, none supervised) before the corrective re-call, as far as the turn budget allows.",
    )
    probe_tasks: int = Field(
        16,
        ge=1,
        le=MAX_TASKS,
        description="Tasks greedily rolled out at each early-stopping check.",
    )
    reuse: bool = Field(
        True,
        description="Reuse a teacher fitted earlier with identical inputs from $MINIVERL_CACHE_DIR/toy-teachers (default ~/.cache/miniverl); false: always refit, store nothing.",
    )
    dagger: DaggerConfig = Field(
        default_factory=DaggerConfig,
        description="Labelled cold-start student states added to the fitting rows (DAgger-style).",
    )
    init_from: str | None = Field(
        None,
        description="Start the fit from a trained toy teacher instead of a fresh initialisation: a run directory written by 'miniverl train' (a toy student trained without LoRA, of models.teacher's shape), one of its checkpoints, a benchmark cold start or a .safetensors file of the whole model. Its SHA-256 enters the fit's reuse digest. Default: fresh weights.",
    )

    @field_validator("noise_kinds")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: w for k, w in value.items() if not (math.isfinite(w) and w >= 0)}
        if bad or not any(w > 0 for w in value.values()):
            raise ValueError(
                "noise_kinds needs finite weights >= 0, at least one of them > 0 "
                f"(got {value}); e.g. {{operand_digit: 0.5, malformed_json: 0.5}}"
            )
        return value


class OracleTeacherConfig(Section):
    """A teacher that is the environment's oracle policy, smoothed (``lab/teachers/oracle.py``)."""

    omitted_at_default: ClassVar[tuple[str, ...]] = ("off_path",)

    smoothing: float = Field(
        0.001,
        gt=0,
        lt=1,
        description="Probability mass epsilon spread uniformly over the vocabulary: the teacher puts 1 - epsilon + epsilon/V on the oracle's next token from the current state (after an error: the corrective re-call) and epsilon/V on every other token.",
    )
    off_path: Literal["context", "turn_only"] = Field(
        "context",
        description="Which positions carry a target (lab/teachers/oracle.py): context = every position where the oracle's continuation is defined (on its path, every turn start, and inside a deviated block of the right kind where the alignment says what comes next); turn_only = only the positions on the oracle's path of their turn (turn starts included). Positions without a target (a block of the wrong kind, a miscopied number, the action used up) leave the selection; EOS is never a target.",
    )


class TeacherFitConfig(Section):
    """The HF analogue of ``toy_fit``: a teacher LoRA adapter fitted on the shared backbone."""

    omitted_at_default: ClassVar[tuple[str, ...]] = ("dagger", "init_from")

    enabled: bool = Field(
        False,
        description="shared_backbone only: give the teacher its own frozen LoRA adapter (shaped by lora below), fitted on oracle and corrective traces of tasks disjoint from eval/test; the run loads it as its teacher checkpoint.",
    )
    steps: int = Field(60, ge=0, description="Optimizer steps of the teacher-adapter fit.")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the teacher-adapter fit.")
    batch_size: int = Field(4, ge=1, description="Traces per teacher-fit step.")
    extra_tasks: int = Field(
        32,
        ge=0,
        description="Further tasks (disjoint from eval/test) added to the training split for the fit.",
    )
    corrective_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Fraction of fit tasks that also get a noise-injected corrective trace (a bad first call, its error, then the oracle); only the correction is supervised.",
    )
    probe_tasks: int = Field(
        8, ge=0, description="Held-out tasks greedily solved by the fitted teacher, for the report."
    )
    cache_dir: str = Field(
        "models/teacher-adapters",
        description="Fitted adapters are saved here under the digest of the fit config and reused.",
    )
    dagger: DaggerConfig = Field(
        default_factory=DaggerConfig,
        description="Labelled states of the warmed-up student on training tasks added to the adapter's fitting rows (DAgger-style); the student's weights then enter the adapter's digest, so each cold start gets its own adapter.",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="The fitted adapter's shape (r, alpha, target_modules); recipes may also write it at models.teacher.lora.",
    )
    init_from: str | None = Field(
        None,
        description="Start the fit from a trained teacher's LoRA adapter instead of zeros: a run directory written by 'miniverl train', one of its checkpoints/NAME directories, a benchmark cold start or an adapter .safetensors file, of the shape lora gives. Its SHA-256 enters the fitted adapter's digest. Default: a fresh adapter.",
    )


class TeacherGateConfig(Section):
    """The benchmark's teacher gate (``lab/teachers/gate.py``): the teacher scored at the
    cold-start student's states on validation tasks before any arm runs."""

    omitted_at_default: ClassVar[tuple[str, ...]] = (
        "on_path",
        "off_path",
        "recovery",
        "required",
        "privileged",
    )

    threshold: float = Field(
        0.95,
        ge=0,
        le=1,
        description="The benchmark refuses to start when the teacher's top-1 accuracy on the correct next action at student-visited states is below this.",
    )
    tasks: int = Field(
        64,
        ge=1,
        le=MAX_TASKS,
        description="Validation tasks the cold-start student is rolled out on for the teacher gate.",
    )
    on_path: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Held-out state gate: minimum teacher top-1 agreement with the oracle label at every labelled position of student turns on the oracle's path (score_state_gate). None: not required.",
    )
    off_path: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Held-out state gate: minimum top-1 agreement at positions after a student deviation (the corrective action's tokens); a privileged prediction (a number no earlier text of the transcript holds) counts as a miss. None: not required.",
    )
    recovery: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Held-out state gate: minimum fraction of student episodes with a deviation that the teacher, continuing greedily from the first state after it, solves. None: not required.",
    )
    privileged: PrivilegedRule = Field(
        "any_new_number",
        description="Which predictions after an in-turn deviation the held-out state gate counts as privileged (a miss). any_new_number: every digit that makes a number no earlier text of the transcript holds. teacher_departs: only a digit where the number, before it, was still one the transcript holds (or a prefix of one), so the teacher is the one departing; a digit carrying on a number the student already wrote wrong is not scored (no continuation is right there).",
    )
    required: bool = Field(
        True,
        description="The benchmark refuses to run arms on a cold start whose teacher gate failed. false: the gate is still measured and stored (teacher_gate.required: false in the cold-start cell), and the arms run on an ungated teacher; say so wherever the result is quoted.",
    )


class WarmupUntilConfig(Section):
    """Cold start by criterion: warm up until the student is good enough, not for a fixed count
    (``lab/benchmark/warmup.py`` measures it; the run's warm-up stops when it says so)."""

    metric: Literal["success", "success_at_k"] = Field(
        "success",
        description="success: greedy success on the validation (eval) split; success_at_k: the same on its tasks of chain length k only (calc_chain tasks carry k).",
    )
    k: int | None = Field(
        None,
        ge=1,
        le=64,
        description="success_at_k: the chain length whose validation tasks are measured (None for metric: success).",
    )
    threshold: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Stop after the first warm-up cycle whose measured success is >= this.",
    )
    max_cycles: int = Field(
        20,
        ge=1,
        le=MAX_STEPS,
        description="Cap: stop after this many warm-up cycles even when the threshold was never reached.",
    )
    check_every: int = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        description="Measure the criterion after every N-th warm-up cycle (and after the last); a measurement is a greedy validation rollout, so a long warm-up checks less often.",
    )

    @model_validator(mode="after")
    def _k_matches_metric(self) -> WarmupUntilConfig:
        if self.metric == "success_at_k" and self.k is None:
            raise ValueError("metric: success_at_k needs k (the chain length to measure)")
        if self.metric == "success" and self.k is not None:
            raise ValueError("k only applies to metric: success_at_k")
        return self


class LabConfig(Section):
    """The ``lab:`` section: each part is left out of the dump while at its default."""

    omitted_at_default: ClassVar[tuple[str, ...]] = (
        "toy_fit",
        "teacher_fit",
        "oracle_teacher",
        "teacher_gate",
        "warmup_until",
        "fixed_state_recovery",
    )

    toy_fit: ToyFitConfig = Field(
        default_factory=ToyFitConfig,
        description="How the lab fits a toy teacher (toy backend, no teacher checkpoint, no oracle teacher).",
    )
    teacher_fit: TeacherFitConfig = Field(
        default_factory=TeacherFitConfig,
        description="A fitted teacher adapter on a shared hf backbone (hf backend only).",
    )
    oracle_teacher: OracleTeacherConfig | None = Field(
        None,
        description="Replace the teacher model by the environment's oracle policy, smoothed (toy backend, environments with an oracle, teacher.mode: standard); no teacher is fitted. Default: a teacher model.",
    )
    teacher_gate: TeacherGateConfig = Field(
        default_factory=TeacherGateConfig, description="The benchmark's teacher gate."
    )
    warmup_until: WarmupUntilConfig | None = Field(
        None,
        description="Warm up until greedy validation success reaches a threshold (at most max_cycles cycles) instead of for train.sft_warmup_cycles; needs train.sft_warmup_cycles: 0. Measured after every check_every-th warm-up cycle on eval.max_tasks tasks of the eval split.",
    )
    fixed_state_recovery: bool = Field(
        False,
        description="Benchmark endpoint 'fixed_recovery' (lab/benchmark/fixed_states.py): the cold start samples its episodes on the arms' evaluation tasks (eval.split, eval.max_tasks) at rollout.temperature and stores those with a deviation; the cold start and each arm's final student continue greedily from the state after each one's first off-path turn, and the cell records which end solved. The same states for every arm of a seed, so the contrast pairs them. calc_chain-style environments with an oracle.",
    )


class LabRunConfig(RunConfig):
    """A recipe with its ``lab:`` section validated (:class:`LabConfig`) beside the core's."""

    lab: LabConfig = Field(  # type: ignore[assignment]
        default_factory=LabConfig,
        description="The lab's settings (teacher fitting, the oracle teacher, teacher gates, the warm-up criterion).",
    )

    def combination_problems(self) -> Iterable[str]:
        """The core's rules, then the lab's (:func:`lab_problems`)."""
        yield from super().combination_problems()
        yield from lab_problems(self, self.lab)


COLD_START_TEACHER = "cold_start"
"""The value of ``models.teacher.checkpoint`` in a benchmark arm that the harness replaces by
the seed's cold start (``lab/benchmark/arms.py``), with the teacher's model block set to the
student's: the student scoring itself. Until then the recipe's toy-teacher fit may stand beside
it: the harness drops that fit from the arm when it points the checkpoint at the cold start."""


def lab_problems(config: RunConfig, lab: LabConfig) -> Iterable[str]:
    """The rules relating the lab's section to the core's, one line each."""
    models = config.models
    if models.teacher.checkpoint is not None:
        if lab.oracle_teacher is not None:
            yield "models.teacher.checkpoint and lab.oracle_teacher both replace the teacher model: set one"
        if lab.teacher_fit.enabled:
            yield "models.teacher.checkpoint loads a trained teacher; lab.teacher_fit.enabled would fit another: set it to false"
        refit = models.teacher.checkpoint != COLD_START_TEACHER
        if lab.toy_fit.dagger.enabled and refit:
            yield "models.teacher.checkpoint loads a trained teacher; lab.toy_fit.dagger.enabled would fit another: set it to false"
        if lab.toy_fit.init_from is not None and refit:
            yield "models.teacher.checkpoint loads a trained teacher; lab.toy_fit.init_from starts a fit from one: set models.teacher.checkpoint: null to refit, or drop init_from"
    if lab.oracle_teacher is not None:
        if models.backend != "toy":
            yield "lab.oracle_teacher needs models.backend: toy (the oracle teacher speaks the toy tokenizer)"
        if config.teacher.mode != "standard":
            yield "lab.oracle_teacher needs teacher.mode: standard (it reads the student's own transcript)"
    if lab.teacher_fit.init_from is not None and not lab.teacher_fit.enabled:
        yield "lab.teacher_fit.init_from starts a teacher-adapter fit, but lab.teacher_fit.enabled is false: enable the fit or drop init_from"
    if lab.teacher_fit.enabled and models.runtime != "shared_backbone":
        yield "lab.teacher_fit.enabled needs models.runtime: shared_backbone (the teacher adapter lives on the student's base)"
    until = lab.warmup_until
    if until is not None:
        if config.train.sft_warmup_cycles > 0:
            yield (
                f"lab.warmup_until and train.sft_warmup_cycles ({config.train.sft_warmup_cycles}) both set "
                "the warm-up length; set train.sft_warmup_cycles: 0 to warm up by criterion (the cap "
                "is lab.warmup_until.max_cycles), or drop lab.warmup_until"
            )
        if config.environment.eval_tasks == 0:
            yield "lab.warmup_until measures validation success, but environment.eval_tasks is 0"


def lab_of(config: RunConfig) -> LabConfig:
    """``config``'s lab section, validated (a :class:`LabRunConfig` already holds it)."""
    if isinstance(config.lab, LabConfig):
        return config.lab
    return LabConfig.model_validate(config.lab)


def with_lab(config: RunConfig) -> LabRunConfig:
    """``config`` as a :class:`LabRunConfig` (its lab section validated and completed)."""
    if isinstance(config, LabRunConfig):
        return config
    return LabRunConfig.from_mapping(config.to_dict(), source="<config>")


def write_reference(path: str | Path) -> None:
    """``docs/configuration.md``: the core sections and the lab's (``config/reference.py``)."""
    from miniverl.config.reference import write_reference as write

    write(path, LabRunConfig)


def load_recipe(path: str | Path, overrides: Iterable[str] = ()) -> LabRunConfig:
    """A recipe file with both layers validated; every problem is reported at once."""
    return LabRunConfig.from_yaml(path, overrides)


__all__ = [
    "DEFAULT_NOISE_KINDS",
    "DaggerConfig",
    "LabConfig",
    "LabRunConfig",
    "OracleTeacherConfig",
    "TeacherFitConfig",
    "TeacherGateConfig",
    "ToyFitConfig",
    "WarmupUntilConfig",
    "lab_of",
    "lab_problems",
    "load_recipe",
    "with_lab",
    "write_reference",
]
