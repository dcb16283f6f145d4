"""``RunConfig``: one validated recipe (docs/design.md §2.1).

Config is validated data, not behaviour. Every section forbids unknown keys, every field
has a description, and :meth:`RunConfig._validate_combination` rejects contradictory
recipes before anything is downloaded or allocated. ``auto`` values stay ``auto`` here;
the training layer resolves them and writes the decision to ``config.resolved.yaml``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from miniverl.errors import ConfigError
from miniverl.utils.safe_load import load_yaml_file, loads_yaml

ENVIRONMENT_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
ENVIRONMENT_REF_PATTERN = r"^(?:[a-z][a-z0-9_]{0,63}|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)$"
"""A registered or entry-point name, or ``package.module:ClassName`` (environments/registry.py)."""
TOY_PRESET_IDS = ("toy-student", "toy-teacher")

Auto = Literal["auto"]

# Sanity bounds on numbers: they catch typos such as ``lr: 2e3`` or
# ``train_tasks: 1e9`` before anything is allocated. A real need for more is met by raising
# the constant here; the validation message names this file.
MAX_LR = 1.0
MAX_TEMPERATURE = 100.0
MAX_WEIGHT = 1e6
MAX_TASKS = 100_000
MAX_TOKENS = 131_072
MAX_STEPS = 1_000_000
MAX_SEED = 2**63 - 1
MAX_THREADS = 4096
MAX_NAME_CHARS = 128
BOUND_HINT = "a sanity bound; to go beyond it, raise the constant in src/miniverl/config/models.py"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunSection(_Section):
    name: str = Field(
        "miniverl-run",
        description="Human-readable run name; also the default output directory name.",
        min_length=1,
        max_length=128,
    )
    mode: Literal["sft", "offline_kd", "opd"] = Field(
        "opd",
        description="sft: cross-entropy on oracle traces; offline_kd: one fixed trajectory set and one frozen teacher cache; opd: fresh student rollouts scored by the teacher every cycle.",
    )
    seed: int = Field(
        1234,
        ge=0,
        le=MAX_SEED,
        description="Root seed. Every other seed is derived from it with derive_seed (sha256), never with Python's salted hash().",
    )
    output_dir: str | None = Field(None, description="Run directory. Default: runs/<run.name>.")
    deterministic: bool = Field(
        True, description="Ask torch for deterministic algorithms (warn-only where none exists)."
    )
    cpu_threads: int | Auto = Field(
        "auto",
        description="torch CPU threads. auto: 1 for the toy backend on the CPU (tiny matrices only lose to thread contention), torch's default otherwise.",
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


class LoraConfig(_Section):
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


class ToyArchConfig(_Section):
    hidden_size: int = Field(48, ge=8, le=8192, description="Toy decoder width H.")
    num_layers: int = Field(2, ge=1, le=64, description="Toy decoder depth.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads; must divide hidden_size.")
    intermediate_size: int = Field(128, ge=8, le=65536, description="SwiGLU inner width.")
    max_seq_len: int = Field(
        1024, ge=16, le=MAX_TOKENS, description="Longest sequence (RoPE table size)."
    )
    tie_embeddings: bool = Field(
        True, description="Share the token embedding and LM head matrices."
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> ToyArchConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size}"
            )
        return self


class ModelSpec(_Section):
    model_id: str = Field(
        ...,
        min_length=1,
        description="toy backend: toy-student / toy-teacher preset or any id with an explicit 'toy' block; hf backend: local path or hub id.",
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
        description="Adapter settings. Ignored for the teacher, which is never trained.",
    )
    toy: ToyArchConfig | None = Field(
        None, description="Toy decoder shape. None: the preset named by model_id."
    )


class ToyFitConfig(_Section):
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
        description="Fraction of the fitting traces that get one tool call corrupted (a changed digit or a malformed call), the tool's real response, then the oracle's corrective re-call; the corrupted step is not supervised (training/noisy_traces.py).",
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


class TeacherFitConfig(_Section):
    """The HF analogue of ``toy_fit``: a teacher LoRA adapter fitted on the shared backbone."""

    enabled: bool = Field(
        False,
        description="shared_backbone only: give the teacher its own frozen LoRA adapter (shaped by models.teacher.lora), fitted on oracle and corrective traces of tasks disjoint from eval/test.",
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


def _default_student() -> ModelSpec:
    return ModelSpec(model_id="toy-student")


def _default_teacher() -> ModelSpec:
    return ModelSpec(model_id="toy-teacher", lora=LoraConfig(enabled=False))


class ModelsConfig(_Section):
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
    teacher: ModelSpec = Field(default_factory=_default_teacher, description="The frozen scorer.")
    toy_fit: ToyFitConfig = Field(
        default_factory=ToyFitConfig,
        description="How the toy teacher is fitted (toy backend only).",
    )
    teacher_fit: TeacherFitConfig = Field(
        default_factory=TeacherFitConfig,
        description="A fitted teacher adapter on a shared hf backbone (hf backend only).",
    )


class EnvironmentConfig(_Section):
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


class RolloutConfig(_Section):
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
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
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


class SelectionConfig(_Section):
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


class TeacherConfig(_Section):
    mode: Literal["standard", "privileged_context"] = Field(
        "standard",
        description="standard: the teacher reads the student's transcript; privileged_context: plus an oracle system block.",
    )
    batch_size: int = Field(
        8, ge=1, le=MAX_TASKS, description="Trajectories per padded teacher forward when scoring a cycle."
    )


class LossConfig(_Section):
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
    exact_max_vocab: int = Field(
        8192,
        ge=1,
        le=1 << 24,
        description="Largest V for which exact_full_vocab is allowed with a swapped teacher.",
    )
    allow_large_exact: bool = Field(
        False, description="Permit exact_full_vocab with a swapped teacher above exact_max_vocab."
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


class CacheConfig(_Section):
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
    max_entries_per_shard: int = Field(256, ge=1, le=1 << 20, description="Entries per shard file.")
    journal: bool = Field(
        True,
        description="Commit each flush as one index.journal line (cost of the new entries); false: rewrite index.json every flush.",
    )
    keep_versions: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description="Prune entries older than this many policy versions after each cycle (None: keep all).",
    )


class MemoryConfig(_Section):
    strategy: Literal["resident", "swap", "auto"] = Field(
        "auto",
        description="resident: both models on the device; swap: one at a time via the cache; auto: resident when it fits.",
    )
    oom_retries: int = Field(
        3,
        ge=0,
        le=32,
        description="Out-of-memory retries; each halves loss.chunk_size and nothing else.",
    )
    min_chunk_size: int = Field(
        16, ge=1, le=1 << 20, description="Smallest chunk an OOM retry may reach."
    )
    auto_swap_vram_headroom_gb: float = Field(
        2.0,
        ge=0,
        le=4096,
        description="auto: free VRAM (GiB) that must remain after loading both models for resident.",
    )


class TrainConfig(_Section):
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
        2, ge=0, le=MAX_STEPS, description="Oracle-trace cross-entropy cycles before KD/OPD."
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


class EvalConfig(_Section):
    split: Literal["eval", "test"] = Field(
        "eval", description="Held-out split for baseline, warm-up and final evaluation."
    )
    max_tasks: int | None = Field(
        None, ge=1, le=MAX_TASKS, description="Evaluate at most this many tasks of the split."
    )
    temperature: float = Field(
        0.0, ge=0, le=MAX_TEMPERATURE, description="Evaluation sampling temperature (0 = greedy)."
    )
    teacher_gate_threshold: float = Field(
        0.95,
        ge=0,
        le=1,
        description="The benchmark refuses to start when the teacher's top-1 accuracy on the correct next action at student-visited states is below this (evaluation/teacher_gate.py).",
    )
    teacher_gate_tasks: int = Field(
        64,
        ge=1,
        le=MAX_TASKS,
        description="Validation tasks the cold-start student is rolled out on for the teacher gate.",
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


class CheckpointConfig(_Section):
    keep: int | None = Field(
        1,
        ge=1,
        description="Cycle checkpoints kept on disk (newest first); warmup and final are always kept. None: keep every one.",
    )


class LoggingConfig(_Section):
    tensorboard: bool = Field(
        False,
        description="Write TensorBoard scalars to <run>/tensorboard (needs the 'tensorboard' extra: tensorboardX).",
    )
    wandb: bool = Field(
        False,
        description="Log the same scalars to Weights & Biases in offline mode (never uses the network; sync later with 'wandb sync'). Needs wandb installed.",
    )
    wandb_project: str = Field("miniverl", min_length=1, description="wandb project name.")


class RunConfig(_Section):
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

    @model_validator(mode="after")
    def _validate_combination(self) -> RunConfig:
        """Reject contradictions of docs/design.md §2.1 and §4, each with its own message."""
        problems = list(_combination_problems(self))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # -- construction -------------------------------------------------------------

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any] | None, *, source: str = "<mapping>"
    ) -> RunConfig:
        """Validate a plain mapping, raising :class:`ConfigError` listing every problem."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{source}: a recipe must be a mapping of sections, got {type(data).__name__}"
            )
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source)) from None

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
        return (
            "\n".join(
                yaml.safe_dump(
                    {key: value}, sort_keys=True, default_flow_style=False, allow_unicode=True
                ).rstrip()
                for key, value in self.to_dict().items()
            )
            + "\n"
        )

    def digest(self) -> str:
        """SHA-256 of :meth:`to_yaml`; identical configs have identical digests."""
        return hashlib.sha256(self.to_yaml().encode("utf-8")).hexdigest()

    def with_overrides(self, overrides: Iterable[str]) -> RunConfig:
        return RunConfig.from_mapping(
            apply_overrides(self.to_dict(), overrides), source="<overrides>"
        )

    # -- derived views ------------------------------------------------------------

    def objective_label(self) -> str:
        """What the run optimizes, stated honestly (replay is not genuine OPD)."""
        if self.run.mode == "sft":
            return "supervised_fine_tuning_on_oracle_traces"
        if self.run.mode == "offline_kd":
            return "offline_knowledge_distillation"
        if self.train.opd_freshness == "replay" and self.train.replay_passes > 1:
            return "online_distillation_with_replay"
        return "on_policy_distillation"


def _combination_problems(cfg: RunConfig) -> Iterable[str]:
    mode = cfg.run.mode
    if mode == "opd" and cfg.cache.reuse_across_policy_versions:
        yield "run.mode: opd cannot set cache.reuse_across_policy_versions: true (on-policy targets must come from the current rollouts; only offline_kd may reuse a frozen cache)"
    if mode == "sft" and cfg.cache.reuse_across_policy_versions:
        yield "cache.reuse_across_policy_versions is only meaningful in run.mode: offline_kd"
    if mode == "opd" and not cfg.cache.strict_policy_version:
        yield "run.mode: opd requires cache.strict_policy_version: true (a target produced under another policy version is not on-policy)"
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
    if isinstance(cfg.loss.chunk_size, int) and cfg.loss.chunk_size < cfg.memory.min_chunk_size:
        yield f"loss.chunk_size {cfg.loss.chunk_size} is below memory.min_chunk_size {cfg.memory.min_chunk_size}"
    quantized = [
        role for role in ("student", "teacher") if getattr(cfg.models, role).quantization != "none"
    ]
    if cfg.models.backend == "toy" and quantized:
        yield f"models.backend: toy cannot be quantized (models.{quantized[0]}.quantization); quantization needs the hf backend on CUDA"
    if cfg.models.backend == "toy":
        for role in ("student", "teacher"):
            spec: ModelSpec = getattr(cfg.models, role)
            if spec.toy is None and spec.model_id not in TOY_PRESET_IDS:
                yield f"models.{role}.model_id {spec.model_id!r} is not a toy preset ({', '.join(TOY_PRESET_IDS)}); add a models.{role}.toy block"
    if cfg.models.backend == "hf":
        for role in ("student", "teacher"):
            if getattr(cfg.models, role).toy is not None:
                yield f"models.{role}.toy is only valid with models.backend: toy"
    if cfg.memory.strategy == "swap" and quantized:
        yield (
            f"memory.strategy: swap is unavailable with a quantized model (models.{quantized[0]}.quantization): "
            "bitsandbytes 4-bit and 8-bit parameters are pinned to the device they were quantized on; "
            "use memory.strategy: resident"
        )
    if cfg.memory.strategy == "swap" and not cfg.cache.enabled and mode != "sft":
        yield "memory.strategy: swap needs cache.enabled: true (targets survive evicting the teacher only through the cache)"
    if mode == "offline_kd" and not cfg.cache.enabled:
        yield "run.mode: offline_kd needs cache.enabled: true (it trains from one frozen teacher cache)"
    if cfg.rollout.max_total_tokens <= cfg.rollout.max_new_tokens_per_turn:
        yield f"rollout.max_total_tokens ({cfg.rollout.max_total_tokens}) must exceed rollout.max_new_tokens_per_turn ({cfg.rollout.max_new_tokens_per_turn})"
    tr = cfg.train
    if mode == "opd" and tr.opd_freshness == "strict" and tr.steps_per_rollout_batch() > 1:
        yield (
            f"train.opd_freshness: strict allows one optimizer step per rollout batch, but "
            f"rollouts_per_cycle={tr.rollouts_per_cycle} with gradient_accumulation_steps={tr.group_size()} "
            f"takes {tr.steps_per_rollout_batch()}; set train.gradient_accumulation_steps to {tr.rollouts_per_cycle} (or auto), "
            "or use train.opd_freshness: replay"
        )
    if tr.opd_freshness == "replay" and mode != "opd":
        yield "train.opd_freshness: replay only applies to run.mode: opd"
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
    if cfg.models.teacher_fit.enabled and cfg.models.runtime != "shared_backbone":
        yield "models.teacher_fit.enabled needs models.runtime: shared_backbone (the teacher adapter lives on the student's base)"
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


# -- YAML and overrides ---------------------------------------------------------------


def path_component_problem(name: str) -> str | None:
    """Why ``name`` is not one safe path component (``None`` when it is).

    Names become directory and file names (``runs/<run.name>``), so ``/``, ``\\``, ``..``,
    NUL and other control characters, and a leading ``-`` or ``.`` are refused.
    """
    if not name or len(name) > MAX_NAME_CHARS:
        return f"must be 1 to {MAX_NAME_CHARS} characters"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "must not contain NUL or other control characters"
    if "/" in name or "\\" in name:
        return "must be a single path component (no '/' or '\\')"
    if name in (".", "..") or name.startswith((".", "-")):
        return "must not be '.' or '..' or start with '.' or '-'"
    return None


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
    exactly as it would in the file.
    """
    result = _deep_copy(data)
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


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem, each with its dotted key path."""
    lines: list[str] = []
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
    return "\n".join([f"{source}: {len(lines)} configuration error(s)", *lines])


__all__ = [
    "ENVIRONMENT_NAME_PATTERN",
    "ENVIRONMENT_REF_PATTERN",
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
    "RunConfig",
    "RunSection",
    "SelectionConfig",
    "TeacherConfig",
    "ToyArchConfig",
    "ToyFitConfig",
    "TrainConfig",
    "apply_overrides",
    "format_validation_error",
    "load_yaml_mapping",
    "parse_override",
    "path_component_problem",
]
