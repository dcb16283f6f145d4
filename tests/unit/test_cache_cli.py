"""``miniverl cache stats|validate|prune``, in process and in a subprocess without torch."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from miniverl.cache import TeacherCache
from miniverl.cli.cache_cmd import cache_app
from miniverl.schemas.cache import CacheProvenance

SRC = Path(__file__).resolve().parents[2] / "src"
K, VOCAB = 8, 100

app = typer.Typer()
app.add_typer(cache_app, name="cache")
runner = CliRunner()


def build(directory: Path, versions: dict[str, int]) -> None:
    cache = TeacherCache(
        directory,
        CacheProvenance(
            teacher_model_id="toy-teacher",
            tokenizer_fingerprint="c" * 64,
            top_k=K,
            temperature=1.0,
            vocab_size=VOCAB,
            dtype="bfloat16",
        ),
        max_entries_per_shard=2,
    )
    for i, (key, version) in enumerate(versions.items()):
        n = 10 + i
        cache.write(
            key,
            {
                "topk_indices": torch.arange(n * K).reshape(n, K) % VOCAB,
                "topk_log_probs": torch.full((n, K), -3.0),
                "tail_log_prob": torch.full((n,), -0.5),
                "teacher_entropy": torch.ones(n),
            },
            trajectory_id=key,
            policy_version=version,
            alignment_digest=hashlib.sha256(key.encode()).hexdigest(),
        )
    cache.flush()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    build(tmp_path / "cache", {"a": 0, "b": 1, "c": 1, "d": 2})
    return tmp_path / "cache"


def test_stats_table_and_json(cache_dir: Path) -> None:
    result = runner.invoke(app, ["cache", "stats", str(cache_dir)])
    assert result.exit_code == 0, result.output
    for text in (
        "entries",
        "positions",
        "bytes per position",
        "versions",
        "shards",
        "v1: 2",
        "toy-teacher",
    ):
        assert text in result.output
    result = runner.invoke(app, ["cache", "stats", str(cache_dir), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["entries"] == 4 and stats["positions"] == 10 + 11 + 12 + 13 and stats["top_k"] == K
    assert stats["versions"] == {"0": 1, "1": 2, "2": 1} and stats["shards"] == 2
    assert stats["bytes_per_position"] == K * (4 + 2) + 2 + 4


def test_validate_exit_codes(cache_dir: Path) -> None:
    result = runner.invoke(app, ["cache", "validate", str(cache_dir)])
    assert result.exit_code == 0, result.output
    assert "is valid: 4 entries" in result.output
    shard = cache_dir / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = runner.invoke(app, ["cache", "validate", str(cache_dir)])
    assert result.exit_code == 1
    assert "shard-00001.safetensors failed its file SHA-256 check" in result.output
    assert "entry 'd'" in result.output and "hint:" in result.output
    assert "Traceback" not in result.output


def test_a_missing_cache_is_a_clean_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["cache", "stats", str(tmp_path)])
    assert result.exit_code == 1 and "index.json is missing" in result.output


def test_prune_keeps_the_given_versions(cache_dir: Path) -> None:
    result = runner.invoke(
        app, ["cache", "prune", str(cache_dir), "--keep-version", "1", "--keep-version", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "removed 1 entries, kept 3" in result.output
    assert sorted(TeacherCache.open(cache_dir).keys()) == ["b", "c", "d"]
    assert runner.invoke(app, ["cache", "validate", str(cache_dir)]).exit_code == 0
    result = runner.invoke(app, ["cache", "prune", str(cache_dir)])
    assert result.exit_code != 0


TORCH_FREE = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch.") or name == "safetensors" or name.startswith("safetensors."):
                raise ImportError(f"{name} is hidden in this test")
            return None

    sys.meta_path.insert(0, NoTorch())
    import typer
    from miniverl.cli.cache_cmd import cache_app

    app = typer.Typer()
    app.add_typer(cache_app, name="cache")
    try:
        app(sys.argv[1:], prog_name="miniverl")
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    assert "torch" not in sys.modules, "torch was imported"
    assert "safetensors" not in sys.modules, "safetensors was imported"
    assert "miniverl.cache.maintenance" in sys.modules, "the torch-free maintenance module was not used"
    print("TORCH-FREE", code)
    sys.exit(code)
    """
)


def run_torch_free(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", TORCH_FREE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_cache_commands_run_with_torch_hidden(cache_dir: Path) -> None:
    stats = run_torch_free("cache", "stats", str(cache_dir), "--json")
    assert stats.returncode == 0, stats.stderr
    assert "TORCH-FREE 0" in stats.stdout and '"entries": 4' in stats.stdout
    table = run_torch_free("cache", "stats", str(cache_dir))
    assert table.returncode == 0 and "bytes per position" in table.stdout, table.stderr
    valid = run_torch_free("cache", "validate", str(cache_dir))
    assert valid.returncode == 0 and "is valid" in valid.stdout, valid.stderr
    pruned = run_torch_free("cache", "prune", str(cache_dir), "--keep-version", "1")
    assert pruned.returncode == 0 and "removed 2 entries, kept 2" in pruned.stdout, pruned.stderr
    again = run_torch_free("cache", "validate", str(cache_dir))
    assert again.returncode == 0, again.stderr
    live_shard = next(iter(TeacherCache.open(cache_dir).index.shards))
    (cache_dir / live_shard).write_bytes(b"\0" * 4)
    broken = run_torch_free("cache", "validate", str(cache_dir))
    assert broken.returncode == 1 and "TORCH-FREE 1" in broken.stdout
    assert "failed validation" in broken.stderr and live_shard in broken.stderr
