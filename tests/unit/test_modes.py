"""The mode registry (``config/modes.py``) is the one place a mode is listed.

Every other fact about the modes is derived from its rows and checked here against them: the
values ``run.mode`` accepts, the objective label, the on-policy rules, the sample source a
cycle draws from, the benchmark's default arms and the CLI's help. And no other module of
``src/`` spells a mode's name: a code string (docstrings are prose and may) that is exactly a
mode's name, or an override ``run.mode=<name>``, fails the scan.
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from helpers import SRC_DIR, tiny_config
from miniverl.config.models import RunConfig
from miniverl.config.modes import (
    MODES,
    REPLAY_OBJECTIVE,
    WARMUP_MODE,
    Mode,
    arm_role,
    default_arms,
    mode_help,
)
from miniverl.config.sections import RunSection
from miniverl.errors import ConfigError

PACKAGE = SRC_DIR / "miniverl"
REGISTRY = PACKAGE / "config" / "modes.py"
ARM_NAMING_MODULES = {PACKAGE / "lab" / "benchmark" / "contrasts.py"}
"""Modules that name *arms* of a pre-registered protocol (``PRIMARY_CONTRASTS``): the default
arm of a mode carries the mode's name, and a protocol's contrasts are fixed by arm name."""


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of ``path`` except docstrings (f-string pieces included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def _spelled_modes(strings: list[tuple[int, str]], where: str) -> list[str]:
    names = set(MODES)
    override = re.compile(r"run\.mode\s*[=:]\s*(\w+)")
    hits = []
    for line, text in strings:
        if text in names or any(m in names for m in override.findall(text)):
            hits.append(f"{where}:{line}: {text!r}")
    return hits


def test_no_module_but_the_registry_spells_a_mode() -> None:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == REGISTRY or path in ARM_NAMING_MODULES:
            continue
        hits += _spelled_modes(_code_strings(path), str(path.relative_to(SRC_DIR)))
    assert hits == [], "derive these from config/modes.py:\n" + "\n".join(hits)


def test_the_scan_sees_a_spelled_mode(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        '"""Prose may say opd."""\n'
        'x = mode == "opd"\n'
        'arms = ("run.mode=seqkd",)\n'
        'label = f"{x} gkd_mix_like"\n'
    )
    hits = _spelled_modes(_code_strings(source), "m.py")
    assert hits == ["m.py:2: 'opd'", "m.py:3: 'run.mode=seqkd'"]


def test_run_mode_accepts_exactly_the_registry() -> None:
    annotation = RunSection.model_fields["mode"].annotation
    assert typing.get_args(annotation) == tuple(MODES)
    assert RunSection.model_fields["mode"].description == mode_help()
    for name, mode in MODES.items():
        assert f"{name}: {mode.description}" in mode_help()
    with pytest.raises(ConfigError, match=r"run\.mode"):
        RunConfig.from_mapping({"run": {"mode": "not_a_mode"}})


def _valid(mode: Mode) -> RunConfig:
    overrides = [f"run.mode={mode.name}"]
    if mode.trajectories == "mixed":
        overrides.append("train.gradient_accumulation_steps=auto")
    return tiny_config(*overrides)


@pytest.mark.parametrize("name", list(MODES))
def test_every_fact_of_a_mode_comes_from_its_row(name: str) -> None:
    mode = MODES[name]
    config = _valid(mode)
    assert config.mode() is mode
    assert config.objective_label() == mode.objective
    assert mode.uses_teacher == (mode.samples or mode.teacher_targets)
    if mode.on_policy:
        with pytest.raises(ConfigError, match="strict_policy_version"):
            config.with_overrides(["cache.strict_policy_version=false"])
    else:
        config.with_overrides(["cache.strict_policy_version=false"])


def test_replay_is_labelled_as_replay() -> None:
    student = next(m for m in MODES.values() if m.trajectories == "student")
    config = tiny_config(
        f"run.mode={student.name}", "train.opd_freshness=replay", "train.replay_passes=2"
    )
    assert config.objective_label() == REPLAY_OBJECTIVE


def test_every_trajectory_kind_has_a_sample_source() -> None:
    import inspect

    from miniverl.training import sources

    body = inspect.getsource(sources.build_source)
    for kind in {m.trajectories for m in MODES.values()} - {"mixed"}:
        assert f'"{kind}"' in body, kind
    assert WARMUP_MODE.oracle_sft and not WARMUP_MODE.uses_teacher


def test_the_default_arms_and_the_help_derive_from_the_registry() -> None:
    from miniverl.cli.lab_cmd import ARMS_HELP
    from miniverl.cli.main import MODE_LIST
    from miniverl.lab.benchmark.arms import ARM_DESCRIPTIONS, DEFAULT_ARMS

    rows = [(arm, mode) for mode in MODES.values() for arm in mode.arms]
    assert list(DEFAULT_ARMS) == [arm.name for arm, _ in rows] == list(default_arms())
    for arm, mode in rows:
        assert DEFAULT_ARMS[arm.name][0] == f"run.mode={mode.name}"
        assert ARM_DESCRIPTIONS[arm.name] == arm.description
        assert arm.name in ARMS_HELP
    assert all(name in MODE_LIST for name in MODES)
    assert {arm_role("reference_ceiling"), arm_role("compute_reference")} <= set(DEFAULT_ARMS)
