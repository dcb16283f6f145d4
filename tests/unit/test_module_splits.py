"""The issue-10 file splits moved code without moving its public import paths.

``config/models.py`` became sections / recipe / loading / limits, ``evaluation/verl_export.py``
lost its key ledger to ``verl_ledger.py``, ``models/hf.py`` its shared backbone to
``hf_shared.py``, ``agent/loop.py`` its episode state machine to ``episode.py``,
``models/toy.py`` its shapes to ``toy_config.py`` and the trainer its cold start to
``training/cold_start.py``, ``evaluation/benchmark.py`` its arms, statistics and printing to
``arms.py``, ``benchmark_stats.py`` and ``benchmark_print.py``; each old path still hands out the very same objects, and
``training/trainer.py`` still hands out ``GroupResult`` (now in ``training/gradients.py``).
``LossConfig.divergence_kwargs`` is the one
unpacking of the loss section into a ``DivergenceSpec``.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from miniverl.config.models import RunConfig

MOVED = {
    "miniverl.config.models": {
        "miniverl.config.sections": ["ENVIRONMENT_REF_PATTERN", "LossConfig", "TrainConfig"],
        "miniverl.config.recipe": ["RunConfig", "TOY_PRESET_IDS"],
        "miniverl.config.loading": ["apply_overrides", "load_yaml_mapping", "parse_override"],
        "miniverl.config.limits": ["BOUND_HINT", "MAX_TASKS", "path_component_problem"],
    },
    "miniverl.evaluation.verl_export": {
        "miniverl.evaluation.verl_ledger": ["KeyFate", "MAPPED", "DROPPED", "_rules"],
    },
    "miniverl.agent.loop": {"miniverl.agent.episode": ["EpisodeRequest"]},
    "miniverl.models.toy": {
        "miniverl.models.toy_config": ["TOY_PRESETS", "TOY_STUDENT", "ToyModelConfig", "toy_preset"]
    },
    "miniverl.training.trainer": {
        "miniverl.training.cold_start": ["COLD_START_MARKER", "COLD_START_STUDENT"],
        "miniverl.training.gradients": ["GroupResult"],
    },
    "miniverl.evaluation.benchmark": {
        "miniverl.evaluation.arms": [
            "ARM_DESCRIPTIONS",
            "BASELINE_ARM",
            "DEFAULT_ARMS",
            "FIXED_KEYS",
            "arm_config",
            "arm_config_for_arm_seed",
            "check_arm_overrides",
            "cold_start_config",
            "fixed_view",
            "resolve_arms",
            "verify_held_fixed",
        ],
        "miniverl.evaluation.benchmark_stats": [
            "BOOTSTRAP_RESAMPLES",
            "BOOTSTRAP_SEED",
            "aggregate",
            "bootstrap_interval",
            "describe",
            "quantile",
            "significance_note",
        ],
        "miniverl.evaluation.benchmark_print": ["print_benchmark", "print_contrasts"],
    },
    "miniverl.training.sources": {
        "miniverl.training.teacher_sources": [
            "MixedPrefixSource",
            "TeacherSampleSource",
            "oom_splitter",
        ],
    },
}


@pytest.mark.parametrize("old", list(MOVED))
def test_old_import_paths_hand_out_the_moved_objects(old: str) -> None:
    old_module = importlib.import_module(old)
    for new, names in MOVED[old].items():
        new_module = importlib.import_module(new)
        for name in names:
            assert getattr(old_module, name) is getattr(new_module, name), f"{old}.{name}"


def test_benchmark_reexports_every_name_it_lists() -> None:
    benchmark = importlib.import_module("miniverl.evaluation.benchmark")
    assert all(hasattr(benchmark, name) for name in benchmark.__all__)


def test_config_models_reexports_every_name_it_lists() -> None:
    models = importlib.import_module("miniverl.config.models")
    assert all(hasattr(models, name) for name in models.__all__)
    assert "models.py" not in models.BOUND_HINT and "limits.py" in models.BOUND_HINT


def test_hf_reexports_the_shared_backbone() -> None:
    pytest.importorskip("torch")
    hf = importlib.import_module("miniverl.models.hf")
    shared = importlib.import_module("miniverl.models.hf_shared")
    assert hf.HFRoleView is shared.HFRoleView
    assert hf.build_shared_backbone is shared.build_shared_backbone


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd", "entropy_aware"])
def test_divergence_kwargs_build_the_spec_the_trainer_builds(divergence: str) -> None:
    pytest.importorskip("torch")
    from miniverl.losses.numerics import DivergenceSpec

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


def test_the_trainer_reexports_load_resolved_config_from_config_loading() -> None:
    pytest.importorskip("torch")
    loading = importlib.import_module("miniverl.config.loading")
    trainer = importlib.import_module("miniverl.training.trainer")
    assert trainer.load_resolved_config is loading.load_resolved_config
