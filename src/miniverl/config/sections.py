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
    model_validator,
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

ENVIRONMENT_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
ENVIRONMENT_REF_PATTERN = r"^(?:[a-z][a-z0-9_]{0,63}|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)$"
"""A registered or entry-point name, or ``package.module:ClassName`` (environments/registry.py)."""

Auto = Literal["auto"]


class _Section(BaseModel):
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


class RunSection(_Section):
    name: str = Field(
        "miniverl-run",
        description="Human-readable run name; also the default output directory name.",
        min_length=1,
        max_length=128,
    )
    mode: Literal["sft", "offline_kd", "opd", "seqkd", "kd_oracle", "gkd_mix"] = Field(
        "opd",
        description="sft: cross-entropy on oracle traces; offline_kd: one fixed trajectory set and one frozen teacher cache; opd: fresh student rollouts scored by the teacher every cycle; seqkd: cross-entropy on fresh teacher samples every cycle; kd_oracle: teacher targets at the oracle's states; gkd_mix: per batch, train.gkd_student_fraction student rollouts and the rest fresh teacher samples, all scored by the teacher.",
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
        description="torch CPU threads. auto: 1 for the toy backend on the CPU (tiny matrices only lose to thread contention, and one thread keeps its numerics machine-independent); the hf backend on the CPU: torch's count only when a short probe times the decode step's matmuls at least 15% faster with it than with 1 thread, else 1; torch's count on an accelerator. The decision and its timings are recorded in config.resolved.yaml.",
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
    omitted_at_default: ClassVar[tuple[str, ...]] = ("checkpoint",)

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
    checkpoint: str | None = Field(
        None,
        description="Teacher only: the trained student of another run as this teacher: a run directory (its checkpoints/final), one checkpoint directory, or a benchmark cold start. Its trainable tensors (the whole toy model, or the LoRA adapter on model_id) are loaded and frozen; model_id, toy and lora must describe that student. A teacher is then never fitted.",
    )


NoiseKind = Literal["operand_digit", "random_operands", "malformed_json", "bad_expression"]
DEFAULT_NOISE_KINDS: dict[str, float] = {
    "operand_digit": 0.5,
    "malformed_json": 0.25,
    "bad_expression": 0.25,
    "random_operands": 0.0,
}
"""Default ``models.toy_fit.noise_kinds``: corruption kind -> relative weight."""


class DaggerConfig(_Section):
    """Student-state fitting data for a fitted teacher (``training/teacher_fit.py``): the toy
    teacher (``models.toy_fit.dagger``) or the hf teacher adapter (``models.teacher_fit.dagger``).

    The cold-start student is rolled out on training tasks; every assistant turn it played
    is labelled with the oracle's next action from that state (after an error: the
    corrective re-call, ``environments/oracle_state.py``), and the teacher is fitted on
    those rows beside the oracle traces.
    """

    enabled: bool = Field(
        False,
        description="Add labelled student states to the toy teacher's fitting rows. A training run then fits the teacher after the SFT warm-up, on the warmed-up student's episodes; benchmarks/dagger_teacher_gate.py fits one from a stored cold start.",
    )
    rollouts_per_task: int = Field(
        1,
        ge=1,
        le=64,
        description="Student episodes per training task; episode i samples at temperatures[i % len(temperatures)].",
    )
    temperatures: list[float] = Field(
        default_factory=lambda: [1.0],
        min_length=1,
        max_length=16,
        description="Sampling temperatures of the student episodes: above 1 injects more errors, so more off-path states get labelled.",
    )
    tasks: int | None = Field(
        None,
        ge=1,
        le=MAX_TASKS,
        description="Roll out only the first N training tasks (None: every training task). Never an eval or test task.",
    )

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, value: list[float]) -> list[float]:
        bad = [t for t in value if not 0 <= t <= MAX_TEMPERATURE]
        if bad:
            raise ValueError(f"temperatures must lie in [0, {MAX_TEMPERATURE}], got {bad}")
        return value


class ToyFitConfig(_Section):
    omitted_at_default: ClassVar[tuple[str, ...]] = ("dagger",)

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
        description="Fraction of the fitting traces that get one tool call corrupted (a changed digit or a malformed call), the tool's real response, then the oracle's corrective re-call; the corrupted step is not supervised (training/teacher_fit.py).",
    )
    noise_kinds: dict[NoiseKind, float] = Field(
        default_factory=lambda: dict(DEFAULT_NOISE_KINDS),
        description="Relative weights of the corruption kinds drawn for a noisy trace: operand_digit (one digit of one number changed), random_operands (every number of the call replaced by an unrelated one), malformed_json, bad_expression (training/teacher_fit.py).",
    )
    noise_max_follow: int = Field(
        0,
        ge=0,
        le=8,
        description="A noisy trace whose corrupted call is valid carries on the wrong chain for 0..noise_max_follow further calls (each from the previous wrong result, none supervised) before the corrective re-call, as far as the turn budget allows.",
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
    dagger: DaggerConfig = Field(
        default_factory=DaggerConfig,
        description="Labelled cold-start student states added to the fitting rows (DAgger-style).",
    )

    @field_validator("noise_kinds")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: w for k, w in value.items() if not (math.isfinite(w) and w >= 0)}
        if bad or not any(w > 0 for w in value.values()):
            raise ValueError(
                "noise_kinds needs finite weights >= 0, at least one of them > 0 "
                f"(got {value}); e.g. {{operand_digit: 0.5, malformed_json: 0.5}}"
            )
        return value


class OracleTeacherConfig(_Section):
    """A teacher that is the environment's oracle policy, smoothed (teachers/oracle.py)."""

    omitted_at_default: ClassVar[tuple[str, ...]] = ("off_path",)

    smoothing: float = Field(
        0.001,
        gt=0,
        lt=1,
        description="Probability mass epsilon spread uniformly over the vocabulary: the teacher puts 1 - epsilon + epsilon/V on the oracle's next token from the current state (after an error: the corrective re-call) and epsilon/V on every other token.",
    )
    off_path: Literal["context", "turn_only"] = Field(
        "context",
        description="Which positions carry a target (teachers/oracle.py): context = every position where the oracle's continuation is defined (on its path, every turn start, and inside a deviated block of the right kind where the alignment says what comes next); turn_only = only the positions on the oracle's path of their turn (turn starts included). Positions without a target (a block of the wrong kind, a miscopied number, the action used up) leave the selection; EOS is never a target.",
    )


class TeacherFitConfig(_Section):
    """The HF analogue of ``toy_fit``: a teacher LoRA adapter fitted on the shared backbone."""

    omitted_at_default: ClassVar[tuple[str, ...]] = ("dagger",)

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
    dagger: DaggerConfig = Field(
        default_factory=DaggerConfig,
        description="Labelled states of the warmed-up student on training tasks added to the adapter's fitting rows (DAgger-style); the student's weights then enter the adapter's digest, so each cold start gets its own adapter.",
    )


def _default_student() -> ModelSpec:
    return ModelSpec(model_id="toy-student")


def _default_teacher() -> ModelSpec:
    return ModelSpec(model_id="toy-teacher", lora=LoraConfig(enabled=False))


class ModelsConfig(_Section):
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
    teacher: ModelSpec = Field(default_factory=_default_teacher, description="The frozen scorer.")
    toy_fit: ToyFitConfig = Field(
        default_factory=ToyFitConfig,
        description="How the toy teacher is fitted (toy backend only).",
    )
    teacher_fit: TeacherFitConfig = Field(
        default_factory=TeacherFitConfig,
        description="A fitted teacher adapter on a shared hf backbone (hf backend only).",
    )
    rollout_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype of the student's rollout weights (hf backend, dual_model runtime): bfloat16 decodes from a bf16 copy refreshed after every update, while training stays in the model's precision. auto: on the CPU with float32 weights, bfloat16 only when a short probe times the decode step's matmuls faster in bf16; otherwise the model's precision. The decision and its timings are recorded in config.resolved.yaml.",
    )
    oracle_teacher: OracleTeacherConfig | None = Field(
        None,
        description="Replace the teacher model by the environment's oracle policy, smoothed (toy backend, environments with an oracle, teacher.mode: standard); no teacher is fitted. Default: a teacher model.",
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
        8,
        ge=1,
        le=MAX_TASKS,
        description="Trajectories per padded teacher forward when scoring a cycle.",
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
    omitted_at_default: ClassVar[tuple[str, ...]] = ("activation_checkpointing",)

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
    activation_checkpointing: bool = Field(
        False,
        description="hf only: keep each decoder layer's input instead of its activations in a training forward (student update, teacher-adapter fit) and recompute the layer in the backward. The gradients are bit-identical; the activations a forward keeps shrink from about 1.2 MB to about 0.1 MB per token of SmolLM2-135M (float32) for one more forward per update (docs/performance.md).",
    )


class WarmupUntilConfig(_Section):
    """Cold start by criterion: warm up until the student is good enough, not for a fixed count."""

    metric: Literal["success", "success_at_k"] = Field(
        "success",
        description="success: greedy success on the validation (eval) split; success_at_k: the same on its tasks of chain length k only (calc_chain tasks carry k).",
    )
    k: int | None = Field(
        None,
        ge=1,
        le=64,
        description="success_at_k: the chain length whose validation tasks are measured (None for metric: success).",
    )
    threshold: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Stop after the first warm-up cycle whose measured success is >= this.",
    )
    max_cycles: int = Field(
        20,
        ge=1,
        le=MAX_STEPS,
        description="Cap: stop after this many warm-up cycles even when the threshold was never reached.",
    )
    check_every: int = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        description="Measure the criterion after every N-th warm-up cycle (and after the last); a measurement is a greedy validation rollout, so a long warm-up checks less often.",
    )

    @model_validator(mode="after")
    def _k_matches_metric(self) -> WarmupUntilConfig:
        if self.metric == "success_at_k" and self.k is None:
            raise ValueError("metric: success_at_k needs k (the chain length to measure)")
        if self.metric == "success" and self.k is not None:
            raise ValueError("k only applies to metric: success_at_k")
        return self


class TrainConfig(_Section):
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
        2, ge=0, le=MAX_STEPS, description="Oracle-trace cross-entropy cycles before KD/OPD."
    )
    sft_warmup_until: WarmupUntilConfig | None = Field(
        None,
        description="Warm up until greedy validation success reaches a threshold (at most max_cycles cycles) instead of for sft_warmup_cycles; needs sft_warmup_cycles: 0. Measured after every warm-up cycle on eval.max_tasks tasks of the eval split.",
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
        description="run.mode: gkd_mix only: the fraction λ of each batch's tasks rolled out by the student (the rest are fresh teacher samples).",
    )
    sft_noise_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="run.mode: sft only: the fraction of each cycle's oracle traces replaced by corrective traces (DART-style noise injection): one tool call corrupted (a changed digit, a malformed call or expression), the environment's answer to it, then the oracle's corrective re-call and the rest of its episode; the corrupted call is not trained on. The SFT warm-up of other modes never sees noise.",
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
    omitted_at_default: ClassVar[tuple[str, ...]] = (
        "teacher_gate_on_path",
        "teacher_gate_off_path",
        "teacher_gate_recovery",
        "teacher_gate_required",
    )

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
    teacher_gate_on_path: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Held-out state gate: minimum teacher top-1 agreement with the oracle label at every labelled position of student turns on the oracle's path (evaluation/teacher_gate.py, score_state_gate). None: not required.",
    )
    teacher_gate_off_path: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Held-out state gate: minimum top-1 agreement at positions after a student deviation (the corrective action's tokens); a privileged prediction (a number no earlier text of the transcript holds) counts as a miss. None: not required.",
    )
    teacher_gate_recovery: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Held-out state gate: minimum fraction of student episodes with a deviation that the teacher, continuing greedily from the first state after it, solves. None: not required.",
    )
    teacher_gate_required: bool = Field(
        True,
        description="The benchmark refuses to run arms on a cold start whose teacher gate failed. false: the gate is still measured and stored (teacher_gate.required: false in the cold-start cell), and the arms run on an ungated teacher; say so wherever the result is quoted.",
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


__all__ = [
    "ENVIRONMENT_NAME_PATTERN",
    "ENVIRONMENT_REF_PATTERN",
    "Auto",
    "CacheConfig",
    "CheckpointConfig",
    "DaggerConfig",
    "EnvironmentConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossConfig",
    "MemoryConfig",
    "ModelSpec",
    "ModelsConfig",
    "OracleTeacherConfig",
    "RolloutConfig",
    "RunSection",
    "SelectionConfig",
    "TeacherConfig",
    "TeacherFitConfig",
    "ToyArchConfig",
    "ToyFitConfig",
    "TrainConfig",
    "WarmupUntilConfig",
]
