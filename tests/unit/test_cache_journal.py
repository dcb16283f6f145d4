"""Journaled cache commits: a flush costs its own entries, and a kill anywhere is harmless.

Every ``cache.*`` failpoint of ``flush`` and ``compact`` is hit in a child process that then
dies on the spot (``os._exit``); the cache it leaves must validate and hold exactly the
state before or after the interrupted commit, and a new writer must be able to go on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cache_store import provenance, put, synthetic

from miniverl.cache import INDEX_NAME, TeacherCache
from miniverl.cache.layout import JOURNAL_NAME
from miniverl.errors import CacheIntegrityError
from miniverl.utils.failpoints import FAILPOINT_ENV, FAILPOINT_EXIT_CODE

REPO = Path(__file__).resolve().parents[2]


def _same(cache: TeacherCache, key: str, seed: int, version: int = 0) -> bool:
    cached = cache.read(key, expect_policy_version=version)
    return torch.equal(cached.topk_log_probs, synthetic(5, seed)["topk_log_probs"])


def test_flush_appends_one_line_and_never_rewrites_the_index(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance(), max_entries_per_shard=4)
    put(cache, "k000", seed=0)
    cache.flush()
    index_bytes = (tmp_path / INDEX_NAME).read_bytes()
    sizes = []
    for i in range(1, 6):
        put(cache, f"k{i:03d}", seed=i)
        before = (tmp_path / JOURNAL_NAME).stat().st_size if i > 1 else 0
        cache.flush()
        sizes.append((tmp_path / JOURNAL_NAME).stat().st_size - before)
        assert (tmp_path / INDEX_NAME).read_bytes() == index_bytes
    assert max(sizes) - min(sizes) <= 8, sizes  # only float reprs differ
    assert len((tmp_path / JOURNAL_NAME).read_bytes().splitlines()) == 5
    reopened = TeacherCache.open(tmp_path, provenance())
    assert sorted(reopened.keys()) == [f"k{i:03d}" for i in range(6)]
    assert reopened.validate().entries == 6
    assert all(_same(reopened, f"k{i:03d}", i) for i in range(6))
    cache.close()
    assert not (tmp_path / JOURNAL_NAME).exists()
    assert (tmp_path / INDEX_NAME).read_bytes() != index_bytes
    assert sorted(TeacherCache.open(tmp_path).keys()) == sorted(reopened.keys())


def test_replacing_every_entry_of_a_shard_drops_it_through_the_journal(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance(), max_entries_per_shard=2)
    put(cache, "a", seed=1)
    put(cache, "b", seed=2)
    cache.flush()
    put(cache, "a", version=1, seed=3)
    cache.flush()
    put(cache, "b", version=1, seed=4)
    cache.flush()
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == [
        "shard-00001.safetensors",
        "shard-00002.safetensors",
    ]
    reopened = TeacherCache.open(tmp_path)
    assert sorted(reopened.index.shards) == ["shard-00001.safetensors", "shard-00002.safetensors"]
    assert _same(reopened, "a", 3, version=1) and _same(reopened, "b", 4, version=1)
    assert reopened.validate().orphan_files == []


def test_a_torn_last_line_is_ignored_and_overwritten(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "a", seed=1)
    cache.flush()
    put(cache, "b", seed=2)
    cache.flush()
    journal = tmp_path / JOURNAL_NAME
    good = journal.read_bytes()
    journal.write_bytes(good + good[: len(good) // 2])
    survivor = TeacherCache.open(tmp_path, provenance())
    assert sorted(survivor.keys()) == ["a", "b"]
    put(survivor, "c", seed=3)
    survivor.flush()
    assert journal.read_bytes().startswith(good) and journal.read_bytes().count(b"\n") == 2
    assert sorted(TeacherCache.open(tmp_path).keys()) == ["a", "b", "c"]


def test_a_corrupted_committed_line_is_an_error_not_silent_loss(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "a", seed=1)
    cache.flush()
    for key in ("b", "c"):
        put(cache, key, seed=2)
        cache.flush()
    journal = tmp_path / JOURNAL_NAME
    lines = journal.read_bytes().splitlines(keepends=True)
    line = json.loads(lines[0])
    line["record"]["entries"][0]["policy_version"] = 7
    journal.write_bytes(json.dumps(line).encode() + b"\n" + lines[1])
    with pytest.raises(CacheIntegrityError, match=r"line 1 is corrupted"):
        TeacherCache.open(tmp_path)


def test_a_journal_left_by_an_interrupted_compaction_is_ignored(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "a", seed=1)
    cache.flush()
    put(cache, "b", seed=2)
    cache.flush()
    stale = (tmp_path / JOURNAL_NAME).read_bytes()
    cache.close()
    (tmp_path / JOURNAL_NAME).write_bytes(stale)
    reopened = TeacherCache.open(tmp_path, provenance())
    assert sorted(reopened.keys()) == ["a", "b"] and reopened.validate().entries == 2
    put(reopened, "c", seed=3)
    reopened.flush()
    assert (tmp_path / JOURNAL_NAME).read_bytes().count(b"\n") == 1
    assert sorted(TeacherCache.open(tmp_path).keys()) == ["a", "b", "c"]


CHILD = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
from miniverl.cache import TeacherCache
from miniverl.schemas.cache import CacheProvenance

def put(cache, key, seed, version=0):
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.log_softmax(torch.randn(5, 50, generator=g), dim=-1)
    top = torch.topk(log_probs, 4, dim=-1)
    tail = torch.log1p(-top.values.exp().sum(-1).clamp(max=1 - 1e-6))
    tensors = {"topk_indices": top.indices, "topk_log_probs": top.values, "tail_log_prob": tail}
    cache.write(key, tensors, trajectory_id=key, policy_version=version, alignment_digest="a" * 64)

prov = CacheProvenance(**json.loads(sys.argv[2]))
codes = {}
for point in sys.argv[3:]:
    pid = os.fork()
    if pid == 0:
        cache = TeacherCache(os.path.join(sys.argv[1], point), prov, max_entries_per_shard=2)
        put(cache, "a", 1); put(cache, "b", 2); cache.flush()
        put(cache, "c", 3); cache.flush()
        os.environ["MINIVERL_FAILPOINT"] = point
        put(cache, "a", 11, version=1); put(cache, "b", 12, version=1); put(cache, "d", 4)
        cache.flush()
        cache.close()
        os._exit(0)
    codes[point] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""

BEFORE = {"a": (1, 0), "b": (2, 0), "c": (3, 0)}
AFTER = {"a": (11, 1), "b": (12, 1), "c": (3, 0), "d": (4, 0)}

FAILPOINTS = [
    "cache.shard_before_rename",
    "cache.shard_renamed",
    "cache.journal_before_append",
    "cache.journal_torn",
    "cache.journal_appended",
    "cache.before_shard_delete",
    "cache.index_before_rename",
    "cache.index_renamed",
]
"""Every step of a flush (shard write, rename, journal append) and of a compaction."""


def _seeded(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.topk(torch.log_softmax(torch.randn(5, 50, generator=g), dim=-1), 4, dim=-1).values


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_kill_at_every_commit_step_leaves_a_valid_cache(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != FAILPOINT_ENV}
    env["PYTHONPATH"] = str(REPO / "src")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), provenance().model_dump_json(), *FAILPOINTS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    assert codes == dict.fromkeys(FAILPOINTS, FAILPOINT_EXIT_CODE)
    for number, point in enumerate(FAILPOINTS):
        directory = tmp_path / point
        cache = TeacherCache.open(directory, provenance())
        cache.validate()
        state = {key: cache.record(key).policy_version for key in cache}
        expected = BEFORE if number < 4 else AFTER
        assert state == {k: v for k, (_, v) in expected.items()}, point
        for key, (seed, version) in expected.items():
            cached = cache.read(key, expect_policy_version=version)
            assert torch.equal(cached.topk_log_probs, _seeded(seed)), (point, key)
        put(cache, "e", seed=5)
        cache.flush()
        cache.prune([0, 1])
        reopened = TeacherCache.open(directory, provenance())
        assert reopened.validate().orphan_files == [] and "e" in reopened, point
