"""Typed records of a run directory: ``metrics.jsonl`` step / cycle / eval lines,
``events.jsonl`` lifecycle events and the checkpoint ``state.json`` (docs/design.md §5).

The trainer builds these models and writes ``record.to_json()``;
:mod:`miniverl.inspection.run_dir` reads every line back through them. Torch-free.

Compatibility policy (old run directories stay readable):

- **Unknown keys are kept** (``extra="allow"``): earlier and later miniverl versions wrote
  keys this version does not name (a reader must not drop what it cannot type).
- **Every field except the discriminator is optional on read**: a record another miniverl
  version wrote may lack one (fingerprints, temperatures, ``teacher_entropy_is_lower_bound``...),
  and it reads as ``None``. Writers set every field (``to_json`` dumps them all).
- **A present field of the wrong type is an error**: :func:`parse_metric` and
  :func:`parse_event` raise :class:`~miniverl.errors.RunDirectoryError` naming the
  file, the line and the field, because a report must not render a corrupt number.
- Numbers keep their JSON type (``int | float`` is not coerced), so a record read and
  written back is byte-identical.

Records also answer ``record.get(key)`` / ``record[key]`` / ``key in record`` /
``{**record}`` over the keys the line actually carried (declared or extra), which is how
the report reads optional keys without caring which version wrote them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal, Self, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, field_validator

from miniverl.config.limits import MAX_STEPS
from miniverl.errors import CheckpointError, MiniverlError, RunDirectoryError
from miniverl.utils.seeding import rng_state_problem


def _json_number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"Input should be a number, got {type(value).__name__}")
    return value


Number: TypeAlias = Annotated[int | float, PlainValidator(_json_number)]
"""A JSON number as written: ints stay ints (``fmt_num`` renders ``3`` and ``3.0`` differently)."""

# -- events.jsonl names (every ``EventLog.emit`` name in src/) ---------------------------

EVENT_NAMES: frozenset[str] = frozenset(
    {
        "benchmark_cold_start_loaded",
        "cache_pruned",
        "checkpoint_loaded",
        "checkpoint_saved",
        "checkpoints_superseded",
        "compute_cap_reached",
        "cycle_end",
        "cycle_skipped_no_selected_positions",
        "eval",
        "eval_reused",
        "explanation",
        "offline_kd_reuse",
        "oom_batch_split",
        "oom_chunk_retry",
        "restarted",
        "resumed",
        "rollouts_collected",
        "run_end",
        "run_start",
        "sft_warmup_cycle",
        "sft_warmup_end",
        "sft_warmup_start",
        "teacher_adapter_fitted",
        "teacher_adapter_loaded",
        "teacher_gate",
        "teacher_state_gate",
        "teacher_targets_path",
        "temperature_mismatch",
        "token_analysis_written",
        "toy_teacher_fitted",
        "toy_teacher_reused",
        "update_skipped_nonfinite",
        "warning",
    }
)
"""Names written today. A reader keeps events with other names (older or newer versions)."""


class RunRecord(BaseModel):
    """Base of every run-directory record: typed fields, unknown keys kept, dict-style reads."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    _always: ClassVar[tuple[str, ...]] = ()
    """Fields written even when left at their default (the ``kind`` discriminator)."""

    def model_post_init(self, context: Any, /) -> None:
        self.model_fields_set.update(self._always)

    @classmethod
    def build(cls, **fields: Any) -> Self:
        """A record for writing, validated exactly as the reader will validate it (strict)."""
        try:
            return cls.model_validate(fields, strict=True)
        except ValidationError as exc:
            raise _error(f"{cls.__name__} being written", exc, RuntimeError) from None

    def _present(self) -> list[str]:
        extra = list((self.__pydantic_extra__ or {}).keys())
        return [k for k in type(self).model_fields if k in self.model_fields_set] + extra

    def keys(self) -> list[str]:
        """Keys the record carries: declared fields that were set, then extra keys."""
        return self._present()

    def __getitem__(self, key: str) -> Any:
        if key not in self._present():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._present()

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self._present() else default

    def items(self) -> Iterator[tuple[str, Any]]:
        return ((k, getattr(self, k)) for k in self._present())

    def to_json(self) -> dict[str, Any]:
        """The JSON object to append: every set field and every extra key, as written."""
        return {k: v for k, v in self.model_dump(mode="python").items() if k in self._present()}


class RolloutStats(RunRecord):
    """``summarize_rollouts``: success and token counts of a batch of rollouts."""

    tasks: int | None = None
    solved: int | None = None
    success_rate: Number | None = None
    mean_generated_tokens: Number | None = None
    generated_tokens: int | None = None
    invalid_tool_calls: int | None = None
    termination: dict[str, int] | None = None
    failure_categories: dict[str, int] | None = None


class StepRecord(RunRecord):
    """One optimizer step (``kind == "step"``)."""

    _always = ("kind",)

    kind: Literal["step"] = "step"
    phase: str | None = None
    cycle: int | None = None
    step: int | None = None
    global_optimizer_step: int | None = None
    parameter_version: int | None = None
    policy_version: int | None = None
    rollout_policy_version: int | None = None
    policy_fingerprint: str | None = None
    rollout_policy_fingerprint: str | None = None
    committed: bool | None = None
    loss: Number | None = None
    divergence_loss: Number | None = None
    sampled_token_nll: Number | None = None
    grad_norm: Number | None = None
    lr: Number | None = None
    selected_positions: int | None = None
    trajectories_in_step: int | None = None
    teacher_entropy_mean: Number | None = None
    teacher_entropy_is_lower_bound: bool | None = None
    sampling_temperature: Number | None = None
    loss_temperature: Number | None = None
    high_entropy_fraction: Number | None = None
    loss_by_span_type: dict[str, Number] | None = None
    seconds: Number | None = None
    train_selected_tokens_per_second: Number | None = None
    projection_chunk_size: int | None = None
    gpu: dict[str, Any] | None = None


class CycleRecord(RunRecord):
    """One training cycle (``kind == "cycle"``); ``rollouts`` is empty for sft / offline_kd."""

    _always = ("kind",)

    kind: Literal["cycle"] = "cycle"
    cycle: int | None = None
    mode: str | None = None
    parameter_version_before: int | None = None
    policy_fingerprint_before: str | None = None
    sampling_temperature: Number | None = None
    loss_temperature: Number | None = None
    rollouts: dict[str, Any] | None = None
    selection: dict[str, Any] | None = None
    skipped: bool | None = None
    steps: int | None = None
    parameter_version: int | None = None
    policy_fingerprint: str | None = None
    loss: Number | None = None
    mean_loss: Number | None = None
    mean_divergence: Number | None = None
    seconds: Number | None = None


class EvalRecord(RolloutStats):
    """One held-out evaluation (``kind == "eval"`` in metrics.jsonl; also an ``eval.json`` entry)."""

    _always = ("kind",)

    kind: Literal["eval"] = "eval"
    cycle: int | None = None
    tag: str | None = None
    split: str | None = None
    temperature: Number | None = None
    parameter_version: int | None = None
    global_optimizer_step: int | None = None


MetricRecord: TypeAlias = StepRecord | CycleRecord | EvalRecord

_BY_KIND: dict[str, type[RunRecord]] = {
    "step": StepRecord,
    "cycle": CycleRecord,
    "eval": EvalRecord,
}


class OtherMetricRecord(RunRecord):
    """A metrics line whose ``kind`` this version does not know (kept, never typed further)."""

    kind: str | None = None


class EventRecord(RunRecord):
    """One ``events.jsonl`` line; the event's own fields are extra keys."""

    event: str
    time: str | None = None
    monotonic_s: Number | None = None

    @property
    def known(self) -> bool:
        return self.event in EVENT_NAMES


class CheckpointState(RunRecord):
    """``checkpoints/<name>/state.json``: every counter a resume restores.

    The required fields are the ones ``training.checkpoint.load_checkpoint`` needs; the rest
    are optional on read (another miniverl version may not write them).
    """

    config_digest: str
    cycle: int = Field(ge=-1, le=MAX_STEPS)
    """The last completed cycle (-1: the checkpoint after the SFT warm-up); a resume
    continues at ``cycle + 1``, so a value past ``train.cycles`` would skip training and
    stamp the final evaluation with it (:func:`check_state_cycle` holds it to the recipe)."""
    global_step: int = Field(ge=0)
    parameter_version: int = Field(ge=0)
    task_cursor: int = Field(ge=0)
    chunk_size: int = Field(ge=0)
    rng: dict[str, Any]
    optimizer: dict[str, Any]
    rollout_policy_version: int | None = None
    schedule: dict[str, Any] | None = None
    main_start_step: int | None = None
    eval_results: dict[str, Any] | None = None
    jsonl_sizes: dict[str, int] | None = None
    jsonl_digests: dict[str, str] | None = None
    source: dict[str, Any] | None = None
    offline_kd: dict[str, Any] | None = None
    """The offline pool's position where a checkpoint keeps it apart from ``source``."""
    teacher: dict[str, Any] | None = None
    """What the run keeps about the teacher it was given (the lab's fit report); a resume must
    be given the teacher with the same ``weights_sha256``."""
    miniverl_version: str | None = None

    @field_validator("rng")
    @classmethod
    def _rng_restorable(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = rng_state_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


def check_state_cycle(
    state: Any, where: str, *, cycles: int, error: type[MiniverlError] = CheckpointError
) -> None:
    """Refuse a checkpoint ``state.json`` whose ``cycle`` the recipe could not have written.

    ``cycles`` is the recipe's ``train.cycles``; a checkpoint is taken after cycle -1 (the
    warm-up) up to ``cycles - 1``. Called at resume, where the recipe is known.
    """
    cycle = state.get("cycle") if isinstance(state, dict) else getattr(state, "cycle", None)
    if type(cycle) is not int or not -1 <= cycle <= cycles - 1:
        raise error(
            f"{where}: field 'cycle': {cycle!r} is outside [-1, {cycles - 1}] for train.cycles {cycles}",
            hint="the file was edited or corrupted; restore it from the run that wrote it",
        )


def _error(
    where: str, exc: ValidationError, error: type[Exception] = RunDirectoryError
) -> Exception:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(record)"
    message = f"{where}: field {field!r}: {first['msg'].removeprefix('Value error, ')}"
    if issubclass(error, MiniverlError):
        return error(
            message, hint="the file was edited or corrupted; restore it from the run that wrote it"
        )
    return error(message)


def parse_metric(raw: Any, where: str) -> RunRecord:
    """One ``metrics.jsonl`` object as its typed record; ``where`` names file and line."""
    if not isinstance(raw, dict):
        raise RunDirectoryError(f"{where}: a metrics record must be a JSON object")
    model = _BY_KIND.get(str(raw.get("kind")), OtherMetricRecord)
    try:
        return model.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise _error(where, exc) from None


def parse_event(raw: Any, where: str) -> EventRecord:
    """One ``events.jsonl`` object as an :class:`EventRecord`."""
    if not isinstance(raw, dict):
        raise RunDirectoryError(f"{where}: an event record must be a JSON object")
    try:
        return EventRecord.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise _error(where, exc) from None


def parse_state(
    raw: Any, where: str, *, error: type[Exception] = RunDirectoryError
) -> CheckpointState:
    """A checkpoint ``state.json`` as :class:`CheckpointState`; failures are ``error``
    (``CheckpointError`` when a resume reads it)."""
    try:
        return CheckpointState.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise _error(where, exc, error) from None


__all__ = [
    "EVENT_NAMES",
    "CheckpointState",
    "CycleRecord",
    "EvalRecord",
    "EventRecord",
    "MetricRecord",
    "OtherMetricRecord",
    "RolloutStats",
    "RunRecord",
    "StepRecord",
    "check_state_cycle",
    "parse_event",
    "parse_metric",
    "parse_state",
]
