"""The recipe's two layers: the core sections and the lab's ``lab:`` section (lab/config.py),
where a recipe may still write lab keys and constants (config/layout.py), and the digest."""

from __future__ import annotations

import copy
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from helpers import REPO_ROOT
from miniverl.config import layout
from miniverl.config.models import RunConfig
from miniverl.errors import ConfigError
from miniverl.lab.config import LabConfig, LabRunConfig, lab_of, load_recipe, with_lab

RECIPES = sorted((REPO_ROOT / "recipes").glob("*.yaml"))
STORED_DIGESTS = {
    "toy_calc_chain_oracle.yaml": "46e475505afe1aa95a2c7584b5da74d4c95a2a4067081ebacf26466477ac41fc",
    "smollm2_calc_chain.yaml": "6a545d6d53eb223e875cffdcfcb447c71ee8beaa90ed772e5b15e92ce69b0078",
    "toy_calculator.yaml": "3c4b131461287c748e813f416a7b24cee9bd931a08f9995e1bcb6b635c020ce6",
    "qwen_consumer_gpu_calc_raw_teacher.yaml": (
        "006067b15fc181bb574d73d84b9a2a35440e114d14be48b282881d84adf2141f"
    ),
}
"""Digests recorded for these recipes by the stored studies and runs (plan.json, cells); the
demo's is its recipe's since held-out success is measured every 100 cycles (its runs' manifests
record it)."""
MAX_CORE_LEAVES = 90


def _leaves(model: type[pydantic.BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation) or (field.annotation,)
        sub = [a for a in args if isinstance(a, type) and issubclass(a, pydantic.BaseModel)]
        out += _leaves(sub[0], f"{prefix}{name}.") if sub else [f"{prefix}{name}"]
    return out


def test_the_core_run_config_has_at_most_ninety_leaf_keys() -> None:
    leaves = _leaves(RunConfig)
    assert len(leaves) <= MAX_CORE_LEAVES, len(leaves)
    assert "lab" in leaves, "the lab's section is one opaque leaf of the core"
    assert not any(leaf.startswith("lab.") for leaf in leaves)
    assert len(_leaves(LabRunConfig)) > len(leaves), "the lab validates its own keys"


def test_the_leaf_count_sees_a_nested_section() -> None:
    class Inner(pydantic.BaseModel):
        a: int = 1
        b: int = 2

    class Outer(pydantic.BaseModel):
        inner: Inner | None = None
        c: dict[str, int] = {}

    assert _leaves(Outer) == ["inner.a", "inner.b", "c"]


@pytest.mark.parametrize("name", list(STORED_DIGESTS))
def test_a_stored_recipe_keeps_its_digest(name: str) -> None:
    assert load_recipe(REPO_ROOT / "recipes" / name).digest() == STORED_DIGESTS[name]


def _rewritten(data: dict) -> dict:  # type: ignore[type-arg]
    """``data`` with every lab key moved by hand to its place under ``lab:``."""
    out = copy.deepcopy(data)
    lab: dict = {}  # type: ignore[type-arg]
    for core, place in layout.LAB_LOCATIONS.items():
        node = out
        for part in core[:-1]:
            node = node.get(part) or {}
        if core[-1] in node:
            target = lab
            for part in place[:-1]:
                target = target.setdefault(part, {})
            target[place[-1]] = node.pop(core[-1])
    if lab:
        out["lab"] = lab
    return out


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_either_layout_of_a_recipe_has_one_digest_and_one_config(
    recipe: Path, tmp_path: Path
) -> None:
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    moved = tmp_path / recipe.name
    moved.write_text(yaml.safe_dump(_rewritten(data)), encoding="utf-8")
    a, b = load_recipe(recipe), load_recipe(moved)
    assert a.digest() == b.digest() and a.to_dict() == b.to_dict()


def test_a_lab_override_wins_whichever_place_it_names() -> None:
    recipe = REPO_ROOT / "recipes" / "toy_calculator.yaml"
    at_core = load_recipe(recipe, ["models.toy_fit.max_steps=7"])
    at_lab = load_recipe(recipe, ["lab.toy_fit.max_steps=7"])
    assert lab_of(at_core).toy_fit.max_steps == lab_of(at_lab).toy_fit.max_steps == 7
    assert at_core.digest() == at_lab.digest() != load_recipe(recipe).digest()
    again = at_core.with_overrides(["models.toy_fit.max_steps=9"])
    assert isinstance(again, LabRunConfig) and again.lab.toy_fit.max_steps == 9


def _records(model: type[pydantic.BaseModel], path: tuple[str, ...] = ()) -> dict[tuple, Any]:
    """Every record below ``model``: path -> (field defaults, omitted-at-default, optional)."""
    out: dict[tuple, Any] = {}
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation) or (field.annotation,)
        sub = [a for a in args if isinstance(a, type) and issubclass(a, pydantic.BaseModel)]
        if not sub:
            continue
        defaults = {
            k: pydantic.TypeAdapter(f.annotation).dump_python(
                f.get_default(call_default_factory=True), mode="json"
            )
            for k, f in sub[0].model_fields.items()
        }
        optional = field.get_default(call_default_factory=True) is None
        out[(*path, name)] = (defaults, frozenset(sub[0].omitted_at_default), optional)
        out.update(_records(sub[0], (*path, name)))
    return out


def test_the_lab_record_tables_are_derived_from_the_lab_config() -> None:
    """The digest's layout completes lab records from LAB_RECORDS: a lab default changed
    without it would change no digest, a field added without it would hash apart."""
    records = _records(LabConfig)
    assert {p: d for p, (d, _, _) in records.items()} == layout.LAB_RECORDS
    assert {p: o for p, (_, o, _) in records.items() if o} == layout.LAB_OMITTED
    assert {p for p, (_, _, opt) in records.items() if opt} == layout.LAB_OPTIONAL
    floats = {
        (*path, name)
        for path in records
        for name, field in _record_model(path).model_fields.items()
        if field.get_default(call_default_factory=True) is None
        and float in typing.get_args(field.annotation)
    }
    assert floats == layout.LAB_FLOATS
    scalars = {
        (name,): field.get_default()
        for name, field in LabConfig.model_fields.items()
        if (name,) not in records
    }
    assert scalars == layout.LAB_SCALARS
    assert {name for (name,) in scalars} <= set(LabConfig.omitted_at_default)
    assert set(scalars) <= set(layout.LAB_LOCATIONS.values())
    assert RunConfig().digest() == with_lab(RunConfig()).digest()


def _record_model(path: tuple[str, ...]) -> type[pydantic.BaseModel]:
    model: type[pydantic.BaseModel] = LabConfig
    for name in path:
        args = typing.get_args(model.model_fields[name].annotation)
        args = args or (model.model_fields[name].annotation,)
        model = next(a for a in args if isinstance(a, type) and issubclass(a, pydantic.BaseModel))
    return model


@pytest.mark.parametrize(
    "lab",
    [
        {"toy_fit": {"max_steps": 20}},
        {"toy_fit": {"dagger": {"enabled": True}}, "teacher_fit": {"lora": {"r": 4}}},
        {"toy_fit": {"dagger": {"enabled": False}}},
        {"oracle_teacher": {}},
        {"oracle_teacher": {"off_path": "turn_only"}},
        {"teacher_gate": {"required": True, "on_path": 0.5}},
        {"warmup_until": {"threshold": 0.5}},
        {"teacher_fit": {"steps": 3, "dagger": {"tasks": 3}}},
        {"teacher_fit": {"lr": 1, "lora": {"alpha": 64}}, "teacher_gate": {"on_path": 1}},
        {"toy_fit": {"noise_kinds": {"operand_digit": 1}, "dagger": {"temperatures": [1, 2]}}},
        {"toy_fit": {"lr": 1, "target_success": 1}, "warmup_until": {"threshold": 1}},
        {"fixed_state_recovery": False},
        {"fixed_state_recovery": True, "teacher_gate": {"tasks": 3}},
    ],
)
def test_a_partial_lab_section_hashes_as_the_lab_validates_it(lab: dict[str, Any]) -> None:
    """The core, which cannot validate ``lab:``, and the lab give one recipe one digest."""
    data = {"models": {"backend": "toy"}, "train": {"sft_warmup_cycles": 0}, "lab": lab}
    core = RunConfig.from_mapping(copy.deepcopy(data))
    assert core.digest() == LabRunConfig.from_mapping(copy.deepcopy(data)).digest()
    assert core.digest() == with_lab(core).digest()


def test_a_constant_at_its_value_loads_and_at_another_is_refused_with_its_hint() -> None:
    ok = RunConfig.from_mapping({"memory": {"oom_retries": 3, "min_chunk_size": 16}})
    assert ok.memory.strategy == "auto"
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(
            {"memory": {"oom_retries": 0}, "loss": {"allow_large_exact": True}, "train": {"lr": -1}}
        )
    text = str(info.value)
    assert "3 configuration error(s)" in text
    assert "memory.oom_retries: not a setting (it is always 3)" in text
    assert "loss.allow_large_exact: not a setting" in text and "train.lr" in text


def test_lab_and_core_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        LabRunConfig.from_mapping(
            {
                "models": {"backend": "hf", "oracle_teacher": {"smoothing": 2.0}},
                "lab": {"toy_fit": {"max_steps": -1}},
                "train": {"cycles": -1},
            }
        )
    text = str(info.value)
    for key in ("lab.oracle_teacher.smoothing", "lab.toy_fit.max_steps", "train.cycles"):
        assert key in text, key
    with pytest.raises(ConfigError, match=r"lab\.oracle_teacher needs models\.backend: toy"):
        LabRunConfig.from_mapping({"models": {"backend": "hf"}, "lab": {"oracle_teacher": {}}})


def test_the_core_keeps_the_lab_section_as_written_and_the_lab_completes_it() -> None:
    raw = {"lab": {"toy_fit": {"max_steps": 7}}}
    core = RunConfig.from_mapping(raw)
    assert core.lab == {"toy_fit": {"max_steps": 7}}
    lab = with_lab(core)
    assert lab.to_dict()["lab"]["toy_fit"]["batch_size"] == 8
    assert "oracle_teacher" not in lab.to_dict()["lab"], "a part at its default is left out"
    assert with_lab(RunConfig()).to_dict()["lab"] == {}
