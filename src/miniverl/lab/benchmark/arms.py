"""Benchmark arms: their definitions, what every arm must hold fixed, and their configs.

An arm is the override keys it applies to the base recipe; every arm of a seed starts from
the same cold start and must run the same splits, cycles, optimizer steps, rollout bounds
and evaluation (:func:`verify_held_fixed`). :func:`arm_temperatures` is what benchmark.json
records per arm: the temperature trajectories were sampled at and the loss temperature.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from miniverl.config.models import RunConfig, parse_override
from miniverl.config.modes import DEFAULT_MODE, MODES, arm_role, default_arms
from miniverl.errors import ConfigError
from miniverl.lab.config import COLD_START_TEACHER, lab_of

BASELINE_ARM = arm_role("reference_ceiling")
DEFAULT_ARMS: dict[str, tuple[str, ...]] = default_arms()
"""Each arm is the set of override keys it applies to the base recipe (recorded verbatim):
every mode's arms of the mode registry (``config/modes.py``), mode by mode. The mixed-prefix
mode's arm takes λ from ``train.gkd_student_fraction`` (0.5 unless the recipe says otherwise)."""


NAMED_ONLY_ARMS: dict[str, tuple[str, ...]] = {
    "opd_privileged": (
        *DEFAULT_ARMS[arm_role("compute_reference")],
        "teacher.mode=privileged_context",
    ),
    "sft_corrective": (*DEFAULT_ARMS[BASELINE_ARM], "train.sft_noise_fraction=0.5"),
    "opd_self": (
        *DEFAULT_ARMS[arm_role("compute_reference")],
        f"models.teacher.checkpoint={COLD_START_TEACHER}",
        "lab.teacher_fit.enabled=false",
    ),
}
"""Arms that run only when ``--arms`` names them, never by default: ``opd_privileged`` needs a
teacher model that reads an oracle block (the on-policy context distillation setting of
arXiv:2602.12275), which the oracle teacher of the toy recipes cannot be; ``sft_corrective``
is the off-policy arm that also sees errors (SFT on corrective traces, DART-style);
``opd_self`` is the negative control (a teacher with no information about the task beyond
the student's own: the seed's cold start)."""

ARM_ALIASES: dict[str, str] = {"sft_only": "sft_oracle"}
"""Deprecated arm names, still accepted: the alias runs under its own name with the
definition and description of the arm it stands for."""

REFERENCE_CEILING_ARMS = (BASELINE_ARM, "sft_only")
"""Arms that copy a perfect oracle: a reference ceiling, not a like-for-like baseline
(every other arm distils an imperfect teacher)."""

ARM_DESCRIPTIONS: dict[str, str] = {
    **{arm.name: arm.description for mode in MODES.values() for arm in mode.arms},
    "sft_only": "deprecated alias of sft_oracle (reference ceiling: oracle-trace SFT)",
    "opd_privileged": "on-policy distillation, forward KL, from a teacher that also reads the task's oracle block",
    "sft_corrective": "off-policy baseline that sees errors: SFT on oracle traces, half of them corrective (a corrupted call, the tool's answer, the oracle's re-call; DART-style)",
    "opd_self": "negative control: on-policy distillation from the cold-start student itself (a teacher that knows nothing the student does not)",
}

FIXED_KEYS: tuple[str, ...] = (
    "environment",
    "eval",
    "models",
    "lab",
    "run.seed",
    "train.cycles",
    "train.rollouts_per_cycle",
    "rollout.max_turns",
    "rollout.max_new_tokens_per_turn",
    "rollout.max_total_tokens",
    "rollout.max_parse_errors",
    "rollout.max_repeated_calls",
)
"""Config keys no arm may override: splits, evaluation, the models the cold start was
trained for, the seed (set by the harness), cycles, rollouts per cycle and rollout bounds."""


def _dotted(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


def override_touches(override_key: str, fixed: str) -> bool:
    """Whether setting ``override_key`` sets ``fixed``, a key inside it, or a section holding it."""
    return (
        override_key == fixed
        or override_key.startswith(fixed + ".")
        or fixed.startswith(override_key + ".")
    )


ARM_TEACHER_KEYS = (
    "models.teacher.checkpoint",
    "lab.teacher_fit.enabled",
    "models.teacher_fit.enabled",
)
"""Keys an arm may set among the held-fixed sections: its own teacher (the cold start stays the
seed's); the teacher-adapter switch may be written at its place under ``lab:`` or ``models``."""


def check_arm_overrides(arm: str, overrides: Sequence[str]) -> None:
    """Refuse an arm whose overrides touch anything the benchmark holds fixed."""
    for item in overrides:
        key = ".".join(parse_override(item)[0])
        if key in ARM_TEACHER_KEYS:
            continue
        hit = next((fixed for fixed in FIXED_KEYS if override_touches(key, fixed)), None)
        if hit is not None:
            raise ConfigError(
                f"benchmark arm {arm!r} overrides {key!r}, which the benchmark holds fixed ({hit})",
                hint="arms may change the objective (run.mode, loss.*, selection.*, teacher.*, train.lr, ...); "
                "put split, cycle, rollout-bound, model and evaluation changes in the base overrides instead",
            )


def fixed_view(config: RunConfig) -> dict[str, Any]:
    """The values of :data:`FIXED_KEYS` plus the planned optimizer steps of the arm phase. The
    teacher's blocks are left out: the only held-fixed keys an arm may set are its own
    teacher's (:data:`ARM_TEACHER_KEYS`, checked by :func:`check_arm_overrides`)."""
    data = config.to_dict()
    data["models"] = {k: v for k, v in data["models"].items() if k != "teacher"}
    data["lab"] = {k: v for k, v in (data.get("lab") or {}).items() if k != "teacher_fit"}
    view = {key: _dotted(data, key) for key in FIXED_KEYS}
    view["optimizer_steps"] = config.train.cycles * config.train.steps_per_rollout_batch()
    return view


def verify_held_fixed(configs: Mapping[str, RunConfig]) -> dict[str, Any]:
    """Compare the arms' validated configs key by key; refuse any difference."""
    names = list(configs)
    reference = fixed_view(configs[names[0]])
    for name in names[1:]:
        view = fixed_view(configs[name])
        for key, value in reference.items():
            if view[key] != value:
                raise ConfigError(
                    f"benchmark arms {names[0]!r} and {name!r} differ in {key} ({value!r} vs {view[key]!r}), which must be held fixed",
                    hint="every arm must run the same splits, cycles, optimizer steps, rollout bounds and evaluation settings",
                )
    return reference


def cold_start_config(base: RunConfig, seed: int) -> RunConfig:
    """The shared cold start: the base recipe with no distillation cycles.

    Its run evaluates the baseline, runs the SFT warm-up and evaluates again (the cell
    prepares its teacher, ``lab/benchmark/cell_runner.py``). A mode without a teacher has no
    warm-up, so such a base recipe is run in the default mode for the cold start only.
    """
    overrides = [
        f"run.seed={seed}",
        "train.cycles=0",
        f"run.name={base.run.name}-cold-start-s{seed}",
    ]
    if not base.mode().warmup:
        overrides.append(f"run.mode={DEFAULT_MODE}")
    return base.with_overrides(overrides)


def arm_config(base: RunConfig, arm: str, overrides: Sequence[str], seed: int) -> RunConfig:
    """The base recipe plus the arm's override keys, at ``seed`` (the harness owns the seed)."""
    return base.with_overrides(
        [*overrides, f"run.seed={seed}", f"run.name={base.run.name}-{arm}-s{seed}"]
    )


def resolve_arms(
    arms: Sequence[str] | None, definitions: Mapping[str, Sequence[str]] | None = None
) -> dict[str, tuple[str, ...]]:
    """Arm name -> override keys, in the requested order; unknown names are refused.

    With the default definitions a deprecated alias (:data:`ARM_ALIASES`) and the arms of
    :data:`NAMED_ONLY_ARMS` are accepted when named; neither is part of the default set.
    """
    known = {name: tuple(spec) for name, spec in (definitions or DEFAULT_ARMS).items()}
    names = list(dict.fromkeys(arms)) if arms else list(known)
    if definitions is None:
        known.update(NAMED_ONLY_ARMS)
        known.update({alias: known[arm] for alias, arm in ARM_ALIASES.items()})
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"unknown benchmark arm(s) {', '.join(unknown)}", hint=f"choose from {', '.join(known)}"
        )
    if not names:
        raise ConfigError("no benchmark arms selected")
    return {name: known[name] for name in names}


def arm_config_for_arm_seed(config: RunConfig, arm_seed: int) -> RunConfig:
    """An arm's config at ``arm_seed``: arm seed 0 is unchanged; others get a derived ``run.seed``.

    Splits come from ``environment.split_seed``, so the held-out tasks stay the same.
    """
    from miniverl.lab.benchmark.cells import arm_phase_seed

    if arm_seed == 0:
        return config
    return config.with_overrides(
        [
            f"run.seed={arm_phase_seed(config.run.seed, arm_seed)}",
            f"run.name={config.run.name}-a{arm_seed}",
        ]
    )


def with_cold_start_teacher(config: RunConfig, cold_start: str) -> RunConfig:
    """``config`` with a ``models.teacher.checkpoint`` of :data:`COLD_START_TEACHER` pointed
    at ``cold_start`` and the teacher's base made the student's (unchanged otherwise); the
    cold start records its own adapter shape (``training/teacher_checkpoint.py``). A recipe
    whose cold start refits a toy teacher (``lab.toy_fit.dagger``, ``init_from``) keeps that
    fit out of the arm: the arm's teacher is the cold-start student, and nothing is fitted."""
    if config.models.teacher.checkpoint != COLD_START_TEACHER:
        return config
    student = config.models.student
    overrides = [
        f"models.teacher.checkpoint={cold_start}",
        f"models.teacher.model_id={student.model_id}",
    ]
    toy_fit = lab_of(config).toy_fit
    if toy_fit.dagger.enabled:
        overrides.append("lab.toy_fit.dagger.enabled=false")
    if toy_fit.init_from is not None:
        overrides.append("lab.toy_fit.init_from=null")
    if student.revision is not None:
        overrides.append(f"models.teacher.revision={student.revision}")
    return config.with_overrides(overrides)


def arm_baseline(arms: Sequence[str]) -> str | None:
    """The arm every other arm's difference is taken against: the first oracle-SFT arm that runs."""
    return next((a for a in arms if a in REFERENCE_CEILING_ARMS), None)


def arm_record(name: str, overrides: Sequence[str], config: RunConfig) -> dict[str, Any]:
    """benchmark.json's ``arms[name]``: overrides, description, mode, temperatures, labels.

    ``sampling_temperature`` is the temperature the arm's training trajectories were
    sampled at (None for arms that train on oracle traces); ``loss_temperature`` the
    divergence temperature (None for cross-entropy arms); see training/sources.py.
    """
    from miniverl.training.sources import temperature_fields

    record: dict[str, Any] = {
        "overrides": list(overrides),
        "description": ARM_DESCRIPTIONS.get(name, ""),
        "mode": config.run.mode,
        "objective": config.objective_label(),
        **temperature_fields(config),
        "reference_ceiling": name in REFERENCE_CEILING_ARMS,
    }
    if name in ARM_ALIASES:
        record["deprecated_alias_of"] = ARM_ALIASES[name]
    return record


__all__ = [
    "ARM_ALIASES",
    "ARM_DESCRIPTIONS",
    "ARM_TEACHER_KEYS",
    "BASELINE_ARM",
    "COLD_START_TEACHER",
    "DEFAULT_ARMS",
    "FIXED_KEYS",
    "NAMED_ONLY_ARMS",
    "REFERENCE_CEILING_ARMS",
    "arm_baseline",
    "arm_config",
    "arm_config_for_arm_seed",
    "arm_record",
    "check_arm_overrides",
    "cold_start_config",
    "fixed_view",
    "override_touches",
    "resolve_arms",
    "verify_held_fixed",
    "with_cold_start_teacher",
]
