"""``RunConfig``: sections, every rejected combination, key paths, YAML, overrides, digest."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from miniverl.config.models import (
    RunConfig,
    apply_overrides,
    load_yaml_mapping,
    parse_override,
)
from miniverl.config.sections import ENVIRONMENT_REF_PATTERN, TrainConfig
from miniverl.errors import ConfigError
from miniverl.lab.config import LabRunConfig


def _problems(data: dict[str, Any]) -> list[str]:
    """The ``  - ...`` lines of the ConfigError that ``data`` raises, read as ``miniverl
    validate`` reads a recipe (both layers, ``LabRunConfig``)."""
    with pytest.raises(ConfigError) as info:
        LabRunConfig.from_mapping(data)
    header, *lines = info.value.message.split("\n")
    assert header == f"<mapping>: {len(lines)} configuration error(s)"
    assert all(line.startswith("  - ") for line in lines)
    return [line[4:] for line in lines]


HF_NF4 = {
    "backend": "hf",
    "student": {"model_id": "m", "quantization": "nf4"},
    "teacher": {"model_id": "m"},
}

COMBINATIONS: dict[str, tuple[dict[str, Any], str]] = {
    "bf16 rollouts on the toy": (
        {"models": {"rollout_dtype": "bfloat16"}},
        "models.rollout_dtype: bfloat16 needs models.backend: hf and models.runtime: dual_model "
        "(the toy decodes in float32; a shared backbone has one set of weights)",
    ),
    "opd reuse": (
        {"cache": {"reuse_across_policy_versions": True}},
        "run.mode: opd cannot set cache.reuse_across_policy_versions: true (on-policy targets must come from the "
        "current rollouts; only offline_kd may reuse a frozen cache)",
    ),
    "sft reuse": (
        {"run": {"mode": "sft"}, "cache": {"reuse_across_policy_versions": True}},
        "cache.reuse_across_policy_versions is only meaningful in run.mode: offline_kd",
    ),
    "opd not strict": (
        {"cache": {"strict_policy_version": False}},
        "run.mode: opd requires cache.strict_policy_version: true (a target produced under another policy version "
        "is not on-policy)",
    ),
    "jsd beta 0": (
        {"loss": {"divergence": "jsd", "jsd_beta": 0}},
        "loss.divergence: jsd needs 0 < loss.jsd_beta < 1, got 0.0; use loss.divergence: forward_kl instead",
    ),
    "jsd beta 1": (
        {"loss": {"divergence": "jsd", "jsd_beta": 1.0}},
        "loss.divergence: jsd needs 0 < loss.jsd_beta < 1, got 1.0; use loss.divergence: reverse_kl instead",
    ),
    "exact with top_k": (
        {"loss": {"mode": "exact_full_vocab", "top_k": 8}},
        "loss.mode: exact_full_vocab uses the full teacher distribution, so an explicit loss.top_k: 8 contradicts "
        "it; remove loss.top_k or use loss.mode: bucketed",
    ),
    "bucketed top_k 0": (
        {"loss": {"top_k": 0}},
        "loss.mode: bucketed needs loss.top_k >= 1 or 'auto'",
    ),
    "bucketed top_k None": (
        {"loss": {"top_k": None}},
        "loss.mode: bucketed needs loss.top_k (an integer or 'auto')",
    ),
    "chunk below min": (
        {"loss": {"chunk_size": 8}},
        "loss.chunk_size 8 is below the smallest chunk, 16 rows",
    ),
    "toy student quantized": (
        {"models": {"student": {"model_id": "toy-student", "quantization": "nf4"}}},
        "models.backend: toy cannot be quantized (models.student.quantization); quantization needs the hf backend on CUDA",
    ),
    "toy teacher quantized": (
        {"models": {"teacher": {"model_id": "toy-teacher", "quantization": "int8"}}},
        "models.backend: toy cannot be quantized (models.teacher.quantization); quantization needs the hf backend on CUDA",
    ),
    "toy unknown preset": (
        {"models": {"student": {"model_id": "Qwen/Qwen3-0.6B"}}},
        "models.student.model_id 'Qwen/Qwen3-0.6B' is not a toy preset (toy-student, toy-teacher)",
    ),
    "noise outside oracle sft": (
        {"run": {"mode": "opd"}, "train": {"sft_noise_fraction": 0.5}},
        "train.sft_noise_fraction applies to run.mode: sft only (the SFT warm-up of opd never sees noise)",
    ),
    "activation checkpointing on the toy": (
        {"memory": {"activation_checkpointing": True}},
        "memory.activation_checkpointing needs models.backend: hf (the toy keeps every activation; its forwards are small)",
    ),
    "swap quantized": (
        {"models": HF_NF4, "memory": {"strategy": "swap"}},
        "memory.strategy: swap is unavailable with a quantized model (models.student.quantization): bitsandbytes "
        "4-bit and 8-bit parameters are pinned to the device they were quantized on; use memory.strategy: resident",
    ),
    "swap without cache": (
        {"memory": {"strategy": "swap"}, "cache": {"enabled": False}},
        "memory.strategy: swap needs cache.enabled: true (targets survive evicting the teacher only through the cache)",
    ),
    "offline_kd without cache": (
        {"run": {"mode": "offline_kd"}, "cache": {"enabled": False}},
        "run.mode: offline_kd needs cache.enabled: true (it trains from one frozen teacher cache)",
    ),
    "total equals per-turn": (
        {"rollout": {"max_total_tokens": 64, "max_new_tokens_per_turn": 64}},
        "rollout.max_total_tokens (64) must exceed rollout.max_new_tokens_per_turn (64)",
    ),
    "total below per-turn": (
        {"rollout": {"max_total_tokens": 32, "max_new_tokens_per_turn": 64}},
        "rollout.max_total_tokens (32) must exceed rollout.max_new_tokens_per_turn (64)",
    ),
    "strict freshness, two steps": (
        {"train": {"rollouts_per_cycle": 8, "gradient_accumulation_steps": 4}},
        "train.opd_freshness: strict allows one optimizer step per rollout batch, but rollouts_per_cycle=8 with "
        "gradient_accumulation_steps=4 takes 2; set train.gradient_accumulation_steps to 8 (or auto), or use "
        "train.opd_freshness: replay",
    ),
    "gkd_mix, two steps": (
        {
            "run": {"mode": "gkd_mix"},
            "train": {"rollouts_per_cycle": 8, "gradient_accumulation_steps": 4},
        },
        "run.mode: gkd_mix allows one optimizer step per batch (its student rollouts are on-policy), but "
        "rollouts_per_cycle=8 with gradient_accumulation_steps=4 takes 2; set train.gradient_accumulation_steps "
        "to 8 (or auto)",
    ),
    "gkd_mix not strict": (
        {"run": {"mode": "gkd_mix"}, "cache": {"strict_policy_version": False}},
        "run.mode: gkd_mix requires cache.strict_policy_version: true (a target produced under another policy "
        "version is not on-policy)",
    ),
    "seqkd reuse": (
        {"run": {"mode": "seqkd"}, "cache": {"reuse_across_policy_versions": True}},
        "cache.reuse_across_policy_versions is only meaningful in run.mode: offline_kd",
    ),
    "replay outside opd": (
        {"run": {"mode": "sft"}, "train": {"opd_freshness": "replay"}},
        "train.opd_freshness: replay only applies to run.mode: opd",
    ),
    "replay passes without replay": (
        {"run": {"mode": "sft"}, "train": {"replay_passes": 2}},
        "train.replay_passes > 1 requires train.opd_freshness: replay",
    ),
    "warm-up by criterion and by count": (
        {"train": {"sft_warmup_cycles": 3, "sft_warmup_until": {"threshold": 0.8}}},
        "lab.warmup_until and train.sft_warmup_cycles (3) both set the warm-up length; set "
        "train.sft_warmup_cycles: 0 to warm up by criterion (the cap is "
        "lab.warmup_until.max_cycles), or drop lab.warmup_until",
    ),
    "warm-up criterion without validation tasks": (
        {
            "environment": {"eval_tasks": 0},
            "eval": {"baseline": False, "after_warmup": False},
            "train": {"sft_warmup_cycles": 0},
            "lab": {"warmup_until": {"max_cycles": 4}},
        },
        "lab.warmup_until measures validation success, but environment.eval_tasks is 0",
    ),
    "batch above group": (
        {"train": {"rollouts_per_cycle": 4, "trajectory_batch_size": 8}},
        "train.trajectory_batch_size (8) cannot exceed the optimizer group size (4)",
    ),
    "group above rollouts": (
        {"train": {"rollouts_per_cycle": 4, "gradient_accumulation_steps": 8}},
        "train.gradient_accumulation_steps (8) cannot exceed train.rollouts_per_cycle (4)",
    ),
    "zero weights": (
        {"selection": {"critical_weight": 0, "other_weight": 0}},
        "selection.critical_weight and selection.other_weight are both 0: nothing would be supervised",
    ),
    "tool_and_final without critical weight": (
        {"selection": {"selector": "tool_and_final", "critical_weight": 0}},
        "selection.selector: tool_and_final keeps only critical tokens, so selection.critical_weight must be > 0",
    ),
    "shared backbone on toy": (
        {"models": {"runtime": "shared_backbone", "student": {"model_id": "toy-teacher"}}},
        "models.runtime: shared_backbone needs models.backend: hf",
    ),
    "shared backbone without lora": (
        {
            "models": {
                "backend": "hf",
                "runtime": "shared_backbone",
                "student": {"model_id": "m", "lora": {"enabled": False}},
                "teacher": {"model_id": "m"},
            }
        },
        "models.runtime: shared_backbone needs models.student.lora.enabled: true (only actor adapters are trained)",
    ),
    "shared backbone, two bases": (
        {
            "models": {
                "backend": "hf",
                "runtime": "shared_backbone",
                "student": {"model_id": "a"},
                "teacher": {"model_id": "b"},
            }
        },
        "models.runtime: shared_backbone needs student and teacher to share one base (same model_id)",
    ),
    "shared backbone with swap": (
        {
            "models": {
                "backend": "hf",
                "runtime": "shared_backbone",
                "student": {"model_id": "a"},
                "teacher": {"model_id": "a"},
            },
            "memory": {"strategy": "swap"},
        },
        "models.runtime: shared_backbone keeps one base model on the device, so memory.strategy: swap cannot evict the teacher; use resident or auto",
    ),
    "teacher fit without a shared backbone": (
        {
            "models": {
                "backend": "hf",
                "student": {"model_id": "a"},
                "teacher": {"model_id": "a"},
                "teacher_fit": {"enabled": True},
            }
        },
        "lab.teacher_fit.enabled needs models.runtime: shared_backbone (the teacher adapter lives on the student's base)",
    ),
    "teacher fit start without a fit": (
        {
            "models": {
                "backend": "hf",
                "runtime": "shared_backbone",
                "student": {"model_id": "a"},
                "teacher": {"model_id": "a"},
                "teacher_fit": {"init_from": "runs/teacher"},
            }
        },
        "lab.teacher_fit.init_from starts a teacher-adapter fit, but lab.teacher_fit.enabled is false: enable the fit or drop init_from",
    ),
    "toy fit start beside a teacher checkpoint": (
        {
            "models": {
                "teacher": {"model_id": "toy-teacher", "checkpoint": "runs/teacher"},
                "toy_fit": {"init_from": "runs/teacher"},
            }
        },
        "models.teacher.checkpoint loads a trained teacher; lab.toy_fit.init_from starts a fit from one: set models.teacher.checkpoint: null to refit, or drop init_from",
    ),
    "test split without tasks": (
        {"eval": {"split": "test"}},
        "eval.split: test needs environment.test_tasks > 0",
    ),
    "eval without tasks": (
        {"environment": {"eval_tasks": 0}},
        "environment.eval_tasks is 0 but evaluation is enabled; set eval.baseline/after_warmup false or add eval tasks",
    ),
    "periodic eval without tasks": (
        {
            "environment": {"eval_tasks": 0},
            "eval": {"every": 2, "baseline": False, "after_warmup": False},
        },
        "eval.every needs held-out tasks, but the 'eval' split is empty (environment.eval_tasks: 0)",
    ),
    "oracle teacher on hf": (
        {"models": {"backend": "hf", "oracle_teacher": {"smoothing": 0.001}}},
        "lab.oracle_teacher needs models.backend: toy (the oracle teacher speaks the toy tokenizer)",
    ),
    "oracle teacher with privileged context": (
        {"lab": {"oracle_teacher": {}}, "teacher": {"mode": "privileged_context"}},
        "lab.oracle_teacher needs teacher.mode: standard (it reads the student's own transcript)",
    ),
    "checkpoint teacher and oracle teacher": (
        {"models": {"teacher": {"checkpoint": "runs/t"}, "oracle_teacher": {}}},
        "models.teacher.checkpoint and lab.oracle_teacher both replace the teacher model: set one",
    ),
    "checkpoint teacher and an adapter fit": (
        {
            "models": {
                "backend": "hf",
                "runtime": "shared_backbone",
                "student": {"model_id": "a"},
                "teacher": {"model_id": "a", "checkpoint": "runs/t"},
                "teacher_fit": {"enabled": True},
            }
        },
        "models.teacher.checkpoint loads a trained teacher; lab.teacher_fit.enabled would fit another: set it to false",
    ),
    "checkpoint teacher and a dagger fit": (
        {
            "models": {"teacher": {"checkpoint": "runs/t"}},
            "lab": {"toy_fit": {"dagger": {"enabled": True}}},
        },
        "models.teacher.checkpoint loads a trained teacher; lab.toy_fit.dagger.enabled would fit another: set it to false",
    ),
}


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_rejected_combination(name: str) -> None:
    data, message = COMBINATIONS[name]
    assert _problems(data) == [message]


def test_chunk_size_zero_reports_both_problems() -> None:
    assert _problems({"loss": {"chunk_size": 0}}) == [
        "loss.chunk_size must be >= 1 or 'auto'",
        "loss.chunk_size 0 is below the smallest chunk, 16 rows",
    ]


def test_every_problem_is_reported_at_once() -> None:
    problems = _problems(
        {
            "cache": {"reuse_across_policy_versions": True, "strict_policy_version": False},
            "loss": {"divergence": "jsd", "jsd_beta": 0.0},
        }
    )
    assert len(problems) == 3
    assert problems[0].startswith("run.mode: opd cannot set cache.reuse_across_policy_versions")
    assert problems[1].startswith("run.mode: opd requires cache.strict_policy_version")
    assert problems[2].startswith("loss.divergence: jsd needs 0 < loss.jsd_beta < 1")


@pytest.mark.parametrize(
    "data",
    [
        {"run": {"mode": "offline_kd"}, "cache": {"reuse_across_policy_versions": True}},
        {"run": {"mode": "sft"}, "cache": {"strict_policy_version": False}},
        {"loss": {"divergence": "jsd", "jsd_beta": 0.3}},
        {"loss": {"mode": "exact_full_vocab", "top_k": 1}},
        {"loss": {"mode": "exact_full_vocab", "top_k": None}},
        {"loss": {"mode": "exact_full_vocab"}},
        {"loss": {"chunk_size": 16, "top_k": 4}},
        {"rollout": {"max_total_tokens": 65, "max_new_tokens_per_turn": 64}},
        {
            "train": {
                "rollouts_per_cycle": 8,
                "gradient_accumulation_steps": 8,
                "trajectory_batch_size": "auto",
            }
        },
        {
            "train": {
                "rollouts_per_cycle": 8,
                "gradient_accumulation_steps": 4,
                "opd_freshness": "replay",
            }
        },
        {"train": {"opd_freshness": "replay", "replay_passes": 3}},
        {
            "models": {
                "backend": "hf",
                "student": {"model_id": "m", "quantization": "nf4"},
                "teacher": {"model_id": "m"},
            },
            "memory": {"strategy": "resident"},
        },
        {
            "models": {
                "backend": "hf",
                "student": {"model_id": "m", "quantization": "nf4"},
                "teacher": {"model_id": "m"},
            }
        },
        {
            "models": {
                "backend": "hf",
                "runtime": "shared_backbone",
                "student": {"model_id": "m"},
                "teacher": {"model_id": "m"},
            }
        },
        {"models": {"student": {"model_id": "toy-teacher"}}},
        {"selection": {"selector": "tool_and_final", "other_weight": 0}},
        {"environment": {"eval_tasks": 0}, "eval": {"baseline": False, "after_warmup": False}},
        {"environment": {"test_tasks": 3}, "eval": {"split": "test"}},
        {"run": {"mode": "sft"}, "memory": {"strategy": "swap"}, "cache": {"enabled": False}},
    ],
)
def test_accepted_neighbours(data: dict[str, Any]) -> None:
    RunConfig.from_mapping(data)


# -- unknown keys and field errors carry their key path ----------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"bogus": 1}, "bogus"),
        ({"train": {"cycle": 4}}, "train.cycle"),
        ({"models": {"student": {"lora": {"rank": 4}}}}, "models.student.lora.rank"),
        ({"models": {"teacher": {"lora_rank": 3}}}, "models.teacher.lora_rank"),
        ({"models": {"toy_fit": {"epochs": 3}}}, "lab.toy_fit.epochs"),
        ({"lab": {"teacher_gate": {"bar": 3}}}, "lab.teacher_gate.bar"),
        ({"environment": {"difficulty": "easy", "seed": 3}}, "environment.seed"),
    ],
)
def test_unknown_keys_rejected_with_key_path(data: dict[str, Any], path: str) -> None:
    assert f"{path}: unknown key (Extra inputs are not permitted)" in _problems(data)


def test_environment_params_are_free_form() -> None:
    cfg = RunConfig.from_mapping(
        {"environment": {"params": {"prompt_style": "verbose", "anything": {"nested": 1}}}}
    )
    assert cfg.environment.params == {"prompt_style": "verbose", "anything": {"nested": 1}}


def test_field_errors_have_key_paths() -> None:
    problems = _problems(
        {
            "loss": {"divergence": "kl"},
            "train": {"cycles": -1},
            "rollout": {"max_turns": 0},
            "lab": {"toy_fit": {"max_steps": -1}},
        }
    )
    assert (
        "loss.divergence: Input should be 'forward_kl', 'reverse_kl', 'jsd' or 'entropy_aware'"
        in problems
    )
    assert "train.cycles: Input should be greater than or equal to 0" in problems
    assert "rollout.max_turns: Input should be greater than or equal to 1" in problems
    assert "lab.toy_fit.max_steps: Input should be greater than or equal to 0" in problems


def test_a_bound_error_points_at_the_file_that_sets_the_bound() -> None:
    from miniverl.config import limits

    [problem] = _problems({"train": {"lr": 2e3}})
    assert problem == f"train.lr: Input should be less than or equal to 1 ({limits.BOUND_HINT})"
    assert limits.BOUND_HINT.endswith(f"src/miniverl/config/{Path(limits.__file__).name}")


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd", "entropy_aware"])
def test_divergence_kwargs_build_the_spec_the_trainer_builds(divergence: str) -> None:
    """``LossConfig.divergence_kwargs`` is the one unpacking of the loss section into a
    ``DivergenceSpec``: every field, each from its recipe key."""
    pytest.importorskip("torch")
    import dataclasses

    from miniverl.losses.divergences import DivergenceSpec

    loss = RunConfig.from_mapping(
        {
            "loss": {
                "divergence": divergence,
                "jsd_beta": 0.3,
                "temperature": 1.7,
                "entropy_threshold": 0.4,
                "entropy_forward_weight": 2.5,
            }
        }
    ).loss
    kwargs = loss.divergence_kwargs()
    assert set(kwargs) == {f.name for f in dataclasses.fields(DivergenceSpec)}
    assert DivergenceSpec(**kwargs) == DivergenceSpec(
        name=divergence,
        temperature=1.7,
        jsd_beta=0.3 if divergence == "jsd" else 0.5,
        entropy_threshold=0.4,
        entropy_forward_weight=2.5,
    )


@pytest.mark.parametrize("field", ["gradient_accumulation_steps", "trajectory_batch_size"])
def test_positive_or_auto(field: str) -> None:
    assert f"train.{field}: must be >= 1 or 'auto'" in _problems({"train": {field: 0}})


@pytest.mark.parametrize(
    "name",
    [
        "os.path",
        "../x",
        "Calculator",
        "1calc",
        "calc-ulator",
        "",
        "a" * 65,
        "os/path",
        "a.b:",
        ":C",
        "a/b:C",
        "a:B.c",
        "a b:C",
        "calculator\n",
    ],
)
def test_environment_name_regex(name: str) -> None:
    assert _problems({"environment": {"name": name}}) == [
        f"environment.name: String should match pattern '{ENVIRONMENT_REF_PATTERN}'"
    ]


def test_environment_name_pattern_accepts_names_and_module_class() -> None:
    for name in ("calculator", "my_env2", "a" * 64, "pkg.mod:Env", "mod:Env", "_m._n:_E"):
        assert RunConfig.from_mapping({"environment": {"name": name}}).environment.name == name


def test_non_mapping_recipe() -> None:
    with pytest.raises(
        ConfigError, match=r"^<mapping>: a recipe must be a mapping of sections, got list$"
    ):
        RunConfig.from_mapping([1, 2])  # type: ignore[arg-type]
    assert RunConfig.from_mapping(None) == RunConfig()


# -- defaults, descriptions, auto ---------------------------------------------------------------


def _sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    found = [(prefix or "<root>", model)]
    for name, field in model.model_fields.items():
        stack = [field.annotation]
        while stack:
            tp = stack.pop()
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                found.extend(_sections(tp, f"{prefix}{name}."))
            else:
                stack.extend(typing.get_args(tp))
    return found


def test_every_field_has_a_description() -> None:
    sections = _sections(LabRunConfig)
    names = {cls.__name__ for _, cls in sections}
    assert {
        "RunSection",
        "ModelsConfig",
        "ModelSpec",
        "TeacherSpec",
        "LoraConfig",
        "LabConfig",
        "ToyFitConfig",
        "TeacherGateConfig",
        "EnvironmentConfig",
        "RolloutConfig",
        "SelectionConfig",
        "TeacherConfig",
        "LossConfig",
        "CacheConfig",
        "MemoryConfig",
        "TrainConfig",
        "EvalConfig",
    } <= names
    missing = [
        f"{path}.{name}"
        for path, cls in sections
        for name, field in cls.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert missing == []
    for _, cls in sections:
        assert cls.model_config.get("extra") == "forbid", cls.__name__


def test_auto_stays_auto() -> None:
    cfg = RunConfig()
    assert cfg.memory.strategy == "auto"
    assert cfg.loss.top_k == "auto" and cfg.loss.chunk_size == "auto"
    assert cfg.models.device == "auto"
    assert cfg.models.student.precision == "auto" and cfg.models.teacher.precision == "auto"
    assert cfg.train.gradient_accumulation_steps == "auto"
    reread = RunConfig.from_mapping(yaml.safe_load(cfg.to_yaml()))
    assert reread.memory.strategy == reread.loss.top_k == reread.loss.chunk_size == "auto"
    assert reread.with_overrides(["train.cycles=1"]).memory.strategy == "auto"
    assert "strategy: auto" in cfg.to_yaml()


def test_defaults_follow_the_design() -> None:
    cfg = RunConfig()
    assert (cfg.run.mode, cfg.run.seed) == ("opd", 1234)
    assert cfg.models.backend == "toy" and cfg.models.student.model_id == "toy-student"
    assert cfg.models.teacher.model_id == "toy-teacher" and cfg.models.teacher.checkpoint is None
    assert cfg.environment.name == "calculator"
    assert cfg.teacher.mode == "standard" and cfg.selection.selector == "all_model_tokens"
    assert cfg.cache.strict_policy_version and not cfg.cache.reuse_across_policy_versions
    assert cfg.train.opd_freshness == "strict" and cfg.train.steps_per_rollout_batch() == 1
    assert cfg.lab == {} and cfg.memory.strategy == "auto"


def test_train_derived_views() -> None:
    assert (
        TrainConfig(rollouts_per_cycle=8, gradient_accumulation_steps=3).steps_per_rollout_batch()
        == 3
    )
    replay = TrainConfig(
        rollouts_per_cycle=8, gradient_accumulation_steps=4, opd_freshness="replay", replay_passes=2
    )
    assert replay.group_size() == 4 and replay.steps_per_rollout_batch() == 4


@pytest.mark.parametrize(
    ("data", "label"),
    [
        ({"run": {"mode": "sft"}}, "supervised_fine_tuning_on_oracle_traces"),
        ({"run": {"mode": "offline_kd"}}, "offline_knowledge_distillation"),
        ({}, "on_policy_distillation"),
        ({"train": {"opd_freshness": "replay", "replay_passes": 1}}, "on_policy_distillation"),
        (
            {"train": {"opd_freshness": "replay", "replay_passes": 2}},
            "online_distillation_with_replay",
        ),
    ],
)
def test_objective_label(data: dict[str, Any], label: str) -> None:
    assert RunConfig.from_mapping(data).objective_label() == label


# -- YAML, digest, overrides --------------------------------------------------------------------

NON_DEFAULT = {
    "run": {"name": "exp", "mode": "opd", "seed": 9},
    "loss": {"divergence": "jsd", "jsd_beta": 0.25, "top_k": 16, "chunk_size": 64},
    "train": {"betas": [0.8, 0.95], "max_grad_norm": None, "cycles": 2},
    "models": {"student": {"model_id": "toy-teacher", "lora": {"target_modules": ["q", "v"]}}},
    "lab": {"toy_fit": {"max_steps": 7}},
    "environment": {"params": {"prompt_style": "verbose"}},
    "selection": {"selector": "hybrid", "ratio": 0.3, "critical_weight": 2.0},
}


@pytest.mark.parametrize("data", [{}, NON_DEFAULT], ids=["defaults", "non-default"])
def test_yaml_round_trip_keeps_the_digest(data: dict[str, Any]) -> None:
    cfg = RunConfig.from_mapping(data)
    text = cfg.to_yaml()
    again = RunConfig.from_mapping(yaml.safe_load(text))
    assert again == cfg
    assert again.digest() == cfg.digest()
    assert again.to_yaml() == text
    assert list(yaml.safe_load(text)) == [
        "run",
        "models",
        "environment",
        "rollout",
        "selection",
        "teacher",
        "loss",
        "cache",
        "memory",
        "train",
        "eval",
        "checkpoint",
        "logging",
        "lab",
    ]


def test_digest_changes_with_content() -> None:
    assert RunConfig().digest() == RunConfig.from_mapping({}).digest()
    assert RunConfig().digest() != RunConfig.from_mapping({"train": {"cycles": 5}}).digest()
    assert len(RunConfig().digest()) == 64


def test_from_yaml_with_overrides(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  cycles: 2\nloss:\n  divergence: forward_kl\n", encoding="utf-8")
    cfg = RunConfig.from_yaml(recipe, ["train.cycles=4", "loss.divergence=reverse_kl"])
    assert (cfg.train.cycles, cfg.loss.divergence) == (4, "reverse_kl")
    same = RunConfig.from_mapping({"train": {"cycles": 4}, "loss": {"divergence": "reverse_kl"}})
    assert cfg.digest() == same.digest()
    assert (
        RunConfig().with_overrides(["train.cycles=4", "loss.divergence=reverse_kl"]).digest()
        == same.digest()
    )


def test_overrides_are_validated_like_the_file(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("{}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        RunConfig.from_yaml(recipe, ["loss.bogus=1", "train.cycles=-1"])
    assert info.value.message.splitlines() == [
        f"{recipe}: 2 configuration error(s)",
        "  - loss.bogus: unknown key (Extra inputs are not permitted)",
        "  - train.cycles: Input should be greater than or equal to 0",
    ]
    with pytest.raises(ConfigError) as info:
        RunConfig.from_yaml(recipe, ["cache.reuse_across_policy_versions=true"])
    assert info.value.message.splitlines() == [
        f"{recipe}: 1 configuration error(s)",
        "  - run.mode: opd cannot set cache.reuse_across_policy_versions: true (on-policy targets must come from "
        "the current rollouts; only offline_kd may reuse a frozen cache)",
    ]


def test_parse_override_values_are_yaml_scalars() -> None:
    assert parse_override("train.cycles=4") == (["train", "cycles"], 4)
    assert parse_override("loss.top_k=auto") == (["loss", "top_k"], "auto")
    assert parse_override("train.max_grad_norm=null") == (["train", "max_grad_norm"], None)
    assert parse_override("cache.enabled=false") == (["cache", "enabled"], False)
    assert parse_override("train.lr=0.5") == (["train", "lr"], 0.5)
    # YAML 1.1 reads "1e-3" as a string; the float field still validates it to 0.001.
    assert RunConfig().with_overrides(["train.lr=1e-3"]).train.lr == 1e-3
    assert parse_override("run.name=") == (["run", "name"], "")
    assert parse_override("train.betas=[0.8, 0.9]") == (["train", "betas"], [0.8, 0.9])


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("train.cycles", "override 'train.cycles' is not of the form section.key=value"),
        ("=4", "override '=4' is not of the form section.key=value"),
        (
            "train..cycles=4",
            "override key 'train..cycles' must be dotted identifiers, e.g. loss.top_k",
        ),
        (
            "train.cycles-x=4",
            "override key 'train.cycles-x' must be dotted identifiers, e.g. loss.top_k",
        ),
    ],
)
def test_bad_override_syntax(item: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_override(item)
    assert str(info.value) == message


def test_override_into_a_scalar_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig().with_overrides(["train.cycles.x=1"])
    assert str(info.value) == "override 'train.cycles.x=1': train.cycles is not a section"


def test_apply_overrides_deep_copies() -> None:
    data = {"train": {"cycles": 2}}
    out = apply_overrides(data, ["train.cycles=3", "loss.top_k=4"])
    assert out == {"train": {"cycles": 3}, "loss": {"top_k": 4}}
    assert data == {"train": {"cycles": 2}}


def test_load_yaml_mapping_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_yaml_mapping(missing)
    assert str(info.value) == f"recipe not found: {missing}"
    assert "recipes/" in info.value.hint
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{bad} is not valid YAML: "):
        load_yaml_mapping(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=rf"^{listing}: a recipe must be a mapping of sections, got list$"
    ):
        load_yaml_mapping(listing)
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert load_yaml_mapping(empty) == {}
    python_tag = tmp_path / "tag.yaml"
    python_tag.write_text("run: !!python/object/apply:os.system ['true']\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_yaml_mapping(python_tag)  # safe_load: no object construction


def test_config_error_hint() -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping({"bogus": 1})
    assert (
        info.value.hint
        == "run 'miniverl validate <recipe.yaml>' to see every problem with its key path"
    )


def test_validate_assignment() -> None:
    cfg = RunConfig()
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        cfg.train.cycles = -1


def _static_prefixes() -> list[str]:
    """The literal text before the first placeholder of every message ``_combination_problems`` yields."""
    import ast
    import inspect

    from miniverl.config import models
    from miniverl.lab import config as lab_config

    tree = ast.parse(inspect.getsource(models._combination_problems))
    tree.body += ast.parse(inspect.getsource(lab_config.lab_problems)).body
    prefixes = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Yield):
            continue
        value = node.value
        parts = value.elts if isinstance(value, ast.Tuple) else [value]
        first = parts[0]
        if isinstance(first, ast.JoinedStr):
            first = first.values[0]
        assert isinstance(first, ast.Constant) and isinstance(first.value, str), ast.dump(node)
        prefixes.append(first.value)
    return prefixes


def test_every_combination_rule_has_a_test() -> None:
    """A new rule in _combination_problems must come with a case in COMBINATIONS."""
    tested = [message for _, message in COMBINATIONS.values()] + [
        "loss.chunk_size must be >= 1 or 'auto'"
    ]
    prefixes = _static_prefixes()
    assert len(prefixes) >= 26
    untested = [p for p in prefixes if not any(m.startswith(p) for m in tested)]
    assert untested == []
