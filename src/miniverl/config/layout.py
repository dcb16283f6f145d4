"""Where recipe keys live, where a recipe may still spell them, and what the digest hashes.

A recipe has two layers (docs/configuration.md): the core sections every run reads, and one
``lab:`` section that only the lab's studies read (``miniverl.lab.config.LabConfig``). Two
facts about keys follow from that, and both are tables here:

- :data:`LAB_LOCATIONS`: a lab key may also be written at its place among the core sections
  (``models.toy_fit``, ``eval.teacher_gate_threshold``, ...), the layout the stored
  studies' recipes, overrides and config files use. :func:`relocate` moves such keys into
  ``lab:`` before validation, so every recipe and stored config file loads.
- :data:`CONSTANTS`: settings that are constants of the code, not keys. A recipe may still
  name one at its constant value (stored config files do); any other value is refused with
  what to do instead.

``RunConfig.digest()`` hashes :func:`canonical_layout`: the core sections with every lab key
at its place among them (each lab record completed with the lab's defaults,
:data:`LAB_RECORDS`) and every constant at its place. The digest of a recipe is therefore the same
whichever layout it was written in, and it names the stored studies' cells by the digests
they recorded. Torch-free, and free of the lab: these are key paths and values only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Path = tuple[str, ...]

LAB_LOCATIONS: dict[Path, Path] = {
    ("models", "toy_fit"): ("toy_fit",),
    ("models", "teacher_fit"): ("teacher_fit",),
    ("models", "teacher", "lora"): ("teacher_fit", "lora"),
    ("models", "oracle_teacher"): ("oracle_teacher",),
    ("train", "sft_warmup_until"): ("warmup_until",),
    ("eval", "teacher_gate_threshold"): ("teacher_gate", "threshold"),
    ("eval", "teacher_gate_tasks"): ("teacher_gate", "tasks"),
    ("eval", "teacher_gate_on_path"): ("teacher_gate", "on_path"),
    ("eval", "teacher_gate_off_path"): ("teacher_gate", "off_path"),
    ("eval", "teacher_gate_recovery"): ("teacher_gate", "recovery"),
    ("eval", "teacher_gate_required"): ("teacher_gate", "required"),
    ("eval", "teacher_gate_privileged"): ("teacher_gate", "privileged"),
    ("eval", "fixed_state_recovery"): ("fixed_state_recovery",),
}
"""Place among the core sections -> place under ``lab:`` (the lab's keys)."""

_ADAPTER = {"enabled": True, "r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": None}
_DAGGER = {"enabled": False, "rollouts_per_task": 1, "temperatures": [1.0], "tasks": None}

LAB_RECORDS: dict[Path, dict[str, Any]] = {
    ("toy_fit",): {
        "max_steps": 1500,
        "lr": 0.002,
        "batch_size": 8,
        "check_every": 100,
        "target_success": 1.0,
        "extra_tasks": 0,
        "noise_fraction": 0.0,
        "noise_kinds": {
            "operand_digit": 0.5,
            "malformed_json": 0.25,
            "bad_expression": 0.25,
            "random_operands": 0.0,
        },
        "noise_max_follow": 0,
        "probe_tasks": 16,
        "reuse": True,
        "dagger": _DAGGER,
        "init_from": None,
    },
    ("toy_fit", "dagger"): _DAGGER,
    ("teacher_fit",): {
        "enabled": False,
        "steps": 60,
        "lr": 0.001,
        "batch_size": 4,
        "extra_tasks": 32,
        "corrective_fraction": 0.25,
        "probe_tasks": 8,
        "cache_dir": "models/teacher-adapters",
        "dagger": _DAGGER,
        "lora": _ADAPTER,
        "init_from": None,
    },
    ("teacher_fit", "dagger"): _DAGGER,
    ("teacher_fit", "lora"): _ADAPTER,
    ("oracle_teacher",): {"smoothing": 0.001, "off_path": "context"},
    ("teacher_gate",): {
        "threshold": 0.95,
        "tasks": 64,
        "on_path": None,
        "off_path": None,
        "recovery": None,
        "required": True,
        "privileged": "any_new_number",
    },
    ("warmup_until",): {
        "metric": "success",
        "k": None,
        "threshold": 0.8,
        "max_cycles": 20,
        "check_every": 1,
    },
}
"""Every record of the ``lab:`` section, with the lab's default of each field: a record a
recipe writes in part is completed from here before it is hashed, so a plain ``RunConfig``
and the lab's ``LabRunConfig`` of one recipe have one digest. ``tests/unit/test_lab_config.py``
derives this table from ``miniverl.lab.config.LabConfig`` and requires it to agree."""

LAB_OMITTED: dict[Path, frozenset[str]] = {
    ("toy_fit",): frozenset({"dagger", "init_from"}),
    ("teacher_fit",): frozenset({"dagger", "init_from"}),
    ("oracle_teacher",): frozenset({"off_path"}),
    ("teacher_gate",): frozenset({"on_path", "off_path", "recovery", "required", "privileged"}),
}
"""Fields a lab record leaves out of its dump while at their default (``Section.omitted_at_default``)."""

LAB_SCALARS: dict[Path, Any] = {("fixed_state_recovery",): False}
"""Lab keys that are plain values, not records, with their defaults: at its default one is
left out of the digest (the lab's dump omits it), so adding one changes no stored digest."""

LAB_OPTIONAL = frozenset({("oracle_teacher",), ("warmup_until",)})
"""Lab records that are absent (``None``) unless a recipe writes them."""

LAB_FLOATS = frozenset(
    {("teacher_gate", "on_path"), ("teacher_gate", "off_path"), ("teacher_gate", "recovery")}
)
"""Float fields of the lab records whose default is ``None`` (the others are floats by their
default): a recipe's ``1`` there is hashed as the lab validates it, ``1.0``."""

CONSTANTS: dict[Path, Any] = {
    ("run", "output_dir"): None,
    ("run", "deterministic"): True,
    ("models", "student", "toy"): None,
    ("models", "student", "checkpoint"): None,
    ("models", "teacher", "tokenizer_id"): None,
    ("models", "teacher", "toy"): None,
    ("loss", "exact_max_vocab"): 8192,
    ("loss", "allow_large_exact"): False,
    ("cache", "max_entries_per_shard"): 256,
    ("cache", "journal"): True,
    ("memory", "oom_retries"): 3,
    ("memory", "min_chunk_size"): 16,
    ("memory", "auto_swap_vram_headroom_gb"): 2.0,
    ("logging", "wandb_project"): "miniverl",
    ("rollout", "top_p"): 1.0,
}
"""Settings that are constants of the code, at the place a recipe could once set them."""

OMITTED_CONSTANTS = frozenset({("models", "student", "checkpoint")})
"""Constants the canonical layout leaves out at their value (its place holds a value only
when one is set, and this one may not be)."""

CONSTANT_HINTS: dict[Path, str] = {
    ("run", "output_dir"): "pass --output DIR to the command (default runs/<run.name>)",
    ("run", "deterministic"): "torch's deterministic algorithms are always requested",
    ("models", "student", "toy"): "name a toy shape preset in models.student.model_id "
    "(toy-student, toy-teacher; models/toy_config.py)",
    ("models", "student", "checkpoint"): "start a student from trained weights with "
    "--cold-start (or --resume)",
    ("models", "teacher", "tokenizer_id"): "the teacher's tokenizer is read from "
    "models.teacher.model_id and must behave like the student's",
    ("models", "teacher", "toy"): "a toy teacher's shape is the preset named by "
    "models.teacher.model_id, or its checkpoint's (models.teacher.checkpoint)",
    ("loss", "exact_max_vocab"): "exact_full_vocab with a swapped teacher is allowed up to "
    "V = 8192 (teachers/local.py); use loss.mode: bucketed above it",
    ("loss", "allow_large_exact"): "use loss.mode: bucketed, or keep the teacher resident",
    ("cache", "max_entries_per_shard"): "shards hold 256 entries",
    ("cache", "journal"): "the cache always commits through its journal",
    ("memory", "oom_retries"): "an out-of-memory retry halves the chunk 3 times at most",
    ("memory", "min_chunk_size"): "the smallest chunk is 16 rows",
    ("memory", "auto_swap_vram_headroom_gb"): "memory.strategy: auto keeps 2 GiB free",
    ("logging", "wandb_project"): "the wandb project is 'miniverl'",
    ("rollout", "top_p"): "rollouts sample from the student's whole distribution, the one the "
    "loss trains (a nucleus would make them off-policy); use rollout.temperature",
}


def _get(data: Mapping[str, Any], path: Path) -> tuple[bool, Any]:
    node: Any = data
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _pop(data: dict[str, Any], path: Path) -> tuple[bool, Any]:
    node: Any = data
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    if not isinstance(node, dict) or path[-1] not in node:
        return False, None
    return True, node.pop(path[-1])


def _put(data: dict[str, Any], path: Path, value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def _merge(base: Any, update: Any) -> Any:
    """``update`` over ``base``, mapping by mapping (a non-mapping replaces)."""
    if isinstance(base, dict) and isinstance(update, Mapping):
        out = dict(base)
        for key, value in update.items():
            out[key] = _merge(base.get(key), value)
        return out
    return copy.deepcopy(update)


def move_lab_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every lab key written at its core place moved under ``lab:``.

    It is merged over the same key under ``lab:``: overrides apply to the moved layout
    (``config.models.apply_overrides``), so an override spelled at the core place wins.
    """
    out = copy.deepcopy(dict(data))
    lab = out.get("lab")
    moved: dict[str, Any] = copy.deepcopy(dict(lab)) if isinstance(lab, Mapping) else {}
    touched = False
    for core_path, lab_path in LAB_LOCATIONS.items():
        found, value = _pop(out, core_path)
        if found:
            touched = True
            had, current = _get(moved, lab_path)
            _put(moved, lab_path, _merge(current, value) if had else value)
    if touched or "lab" in out:
        out["lab"] = moved if (touched or isinstance(lab, Mapping)) else lab
    return out


def relocate(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` with lab keys moved under ``lab:`` (:func:`move_lab_keys`) and constants taken
    out; the problems found. A constant at its value is dropped; at another value it stays out
    too and is reported with its hint, one line each, in the format of every other
    validation problem.
    """
    out = move_lab_keys(data)
    problems: list[str] = []
    for path, constant in CONSTANTS.items():
        found, value = _pop(out, path)
        if found and value != constant:
            problems.append(
                f"  - {'.'.join(path)}: not a setting (it is always {constant!r}); "
                f"{CONSTANT_HINTS[path]}"
            )
    return out, problems


def complete_lab_record(path: Path, value: Any) -> Any:
    """``value`` (the lab record at ``path``, or ``None``) with every field it leaves out at the
    lab's default and every field of :data:`LAB_OMITTED` at its default left out, as the lab's
    own dump writes it."""
    defaults = LAB_RECORDS.get(path)
    if defaults is None or not isinstance(value, Mapping):
        return copy.deepcopy(value)
    out = {key: copy.deepcopy(item) for key, item in value.items() if key not in defaults}
    for key, default in defaults.items():
        item = complete_lab_record((*path, key), value.get(key, default))
        item = _as_float(item) if (*path, key) in LAB_FLOATS else _typed_like(default, item)
        if not (key in LAB_OMITTED.get(path, ()) and item == default):
            out[key] = item
    return out


def _as_float(value: Any) -> Any:
    """An int (not a bool) as the float the lab's validation makes of it."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _typed_like(default: Any, value: Any) -> Any:
    """``value`` with the ints a float field (or a list or mapping of floats) holds as floats,
    judged by the field's ``default``."""
    if isinstance(default, float):
        return _as_float(value)
    items = default.values() if isinstance(default, dict) else default
    of_floats = isinstance(default, (list, dict)) and bool(default)
    of_floats = of_floats and all(isinstance(v, float) for v in items)
    if of_floats and isinstance(default, list) and isinstance(value, list):
        return [_as_float(v) for v in value]
    if of_floats and isinstance(default, dict) and isinstance(value, dict):
        return {k: _as_float(v) for k, v in value.items()}
    return value


_NO_DEFAULT = object()


def canonical_layout(dump: Mapping[str, Any]) -> dict[str, Any]:
    """What ``RunConfig.digest()`` hashes: ``dump`` (a ``RunConfig.to_dict()``) with the
    ``lab:`` section's keys at their core places (:data:`LAB_LOCATIONS`, records completed by
    :func:`complete_lab_record`) and every constant at its place (:data:`CONSTANTS`)."""
    out = copy.deepcopy({k: v for k, v in dump.items() if k != "lab"})
    given = dump.get("lab") or {}
    lab = {
        key: copy.deepcopy(value)
        for key, value in given.items()
        if LAB_SCALARS.get((key,), _NO_DEFAULT) != value
    }
    for path in LAB_RECORDS:
        if len(path) == 1:
            value = given.get(path[0], None if path in LAB_OPTIONAL else {})
            lab[path[0]] = complete_lab_record(path, value)
    # the teacher adapter's shape sits inside teacher_fit under lab:, beside it at core places
    for core_path, lab_path in sorted(LAB_LOCATIONS.items(), key=lambda kv: len(kv[1])):
        found, value = _get(lab, lab_path)
        if found:
            if lab_path == ("teacher_fit",) and isinstance(value, Mapping):
                value = {k: v for k, v in value.items() if k != "lora"}
            _put(out, core_path, copy.deepcopy(value))
    for path, constant in CONSTANTS.items():
        if path not in OMITTED_CONSTANTS:
            _put(out, path, constant)
    return out


__all__ = [
    "CONSTANTS",
    "CONSTANT_HINTS",
    "LAB_FLOATS",
    "LAB_LOCATIONS",
    "LAB_OMITTED",
    "LAB_OPTIONAL",
    "LAB_RECORDS",
    "LAB_SCALARS",
    "canonical_layout",
    "complete_lab_record",
    "move_lab_keys",
    "relocate",
]
