"""The sections of a recipe: one pydantic model per top-level YAML key (docs/design.md §2.1).

Each section forbids unknown keys and documents every field; a field validator checks
only that field. Rules that relate fields of several sections live in
``config/models.py`` with :class:`~miniverl.config.models.RunConfig`, which composes these.
One model per recipe key, each field with its bounds and description, in one file: it is
the reference that ``docs/configuration.md`` is generated from.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from miniverl.config.limits import (
    BOUND_HINT,
    MAX_LR,
    MAX_SEED,
    MAX_STEPS,
    MAX_TASKS,
    MAX_TEMPERATURE,
    MAX_THREADS,
    MAX_TOKENS,
    MAX_WEIGHT,
    path_component_problem,
)
from miniverl.config.modes import DEFAULT_MODE, WARMUP_MODE, ModeName, mode_help, mode_of_kind

ENVIRONMENT_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
ENVIRONMENT_REF_PATTERN = r"^(?:[a-z][a-z0-9_]{0,63}|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)$"
"""A registered or entry-point name, or ``package.module:ClassName`` (environments/registry.py)."""

Auto = Literal["auto"]


class Section(BaseModel):
    """A recipe section: unknown keys refused, every field documented, values re-validated
    on assignment (the base of every section here and of the lab's, ``miniverl.lab.config``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    omitted_at_default: ClassVar[tuple[str, ...]] = ()
    """Fields left out of the dump (and so of ``RunConfig.digest``) while at their default.

    Why: a field added later must not change the digest of every recipe that does not use
    it, or every stored benchmark cell keyed by that digest would stop matching its plan.
    """

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        for name in self.omitted_at_default:
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if isinstance(data, dict) and getattr(self, name) == default:
                data.pop(name, None)
        return data


class RunSection(Section):
    name: str = Field(
        "miniverl-run",
        description="Human-readable run name; also the default output directory name.",
        min_length=1,
        max_length=128,
    )
    mode: ModeName = Field(DEFAULT_MODE, description=mode_help())
    seed: int = Field(
        1234,
        ge=0,
        le=MAX_SEED,
        description="Root seed. Every other seed is derived from it with derive_seed (sha256), never with Python's salted hash().",
    )
    cpu_threads: int | Auto = Field(
        "auto",
        description="torch CPU threads. auto: 1 for the toy backend on the CPU (tiny matrices only lose to thread contention, and one thread keeps its numerics machine-independent; a lab toy-teacher fit, a wider model on whole traces, takes torch's count); the hf backend on the CPU: torch's count only when a short probe times the decode step's matmuls at least 15% faster with it than with 1 thread, else 1; torch's count on an accelerator. The decision and its timings are recorded in config.resolved.yaml.",
    )

    @field_validator("cpu_threads")
    @classmethod
    def _threads_positive(cls, value: int | str) -> int | str:
        if value != "auto" and value < 1:
            raise ValueError("must be >= 1 or 'auto'")
        if value != "auto" and value > MAX_THREADS:
            raise ValueError(f"must be <= {MAX_THREADS} ({BOUND_HINT})")
        return value

    @field_validator("name")
    @classmethod
    def _name_is_one_path_component(cls, value: str) -> str:
        problem = path_component_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class LoraConfig(Section):
    enabled: bool = Field(
        True,
        description="Train low-rank adapters instead of every weight. Only adapter parameters enter the optimizer.",
    )
    r: int = Field(8, ge=1, le=1024, description="Adapter rank.")
    alpha: float = Field(
        16.0, gt=0, le=1e6, description="Adapter scaling numerator (scale = alpha / r)."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[str] | None = Field(
        None,
        description="Module names to adapt. None: attention and MLP projections of the architecture.",
    )


class ModelSpec(Section):
    """The student: the policy being trained."""

    model_id: str = Field(
        ...,
        min_length=1,
        description="toy backend: a toy shape preset (toy-student, toy-teacher; models/toy_config.py); hf backend: local path or hub id.",
    )
    revision: str | None = Field(
        None, description="Pinned hub revision (commit hash or tag); recorded in the manifest."
    )
    tokenizer_id: str | None = Field(
        None, description="Tokenizer source when it differs from model_id."
    )
    precision: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weight dtype. auto: bfloat16 on CUDA with bf16 support, else float32."
    )
    quantization: Literal["none", "nf4", "int8"] = Field(
        "none", description="bitsandbytes weight quantization (hf backend on CUDA only)."
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="Adapter settings: with enabled, only the adapter's parameters are trained.",
    )


class TeacherSpec(Section):
    """The frozen scorer: a base model, or the trained student of another run."""

    omitted_at_default: ClassVar[tuple[str, ...]] = ("checkpoint",)

    model_id: str = Field(
        "toy-teacher",
        min_length=1,
        description="toy backend: a toy shape preset; hf backend: local path or hub id (the base the checkpoint's adapter sits on, if any).",
    )
    revision: str | None = Field(
        None, description="Pinned hub revision (commit hash or tag); recorded in the manifest."
    )
    precision: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weight dtype. auto: bfloat16 on CUDA with bf16 support, else float32."
    )
    quantization: Literal["none", "nf4", "int8"] = Field(
        "none", description="bitsandbytes weight quantization (hf backend on CUDA only)."
    )
    checkpoint: str | None = Field(
        None,
        description="The trained student of another run as this teacher: a run directory (its checkpoints/final), one checkpoint directory, a benchmark cold start, or a .safetensors file. Its trainable tensors (the whole toy model, or a LoRA adapter on model_id) are loaded and frozen; its shape is read from what the checkpoint records (the run's config, the cold start's marker, or the file's metadata).",
    )


def _default_student() -> ModelSpec:
    return ModelSpec(model_id="toy-student")


class ModelsConfig(Section):
    omitted_at_default: ClassVar[tuple[str, ...]] = ("rollout_dtype",)

    backend: Literal["toy", "hf"] = Field(
        "toy",
        description="toy: the embedded CPU decoder and tokenizer; hf: transformers checkpoints.",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$",
        description="auto: cuda when available, else cpu.",
    )
    runtime: Literal["dual_model", "shared_backbone"] = Field(
        "dual_model",
        description="dual_model: independent student and teacher backends; shared_backbone: one hf base with role-scoped adapters.",
    )
    student: ModelSpec = Field(
        default_factory=_default_student, description="The policy being trained."
    )
    teacher: TeacherSpec = Field(default_factory=TeacherSpec, description="The frozen scorer.")
    rollout_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype of the student's rollout weights (hf backend, dual_model runtime): bfloat16 decodes from a bf16 copy refreshed after every update, while training stays in the model's precision. auto: on the CPU with float32 weights, bfloat16 only when a short probe times the decode step's matmuls faster in bf16; otherwise the model's precision. The decision and its timings are recorded in config.resolved.yaml.",
    )


class EnvironmentConfig(Section):
    name: str = Field(
        "calculator",
        pattern=ENVIRONMENT_REF_PATTERN,
        max_length=200,
        description="A registered name (calculator, calc_chain, shop), an entry point in the group miniverl.environments, or package.module:ClassName; resolved by 'miniverl validate' (docs/environments.md).",
    )
    tasks: str | None = Field(
        None,
        description="A JSONL task file (one task per line: prompt, answer, optional oracle); splits are dealt from it with split_seed instead of sampled. Relative paths are read from the working directory.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the environment constructor."
    )
    difficulty: Literal["easy", "medium", "hard", "mixed"] = Field(
        "easy", description="Task difficulty of every split."
    )
    train_tasks: int = Field(32, ge=1, le=MAX_TASKS, description="Size of the training split.")
    eval_tasks: int = Field(
        12, ge=0, le=MAX_TASKS, description="Size of the held-out evaluation split."
    )
    test_tasks: int = Field(
        0,
        ge=0,
        le=MAX_TASKS,
        description="Size of the test split (never used in training or eval).",
    )
    split_seed: int = Field(
        7,
        ge=0,
        le=MAX_SEED,
        description="Seed of make_splits; splits are disjoint and deterministic.",
    )


class RolloutConfig(Section):
    max_turns: int = Field(4, ge=1, le=256, description="Assistant turns per episode.")
    max_new_tokens_per_turn: int = Field(
        64, ge=1, le=MAX_TOKENS, description="Sampled tokens per assistant turn."
    )
    max_total_tokens: int = Field(
        768,
        ge=2,
        le=MAX_TOKENS,
        description="Whole-trajectory token budget; a turn does not start past it.",
    )
    temperature: float = Field(
        1.0,
        ge=0,
        le=MAX_TEMPERATURE,
        description="Sampling temperature for training rollouts (0 = greedy).",
    )
    max_parse_errors: int = Field(
        1,
        ge=0,
        le=10_000,
        description="Stop when the parse-error count reaches this (0: stop on the first error).",
    )
    max_repeated_calls: int = Field(
        1,
        ge=0,
        le=10_000,
        description="Stop when an identical call signature repeats more than this many times.",
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_TASKS,
        description="Episodes decoded together, turn by turn (None: all rollouts of the cycle; 1: one at a time).",
    )


class SelectionConfig(Section):
    selector: Literal["all_model_tokens", "tool_and_final", "uniform_ratio", "hybrid"] = Field(
        "all_model_tokens", description="Which model-generated positions enter the loss."
    )
    ratio: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Fraction of model tokens kept by uniform_ratio, and the budget of hybrid.",
    )
    critical_weight: float = Field(
        1.0, ge=0, le=MAX_WEIGHT, description="Raw weight of tool-call and final-answer tokens."
    )
    other_weight: float = Field(
        1.0, ge=0, le=MAX_WEIGHT, description="Raw weight of other model-generated tokens."
    )


class TeacherConfig(Section):
    mode: Literal["standard", "privileged_context"] = Field(
        "standard",
        description="standard: the teacher reads the student's transcript; privileged_context: plus an oracle system block.",
    )
    batch_size: int = Field(
        8,
        ge=1,
        le=MAX_TASKS,
        description="Trajectories per padded teacher forward when scoring a cycle.",
    )


class LossConfig(Section):
    mode: Literal["bucketed", "exact_full_vocab"] = Field(
        "bucketed",
        description="bucketed: teacher top-k + tail (cacheable); exact_full_vocab: full teacher distribution rebuilt per chunk.",
    )
    divergence: Literal["forward_kl", "reverse_kl", "jsd", "entropy_aware"] = Field(
        "forward_kl", description="Token-level divergence, see docs/objectives.md."
    )
    jsd_beta: float = Field(0.5, ge=0, le=1, description="Generalized JSD beta (0 < beta < 1).")
    top_k: int | Auto | None = Field(
        "auto",
        description="Bucketed top-k. auto: min(64, V), resolved at run start. Must be unset/auto/1 in exact_full_vocab.",
    )
    temperature: float = Field(
        1.0,
        gt=0,
        le=MAX_TEMPERATURE,
        description="Distillation temperature applied to both distributions.",
    )
    chunk_size: int | Auto = Field(
        "auto",
        description="Rows projected to [chunk, V] at a time. auto: resolved at run start from V.",
    )
    sampled_token_nll_weight: float = Field(
        0.0, ge=0, le=MAX_WEIGHT, description="Weight c of the auxiliary sampled-token NLL."
    )
    entropy_threshold: float = Field(
        0.8,
        ge=0,
        le=MAX_TEMPERATURE,
        description="entropy_aware: teacher entropy h (nats) above which forward KL is added. Under loss.mode: bucketed the gate thresholds the entropy of the K+1 buckets, a lower bound on the teacher's entropy.",
    )
    entropy_forward_weight: float = Field(
        1.0, ge=0, le=MAX_WEIGHT, description="entropy_aware: weight alpha of the forward-KL term."
    )

    def divergence_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``losses.divergences.DivergenceSpec`` for this section.

        The one place the loss section is unpacked into a divergence (config cannot import
        ``losses``, so it returns plain values). ``jsd_beta`` is carried only for ``jsd``;
        any other divergence gets the spec's default 0.5, which it never reads or checks.
        """
        return {
            "name": self.divergence,
            "temperature": self.temperature,
            "jsd_beta": self.jsd_beta if self.divergence == "jsd" else 0.5,
            "entropy_threshold": self.entropy_threshold,
            "entropy_forward_weight": self.entropy_forward_weight,
        }


class CacheConfig(Section):
    enabled: bool = Field(True, description="Write teacher targets to the safetensors cache.")
    dir: str | None = Field(None, description="Cache directory. Default: <run>/teacher-cache.")
    strict_policy_version: bool = Field(
        True, description="Refuse targets produced under another policy version (forced in opd)."
    )
    reuse_across_policy_versions: bool = Field(
        False, description="offline_kd only: reuse one frozen cache across updates."
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="Storage dtype of cached log-probabilities."
    )
    keep_versions: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description="Prune entries older than this many policy versions after each cycle (None: keep all).",
    )


class MemoryConfig(Section):
    omitted_at_default: ClassVar[tuple[str, ...]] = ("activation_checkpointing",)

    strategy: Literal["resident", "swap", "auto"] = Field(
        "auto",
        description="resident: both models on the device; swap: one at a time via the cache; auto: resident when it fits with 2 GiB of device memory to spare.",
    )
    activation_checkpointing: bool = Field(
        False,
        description="hf only: keep each decoder layer's input instead of its activations in a training forward (student update, teacher-adapter fit) and recompute the layer in the backward. The gradients are bit-identical; the activations a forward keeps shrink from about 1.2 MB to about 0.1 MB per token of SmolLM2-135M (float32) for one more forward per update (docs/performance.md).",
    )


class TrainConfig(Section):
    omitted_at_default: ClassVar[tuple[str, ...]] = ("sft_noise_fraction",)

    lr: float = Field(2e-3, gt=0, le=MAX_LR, description="Peak AdamW learning rate.")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate schedule over all optimizer steps."
    )
    warmup_steps: int = Field(
        0, ge=0, le=MAX_STEPS, description="Linear warm-up steps of the schedule."
    )
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Final lr / peak lr for linear and cosine."
    )
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float | None = Field(
        1.0, gt=0, le=1e6, description="Gradient clipping norm (None: no clipping)."
    )
    cycles: int = Field(4, ge=0, le=MAX_STEPS, description="KD/OPD cycles after the warm-up.")
    rollouts_per_cycle: int = Field(8, ge=1, le=4096, description="Trajectories per cycle.")
    gradient_accumulation_steps: int | Auto = Field(
        "auto",
        description="Trajectories per optimizer group. auto: rollouts_per_cycle (one update per cycle).",
    )
    trajectory_batch_size: int | Auto = Field(
        "auto",
        description="Most trajectories in one padded forward. Mathematically neutral. auto: the optimizer group, capped by the memory plan.",
    )
    sft_warmup_cycles: int = Field(
        2,
        ge=0,
        le=MAX_STEPS,
        description="Oracle-trace cross-entropy cycles before KD/OPD (the most a warm-up stopped by a criterion of the caller may run).",
    )
    sft_lr: float | None = Field(
        None, gt=0, le=MAX_LR, description="Warm-up learning rate (None: train.lr)."
    )
    opd_freshness: Literal["strict", "replay"] = Field(
        "strict",
        description="strict: one update per rollout version; replay: replay_passes updates, labelled online_distillation_with_replay.",
    )
    replay_passes: int = Field(
        1, ge=1, le=1000, description="replay: optimizer passes over one rollout batch."
    )
    checkpoint_every: int = Field(
        1, ge=1, le=MAX_STEPS, description="Save a resumable checkpoint every N cycles."
    )
    gkd_student_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description=f"run.mode: {mode_of_kind('mixed').name} only: the fraction λ of each batch's tasks rolled out by the student (the rest are fresh teacher samples).",
    )
    sft_noise_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description=f"run.mode: {WARMUP_MODE.name} only: the fraction of each cycle's oracle traces replaced by corrective traces (DART-style noise injection): one tool call corrupted (a changed digit, a malformed call or expression, a misnamed key) or one call made after the last step, the environment's answer to it, then the oracle's correction (its re-call, or its answer) and the rest of its episode; the bad call is not trained on (kinds and weights: agent/corrective.py CORRUPTION_KINDS). The SFT warm-up of other modes never sees noise.",
    )

    @field_validator("gradient_accumulation_steps", "trajectory_batch_size")
    @classmethod
    def _positive_or_auto(cls, value: int | str) -> int | str:
        if value != "auto" and value < 1:
            raise ValueError("must be >= 1 or 'auto'")
        if value != "auto" and value > 4096:
            raise ValueError(f"must be <= 4096 ({BOUND_HINT})")
        return value

    @field_validator("betas")
    @classmethod
    def _betas_in_unit_interval(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"each beta must satisfy 0 <= beta < 1, got {list(value)}")
        return value

    def group_size(self) -> int:
        """Trajectories per optimizer group (``auto`` = one group per cycle)."""
        gas = self.gradient_accumulation_steps
        return self.rollouts_per_cycle if gas == "auto" else int(gas)

    def steps_per_rollout_batch(self) -> int:
        """ceil(rollouts_per_cycle / group) x replay passes: optimizer steps per batch."""
        passes = self.replay_passes if self.opd_freshness == "replay" else 1
        return math.ceil(self.rollouts_per_cycle / self.group_size()) * passes


class EvalConfig(Section):
    split: Literal["eval", "test"] = Field(
        "eval", description="Held-out split for baseline, warm-up and final evaluation."
    )
    max_tasks: int | None = Field(
        None, ge=1, le=MAX_TASKS, description="Evaluate at most this many tasks of the split."
    )
    temperature: float = Field(
        0.0, ge=0, le=MAX_TEMPERATURE, description="Evaluation sampling temperature (0 = greedy)."
    )
    baseline: bool = Field(True, description="Evaluate before training.")
    after_warmup: bool = Field(True, description="Evaluate after the SFT warm-up.")
    every: int | None = Field(
        None,
        ge=1,
        description="Also evaluate held-out success every N cycles (tag cycle-NNNN in metrics.jsonl). None: baseline, warm-up and final only.",
    )
    batch_size: int = Field(
        32, ge=1, le=MAX_TASKS, description="Held-out episodes decoded together (1: one at a time)."
    )


class CheckpointConfig(Section):
    keep: int | None = Field(
        1,
        ge=1,
        description="Cycle checkpoints kept on disk (newest first); warmup and final are always kept. None: keep every one.",
    )


class LoggingConfig(Section):
    tensorboard: bool = Field(
        False,
        description="Write TensorBoard scalars to <run>/tensorboard (needs the 'tensorboard' extra: tensorboardX).",
    )
    wandb: bool = Field(
        False,
        description="Log the same scalars to Weights & Biases (project miniverl) in offline mode (never uses the network; sync later with 'wandb sync'). Needs wandb installed.",
    )


__all__ = [
    "ENVIRONMENT_NAME_PATTERN",
    "ENVIRONMENT_REF_PATTERN",
    "Auto",
    "CacheConfig",
    "CheckpointConfig",
    "EnvironmentConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossConfig",
    "MemoryConfig",
    "ModelSpec",
    "ModelsConfig",
    "RolloutConfig",
    "RunSection",
    "Section",
    "SelectionConfig",
    "TeacherConfig",
    "TeacherSpec",
    "TrainConfig",
]
