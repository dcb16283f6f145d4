"""Every subcommand against a corrupted copy of each run-directory file it reads.

Each case copies a finished tiny run, corrupts one file in one way (garbage bytes, deep
nesting, the wrong top-level type, a truncation, a FIFO in its place) and runs the command
in-process. Required: a non-zero exit, a message naming the file, and no traceback (the
command raised a ``MiniverlError`` that the CLI printed, never anything else).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miniverl.cli.main import app

JSON_KINDS = ("garbage", "deep", "wrong_type", "fifo")
JSONL_KINDS = ("garbage", "deep", "wrong_type", "fifo")
YAML_KINDS = ("garbage", "deep", "wrong_type", "fifo")
BINARY_KINDS = ("garbage", "truncated", "empty", "fifo")

READS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "report": [
        ("metrics.jsonl", JSONL_KINDS),
        ("events.jsonl", JSONL_KINDS),
        ("token_analysis.jsonl", JSONL_KINDS),
        ("trajectories.jsonl", ("garbage", "deep", "wrong_type")),
        ("manifest.json", JSON_KINDS),
        ("eval.json", JSON_KINDS),
        ("config.resolved.yaml", YAML_KINDS),
    ],
    "export": [
        ("eval.json", JSON_KINDS),
        ("manifest.json", JSON_KINDS),
        ("environment.json", JSON_KINDS),
        ("config.resolved.yaml", YAML_KINDS),
    ],
    "eval": [
        ("config.resolved.yaml", YAML_KINDS),
        ("config.validated.yaml", YAML_KINDS),
        ("checkpoints/final/checkpoint.json", JSON_KINDS),
        ("checkpoints/final/state.json", JSON_KINDS),
        ("checkpoints/final/adapter.safetensors", BINARY_KINDS),
        ("checkpoints/final/optimizer.safetensors", BINARY_KINDS),
    ],
    "resume": [
        ("checkpoints/final/checkpoint.json", JSON_KINDS),
        ("checkpoints/final/state.json", JSON_KINDS),
        ("checkpoints/final/adapter.safetensors", BINARY_KINDS),
        ("checkpoints/final/optimizer.safetensors", BINARY_KINDS),
        ("toy-teacher.safetensors", BINARY_KINDS),
    ],
    "inspect": [
        ("trajectories.jsonl", ("garbage", "deep", "wrong_type", "fifo")),
        ("eval_trajectories.jsonl", ("garbage", "deep", "wrong_type", "fifo")),
        ("manifest.json", ("garbage", "deep")),
    ],
    "cache-validate": [
        ("teacher-cache/index.json", JSON_KINDS),
        ("teacher-cache/SHARD", BINARY_KINDS),
    ],
    "cache-stats": [("teacher-cache/index.json", JSON_KINDS)],
    "cache-prune": [("teacher-cache/index.json", JSON_KINDS)],
}

CASES = [
    pytest.param(command, name, kind, id=f"{command}-{name.replace('/', '_')}-{kind}")
    for command, files in READS.items()
    for name, kinds in files
    for kind in kinds
]


def _corrupt(path: Path, kind: str) -> None:
    original = path.read_bytes() if path.is_file() else b""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return
    data = {
        "garbage": b"\x00\xff garbage {[\n",
        "deep": b"[" * 200_000 + b"]" * 200_000 + b"\n",
        "truncated": original[: len(original) // 2],
        "empty": b"",
    }.get(kind)
    if kind == "wrong_type":
        if path.suffix == ".yaml":
            data = b"- a\n- b\n"
        elif path.suffix == ".jsonl":
            data = b"[1, 2]\n"
        else:
            data = b"[1, 2]"
    assert data is not None
    path.write_bytes(data)


def _args(command: str, run: Path, recipe: Path) -> list[str]:
    return {
        "report": ["report", str(run)],
        "export": ["export", str(run), "--out", str(run.parent / "result.json")],
        "eval": ["eval", "--run", str(run), "--quiet"],
        "resume": ["train", str(recipe), "--output", str(run), "--resume", "-q", "--no-report"],
        "inspect": ["inspect", str(run / "trajectories.jsonl")],
        "cache-validate": ["cache", "validate", str(run / "teacher-cache")],
        "cache-stats": ["cache", "stats", str(run / "teacher-cache")],
        "cache-prune": ["cache", "prune", str(run / "teacher-cache"), "--keep-version", "0"],
    }[command]


@pytest.mark.parametrize(("command", "name", "kind"), CASES)
def test_corrupt_run_file_gives_a_clean_error_naming_it(
    tmp_path: Path, finished_run: Path, tiny_recipe: Path, command: str, name: str, kind: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    if command == "resume":
        (run / "eval.json").unlink()  # killed after the final checkpoint: resumable
    if name.endswith("SHARD"):
        shards = sorted((run / "teacher-cache").glob("shard-*.safetensors"))
        if not shards:
            pytest.skip("the tiny run cached no targets")
        name = f"teacher-cache/{shards[0].name}"
    target = run / name
    args = _args(command, run, tiny_recipe)
    if command == "inspect" and name != "trajectories.jsonl":
        args = ["inspect", str(run / "eval_trajectories.jsonl")] if "eval_" in name else args
    _corrupt(target, kind)
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception}"
    )
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    assert Path(name).name in result.output, result.output
