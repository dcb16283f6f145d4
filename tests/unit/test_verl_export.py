"""``miniverl export-verl`` inside miniverl's own environment (no verl needed).

The ledger (every recipe key has a rule and one fate), the refusals, the override values
mapped from the recipe, the parquet rows against ``make_splits``, the tool adapter's
pure functions against ``CalculatorEnvironment.step``, and the CLI's files and errors.
Validation against verl's own code lives in tests/integration/test_verl_export_against_verl.py.
"""

from __future__ import annotations

import builtins
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO_ROOT, SRC_DIR
from miniverl.config.models import RunConfig
from miniverl.environments.base import ToolCall, make_splits
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.errors import BackendError, ConfigError
from miniverl.export import verl_tool
from miniverl.lab.verl import export as vx
from miniverl.lab.verl import ledger

TINY_RECIPE = REPO_ROOT / "tests" / "data" / "verl_export" / "tiny_hf_opd.yaml"
TOY_RECIPE = REPO_ROOT / "recipes" / "toy_calculator.yaml"


def _hf(**overrides: str) -> RunConfig:
    items = [f"{k}={v}" for k, v in overrides.items()]
    return RunConfig.from_yaml(TINY_RECIPE, items)


def _leaf_keys(cfg: RunConfig) -> list[str]:
    return [k for k, _ in ledger.config_leaves(cfg.to_dict())]


# -- the ledger ---------------------------------------------------------------------------


def test_every_recipe_key_has_an_explicit_rule_and_exactly_one_fate() -> None:
    cfg = _hf()
    plan = vx.plan_export(cfg)
    keys = [f.key for f in plan.fates]
    assert keys == _leaf_keys(cfg)
    assert len(keys) == len(set(keys))
    unruled = [f.key for f in plan.fates if "no verl mapping rule" in f.note]
    assert unruled == [], f"add a rule in lab/verl/ledger.py _rules for: {unruled}"
    assert {f.status for f in plan.fates} <= {ledger.MAPPED, ledger.DROPPED, ledger.NOT_APPLICABLE}
    dropped = {f.key for f in plan.dropped()}
    assert dropped >= {
        "cache.enabled", "cache.strict_policy_version", "memory.strategy", "run.cpu_threads",
        "rollout.max_parse_errors", "rollout.max_repeated_calls", "rollout.max_new_tokens_per_turn",
    }  # fmt: skip
    assert not dropped & {"train.lr", "loss.divergence", "models.student.model_id"}


def test_a_key_without_a_rule_is_listed_as_dropped_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = vx._rules

    def without_lr(cfg, o, lengths):  # type: ignore[no-untyped-def]
        rules = real(cfg, o, lengths)
        del rules["train.lr"]
        return rules

    monkeypatch.setattr(vx, "_rules", without_lr)
    plan = vx.plan_export(_hf())
    fate = next(f for f in plan.fates if f.key == "train.lr")
    assert fate.status == ledger.DROPPED and "no verl mapping rule" in fate.note
    assert fate in plan.dropped()
    assert "actor_rollout_ref.actor.optim.lr" not in plan.overrides


def test_toy_backend_is_refused_saying_verl_needs_a_hugging_face_model() -> None:
    with pytest.raises(ConfigError) as err:
        vx.plan_export(RunConfig.from_yaml(TOY_RECIPE))
    assert "models.backend: toy — verl needs a Hugging Face model" in err.value.message


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("loss.divergence=jsd", "loss.divergence: jsd has no verl 0.9.1 distillation loss"),
        ("loss.divergence=entropy_aware", "loss.divergence: entropy_aware has no verl"),
        ("loss.mode=exact_full_vocab", "loss.mode: exact_full_vocab"),
        ("selection.selector=tool_and_final", "selection.selector: 'tool_and_final'"),
        ("selection.other_weight=0.5", "selection.other_weight: 0.5"),
        ("teacher.mode=privileged_context", "teacher.mode: 'privileged_context'"),
        ("loss.temperature=2.0", "loss.temperature: 2.0"),
        ("loss.sampled_token_nll_weight=0.1", "loss.sampled_token_nll_weight: 0.1"),
        ("train.schedule=linear", "train.schedule: linear"),
        ("rollout.temperature=0", "rollout.temperature: 0 (greedy)"),
        ("run.mode=sft", "run.mode: sft"),
        ("models.student.revision=abc123", "models.student.revision is set"),
        ("models.teacher.tokenizer_id=x", "models.teacher.tokenizer_id"),
        ("models.teacher.precision=float16", "models.teacher.precision float16 differs"),
        ("rollout.max_total_tokens=600", "rollout.max_total_tokens 600 leaves"),
    ],
)
def test_objective_changing_values_are_refused_with_their_key(override: str, fragment: str) -> None:
    key, value = override.split("=")
    extra = {"loss.top_k": "null"} if override == "loss.mode=exact_full_vocab" else {}
    with pytest.raises(ConfigError) as err:
        vx.plan_export(_hf(**{key: value}, **extra))
    assert fragment in err.value.message


def test_a_fitted_teacher_adapter_is_refused() -> None:
    cfg = _hf(
        **{
            "models.runtime": "shared_backbone",
            "models.teacher.model_id": _hf().models.student.model_id,
            "models.teacher_fit.enabled": "true",
        }
    )
    with pytest.raises(ConfigError) as err:
        vx.plan_export(cfg)
    assert "lab.teacher_fit.enabled: verl serves the teacher as a separate replica" in (
        err.value.message
    )


def test_all_refusals_are_listed_together() -> None:
    with pytest.raises(ConfigError) as err:
        vx.plan_export(_hf(**{"loss.divergence": "jsd", "teacher.mode": "privileged_context"}))
    lines = [ln for ln in err.value.message.splitlines() if ln.startswith("  - ")]
    assert len(lines) == 2


# -- mapped values ------------------------------------------------------------------------


def test_distillation_and_rollout_overrides_are_mapped_from_the_recipe() -> None:
    cfg = _hf()
    o = vx.plan_export(cfg).overrides
    assert o["distillation.enabled"] is True
    assert o["distillation.distillation_loss.loss_mode"] == "forward_kl_topk"
    assert o["distillation.distillation_loss.topk"] == 16
    assert o["distillation.distillation_loss.use_policy_gradient"] is False
    assert o["distillation.distillation_loss.use_task_rewards"] is False
    assert o["distillation.teacher_models.teacher_model.model_path"] == "PLACEHOLDER_TEACHER_DIR"
    assert o["actor_rollout_ref.model.path"] == "PLACEHOLDER_STUDENT_DIR"
    assert o["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"] == 3
    assert o["data.max_prompt_length"] + o["data.max_response_length"] == 1024
    assert o["actor_rollout_ref.rollout.temperature"] == 0.8
    assert o["actor_rollout_ref.actor.optim.lr"] == 0.0005
    assert o["actor_rollout_ref.actor.optim.lr_scheduler_type"] == "cosine"
    assert o["trainer.total_training_steps"] == 3
    assert o["data.train_batch_size"] == 4
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == 4
    assert o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 2
    assert o["actor_rollout_ref.model.lora_rank"] == 4
    assert o["actor_rollout_ref.model.lora_alpha"] == 8.0
    assert o["data.seed"] == 11


def test_reverse_kl_maps_to_k3_and_top_k_is_dropped_as_unused() -> None:
    plan = vx.plan_export(_hf(**{"loss.divergence": "reverse_kl"}))
    assert plan.overrides["distillation.distillation_loss.loss_mode"] == "k3"
    assert "distillation.distillation_loss.topk" not in plan.overrides
    assert any(f.key == "loss.top_k" for f in plan.dropped())


def test_auto_top_k_resolves_to_64_and_replay_sets_ppo_epochs() -> None:
    o = vx.plan_export(
        _hf(**{"loss.top_k": "auto", "train.opd_freshness": "replay", "train.replay_passes": "3"})
    ).overrides
    assert o["distillation.distillation_loss.topk"] == 64
    assert o["actor_rollout_ref.actor.ppo_epochs"] == 3


def test_prompt_bound_covers_messages_and_tool_schemas() -> None:
    msgs = [[{"role": "system", "content": "x" * 100}, {"role": "user", "content": "y" * 50}]]
    schema = [{"a": "b"}]
    bound = vx.prompt_length_bound(msgs, schema)
    raw = (
        150
        + 2 * vx.PROMPT_OVERHEAD_TOKENS
        + len(json.dumps(schema))
        + 4 * vx.PROMPT_OVERHEAD_TOKENS
    )
    assert bound == -(-raw // 8) * 8 and bound % 8 == 0 and bound >= raw


def test_max_prompt_tokens_replaces_the_character_bound() -> None:
    cfg = _hf(**{"rollout.max_total_tokens": "300"})
    with pytest.raises(ConfigError, match="--max-prompt-tokens"):
        vx.plan_export(cfg)
    o = vx.plan_export(cfg, max_prompt_tokens=128).overrides
    assert (o["data.max_prompt_length"], o["data.max_response_length"]) == (128, 172)
    with pytest.raises(ConfigError, match="must be >= 1"):
        vx.plan_export(cfg, max_prompt_tokens=0)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (0.5, "0.5"),
        ([0.9, 0.999], "[0.9,0.999]"),
        ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"),
        ("a b", "'a b'"),
        ("it's", "'it\\'s'"),
        ("true", "'true'"),
    ],
)
def test_hydra_value_quotes_what_hydra_would_misread(value: object, text: str) -> None:
    assert vx.hydra_value(value) == text


# -- rows ---------------------------------------------------------------------------------


def test_rows_are_miniverls_own_splits_in_verls_schema() -> None:
    cfg = _hf(**{"eval.split": "test", "environment.test_tasks": "5"})
    plan = vx.plan_export(cfg)
    env = CalculatorEnvironment()
    splits = make_splits(env, {"train": 12, "eval": 6, "test": 5}, 7, "mixed")
    for split in ("train", "test"):
        rows = vx.dataset_rows(cfg, plan, split)
        assert [r["reward_model"]["ground_truth"] for r in rows] == [
            t.answer for t in splits[split]
        ]
        for i, (row, task) in enumerate(zip(rows, splits[split], strict=True)):
            assert row["prompt"] == [
                {"role": "system", "content": env.system_prompt()},
                {"role": "user", "content": task.prompt},
            ]
            assert row["data_source"] == "calculator" and row["agent_name"] == "tool_agent"
            assert row["extra_info"]["index"] == i
            create = row["extra_info"]["tools_kwargs"]["calculator"]["create_kwargs"]
            assert create["task_id"] == task.task_id
            assert json.loads(create["data_json"]) == dict(task.data)


def test_parquet_round_trips_the_rows(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    cfg = _hf()
    plan = vx.plan_export(cfg)
    rows = vx.dataset_rows(cfg, plan, "train")
    vx.write_parquet(rows, tmp_path / "t.parquet")
    assert pq.read_table(tmp_path / "t.parquet").to_pylist() == rows


# -- tool adapter (pure parts) ------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [{"expression": "3 * 7"}, {"expr": "3"}, {"expression": "2 +* 3"}, {"expression": 7}, {}],
)
def test_adapter_call_matches_the_environment_step(arguments: dict) -> None:
    env = verl_tool.new_episode("calculator", {}, None)
    reference = CalculatorEnvironment()
    got = verl_tool.execute_call(env, "calculator", arguments).observation_text()
    assert got == reference.step(ToolCall("calculator", arguments)).observation_text()


def test_adapter_refuses_non_object_arguments_with_the_parsers_message() -> None:
    env = verl_tool.new_episode("calculator", {}, None)
    result = verl_tool.execute_call(env, "calculator", ["1 + 1"])
    assert not result.ok and result.error == 'tool call "arguments" must be a JSON object'


def test_reward_is_the_environments_verifier_on_the_last_final_block() -> None:
    info = {"environment_params_json": "{}"}
    text = "<final>3</final> then <tool_call>x</tool_call> <final>\n12\n</final>"
    assert verl_tool.compute_score("calculator", text, "12", info) == 1.0
    assert (
        verl_tool.compute_score("calculator", "<final>12</final><final>3</final>", "12", info)
        == 0.0
    )
    assert verl_tool.compute_score("calculator", "12", "12", info) == 0.0
    assert verl_tool.compute_score("calculator", "<final>1,2</final>", "12", info) == 1.0


def test_tool_module_imports_without_verl_and_builds_the_class_lazily() -> None:
    code = (
        "import sys; import miniverl.export.verl_tool as m; assert 'verl' not in sys.modules\n"
        "try:\n    m.MiniverlEnvTool\nexcept ImportError as e:\n    print('lazy', e.name)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC_DIR), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("lazy verl", "")


# -- files and CLI ------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "miniverl.cli.main", "export-verl", *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC_DIR), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        check=False,
        timeout=120,
    )


def test_cli_writes_every_file_and_the_ledger(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    out = tmp_path / "exp"
    proc = _cli(str(TINY_RECIPE), "models.student.lora.dropout=0.1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert names == {
        "data/train.parquet", "data/val.parquet", "tools.yaml", "miniverl_reward.py",
        "overrides.yaml", "run_verl.sh", "recipe.resolved.yaml", "MAPPING.md",
    }  # fmt: skip
    assert "models.student.lora.dropout = 0.1" in proc.stdout
    mapping = (out / "MAPPING.md").read_text()
    cfg = RunConfig.from_yaml(out / "recipe.resolved.yaml")
    for key in _leaf_keys(cfg):
        assert mapping.count(f"| `{key}` |") == 1, key
    dropped = mapping.split("## Dropped keys")[1].split("## Every recipe key")[0]
    assert "`models.student.lora.dropout` = `0.1`" in dropped
    for guarantee in ("Policy-version / fingerprint", "Bucketed tail divergence", "Exact resume", "Span-typed provenance"):  # fmt: skip
        assert guarantee in mapping
    doc = yaml.safe_load((out / "overrides.yaml").read_text())
    assert "distillation.enabled=true" in doc["overrides"]
    script = (out / "run_verl.sh").read_text()
    assert all(f"{s}" in script or repr(s) in script for s in ("distillation.enabled=true",))
    tools = yaml.safe_load((out / "tools.yaml").read_text())["tools"]
    assert tools[0]["class_name"] == "miniverl.export.verl_tool.MiniverlEnvTool"
    assert tools[0]["tool_schema"]["function"]["parameters"]["required"] == ["expression"]


def test_cli_refuses_toy_recipe_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    proc = _cli(str(TOY_RECIPE), "--out", str(out))
    assert proc.returncode == 1
    assert "verl needs a Hugging Face model" in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_refuses_a_non_empty_out_without_force(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    out = tmp_path / "exp"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = _cli(str(TINY_RECIPE), "--out", str(out))
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert _cli(str(TINY_RECIPE), "--out", str(out), "--force").returncode == 0
    assert not (out / "keep.txt").exists() and (out / "MAPPING.md").is_file()


def test_missing_pyarrow_is_a_clear_error_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(BackendError) as err:
        vx.export_verl(_hf(), tmp_path / "exp")
    assert (
        err.value.hint
        == 'from a clone of miniverl: pip install -e ".[verl-export]" (README, Quick start)'
    )
    assert list(tmp_path.iterdir()) == []


def test_export_writes_everything_with_torch_and_transformers_blocked(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ModuleNotFoundError(f"blocked {{name}}", name=name)
sys.meta_path.insert(0, Block())
from typer.testing import CliRunner
import miniverl.cli.main as cli
result = CliRunner().invoke(cli.app, ["export-verl", {str(TINY_RECIPE)!r}, "--out", {str(tmp_path / "x")!r}])
assert result.exit_code == 0, (result.stdout, result.stderr, repr(result.exception))
assert "torch" not in sys.modules and "transformers" not in sys.modules
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC_DIR), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x" / "data" / "train.parquet").is_file()
