"""Validate a ``miniverl export-verl`` directory against verl's own code (run in verl's venv).

Usage: ``python check_export.py EXPORT_DIR`` with miniverl's ``src`` on PYTHONPATH. Prints
one JSON object on the last line of stdout; exits non-zero on the first failed check.
Checks, each with verl's real classes:

1. compose ``verl/trainer/config/ppo_trainer.yaml`` with the exported overrides (Hydra),
   run verl's ``validate_config`` and build the dataclass configs with
   ``omega_conf_to_dataclass`` (distillation, actor, rollout, model, algorithm);
2. load both parquet files with ``RLHFDataset`` and compare prompts and ground truths
   with miniverl's own splits for the exported recipe;
3. instantiate the tool through ``initialize_tools_from_config`` and call it (create,
   execute, release) with a correct and a malformed call, comparing with
   ``ToolEnvironment.step``; and score a correct and a wrong ``<final>`` with the
   exported reward function.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path


def compose(export_dir: Path) -> tuple[object, dict]:
    import verl
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    doc = yaml.safe_load((export_dir / "overrides.yaml").read_text())
    os.environ[doc["export_dir_env"]] = str(export_dir)
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = hydra_compose(config_name=doc["config_name"], overrides=doc["overrides"])
    OmegaConf.resolve(cfg)
    # validate_config's vLLM LoRA-rank check imports vllm, which needs a GPU build; run it on
    # a copy with LoRA off and apply verl's own fallback rank list (vllm_rollout/utils.py).
    checked = OmegaConf.create(OmegaConf.to_container(cfg))
    lora_rank = int(checked.actor_rollout_ref.model.lora_rank)
    checked.actor_rollout_ref.model.lora_rank = 0
    validate_config(
        checked, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )
    assert 0 <= lora_rank <= 512, f"vLLM serves LoRA ranks up to 512, got {lora_rank}"
    distillation = omega_conf_to_dataclass(cfg.distillation)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    algorithm = omega_conf_to_dataclass(cfg.algorithm)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    assert distillation.enabled is True
    assert rollout.multi_turn.enable is True
    teacher = next(iter(distillation.teacher_models.values()))
    block = OmegaConf.to_container(cfg.distillation, resolve=True)
    summary = {
        "distillation_block": block,
        "resolved": {
            "loss_mode": distillation.distillation_loss.loss_mode,
            "topk": distillation.distillation_loss.topk,
            "use_topk": distillation.distillation_loss.loss_settings.use_topk,
            "use_policy_gradient": distillation.distillation_loss.use_policy_gradient,
            "use_task_rewards": distillation.distillation_loss.use_task_rewards,
            "teacher_model_path": teacher.model_path,
            "teacher_num_replicas": teacher.num_replicas,
            "teacher_prompt_length": teacher.inference.prompt_length,
            "max_assistant_turns": rollout.multi_turn.max_assistant_turns,
            "prompt_length": rollout.prompt_length,
            "response_length": rollout.response_length,
            "temperature": rollout.temperature,
            "lr": actor.optim.lr,
            "ppo_mini_batch_size": actor.ppo_mini_batch_size,
            "adv_estimator": str(algorithm.adv_estimator),
            "model_path": model.path,
            "lora_rank": model.lora_rank,
        },
    }
    return cfg, summary


def check_dataset(cfg: object, export_dir: Path) -> dict:
    import yaml
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from miniverl.config.models import RunConfig
    from miniverl.environments.base import make_splits
    from miniverl.environments.registry import make_environment

    recipe = RunConfig.from_yaml(export_dir / "recipe.resolved.yaml")
    env = make_environment(recipe.environment.name, **recipe.environment.params)
    splits = make_splits(
        env,
        {
            "train": recipe.environment.train_tasks,
            "eval": recipe.environment.eval_tasks,
            "test": recipe.environment.test_tasks,
        },
        recipe.environment.split_seed,
        recipe.environment.difficulty,
    )
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    schemas = yaml.safe_load((export_dir / "tools.yaml").read_text())["tools"]
    schemas = [t["tool_schema"] for t in schemas]
    counts: dict = {"longest_prompt_tokens": 0}
    for name, split in (("train", "train"), ("val", recipe.eval.split)):
        data_cfg = cfg.data
        ds = RLHFDataset(
            data_files=[str(export_dir / "data" / f"{name}.parquet")],
            tokenizer=tokenizer,
            config=data_cfg,
            max_samples=-1,
        )
        tasks = splits[split]
        assert len(ds) == len(tasks), (name, len(ds), len(tasks))
        for i, task in enumerate(tasks):
            row = ds[i]
            expected = [
                {"role": "system", "content": env.system_prompt()},
                {"role": "user", "content": task.prompt},
            ]
            got = [{"role": m["role"], "content": m["content"]} for m in row["raw_prompt"]]
            assert got == expected, (name, i, got, expected)
            assert row["reward_model"]["ground_truth"] == task.answer, (name, i)
            assert row["data_source"] == recipe.environment.name
            create = row["tools_kwargs"][env.tool_specs()[0].name]["create_kwargs"]
            assert create["task_id"] == task.task_id, (create, task.task_id)
            assert json.loads(create["data_json"]) == dict(task.data)
            ids = tokenizer.apply_chat_template(
                row["raw_prompt"], tools=schemas, add_generation_prompt=True, tokenize=True
            )
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            counts["longest_prompt_tokens"] = max(counts["longest_prompt_tokens"], len(ids))
            assert len(ids) <= cfg.data.max_prompt_length, (len(ids), cfg.data.max_prompt_length)
        counts[name] = len(ds)
    return counts


async def _call(tool: object, create_kwargs: dict, arguments: object) -> str:
    instance_id, _ = await tool.create(create_kwargs=create_kwargs)
    try:
        response, reward, _metrics = await tool.execute(instance_id, arguments)
    finally:
        await tool.release(instance_id)
    assert reward == 0.0
    return response.text


def check_tool(export_dir: Path) -> dict:
    import pyarrow.parquet as pq
    from verl.tools.base_tool import BaseTool
    from verl.tools.tool_registry import initialize_tools_from_config
    from verl.utils.import_utils import load_extern_object

    from miniverl.environments.base import ToolCall
    from miniverl.environments.registry import make_environment
    from miniverl.export.verl_tool import task_from_create_kwargs

    tools = initialize_tools_from_config(str(export_dir / "tools.yaml"))
    assert len(tools) == 1 and isinstance(tools[0], BaseTool), tools
    tool = tools[0]
    row = pq.read_table(export_dir / "data" / "train.parquet").slice(0, 1).to_pylist()[0]
    create_kwargs = row["extra_info"]["tools_kwargs"][tool.name]["create_kwargs"]
    task = task_from_create_kwargs(create_kwargs)
    expression = task.data["expressions"][0]
    env_params = json.loads(row["extra_info"]["environment_params_json"])
    env = make_environment(row["data_source"], **env_params)
    env.reset(task)
    cases = {
        "correct": {"expression": expression},
        "malformed_argument": {"expr": expression},
        "bad_expression": {"expression": "2 +* 3"},
        "not_a_string": {"expression": 7},
    }
    results = {}
    for label, arguments in cases.items():
        got = asyncio.run(_call(tool, create_kwargs, arguments))
        want = env.step(ToolCall(tool.name, arguments)).observation_text()
        assert got == want, (label, got, want)
        results[label] = got
    assert json.loads(results["correct"])["ok"] is True
    assert json.loads(results["malformed_argument"])["ok"] is False

    score = load_extern_object(str(export_dir / "miniverl_reward.py"), "compute_score")
    answer = row["reward_model"]["ground_truth"]
    right = score(row["data_source"], f"<final>\n{answer}\n</final>", answer, row["extra_info"])
    wrong = score(row["data_source"], f"<final>\n{answer}1\n</final>", answer, row["extra_info"])
    missing = score(row["data_source"], "no final block", answer, row["extra_info"])
    assert (right, wrong, missing) == (1.0, 0.0, 0.0), (right, wrong, missing)
    results["reward_right_wrong_missing"] = [right, wrong, missing]
    return results


def main() -> int:
    export_dir = Path(sys.argv[1]).resolve()
    cfg, summary = compose(export_dir)
    summary["dataset_rows"] = check_dataset(cfg, export_dir)
    summary["tool"] = check_tool(export_dir)
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
