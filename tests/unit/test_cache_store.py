"""TeacherCache: round trip, policy-version contract, flush/prune mechanics and crash safety."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from miniverl.agent.loop import RolloutRunner
from miniverl.cache import (
    INDEX_NAME,
    TeacherCache,
    encode_key,
    read_safetensors_header,
    tensor_name,
)
from miniverl.config.models import SelectionConfig
from miniverl.environments.base import make_splits
from miniverl.environments.registry import make_environment
from miniverl.errors import CacheIntegrityError, ConfigError, OffPolicyError, StaleCacheError
from miniverl.losses import DivergenceSpec, chunked_selected_position_loss
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend, ToyModelConfig
from miniverl.schemas.cache import CacheProvenance
from miniverl.selection.selectors import select_positions
from miniverl.teachers import LocalTeacherScorer
from miniverl.trajectory.alignment import build_alignment_map

TOKENIZER = ToyTokenizer()
SMALL = ToyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
SPEC = DivergenceSpec("reverse_kl", temperature=1.0)
K, VOCAB = 4, 50


def provenance(**changes) -> CacheProvenance:
    fields = {
        "teacher_model_id": "teacher",
        "tokenizer_fingerprint": "a" * 64,
        "top_k": K,
        "temperature": 1.0,
        "vocab_size": VOCAB,
    }
    return CacheProvenance(**(fields | changes))


def synthetic(n: int, seed: int, k: int = K, vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """Plausible bucketed targets: distinct ids per row, decreasing log-probs, a tail."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g)
    log_probs = torch.log_softmax(logits, dim=-1)
    top = torch.topk(log_probs, k, dim=-1)
    tail = torch.log1p(-top.values.exp().sum(-1).clamp(max=1 - 1e-6))
    return {
        "topk_indices": top.indices,
        "topk_log_probs": top.values,
        "tail_log_prob": tail,
        "teacher_entropy": -(log_probs.exp() * log_probs).sum(-1),
    }


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def put(
    cache: TeacherCache, key: str, n: int = 5, version: int = 0, seed: int | None = None
) -> dict[str, torch.Tensor]:
    tensors = synthetic(n, seed if seed is not None else len(key) + 31 * version)
    cache.write(
        key, tensors, trajectory_id=key, policy_version=version, alignment_digest=digest(key)
    )
    return tensors


# -- round trip with a real teacher ----------------------------------------------------


@pytest.fixture(scope="module")
def scored():
    teacher = ToyBackend(SMALL, TOKENIZER, model_id="toy-teacher", seed=5)
    student = ToyBackend(SMALL, TOKENIZER, model_id="toy-student", seed=6)
    env = make_environment("calculator")
    tasks = make_splits(env, {"train": 4, "eval": 0, "test": 0}, seed=7)["train"]
    runner = RolloutRunner(backend=teacher, environment=env)
    scorer = LocalTeacherScorer(teacher, spec=SPEC, loss_mode="bucketed", top_k=16, chunk_size=9)
    rows = []
    for version, task in enumerate(tasks):
        trajectory = runner.oracle_rollout(task, policy_version=version)
        selection = select_positions(trajectory, SelectionConfig(), run_seed=1)
        alignment = build_alignment_map(trajectory, selection.positions, selection.weights)
        rows.append((trajectory, alignment, scorer.score(trajectory, alignment)))
    return scorer, student, rows


def loss_and_grads(student, trajectory, alignment, provider):
    for p in student.trainable_parameters():
        p.grad = None
    hidden = student.hidden_states_at(
        trajectory.token_ids, alignment.student_prediction_positions, with_grad=True
    )
    result = chunked_selected_position_loss(
        hidden_states=hidden,
        lm_head=student.project,
        weights=torch.tensor(alignment.token_weights) / alignment.total_weight,
        weight_normalizer=1,
        provider=provider,
        target_token_ids=torch.tensor(alignment.target_token_ids),
        ce_weight=0.0,
        chunk_size=8,
        backward=True,
    )
    return result.loss, [p.grad.clone() for p in student.trainable_parameters()]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_identical(tmp_path: Path, scored, dtype: str) -> None:
    scorer, _, rows = scored
    cache = TeacherCache(tmp_path, scorer.cache_provenance(dtype=dtype), max_entries_per_shard=3)
    for trajectory, _, result in rows:
        cache.write(trajectory.trajectory_id, result)
    assert cache.keys() == [] and cache.num_staged == len(rows)
    assert cache.flush() == ["shard-00000.safetensors", "shard-00001.safetensors"]
    reopened = TeacherCache.open(tmp_path, scorer.cache_provenance(dtype=dtype))
    for trajectory, alignment, result in rows:
        cached = reopened.read(
            trajectory.trajectory_id, expect_policy_version=trajectory.policy_version
        )
        wanted = {"topk_indices": torch.int32, "teacher_entropy": torch.float32}
        expected = {
            name: t.to(device="cpu", dtype=wanted.get(name, getattr(torch, dtype)))
            for name, t in result.cache_tensors().items()
        }
        assert set(cached.tensors) == set(expected)
        for name, tensor in expected.items():
            assert cached.tensors[name].dtype == tensor.dtype
            assert torch.equal(cached.tensors[name].view(torch.uint8), tensor.view(torch.uint8)), (
                name
            )
        assert (
            cached.alignment_digest == alignment.digest()
            and cached.policy_version == trajectory.policy_version
        )
        assert cached.entropy_is_lower_bound
        assert reopened.record(trajectory.trajectory_id).teacher_entropy_mean == pytest.approx(
            result.teacher_entropy_mean
        )
    assert reopened.validate().entries == len(rows)


def test_cached_provider_gives_the_live_loss_and_gradients(tmp_path: Path, scored) -> None:
    scorer, student, rows = scored
    cache = TeacherCache(tmp_path, scorer.cache_provenance())
    for trajectory, _, result in rows:
        cache.write(trajectory.trajectory_id, result)
    cache.flush()
    for trajectory, alignment, result in rows:
        cached = cache.read(
            trajectory.trajectory_id,
            expect_policy_version=trajectory.policy_version,
            expect_alignment_digest=alignment.digest(),
        )
        live_loss, live_grads = loss_and_grads(student, trajectory, alignment, result.provider)
        cached_loss, cached_grads = loss_and_grads(
            student, trajectory, alignment, cached.provider(SPEC)
        )
        assert cached_loss == live_loss and live_loss > 0
        for a, b in zip(cached_grads, live_grads, strict=True):
            assert torch.equal(a, b)


def test_cached_targets_refuse_another_temperature(tmp_path: Path, scored) -> None:
    scorer, _, rows = scored
    trajectory, _, result = rows[0]
    cache = TeacherCache(tmp_path, scorer.cache_provenance())
    cache.write(trajectory.trajectory_id, result)
    cache.flush()
    cached = cache.read(trajectory.trajectory_id, expect_policy_version=trajectory.policy_version)
    with pytest.raises(ConfigError, match="temperature"):
        cached.provider(DivergenceSpec("reverse_kl", temperature=2.0))


def test_a_result_from_other_settings_is_refused(tmp_path: Path, scored) -> None:
    scorer, _, rows = scored
    trajectory, _, result = rows[0]
    cache = TeacherCache(
        tmp_path, scorer.cache_provenance().model_copy(update={"temperature": 2.0})
    )
    with pytest.raises(ConfigError, match="temperature"):
        cache.write(trajectory.trajectory_id, result)
    cache = TeacherCache(tmp_path / "b", scorer.cache_provenance())
    with pytest.raises(ValueError, match="policy_version"):
        cache.write(trajectory.trajectory_id, result, policy_version=trajectory.policy_version + 1)


# -- the policy-version contract -------------------------------------------------------


def test_strict_read_refuses_an_entry_of_a_newer_policy_version(tmp_path: Path) -> None:
    """Strict means equal, not "at least as new": targets scored for a later policy than the
    one being trained (a resumed run reading ahead, a replayed cache) are not on-policy."""
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "traj-b", version=5)
    cache.flush()
    with pytest.raises(StaleCacheError) as caught:
        cache.read("traj-b", expect_policy_version=4)
    assert (
        "'traj-b'" in caught.value.message
        and "policy version 5" in caught.value.message
        and "policy version 4 was expected" in caught.value.message
    )
    assert cache.read("traj-b", expect_policy_version=5).policy_version == 5
    reuse = TeacherCache.open(tmp_path, reuse_across_policy_versions=True)
    assert reuse.read("traj-b", expect_policy_version=4).policy_version == 5


def test_read_expecting_a_fingerprint_refuses_an_entry_recorded_without_one(
    tmp_path: Path,
) -> None:
    """A rollout with a policy fingerprint cannot be trained on targets that carry none:
    nothing then ties them to the weights that sampled it."""
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "bare", version=2)
    cache.write(
        "stamped", synthetic(5, seed=9), trajectory_id="stamped", policy_version=2,
        alignment_digest=digest("stamped"), policy_fingerprint="fp-A",
    )  # fmt: skip
    cache.flush()
    assert cache.record("bare").policy_fingerprint is None
    with pytest.raises(OffPolicyError, match="'bare' were produced for policy fingerprint None"):
        cache.read("bare", expect_policy_version=2, expect_policy_fingerprint="fp-A")
    with pytest.raises(OffPolicyError, match="fingerprint fp-A, but fp-B was expected"):
        cache.read("stamped", expect_policy_version=2, expect_policy_fingerprint="fp-B")
    stamped = cache.read("stamped", expect_policy_version=2, expect_policy_fingerprint="fp-A")
    assert stamped.record.policy_fingerprint == "fp-A"


def test_stale_read_raises_and_reuse_allows_it(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "traj-a", version=3)
    cache.flush()
    assert cache.read("traj-a", expect_policy_version=3).policy_version == 3
    with pytest.raises(StaleCacheError) as caught:
        cache.read("traj-a", expect_policy_version=4)
    assert (
        "'traj-a'" in caught.value.message
        and "version 3" in caught.value.message
        and "4" in caught.value.message
    )
    with pytest.raises(ValueError, match="expect_policy_version"):
        cache.read("traj-a", expect_policy_version=None)
    reuse = TeacherCache.open(tmp_path, reuse_across_policy_versions=True)
    assert reuse.read("traj-a", expect_policy_version=4).policy_version == 3
    assert reuse.read("traj-a", expect_policy_version=None).policy_version == 3
    lax = TeacherCache.open(tmp_path, strict_policy_version=False)
    assert lax.read("traj-a", expect_policy_version=9).policy_version == 3
    with pytest.raises(StaleCacheError, match="different alignment"):
        cache.read("traj-a", expect_policy_version=3, expect_alignment_digest=digest("other"))
    with pytest.raises(KeyError):
        cache.read("missing", expect_policy_version=3)


def test_provenance_mismatch_names_the_field(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "a")
    cache.flush()
    with pytest.raises(CacheIntegrityError, match=r"top_k \(cache has 4, expected 8\)"):
        TeacherCache.open(tmp_path, provenance(top_k=8))
    with pytest.raises(CacheIntegrityError, match="temperature") as caught:
        TeacherCache(tmp_path, provenance(temperature=2.0))
    assert "top_k" not in caught.value.message
    with pytest.raises(CacheIntegrityError, match=r"index.json is missing"):
        TeacherCache.open(tmp_path / "nothing")
    with pytest.raises(CacheIntegrityError, match=r"index.json is missing"):
        TeacherCache(tmp_path / "nothing")


# -- writing ---------------------------------------------------------------------------


def test_write_checks_tensors_and_keys(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    good = synthetic(3, 0)
    meta = {"trajectory_id": "t", "policy_version": 0, "alignment_digest": digest("t")}
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        cache.write("t", synthetic(3, 0, k=5), **meta)
    with pytest.raises(ValueError, match="lie in"):
        cache.write("t", good | {"topk_indices": good["topk_indices"] + VOCAB}, **meta)
    with pytest.raises(ValueError, match="missing"):
        cache.write("t", {"topk_indices": good["topk_indices"]}, **meta)
    with pytest.raises(ValueError, match="trajectory_id"):
        cache.write("t", good)
    for bad in ["", "x" * 513, "line\nbreak", "tab\there"]:
        with pytest.raises(ValueError):
            cache.write(bad, good, **meta)
    with pytest.raises(Exception, match="alignment_digest"):
        cache.write("t", good, trajectory_id="t", policy_version=0, alignment_digest="not-a-digest")


def test_keys_with_slashes_and_percent_signs_round_trip(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    keys = ["run/1/traj%2F7", "a%25b", "a%b", "../../etc/passwd", "ключ:7"]
    written = {key: put(cache, key, seed=i) for i, key in enumerate(keys)}
    cache.flush()
    header, _ = read_safetensors_header(tmp_path / "shard-00000.safetensors")
    assert tensor_name("run/1/traj%2F7", "tail_log_prob") == "run%2F1%2Ftraj%252F7/tail_log_prob"
    assert all(name.count("/") == 1 for name in header if name != "__metadata__")
    assert encode_key("a%b") != encode_key("a%25b")
    for key, tensors in written.items():
        cached = cache.read(key, expect_policy_version=0)
        assert torch.equal(cached.topk_indices.long(), tensors["topk_indices"])
        assert torch.equal(cached.topk_log_probs, tensors["topk_log_probs"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [INDEX_NAME, "shard-00000.safetensors"]


def test_flush_writes_new_shards_and_never_rewrites_old_ones(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance(), max_entries_per_shard=2)
    for i in range(3):
        put(cache, f"t{i}")
    assert cache.flush() == ["shard-00000.safetensors", "shard-00001.safetensors"]
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.glob("shard-*")}
    put(cache, "t3")
    put(cache, "t4")
    assert cache.flush() == ["shard-00002.safetensors"]
    for name, (mtime, data) in before.items():
        assert (tmp_path / name).stat().st_mtime_ns == mtime and (
            tmp_path / name
        ).read_bytes() == data
    assert cache.flush() == []
    assert len(TeacherCache.open(tmp_path)) == 5
    assert cache.validate().shards == 3


def test_rewriting_a_key_replaces_it_and_drops_an_emptied_shard(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "k", seed=1)
    cache.flush()
    second = put(cache, "k", version=1, seed=2)
    cache.flush()
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == ["shard-00001.safetensors"]
    cached = cache.read("k", expect_policy_version=1)
    assert torch.equal(cached.topk_log_probs, second["topk_log_probs"])
    cache.validate()


def test_empty_entries_and_empty_caches(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    assert cache.flush() == []
    assert (tmp_path / INDEX_NAME).exists() and TeacherCache.open(tmp_path).stats()["entries"] == 0
    put(cache, "empty", n=0)
    cache.flush()
    cached = cache.read("empty", expect_policy_version=0)
    assert cached.topk_indices.shape == (0, K) and cached.tail_log_prob.shape == (0,)
    assert cache.validate().positions == 0
    assert cache.stats()["bytes_per_position"] is None


# -- crash safety ----------------------------------------------------------------------


def test_a_crash_before_the_index_rename_leaves_the_previous_cache_valid(
    tmp_path: Path, monkeypatch
) -> None:
    """The whole-index commit (``journal=False``, and every compaction) is crash safe too."""
    cache = TeacherCache(tmp_path, provenance(), max_entries_per_shard=2, journal=False)
    old = {key: put(cache, key) for key in ("a", "b", "c")}
    cache.flush()
    index_before = (tmp_path / INDEX_NAME).read_bytes()
    shards_before = {p.name: p.read_bytes() for p in tmp_path.glob("shard-*")}
    put(cache, "d")
    put(cache, "a", version=1, seed=99)

    real_replace = os.replace
    renamed: list[str] = []

    def crash_on_index(src, dst):
        if Path(dst).name == INDEX_NAME:
            raise OSError("simulated power loss before the index rename")
        renamed.append(Path(dst).name)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_index)
    with pytest.raises(OSError, match="simulated"):
        cache.flush()
    monkeypatch.setattr(os, "replace", real_replace)

    assert renamed == ["shard-00002.safetensors"]
    assert (tmp_path / INDEX_NAME).read_bytes() == index_before
    assert {
        p.name: p.read_bytes() for p in tmp_path.glob("shard-*") if p.name in shards_before
    } == shards_before
    survivor = TeacherCache.open(tmp_path, provenance())
    report = survivor.validate()
    assert report.entries == 3 and report.orphan_files == ["shard-00002.safetensors"]
    assert sorted(survivor.keys()) == ["a", "b", "c"]
    assert torch.equal(
        survivor.read("a", expect_policy_version=0).topk_log_probs, old["a"]["topk_log_probs"]
    )
    assert not list(tmp_path.glob(".*.tmp"))

    assert cache.num_staged == 2
    assert cache.flush() == ["shard-00003.safetensors"]
    assert cache.read("a", expect_policy_version=1).policy_version == 1
    assert cache.validate().orphan_files == ["shard-00002.safetensors"]
    assert cache.prune([0, 1])["removed_unreferenced_files"] == ["shard-00002.safetensors"]
    assert cache.validate().orphan_files == []


# -- prune and stats -------------------------------------------------------------------


def test_prune_deletes_empty_shards_and_compacts_partial_ones(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance(), max_entries_per_shard=3)
    versions = {"a": 0, "b": 1, "c": 0, "d": 1, "e": 1, "f": 1, "g": 2}
    written = {key: put(cache, key, version=v) for key, v in versions.items()}
    cache.flush()
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == [
        f"shard-0000{i}.safetensors" for i in range(3)
    ]
    result = cache.prune(keep_versions=[0, 2])
    assert result["removed_entries"] == 4 and result["kept_entries"] == 3
    assert result["kept_versions"] == {0: 2, 2: 1}
    assert result["deleted_shards"] == ["shard-00001.safetensors"]
    assert result["compacted_shards"] == {"shard-00000.safetensors": "shard-00003.safetensors"}
    assert result["bytes_after"] < result["bytes_before"]
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == [
        "shard-00002.safetensors",
        "shard-00003.safetensors",
    ]
    compacted = tmp_path / "shard-00003.safetensors"
    with safe_open(compacted, framework="pt") as handle:
        assert sorted(handle.keys()) == sorted(tensor_name(k, t) for k in "ac" for t in written[k])
        assert torch.equal(
            handle.get_tensor(tensor_name("c", "topk_log_probs")), written["c"]["topk_log_probs"]
        )
    reopened = TeacherCache.open(tmp_path, provenance())
    reopened.validate()
    for key in "acg":
        cached = reopened.read(key, expect_policy_version=versions[key])
        for name, tensor in written[key].items():
            assert torch.equal(cached.tensors[name].to(tensor.dtype), tensor)
    assert sorted(reopened.keys()) == ["a", "c", "g"]
    assert reopened.prune([0, 2])["compacted_shards"] == {}
    assert reopened.prune([])["kept_entries"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [INDEX_NAME]


def test_prune_compacts_shards_holding_superseded_tensors(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "x")
    put(cache, "y")
    cache.flush()
    put(cache, "x", version=0, seed=7)
    cache.flush()
    result = cache.prune([0])
    assert result["removed_entries"] == 0
    assert result["compacted_shards"] == {"shard-00000.safetensors": "shard-00002.safetensors"}
    cache.validate()


def test_prune_refuses_staged_entries_and_corrupted_sources(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance())
    put(cache, "a", version=0)
    put(cache, "b", version=1)
    with pytest.raises(ValueError, match="flush"):
        cache.prune([0])
    cache.flush()
    shard = tmp_path / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheIntegrityError, match="refusing to compact"):
        cache.prune([0])
    assert sorted(TeacherCache.open(tmp_path).keys()) == ["a", "b"]


def test_stats(tmp_path: Path) -> None:
    cache = TeacherCache(tmp_path, provenance(), max_entries_per_shard=2)
    put(cache, "a", n=10, version=0)
    put(cache, "b", n=20, version=1)
    put(cache, "c", n=30, version=1)
    cache.flush()
    stats = cache.stats()
    assert (
        stats["entries"] == 3
        and stats["positions"] == 60
        and stats["shards"] == 2
        and stats["top_k"] == K
    )
    assert stats["versions"] == {0: 1, 1: 2}
    assert stats["bytes_per_position"] == K * (4 + 4) + 4 + 4
    assert stats["tensor_bytes"] == 60 * stats["bytes_per_position"]
    assert stats["total_bytes"] == sum(p.stat().st_size for p in tmp_path.glob("shard-*"))
    assert stats["full_logits_bf16_bytes_per_position"] == 2 * VOCAB
    assert stats["index_dtype"] == "I32" and stats["dtype"] == "float32"
