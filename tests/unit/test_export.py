"""``miniverl export``: what leaves the machine is an allow-listed, path-free result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from miniverl.cli.main import app
from miniverl.config.models import RunConfig
from miniverl.errors import RunDirectoryError
from miniverl.export.result import export_run, sanitize_hardware, scrub
from miniverl.utils.env import collect_environment
from miniverl.utils.io import write_json
from miniverl.utils.runs import RunPaths

HOSTNAME = "build-box-7f3a.corp.example"
USERNAME = "alice"
HOME = "/home/alice"
SECRET = "s3cr3t-token-value"
PLANTED = (HOSTNAME, USERNAME, HOME, "/home/", SECRET, "build-box", "C:\\Users")


def _planted_environment() -> dict[str, Any]:
    env = collect_environment()
    env.update(
        hostname=HOSTNAME, user=USERNAME, home=HOME, cwd=f"{HOME}/work/miniverl", node=HOSTNAME
    )
    env["os"] = {**env["os"], "node": HOSTNAME, "release": env["os"]["release"]}
    env["python"] = {**env["python"], "executable": f"{HOME}/.venv/bin/python"}
    env["packages"] = {
        **env["packages"],
        "torch": f"2.13.0 ({HOME}/.venv/lib/site-packages)",
        "private-pkg": "1.0",
    }
    env["gpu"] = {
        "status": "measured",
        "count": 1,
        "cuda": "12.8",
        "devices": [
            {
                "name": "NVIDIA H200",
                "total_memory_gib": 139.8,
                "capability": "9.0",
                "uuid": "GPU-1234",
                "bus": HOSTNAME,
            }
        ],
    }
    env["cpu"] = {
        "model": "AMD EPYC 9R14 96-Core Processor",
        "isa": ["avx2", f"{HOME}/flag", "avx512_bf16", "made_up"],
        "serial": HOSTNAME,
    }
    env["env_vars"] = {
        "OMP_NUM_THREADS": "4",
        "CUDA_VISIBLE_DEVICES": f"{HOME}/x",
        "HOME": HOME,
        "USER": USERNAME,
        "API_TOKEN": SECRET,
    }
    return env


def _planted_run(root: Path) -> Path:
    paths = RunPaths(root)
    root.mkdir(parents=True)
    config = RunConfig.from_mapping(
        {
            "run": {"name": "shared"},
            "models": {
                "student": {"model_id": "toy-student", "lora": {"enabled": False}},
                "teacher": {"model_id": "toy-teacher"},
            },
            "cache": {"dir": f"{HOME}/cache/teacher"},
        }
    )
    stored = config.to_dict()
    stored["run"]["output_dir"] = f"{HOME}/runs/shared"  # a config file may name where it ran
    paths.config_resolved.write_text(
        f"# memory plan: resolved on {HOSTNAME} by {USERNAME}\n" + yaml.safe_dump(stored),
        encoding="utf-8",
    )
    write_json(paths.environment, _planted_environment())
    final = {
        "tag": "final",
        "split": "eval",
        "tasks": 4,
        "solved": 3,
        "success_rate": 0.75,
        "termination": {"final_answer": 3, "max_turns": 1},
    }
    write_json(
        paths.manifest,
        {
            "miniverl_version": "0.3.0",
            "run_id": f"{HOME}/runs/shared",
            "created_at": "2026-01-01T00:00:00+00:00",
            "git_commit": "abc123",
            "hostname": HOSTNAME,
            "user": USERNAME,
            "mode": "opd",
            "seed": 1234,
            "deterministic": True,
            "config_digest": config.digest(),
            "environment": {
                "name": "calculator",
                "difficulty": "easy",
                "split_sizes": {"train": 8, "eval": 4},
                "cwd": f"{HOME}/work",
            },
            "models": {
                "student": {
                    "model_id": f"{HOME}/models/Qwen3-0.6B",
                    "revision": None,
                    "quantization": "nf4",
                    "precision": "bfloat16",
                    "capabilities": {"path": f"{HOME}/models"},
                }
            },
            "tokenizer": {"fingerprint": "f" * 64, "vocab_size": 357, "path": f"{HOME}/tok"},
            "objective": {
                "label": "on_policy_distillation",
                "divergence": "forward_kl",
                "selector": "all_model_tokens",
            },
            "memory_plan": {
                "strategy": "swap",
                "requested": "auto",
                "teacher_resident": False,
                "reason": f"auto -> swap: free VRAM on {HOME}/.cache too small",
            },
            "global_optimizer_step": 3,
            "parameter_version": 3,
            "packages": {"torch": f"2.13 ({HOME})"},
            "os": {"node": HOSTNAME},
            "toy_teacher": {
                "steps": 20,
                "train_success": 1.0,
                "heldout_success": 0.5,
                "weights_sha256": "e" * 64,
                "checks": [{"host": HOSTNAME}],
            },
        },
    )
    write_json(
        paths.eval_json,
        {
            "mode": "opd",
            "global_optimizer_step": 3,
            "evaluations": {"final": final},
            "final": final,
            "seconds": 9.5,
        },
    )
    write_json(
        paths.eval_tag_json("reeval"),
        {
            **final,
            "tag": "reeval",
            "checkpoint": "final",
            "config_resolved": "config.resolved.yaml",
            "path": f"{HOME}/runs/shared/eval.reeval.json",
        },
    )
    return root


def _assert_clean(text: str) -> None:
    for needle in PLANTED:
        assert needle not in text, needle


def test_sanitize_hardware_is_an_allow_list() -> None:
    clean = sanitize_hardware(_planted_environment())
    _assert_clean(json.dumps(clean))
    assert set(clean) == {
        "python",
        "os",
        "cpu_count",
        "cpu",
        "byteorder",
        "gpu",
        "packages",
        "env_vars",
    }
    assert set(clean["os"]) == {"system", "release", "machine"}
    assert clean["gpu"]["devices"] == [
        {"name": "NVIDIA H200", "total_memory_gib": 139.8, "capability": "9.0"}
    ]
    assert clean["env_vars"] == {"OMP_NUM_THREADS": "4"}
    assert clean["cpu"] == {
        "model": "AMD EPYC 9R14 96-Core Processor",
        "isa": ["avx2", "avx512_bf16"],
    }
    assert "private-pkg" not in clean["packages"] and clean["packages"]["torch"] is None
    assert clean["packages"]["pydantic"]


def test_sanitize_hardware_of_an_empty_or_odd_environment() -> None:
    assert sanitize_hardware({})["gpu"] == {}
    odd = sanitize_hardware({"gpu": "yes", "packages": ["torch"], "os": None, "cpu_count": "many"})
    assert odd["cpu_count"] is None and odd["packages"] == {} and odd["os"] == {}
    assert sanitize_hardware({"cpu": {"model": "/home/x", "isa": "avx2"}})["cpu"] == {
        "model": None,
        "isa": [],
    }


def test_export_run_leaves_nothing_identifying(tmp_path: Path) -> None:
    run = _planted_run(tmp_path / "shared-run")
    out = tmp_path / "out" / "result.json"
    result = export_run(run, out)
    text = out.read_text(encoding="utf-8")
    _assert_clean(text)
    assert str(tmp_path) not in text
    assert json.loads(text) == result
    assert result["run_dir"] == "shared-run" and result["run_id"] == "shared"
    assert result["objective"]["divergence"] == "forward_kl"
    assert len(result["config_digest"]) == 64 and result["mode"] == "opd" and result["seed"] == 1234
    assert (
        result["config"]["run"]["output_dir"] == "shared"
        and result["config"]["cache"]["dir"] == "teacher"
    )
    assert result["models"]["student"]["model_id"] == "Qwen3-0.6B"
    assert result["evaluations"]["stages"]["final"]["success_rate"] == 0.75
    assert result["evaluations"]["tagged"]["reeval"]["checkpoint"] == "final"
    assert result["memory_plan"]["strategy"] == "swap"
    assert result["hardware"]["gpu"]["devices"][0]["name"] == "NVIDIA H200"
    assert "benchmark" not in result


def test_export_carries_the_benchmark(tmp_path: Path) -> None:
    run = _planted_run(tmp_path / "run")
    write_json(
        RunPaths(run).benchmark_json,
        {
            "seeds": [1],
            "rows": [{"arm": "opd", "run_dir": "seed-1/opd", "note": f"ran in {HOME}/b"}],
            "significance": {"note": "no statistical significance is claimed (1 seed)"},
        },
    )
    result = export_run(run, tmp_path / "r.json")
    _assert_clean((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert result["benchmark"]["rows"][0]["run_dir"] == "seed-1/opd"
    assert result["benchmark"]["significance"]["note"].startswith("no statistical significance")


def test_export_cli(tmp_path: Path) -> None:
    run = _planted_run(tmp_path / "run")
    out = tmp_path / "result.json"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    _assert_clean(out.read_text(encoding="utf-8"))
    missing = CliRunner().invoke(app, ["export", str(tmp_path / "nowhere"), "--out", str(out)])
    assert missing.exit_code == 1


def test_export_refuses_a_directory_without_results(tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError):
        export_run(tmp_path, tmp_path / "r.json")


def test_export_of_a_copied_demo_like_run_keeps_relative_names(tmp_path: Path) -> None:
    run = _planted_run(tmp_path / "a")
    copy = tmp_path / "b" / "nested-name"
    shutil.copytree(run, copy)
    assert export_run(copy, tmp_path / "r.json")["run_dir"] == "nested-name"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("/home/alice/models/qwen", "qwen"),
        ("loaded /home/alice/x/y.safetensors ok", "loaded y.safetensors ok"),
        ("~/data/z", "z"),
        ("C:\\Users\\alice\\m", "m"),
        ("C:\\Users\\alice", "<path>"),
        ("/home/alice/", "<path>"),
        ("seed-1/opd", "seed-1/opd"),
        ("3/4 solved", "3/4 solved"),
        ("auto -> resident", "auto -> resident"),
    ],
)
def test_scrub_reduces_paths_to_their_last_component(raw: str, clean: str) -> None:
    assert scrub(raw) == clean
    assert scrub({raw: [raw]}) == {clean: [clean]}
