"""The key ledger of ``miniverl export-verl``: one rule per recipe key, and the fixed overrides.

Each rule turns one leaf of the validated :class:`~miniverl.config.models.RunConfig` into a
:class:`KeyFate` (``mapped`` to named verl overrides, ``dropped`` with its value listed, or
``not applicable``) or a refusal string when dropping the key would change the objective.
The table is long because the recipe is: one entry per key, so a reviewer can check every
translation against verl 0.9.1's ``ppo_trainer.yaml`` in one place. Planning, the dataset
and the written files are ``lab/verl/export.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.config.modes import MODES, mode_of_kind
from miniverl.export.verl_tool import TOOL_CLASS_NAME
from miniverl.schemas.text import FINAL_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

VERL_VERSION = "0.9.1"
EXPORT_DIR_ENV = "MINIVERL_VERL_EXPORT"
"""run_verl.sh sets it to the export directory; overrides reference files through it."""
TOOL_CLASS = f"miniverl.export.verl_tool.{TOOL_CLASS_NAME}"
AGENT_LOOP = "tool_agent"
TOPK_AUTO = 64
"""``loss.top_k: auto`` resolves to min(64, V) at run start in miniverl; verl needs a number."""

MAPPED, DROPPED, NOT_APPLICABLE = "mapped", "dropped", "not applicable"


@dataclass(frozen=True)
class KeyFate:
    """What one recipe key became. ``verl`` names the override(s) or says why nothing."""

    key: str
    value: Any
    status: str
    verl: str
    note: str = ""


Rule = Callable[[Any, RunConfig], "KeyFate | str"]


ORACLE_TEACHER_REASON = (
    "lab.oracle_teacher: verl's teacher is a served checkpoint; the smoothed oracle policy "
    "(lab/teachers/oracle.py) is not a model it can load"
)
LAB_NOTE = "the lab's settings (how a teacher is fitted, the benchmark's gate): not part of a run"


def config_leaves(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a config dump; nested mappings are walked,
    except ``params`` (an environment's parameters are one opaque value)."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and key != "params":
            yield from config_leaves(value, dotted + ".")
        else:
            yield dotted, value


def _lab_rules(cfg: RunConfig, n_a: Any, refuse_unless: Any, warmup_until: Rule) -> dict[str, Rule]:
    """A rule for every leaf of the recipe's ``lab:`` section: an oracle teacher and a fitted
    teacher adapter are refused (verl's teacher is a served checkpoint), a warm-up criterion
    is dropped with the warm-up, everything else does not apply to a run verl trains."""
    rules: dict[str, Rule] = {}
    for key, _ in config_leaves({"lab": cfg.to_dict().get("lab") or {}}):
        if key.startswith("lab.oracle_teacher"):
            rules[key] = lambda v, _: ORACLE_TEACHER_REASON
        elif key == "lab.teacher_fit.enabled":
            rules[key] = refuse_unless(
                lambda v: not v,
                "lab.teacher_fit.enabled: verl serves the teacher as a separate replica of a checkpoint and cannot fit or switch a LoRA adapter on the student's base; merge the fitted adapter into a checkpoint and pass its directory as models.teacher.model_id",
                n_a("no fitted teacher adapter"),
            )
        elif key.startswith("lab.warmup_until"):
            rules[key] = warmup_until
        else:
            rules[key] = n_a(LAB_NOTE)
    return rules


def _rules(cfg: RunConfig, o: dict[str, Any], env_len: dict[str, Any]) -> dict[str, Rule]:
    """One rule per recipe key. A rule returns a KeyFate, or a string: the refusal reason.

    Rules also fill ``o``, the Hydra overrides, for the keys they map.
    """

    def mapped(verl_key: str | list[str], value: Any = None, note: str = "") -> Rule:
        keys = [verl_key] if isinstance(verl_key, str) else verl_key

        def rule(v: Any, _: RunConfig) -> KeyFate:
            for k in keys:
                o[k] = v if value is None else value
            return KeyFate("", v, MAPPED, ", ".join(keys), note)

        return rule

    def dropped(note: str) -> Rule:
        return lambda v, _: KeyFate("", v, DROPPED, "(none)", note)

    def n_a(note: str) -> Rule:
        return lambda v, _: KeyFate("", v, NOT_APPLICABLE, "(none)", note)

    def refuse_unless(ok: Callable[[Any], bool], reason: str, fate: Rule) -> Rule:
        return lambda v, c: fate(v, c) if ok(v) else reason

    mode = cfg.run.mode
    divergence = cfg.loss.divergence
    loss_mode = "forward_kl_topk" if divergence == "forward_kl" else "k3"
    topk = cfg.loss.top_k if isinstance(cfg.loss.top_k, int) else TOPK_AUTO
    prompt_len = env_len["prompt"]
    response_len = cfg.rollout.max_total_tokens - prompt_len

    def rollout_bounds(v: Any, _: RunConfig) -> KeyFate | str:
        if response_len <= cfg.rollout.max_new_tokens_per_turn:
            return (
                f"rollout.max_total_tokens {v} leaves {response_len} response tokens after the "
                f"{prompt_len}-token prompt bound; raise it above {prompt_len + cfg.rollout.max_new_tokens_per_turn}"
                " or pass --max-prompt-tokens with the measured prompt length"
            )
        o["data.max_prompt_length"] = prompt_len
        o["data.max_response_length"] = response_len
        return KeyFate(
            "",
            v,
            MAPPED,
            "data.max_prompt_length, data.max_response_length",
            f"split as prompt {prompt_len} ({env_len['source']}) + response "
            f"{response_len}; verl's response budget covers all turns and tool results, as here",
        )

    def distill_loss(v: Any, _: RunConfig) -> KeyFate | str:
        if v not in ("forward_kl", "reverse_kl"):
            return f"loss.divergence: {v} has no verl 0.9.1 distillation loss (only forward_kl_topk and the k1/k3 reverse-KL estimators); use forward_kl or reverse_kl"
        o["distillation.distillation_loss.loss_mode"] = loss_mode
        o["distillation.distillation_loss.use_policy_gradient"] = False
        note = (
            "forward KL over the teacher's top-k only (verl renormalises nothing, clamps the per-token loss at >= 0); miniverl adds a tail bucket"
            if v == "forward_kl"
            else "k3 single-sample estimator of reverse KL at the sampled token, backpropagated; miniverl computes reverse KL over top-k + tail buckets"
        )
        return KeyFate(
            "", v, MAPPED, "distillation.distillation_loss.loss_mode", f"{loss_mode}: {note}"
        )

    def top_k(v: Any, _: RunConfig) -> KeyFate:
        if divergence != "forward_kl":
            return KeyFate(
                "", v, DROPPED, "(none)", "k3 uses only the sampled token's log-probabilities"
            )
        o["distillation.distillation_loss.topk"] = topk
        return KeyFate(
            "",
            v,
            MAPPED,
            "distillation.distillation_loss.topk",
            f"{topk}" + (" (auto resolved to 64; miniverl uses min(64, V))" if v == "auto" else ""),
        )

    def student_path(v: Any, _: RunConfig) -> KeyFate:
        o["actor_rollout_ref.model.path"] = v
        return KeyFate("", v, MAPPED, "actor_rollout_ref.model.path")

    def teacher_path(v: Any, c: RunConfig) -> KeyFate:
        o["distillation.teacher_models.teacher_model.model_path"] = v
        note = ""
        if c.models.runtime == "shared_backbone":
            note = (
                "shared_backbone: the teacher is the base model, served as a separate verl replica"
            )
        return KeyFate("", v, MAPPED, "distillation.teacher_models.teacher_model.model_path", note)

    def precision(v: Any, _: RunConfig) -> KeyFate:
        dtype = "bfloat16" if v == "auto" else v
        o["actor_rollout_ref.rollout.dtype"] = dtype
        return KeyFate(
            "",
            v,
            MAPPED,
            "actor_rollout_ref.rollout.dtype",
            f"{dtype}; the teacher inherits it through ${{oc.select:actor_rollout_ref.rollout.dtype}}; FSDP keeps fp32 master weights",
        )

    def teacher_precision(v: Any, c: RunConfig) -> KeyFate | str:
        student = c.models.student.precision
        if v not in (student, "auto") and not (student == "auto" and v == "bfloat16"):
            return f"models.teacher.precision {v} differs from models.student.precision {student}; verl 0.9.1 serves the teacher in the rollout dtype. Set both to the same value"
        return KeyFate("", v, MAPPED, "(via actor_rollout_ref.rollout.dtype)")

    def lora_enabled(v: Any, c: RunConfig) -> KeyFate:
        spec = c.models.student.lora
        if not v:
            o["actor_rollout_ref.model.lora_rank"] = 0
            return KeyFate(
                "", v, MAPPED, "actor_rollout_ref.model.lora_rank", "0: full fine-tuning"
            )
        o["actor_rollout_ref.model.lora_rank"] = spec.r
        o["actor_rollout_ref.model.lora_alpha"] = spec.alpha
        o["actor_rollout_ref.model.target_modules"] = (
            spec.target_modules if spec.target_modules else "all-linear"
        )
        return KeyFate("", v, MAPPED, "actor_rollout_ref.model.lora_rank (from lora.r)")

    def lora_target(v: Any, c: RunConfig) -> KeyFate:
        if not c.models.student.lora.enabled:
            return KeyFate("", v, NOT_APPLICABLE, "(none)", "LoRA disabled")
        note = "" if v else "None (miniverl: attention + MLP projections) becomes verl's all-linear"
        return KeyFate("", v, MAPPED, "actor_rollout_ref.model.target_modules", note)

    def schedule(v: Any, _: RunConfig) -> KeyFate | str:
        if v == "linear":
            return "train.schedule: linear has no verl FSDP optimizer equivalent (constant or cosine); choose one of those"
        o["actor_rollout_ref.actor.optim.lr_scheduler_type"] = v
        return KeyFate("", v, MAPPED, "actor_rollout_ref.actor.optim.lr_scheduler_type")

    def freshness(v: Any, c: RunConfig) -> KeyFate:
        epochs = c.train.replay_passes if v == "replay" else 1
        o["actor_rollout_ref.actor.ppo_epochs"] = epochs
        return KeyFate(
            "",
            v,
            MAPPED,
            "actor_rollout_ref.actor.ppo_epochs",
            f"{epochs} pass(es) per rollout batch",
        )

    def eval_temperature(v: Any, _: RunConfig) -> KeyFate:
        o["actor_rollout_ref.rollout.val_kwargs.temperature"] = v
        o["actor_rollout_ref.rollout.val_kwargs.do_sample"] = v > 0
        return KeyFate(
            "", v, MAPPED, "actor_rollout_ref.rollout.val_kwargs.temperature, .do_sample"
        )

    def eval_split(v: Any, _: RunConfig) -> KeyFate:
        return KeyFate("", v, MAPPED, "data/val.parquet", f"val.parquet holds the {v} split")

    def max_tasks(v: Any, _: RunConfig) -> KeyFate:
        o["data.val_max_samples"] = -1 if v is None else v
        return KeyFate("", v, MAPPED, "data.val_max_samples")

    def sft_warmup(v: Any, _: RunConfig) -> KeyFate:
        note = "verl's ppo_trainer has no oracle-trace warm-up: warm the student first (miniverl sft, or verl's sft_trainer) and export with models.student.model_id=<that checkpoint>"
        return KeyFate("", v, DROPPED if v else NOT_APPLICABLE, "(none)", note)

    def sft_warmup_until(v: Any, _: RunConfig) -> KeyFate:
        note = "verl has no oracle-trace warm-up, so none by criterion either (see train.sft_warmup_cycles)"
        return KeyFate("", v, NOT_APPLICABLE if v is None else DROPPED, "(none)", note)

    def only_default(key: str, default: Any, why: str) -> Rule:
        def rule(v: Any, c: RunConfig) -> KeyFate | str:
            if v == default:
                return KeyFate("", v, NOT_APPLICABLE, "(none)", "the default, which verl matches")
            return f"{key}: {v!r} {why}"

        return rule

    cache_note = "verl recomputes teacher targets for every rollout batch; there is no teacher cache (equivalent to strict OPD without reuse)"
    memory_note = "verl manages memory with FSDP sharding/offload and vLLM's gpu_memory_utilization"
    rules: dict[str, Rule] = {
        "run.name": mapped("trainer.experiment_name"),
        "run.mode": refuse_unless(
            lambda v: MODES[v].trajectories == "student",
            f"run.mode: {mode} — verl's distillation is on-policy only; export an opd recipe (sft/offline_kd have no ppo_trainer equivalent)",
            mapped("distillation.enabled", True, "opd -> on-policy distillation"),
        ),
        "run.seed": mapped(
            ["data.seed", "actor_rollout_ref.rollout.seed"],
            note="verl's dataloader shuffle and rollout sampling seed (the splits themselves come from environment.split_seed)",
        ),
        "run.cpu_threads": dropped("no CPU thread knob in verl"),
        "models.backend": refuse_unless(
            lambda v: v == "hf",
            "models.backend: toy — verl needs a Hugging Face model (models.backend: hf with a checkpoint path or hub id); the toy decoder and tokenizer exist only inside miniverl",
            n_a("hf checkpoints are what verl loads"),
        ),
        "models.device": dropped("verl places workers on trainer.n_gpus_per_node GPUs"),
        "models.runtime": n_a("verl always runs separate student and teacher replicas"),
        "models.rollout_dtype": dropped(
            "verl's rollout engine sets its own dtype (actor_rollout_ref.rollout.dtype); a CPU rollout copy does not carry over"
        ),
        "models.student.model_id": student_path,
        "models.student.revision": refuse_unless(
            lambda v: v is None,
            "models.student.revision is set but verl loads model paths without a revision; download that revision and pass its directory as models.student.model_id",
            n_a("no revision pinned"),
        ),
        "models.student.tokenizer_id": lambda v, _: (
            mapped("actor_rollout_ref.model.tokenizer_path")(v, _)
            if v
            else KeyFate("", v, NOT_APPLICABLE, "(none)", "tokenizer from the model path")
        ),
        "models.student.precision": precision,
        "models.student.quantization": lambda v, _: KeyFate(
            "",
            v,
            DROPPED if v != "none" else NOT_APPLICABLE,
            "(none)",
            "verl trains the student unquantized (bf16 compute, fp32 FSDP master weights): QLoRA numerics do not carry over"
            if v != "none"
            else "",
        ),
        "models.student.lora.enabled": lora_enabled,
        "models.student.lora.r": lambda v, c: KeyFate(
            "",
            v,
            MAPPED if c.models.student.lora.enabled else NOT_APPLICABLE,
            "actor_rollout_ref.model.lora_rank",
        ),
        "models.student.lora.alpha": lambda v, c: KeyFate(
            "",
            v,
            MAPPED if c.models.student.lora.enabled else NOT_APPLICABLE,
            "actor_rollout_ref.model.lora_alpha",
        ),
        "models.student.lora.dropout": lambda v, c: KeyFate(
            "",
            v,
            DROPPED if (v and c.models.student.lora.enabled) else NOT_APPLICABLE,
            "(none)",
            "verl's FSDP LoRA has no adapter dropout" if v else "",
        ),
        "models.student.lora.target_modules": lora_target,
        "models.teacher.model_id": teacher_path,
        "models.teacher.revision": refuse_unless(
            lambda v: v is None,
            "models.teacher.revision is set but verl loads the teacher path without a revision; download that revision and pass its directory as models.teacher.model_id",
            n_a("no revision pinned"),
        ),
        "models.teacher.precision": teacher_precision,
        "models.teacher.quantization": lambda v, _: KeyFate(
            "",
            v,
            DROPPED if v != "none" else NOT_APPLICABLE,
            "(none)",
            "the teacher is served unquantized by vLLM" if v != "none" else "",
        ),
        "models.teacher.checkpoint": refuse_unless(
            lambda v: v is None,
            "models.teacher.checkpoint: verl serves the teacher as a separate replica of a checkpoint and cannot load a LoRA adapter of another run into it; merge that student into a checkpoint and pass its directory as models.teacher.model_id",
            n_a("the teacher is the base model models.teacher.model_id names"),
        ),
        **_lab_rules(cfg, n_a, refuse_unless, sft_warmup_until),
        "environment.name": lambda v, _: KeyFate(
            "",
            v,
            MAPPED,
            "data_source (parquet), tools.yaml config.environment",
            "the tool adapter rebuilds it from miniverl's registry",
        ),
        "environment.params": lambda v, _: KeyFate(
            "",
            v,
            MAPPED,
            "tools.yaml config.environment_params + extra_info.environment_params_json",
        ),
        "environment.tasks": lambda v, _: KeyFate(
            "",
            v,
            MAPPED,
            "data/*.parquet rows (dealt from the task file, as miniverl deals them)"
            if v
            else "(none: tasks are sampled)",
        ),
        "environment.difficulty": lambda v, _: KeyFate(
            "", v, MAPPED, "data/*.parquet rows (make_splits)"
        ),
        "environment.train_tasks": lambda v, _: KeyFate(
            "", v, MAPPED, "rows of data/train.parquet"
        ),
        "environment.eval_tasks": lambda v, _: KeyFate(
            "", v, MAPPED, "rows of data/val.parquet when eval.split is eval"
        ),
        "environment.test_tasks": lambda v, _: KeyFate(
            "",
            v,
            MAPPED,
            "rows of data/val.parquet when eval.split is test; drawn either way so splits match miniverl",
        ),
        "environment.split_seed": lambda v, _: KeyFate(
            "", v, MAPPED, "data/*.parquet (make_splits seed)"
        ),
        "rollout.max_turns": mapped(["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"]),
        "rollout.max_new_tokens_per_turn": dropped(
            "verl bounds the whole response (data.max_response_length), not each turn"
        ),
        "rollout.max_total_tokens": rollout_bounds,
        "rollout.temperature": refuse_unless(
            lambda v: v > 0,
            "rollout.temperature: 0 (greedy) — verl's rollout samples; set a temperature > 0",
            mapped("actor_rollout_ref.rollout.temperature"),
        ),
        "rollout.max_parse_errors": dropped(
            "verl's ToolAgentLoop does not stop on unparseable turns; it ends the episode when a turn has no tool call"
        ),
        "rollout.max_repeated_calls": dropped("verl has no repeated-call stop"),
        "rollout.batch_size": dropped("decode batching; verl's rollout engine batches by itself"),
        "selection.selector": only_default(
            "selection.selector",
            "all_model_tokens",
            "has no verl equivalent: verl supervises every response token the model generated",
        ),
        "selection.ratio": lambda v, c: KeyFate(
            "", v, NOT_APPLICABLE, "(none)", "used only by uniform_ratio/hybrid"
        ),
        "selection.critical_weight": only_default(
            "selection.critical_weight",
            1.0,
            "re-weights tokens; verl weights every response token equally",
        ),
        "selection.other_weight": only_default(
            "selection.other_weight",
            1.0,
            "re-weights tokens; verl weights every response token equally",
        ),
        "teacher.mode": only_default(
            "teacher.mode",
            "standard",
            "— verl's teacher scores the student's exact context; privileged context cannot be expressed",
        ),
        "teacher.batch_size": dropped("scoring batch size; verl's teacher pool batches by itself"),
        "loss.mode": refuse_unless(
            lambda v: v == "bucketed",
            "loss.mode: exact_full_vocab — verl 0.9.1 has no full-vocabulary distillation loss; use loss.mode: bucketed (exported as top-k)",
            lambda v, _: KeyFate(
                "",
                v,
                MAPPED,
                "distillation.distillation_loss.loss_mode",
                "bucketed -> top-k (see divergence)",
            ),
        ),
        "loss.divergence": distill_loss,
        "loss.jsd_beta": n_a("used only by divergence jsd"),
        "loss.top_k": top_k,
        "loss.temperature": only_default(
            "loss.temperature", 1.0, "— verl has no distillation temperature"
        ),
        "loss.chunk_size": dropped("memory knob; verl chunks top-k only with use_chunked_topk"),
        "loss.sampled_token_nll_weight": only_default(
            "loss.sampled_token_nll_weight", 0.0, "— verl has no auxiliary sampled-token NLL term"
        ),
        "loss.entropy_threshold": n_a("used only by divergence entropy_aware"),
        "loss.entropy_forward_weight": n_a("used only by divergence entropy_aware"),
        **{f"cache.{k}": dropped(cache_note) for k in cfg.cache.model_dump()},
        **{f"memory.{k}": dropped(memory_note) for k in cfg.memory.model_dump()},
        "train.lr": mapped("actor_rollout_ref.actor.optim.lr"),
        "train.schedule": schedule,
        "train.warmup_steps": mapped("actor_rollout_ref.actor.optim.lr_warmup_steps"),
        "train.min_lr_ratio": lambda v, c: (
            mapped("actor_rollout_ref.actor.optim.min_lr_ratio")(v, c)
            if c.train.schedule == "cosine"
            else KeyFate("", v, NOT_APPLICABLE, "(none)", "constant schedule")
        ),
        "train.weight_decay": mapped("actor_rollout_ref.actor.optim.weight_decay"),
        "train.betas": lambda v, c: mapped("actor_rollout_ref.actor.optim.betas", list(v))(v, c),
        "train.max_grad_norm": lambda v, c: mapped(
            ["actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.clip_grad"],
            1e9 if v is None else v,
            "None (no clipping) becomes 1e9",
        )(v, c),
        "train.cycles": mapped(
            "trainer.total_training_steps", note="one verl step = one rollout batch + its update(s)"
        ),
        "train.rollouts_per_cycle": mapped(
            ["data.train_batch_size"], note="with actor_rollout_ref.rollout.n=1"
        ),
        "train.gradient_accumulation_steps": lambda v, c: mapped(
            "actor_rollout_ref.actor.ppo_mini_batch_size", c.train.group_size()
        )(v, c),
        "train.trajectory_batch_size": lambda v, c: mapped(
            [
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
            ],
            c.train.group_size() if v == "auto" else v,
            "per GPU in verl",
        )(v, c),
        "train.sft_warmup_cycles": sft_warmup,
        "train.sft_lr": n_a("warm-up only"),
        "train.gkd_student_fraction": n_a(
            f"{mode_of_kind('mixed').name} only; a verl export needs run.mode: "
            f"{mode_of_kind('student').name}"
        ),
        "train.opd_freshness": freshness,
        "train.replay_passes": lambda v, c: KeyFate(
            "",
            v,
            MAPPED if c.train.opd_freshness == "replay" else NOT_APPLICABLE,
            "actor_rollout_ref.actor.ppo_epochs",
        ),
        "train.checkpoint_every": mapped("trainer.save_freq"),
        "eval.split": eval_split,
        "eval.max_tasks": max_tasks,
        "eval.temperature": eval_temperature,
        "eval.baseline": mapped("trainer.val_before_train"),
        "eval.after_warmup": n_a("no warm-up in verl"),
        "eval.every": dropped(
            "miniverl's periodic held-out evaluation; verl's is trainer.test_freq (not set by the export)"
        ),
        "checkpoint.keep": dropped(
            "miniverl's cycle-checkpoint retention; verl keeps checkpoints by its own trainer settings"
        ),
        "logging.tensorboard": dropped(
            "miniverl-side scalar mirror; verl logs through trainer.logger"
        ),
        "logging.wandb": dropped(
            "miniverl-side offline wandb mirror; verl logs through trainer.logger"
        ),
        "eval.batch_size": dropped("decode batching; verl's rollout engine batches by itself"),
    }
    return rules


def _fixed_overrides(cfg: RunConfig) -> dict[str, Any]:
    """verl settings the export always makes (not driven by one recipe key); listed in MAPPING.md."""
    d = f"${{oc.env:{EXPORT_DIR_ENV}}}"
    return {
        "data.train_files": f"{d}/data/train.parquet",
        "data.val_files": f"{d}/data/val.parquet",
        "data.return_raw_chat": True,
        "data.truncation": "error",
        "data.filter_overlong_prompts": False,
        "data.dataloader_num_workers": 0,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": 1,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.multi_turn.enable": True,
        "actor_rollout_ref.rollout.multi_turn.format": "hermes",
        "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": 1,
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": f"{d}/tools.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_LOOP,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "algorithm.use_kl_in_reward": False,
        "algorithm.adv_estimator": "grpo",
        "distillation.distillation_loss.use_task_rewards": False,
        "distillation.n_gpus_per_node": 1,
        "distillation.nnodes": 1,
        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size": 1,
        "reward.custom_reward_function.path": f"{d}/miniverl_reward.py",
        "reward.custom_reward_function.name": "compute_score",
        "trainer.project_name": "miniverl-export",
        "trainer.n_gpus_per_node": 1,
        "trainer.nnodes": 1,
        "trainer.test_freq": max(1, cfg.train.cycles),
        "trainer.logger": ["console"],
    }


FIXED_NOTES = {
    "algorithm.adv_estimator": "grpo needs no critic; with use_task_rewards=false the distillation loss is the only training signal, as in miniverl opd",
    "distillation.distillation_loss.use_task_rewards": "miniverl opd trains on the divergence alone; the verifier only scores evaluation",
    "distillation.n_gpus_per_node": "teacher pool: 1 GPU to start; scale with trainer.n_gpus_per_node",
    "actor_rollout_ref.rollout.multi_turn.format": f"hermes parses {TOOL_CALL_OPEN}{{json}}{TOOL_CALL_CLOSE}, the block miniverl's protocol emits",
    "reward.custom_reward_function.path": f"the environment's exact verifier on the last {FINAL_OPEN} block",
    "trainer.test_freq": "train.cycles: evaluate once at the end, as miniverl's final evaluation",
    "data.train_files": f"files are found through ${EXPORT_DIR_ENV}, which run_verl.sh sets, so the directory can move",
}


__all__ = [
    "AGENT_LOOP",
    "DROPPED",
    "EXPORT_DIR_ENV",
    "FIXED_NOTES",
    "MAPPED",
    "NOT_APPLICABLE",
    "TOOL_CLASS",
    "TOPK_AUTO",
    "VERL_VERSION",
    "KeyFate",
    "Rule",
]
