"""``environment.tasks``: a JSONL task file, validated with ``path:line`` errors, dealt to splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miniverl.config.models import EnvironmentConfig
from miniverl.environments.base import ToolCall, ToolEnvironment
from miniverl.environments.calculator import CalculatorEnvironment
from miniverl.environments.shop import ShopEnvironment
from miniverl.environments.tasks_file import build_splits, check_environment, load_task_file
from miniverl.errors import ConfigError, ToolEnvironmentError


def _line(prompt: str, answer: str, oracle_expr: str | None = None, **extra: object) -> str:
    obj: dict = {"prompt": prompt, "answer": answer, **extra}
    if oracle_expr is not None:
        obj["oracle"] = {
            "tool_calls": [{"name": "calculator", "arguments": {"expression": oracle_expr}}],
            "final_answer": answer,
        }
    return json.dumps(obj)


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    lines = [_line(f"What is {i} times 7?", str(7 * i), f"{i} * 7") for i in range(1, 11)]
    path.write_text("\n".join(lines[:5]) + "\n\n" + "\n".join(lines[5:]) + "\n", encoding="utf-8")
    return path


def _cfg(path: Path, **kw: object) -> EnvironmentConfig:
    return EnvironmentConfig(tasks=str(path), **{"train_tasks": 6, "eval_tasks": 3, **kw})


def test_splits_are_dealt_deterministically_and_disjointly(task_file: Path) -> None:
    env = CalculatorEnvironment()
    a = build_splits(env, _cfg(task_file, test_tasks=1))
    b = build_splits(CalculatorEnvironment(), _cfg(task_file, test_tasks=1))
    assert a == b
    assert [len(a[s]) for s in ("train", "eval", "test")] == [6, 3, 1]
    prompts = [t.prompt for s in a.values() for t in s]
    assert len(set(prompts)) == 10
    assert build_splits(env, _cfg(task_file, test_tasks=1, split_seed=8)) != a
    assert a["eval"][0].task_id == "calc-eval-0"
    lines = task_file.read_text().splitlines()
    for task in a["train"]:
        lineno = int(task.data["source"].split(":")[1])
        assert json.loads(lines[lineno - 1])["prompt"] == task.prompt


def test_file_oracle_drives_the_oracle_and_verification(task_file: Path) -> None:
    env = CalculatorEnvironment()
    task = build_splits(env, _cfg(task_file))["train"][0]
    oracle = env.oracle_solution(task)
    assert oracle.final_answer == task.answer
    (call,) = oracle.tool_calls
    env.reset(task)
    assert env.step(call).result == task.answer
    assert env.verify(task, task.answer).solved
    assert "Reference solution" in env.privileged_context(task)


def test_a_task_without_oracle_says_so(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_line("What is 2 plus 2?", "4") + "\n", encoding="utf-8")
    env = CalculatorEnvironment()
    task = build_splits(env, EnvironmentConfig(tasks=str(path), train_tasks=1, eval_tasks=0))[
        "train"
    ][0]
    with pytest.raises(ToolEnvironmentError) as info:
        env.oracle_solution(task)
    assert str(info.value) == (
        "task calc-train-0 has no oracle expressions (and no 'oracle' in its task file)"
    )


def test_every_bad_line_is_reported_with_path_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "\n".join(
            [
                _line("ok prompt", "1", "1"),
                "{not json",
                "[1, 2]",
                json.dumps({"prompt": "p2"}),
                json.dumps({"prompt": "p3", "answer": 3}),
                json.dumps({"prompt": "p4", "answer": "4", "bogus": 1}),
                json.dumps(
                    {
                        "prompt": "p5",
                        "answer": "5",
                        "oracle": {"tool_calls": [{"arguments": {}}], "final_answer": "5"},
                    }
                ),
                json.dumps({"prompt": "p6", "answer": "6", "difficulty": "extreme"}),
                _line("ok prompt", "1"),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_task_file(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{path}: 8 task-file error(s)"
    assert lines[1:] == [
        f"  - {path}:2: not valid JSON: Expecting property name enclosed in double quotes (column 2)",
        f"  - {path}:3: expected a JSON object, got list",
        f"  - {path}:4: answer: Field required",
        f"  - {path}:5: answer: Input should be a valid string",
        f"  - {path}:6: bogus: unknown key",
        f"  - {path}:7: oracle.tool_calls.0.name: Field required",
        f"  - {path}:8: difficulty: Input should be 'easy', 'medium' or 'hard'",
        f"  - {path}:9: prompt: duplicate of line 1 (a prompt may appear once, so splits stay disjoint)",
    ]


def test_missing_empty_and_too_small_files(tmp_path: Path, task_file: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^environment.tasks: task file not found: .*nope.jsonl$"
    ):
        load_task_file(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"the task file holds no tasks$"):
        load_task_file(tmp_path / "empty.jsonl")
    with pytest.raises(ConfigError) as info:
        build_splits(CalculatorEnvironment(), _cfg(task_file, train_tasks=9, eval_tasks=2))
    assert str(info.value) == (
        f"{task_file}: 10 task(s), but the splits need 11 "
        "(environment.train_tasks 9 + eval_tasks 2 + test_tasks 0)"
    )


def test_environments_without_task_file_support_refuse(task_file: Path) -> None:
    class NoFiles(CalculatorEnvironment):
        supports_task_files = False

    assert ToolEnvironment.supports_task_files is False
    with pytest.raises(
        ToolEnvironmentError, match=r"^environment 'calculator' does not support environment.tasks$"
    ):
        build_splits(NoFiles(), _cfg(task_file))


def test_shop_accepts_a_task_file_oracle(tmp_path: Path) -> None:
    path = tmp_path / "shop.jsonl"
    oracle = {
        "tool_calls": [
            {"name": "price", "arguments": {"item": "tea"}},
            {"name": "calculator", "arguments": {"expression": "3 * 11"}},
        ],
        "final_answer": "33",
    }
    path.write_text(json.dumps({"prompt": "Buy 3 tea.", "answer": "33", "oracle": oracle}) + "\n")
    env = ShopEnvironment()
    task = build_splits(env, EnvironmentConfig(tasks=str(path), train_tasks=1, eval_tasks=0))[
        "train"
    ][0]
    assert env.oracle_solution(task).tool_calls == (
        ToolCall("price", {"item": "tea"}),
        ToolCall("calculator", {"expression": "3 * 11"}),
    )


def test_validate_reports_task_file_errors(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from miniverl.cli.main import app

    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "x"}\n', encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"environment:\n  tasks: {path}\n  train_tasks: 1\n  eval_tasks: 0\n")
    result = CliRunner().invoke(
        app, ["validate", str(recipe), "eval.baseline=false", "eval.after_warmup=false"]
    )
    assert result.exit_code == 1
    assert f"{path}:1: answer: Field required" in result.stderr
    assert check_environment(EnvironmentConfig(name="shop")).startswith(
        "environment shop -> miniverl.environments.shop.ShopEnvironment: "
        "tools ['price(item)', 'calculator(expression)']; tasks sampled (easy): train 32, eval 12"
    )


def test_the_trainer_takes_its_splits_from_the_task_file(task_file: Path, tmp_path: Path) -> None:
    from helpers import tiny_config
    from miniverl.training.recipe import OPDTrainer

    config = tiny_config(
        f"environment.tasks={task_file}", "environment.train_tasks=6", "environment.eval_tasks=3"
    )
    trainer = OPDTrainer(config, output_dir=tmp_path / "run", quiet=True, progress=False)
    trainer.setup()
    assert trainer.splits == build_splits(CalculatorEnvironment(), config.environment)
    file_prompts = {
        json.loads(line)["prompt"] for line in task_file.read_text().splitlines() if line
    }
    assert {t.prompt for s in trainer.splits.values() for t in s} <= file_prompts
    assert trainer.resolved_config.environment.tasks == str(task_file.resolve())


def test_export_verl_deals_the_same_splits_from_a_task_file(task_file: Path) -> None:
    from helpers import REPO_ROOT
    from miniverl.config.models import RunConfig
    from miniverl.lab.verl import export as vx
    from miniverl.lab.verl.ledger import MAPPED

    cfg = RunConfig.from_yaml(
        REPO_ROOT / "tests" / "data" / "verl_export" / "tiny_hf_opd.yaml",
        [
            f"environment.tasks={task_file}",
            "environment.train_tasks=6",
            "environment.eval_tasks=3",
            "environment.test_tasks=0",
        ],
    )
    plan = vx.plan_export(cfg)
    assert plan.splits == build_splits(CalculatorEnvironment(), cfg.environment)
    (fate,) = [f for f in plan.fates if f.key == "environment.tasks"]
    assert fate.status == MAPPED and "task file" in fate.verl
