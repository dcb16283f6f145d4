"""``RunConfig``: one validated recipe, how it is read, and the rules that relate its sections.

Config is validated data, not behaviour (docs/design.md §2.1). Every section
(``config/sections.py``) forbids unknown keys and has a description per field;
:meth:`RunConfig._validate_combination` rejects contradictory recipes before anything is
downloaded or allocated, listing every problem at once. ``auto`` values stay ``auto`` here;
the training layer resolves them and writes the decision to ``config.resolved.yaml``, which
``config/loading.py`` reads back.

The recipe's ``lab:`` section is one opaque mapping here: only the lab's studies read it,
and ``miniverl.lab.config.LabRunConfig`` (a ``RunConfig`` whose ``lab`` is validated) checks
it together with the core sections. Where a recipe may still write a lab key or a constant
among the core sections, and what :meth:`RunConfig.digest` hashes, is ``config/layout.py``.

Reading a recipe happens before and around validation, on plain mappings: safe YAML
(:func:`load_yaml_mapping`), dotted ``key=value`` overrides (:func:`apply_overrides`) and
one line per validation problem (:func:`format_validation_error`). They live here because
:meth:`RunConfig.from_yaml`, :meth:`~RunConfig.from_mapping` and
:meth:`~RunConfig.with_overrides` are built on them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from miniverl.config.layout import canonical_layout, move_lab_keys, relocate
from miniverl.config.limits import BOUND_HINT, MIN_CHUNK_SIZE
from miniverl.config.modes import MODES, REPLAY_OBJECTIVE, Mode
from miniverl.config.sections import (
    CacheConfig,
    CheckpointConfig,
    EnvironmentConfig,
    EvalConfig,
    LoggingConfig,
    LossConfig,
    MemoryConfig,
    ModelsConfig,
    RolloutConfig,
    RunSection,
    Section,
    SelectionConfig,
    TeacherConfig,
    TrainConfig,
)
from miniverl.errors import ConfigError
from miniverl.utils.hashing import sha256_text
from miniverl.utils.safe_load import load_yaml_file, loads_yaml

TOY_PRESET_IDS = ("toy-student", "toy-teacher")


class RunConfig(Section):
    """The whole recipe. Build it with :meth:`from_mapping` or :meth:`from_yaml`."""

    run: RunSection = Field(default_factory=RunSection, description="Identity, mode and seed.")
    models: ModelsConfig = Field(
        default_factory=ModelsConfig, description="Backends for student and teacher."
    )
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig, description="Tool environment and splits."
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Episode bounds and sampling."
    )
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig, description="Which positions are supervised."
    )
    teacher: TeacherConfig = Field(
        default_factory=TeacherConfig, description="Teacher context mode."
    )
    loss: LossConfig = Field(default_factory=LossConfig, description="Objective.")
    cache: CacheConfig = Field(default_factory=CacheConfig, description="Teacher-target cache.")
    memory: MemoryConfig = Field(
        default_factory=MemoryConfig, description="Device memory strategy."
    )
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimization.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Which checkpoints stay on disk."
    )
    logging: LoggingConfig = Field(
        default_factory=LoggingConfig, description="Live metric sinks besides metrics.jsonl."
    )
    lab: dict[str, Any] = Field(
        default_factory=dict,
        description="The lab's settings (teacher fitting, the oracle teacher, teacher gates, the warm-up criterion): validated by miniverl.lab.config.LabConfig, never read by a training run (docs/configuration.md, section `lab`).",
    )

    @model_validator(mode="after")
    def _validate_combination(self) -> RunConfig:
        """Reject contradictions of docs/design.md §2.1 and §4, each with its own message."""
        problems = list(self.combination_problems())
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def combination_problems(self) -> Iterable[str]:
        """Every rule relating several sections that this recipe breaks, one line each
        (a subclass that validates more sections adds its own)."""
        return _combination_problems(self)

    # -- construction -------------------------------------------------------------

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any] | None, *, source: str = "<mapping>"
    ) -> RunConfig:
        """Validate a plain mapping, raising :class:`ConfigError` listing every problem.

        Lab keys and constants written among the core sections are moved or checked first
        (:func:`~miniverl.config.layout.relocate`).
        """
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{source}: a recipe must be a mapping of sections, got {type(data).__name__}"
            )
        data, problems = relocate(data)
        try:
            config = cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source, problems)) from None
        if problems:
            raise ConfigError(_error_text(source, problems))
        return config

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Iterable[str] = ()) -> RunConfig:
        """Load a YAML recipe, apply ``key=value`` dotted overrides, validate."""
        data = load_yaml_mapping(path)
        data = apply_overrides(data, overrides)
        return cls.from_mapping(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """Canonical YAML: fixed section order, sorted keys inside sections."""
        return _yaml(self.to_dict())

    def canonical_yaml(self) -> str:
        """The YAML :meth:`digest` hashes: :func:`~miniverl.config.layout.canonical_layout`
        of the dump, in :meth:`to_yaml`'s format."""
        return _yaml(canonical_layout(self.to_dict()))

    def digest(self) -> str:
        """SHA-256 of :meth:`canonical_yaml`; identical configs have identical digests,
        whichever layout their recipe was written in."""
        return sha256_text(self.canonical_yaml())

    def with_overrides(self, overrides: Iterable[str]) -> RunConfig:
        """This config with dotted overrides applied (validated as this class)."""
        return type(self).from_mapping(
            apply_overrides(self.to_dict(), overrides), source="<overrides>"
        )

    # -- derived views ------------------------------------------------------------

    def mode(self) -> Mode:
        """The registry row of ``run.mode`` (``config/modes.py``)."""
        return MODES[self.run.mode]

    def objective_label(self) -> str:
        """What the run optimizes, stated honestly (replay is not genuine OPD)."""
        if self.train.opd_freshness == "replay" and self.train.replay_passes > 1:
            return REPLAY_OBJECTIVE
        return self.mode().objective


def _yaml(data: Mapping[str, Any]) -> str:
    """Fixed section order, sorted keys inside sections, one block per section."""
    return (
        "\n".join(
            yaml.safe_dump(
                {key: value}, sort_keys=True, default_flow_style=False, allow_unicode=True
            ).rstrip()
            for key, value in data.items()
        )
        + "\n"
    )


def _combination_problems(cfg: RunConfig) -> Iterable[str]:
    mode = cfg.mode()
    reuse = cfg.cache.reuse_across_policy_versions
    frozen = [m.name for m in MODES.values() if m.trajectories == "teacher_pool"]
    if mode.on_policy and reuse:
        yield f"run.mode: {mode.name} cannot set cache.reuse_across_policy_versions: true (on-policy targets must come from the current rollouts; only {', '.join(frozen)} may reuse a frozen cache)"
    elif reuse and mode.trajectories != "teacher_pool":
        yield f"cache.reuse_across_policy_versions is only meaningful in run.mode: {', '.join(frozen)}"
    if mode.on_policy and not cfg.cache.strict_policy_version:
        yield f"run.mode: {mode.name} requires cache.strict_policy_version: true (a target produced under another policy version is not on-policy)"
    if cfg.loss.divergence == "jsd" and cfg.loss.jsd_beta in (0.0, 1.0):
        which = "forward_kl" if cfg.loss.jsd_beta == 0.0 else "reverse_kl"
        yield f"loss.divergence: jsd needs 0 < loss.jsd_beta < 1, got {cfg.loss.jsd_beta}; use loss.divergence: {which} instead"
    if (
        cfg.loss.mode == "exact_full_vocab"
        and isinstance(cfg.loss.top_k, int)
        and cfg.loss.top_k != 1
    ):
        yield f"loss.mode: exact_full_vocab uses the full teacher distribution, so an explicit loss.top_k: {cfg.loss.top_k} contradicts it; remove loss.top_k or use loss.mode: bucketed"
    if cfg.loss.mode == "bucketed" and isinstance(cfg.loss.top_k, int) and cfg.loss.top_k < 1:
        yield "loss.mode: bucketed needs loss.top_k >= 1 or 'auto'"
    if cfg.loss.mode == "bucketed" and cfg.loss.top_k is None:
        yield "loss.mode: bucketed needs loss.top_k (an integer or 'auto')"
    if isinstance(cfg.loss.chunk_size, int) and cfg.loss.chunk_size < 1:
        yield "loss.chunk_size must be >= 1 or 'auto'"
    for key in ("top_k", "chunk_size"):
        value = getattr(cfg.loss, key)
        if isinstance(value, int) and value > 1 << 24:
            yield f"loss.{key} must be <= {1 << 24} ({BOUND_HINT})"
    if isinstance(cfg.loss.chunk_size, int) and cfg.loss.chunk_size < MIN_CHUNK_SIZE:
        yield f"loss.chunk_size {cfg.loss.chunk_size} is below the smallest chunk, {MIN_CHUNK_SIZE} rows"
    quantized = [
        role for role in ("student", "teacher") if getattr(cfg.models, role).quantization != "none"
    ]
    if cfg.models.backend == "toy" and quantized:
        yield f"models.backend: toy cannot be quantized (models.{quantized[0]}.quantization); quantization needs the hf backend on CUDA"
    if cfg.models.backend == "toy":
        for role in ("student", "teacher"):
            model_id = getattr(cfg.models, role).model_id
            if model_id not in TOY_PRESET_IDS:
                yield f"models.{role}.model_id {model_id!r} is not a toy preset ({', '.join(TOY_PRESET_IDS)})"
    if cfg.train.sft_noise_fraction > 0 and not mode.oracle_sft:
        sft = [m.name for m in MODES.values() if m.oracle_sft]
        yield f"train.sft_noise_fraction applies to run.mode: {', '.join(sft)} only (the SFT warm-up of {mode.name} never sees noise)"
    if cfg.models.rollout_dtype == "bfloat16" and (
        cfg.models.backend != "hf" or cfg.models.runtime != "dual_model"
    ):
        yield "models.rollout_dtype: bfloat16 needs models.backend: hf and models.runtime: dual_model (the toy decodes in float32; a shared backbone has one set of weights)"
    if cfg.memory.activation_checkpointing and cfg.models.backend != "hf":
        yield "memory.activation_checkpointing needs models.backend: hf (the toy keeps every activation; its forwards are small)"
    if cfg.memory.strategy == "swap" and quantized:
        yield (
            f"memory.strategy: swap is unavailable with a quantized model (models.{quantized[0]}.quantization): "
            "bitsandbytes 4-bit and 8-bit parameters are pinned to the device they were quantized on; "
            "use memory.strategy: resident"
        )
    if cfg.memory.strategy == "swap" and not cfg.cache.enabled and mode.uses_teacher:
        yield "memory.strategy: swap needs cache.enabled: true (targets survive evicting the teacher only through the cache)"
    if mode.trajectories == "teacher_pool" and not cfg.cache.enabled:
        yield f"run.mode: {mode.name} needs cache.enabled: true (it trains from one frozen teacher cache)"
    if cfg.rollout.max_total_tokens <= cfg.rollout.max_new_tokens_per_turn:
        yield f"rollout.max_total_tokens ({cfg.rollout.max_total_tokens}) must exceed rollout.max_new_tokens_per_turn ({cfg.rollout.max_new_tokens_per_turn})"
    tr = cfg.train
    if (
        mode.trajectories == "student"
        and tr.opd_freshness == "strict"
        and tr.steps_per_rollout_batch() > 1
    ):
        yield (
            f"train.opd_freshness: strict allows one optimizer step per rollout batch, but "
            f"rollouts_per_cycle={tr.rollouts_per_cycle} with gradient_accumulation_steps={tr.group_size()} "
            f"takes {tr.steps_per_rollout_batch()}; set train.gradient_accumulation_steps to {tr.rollouts_per_cycle} (or auto), "
            "or use train.opd_freshness: replay"
        )
    if mode.trajectories == "mixed" and tr.steps_per_rollout_batch() > 1:
        yield (
            f"run.mode: {mode.name} allows one optimizer step per batch (its student rollouts are on-policy), but "
            f"rollouts_per_cycle={tr.rollouts_per_cycle} with gradient_accumulation_steps={tr.group_size()} "
            f"takes {tr.steps_per_rollout_batch()}; set train.gradient_accumulation_steps to {tr.rollouts_per_cycle} (or auto)"
        )
    if tr.opd_freshness == "replay" and mode.trajectories != "student":
        student = [m.name for m in MODES.values() if m.trajectories == "student"]
        yield f"train.opd_freshness: replay only applies to run.mode: {', '.join(student)}"
    if tr.replay_passes > 1 and tr.opd_freshness != "replay":
        yield "train.replay_passes > 1 requires train.opd_freshness: replay"
    gas = tr.group_size()
    if isinstance(tr.trajectory_batch_size, int) and tr.trajectory_batch_size > gas:
        yield f"train.trajectory_batch_size ({tr.trajectory_batch_size}) cannot exceed the optimizer group size ({gas})"
    if gas > tr.rollouts_per_cycle:
        yield f"train.gradient_accumulation_steps ({gas}) cannot exceed train.rollouts_per_cycle ({tr.rollouts_per_cycle})"
    if cfg.selection.critical_weight == 0 and cfg.selection.other_weight == 0:
        yield "selection.critical_weight and selection.other_weight are both 0: nothing would be supervised"
    if cfg.selection.selector == "tool_and_final" and cfg.selection.critical_weight == 0:
        yield "selection.selector: tool_and_final keeps only critical tokens, so selection.critical_weight must be > 0"
    if cfg.models.runtime == "shared_backbone":
        if cfg.models.backend != "hf":
            yield "models.runtime: shared_backbone needs models.backend: hf"
        if not cfg.models.student.lora.enabled:
            yield "models.runtime: shared_backbone needs models.student.lora.enabled: true (only actor adapters are trained)"
        if cfg.models.student.model_id != cfg.models.teacher.model_id:
            yield "models.runtime: shared_backbone needs student and teacher to share one base (same model_id)"
        if cfg.memory.strategy == "swap":
            yield "models.runtime: shared_backbone keeps one base model on the device, so memory.strategy: swap cannot evict the teacher; use resident or auto"
    if cfg.eval.split == "test" and cfg.environment.test_tasks == 0:
        yield "eval.split: test needs environment.test_tasks > 0"
    if (
        cfg.eval.split == "eval"
        and cfg.environment.eval_tasks == 0
        and (cfg.eval.baseline or cfg.eval.after_warmup)
    ):
        yield "environment.eval_tasks is 0 but evaluation is enabled; set eval.baseline/after_warmup false or add eval tasks"
    held_out = (
        cfg.environment.test_tasks if cfg.eval.split == "test" else cfg.environment.eval_tasks
    )
    if cfg.eval.every is not None and held_out == 0:
        yield f"eval.every needs held-out tasks, but the {cfg.eval.split!r} split is empty (environment.{cfg.eval.split}_tasks: 0)"


# -- reading a recipe ------------------------------------------------------------------


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a recipe through :func:`miniverl.utils.safe_load.load_yaml_file`.

    Safe constructors only, a size, depth and alias-expansion limit, duplicate keys
    refused, and only a regular file is opened.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            f"recipe not found: {path}",
            hint="pass the path of a YAML recipe, e.g. recipes/toy_demo.yaml",
        )
    data = load_yaml_file(path, error=ConfigError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}"
        )
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.cycles=4"`` -> (["train", "cycles"], 4). Values are parsed as YAML scalars."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"override {item!r} is not of the form section.key=value",
            hint="e.g. train.cycles=4 loss.divergence=reverse_kl",
        )
    parts = key.split(".")
    if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts):
        raise ConfigError(f"override key {key!r} must be dotted identifiers, e.g. loss.top_k")
    value = loads_yaml(raw, where=f"override {item!r}", error=ConfigError) if raw.strip() else ""
    return parts, value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a deep copy of ``data`` with dotted overrides applied.

    Unknown keys are not rejected here: validation rejects them with their key path,
    exactly as it would in the file. Lab keys written at their core places are moved under
    ``lab:`` first (``config/layout.py``), so an override wins whichever place it names.
    """
    result = _deep_copy(move_lab_keys(data))
    for item in overrides:
        parts, value = parse_override(item)
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[: depth + 1])} is not a section"
                )
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _error_text(source: str, lines: list[str]) -> str:
    return "\n".join([f"{source}: {len(lines)} configuration error(s)", *lines])


def format_validation_error(exc: ValidationError, source: str, also: Iterable[str] = ()) -> str:
    """One line per problem, each with its dotted key path (``also``: lines found before
    validation, already in this format)."""
    lines: list[str] = list(also)
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (Extra inputs are not permitted)"
        if err["type"] in ("less_than_equal", "less_than"):
            msg = f"{msg} ({BOUND_HINT})"
        if loc == "<root>":
            lines.extend(f"  - {part}" for part in msg.split("\n"))
        else:
            lines.append(f"  - {loc}: {msg}")
    return _error_text(source, lines)


__all__ = [
    "TOY_PRESET_IDS",
    "RunConfig",
    "apply_overrides",
    "format_validation_error",
    "load_yaml_mapping",
    "parse_override",
]
