"""Tampering, truncation and hostile headers: every one is a named CacheIntegrityError."""

from __future__ import annotations

import hashlib
import json
import struct
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from miniverl.cache import (
    INDEX_NAME,
    TeacherCache,
    parse_safetensors_header,
    read_safetensors_header,
    tensor_name,
)
from miniverl.cache.safetensors_io import tensor_infos
from miniverl.errors import CacheIntegrityError
from miniverl.schemas.cache import CacheProvenance

K, VOCAB = 4, 50
SHARD = "shard-00000.safetensors"


def build(directory: Path, keys: tuple[str, ...] = ("alpha", "beta", "gamma")) -> TeacherCache:
    cache = TeacherCache(
        directory,
        CacheProvenance(
            teacher_model_id="t",
            tokenizer_fingerprint="a" * 64,
            top_k=K,
            temperature=1.0,
            vocab_size=VOCAB,
        ),
    )
    for i, key in enumerate(keys):
        g = torch.Generator().manual_seed(i)
        log_probs = torch.log_softmax(torch.randn(6, VOCAB, generator=g), dim=-1)
        top = torch.topk(log_probs, K)
        cache.write(
            key,
            {
                "topk_indices": top.indices,
                "topk_log_probs": top.values,
                "tail_log_prob": torch.full((6,), -2.0),
            },
            trajectory_id=key,
            policy_version=0,
            alignment_digest=hashlib.sha256(key.encode()).hexdigest(),
        )
    cache.flush()
    return cache


def edit_index(directory: Path, change) -> None:
    path = directory / INDEX_NAME
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))


def header_file(header: dict, data: bytes = b"", *, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


# -- tampering with a real cache -------------------------------------------------------


def test_a_flipped_data_byte_names_the_entry(tmp_path: Path) -> None:
    cache = build(tmp_path)
    shard = tmp_path / SHARD
    header, start = read_safetensors_header(shard)
    target = tensor_infos(header, start)[tensor_name("beta", "topk_log_probs")]
    data = bytearray(shard.read_bytes())
    data[target.begin + 5] ^= 0x40
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheIntegrityError) as caught:
        TeacherCache.open(tmp_path).validate()
    message = caught.value.message
    assert "entry 'beta'" in message and "tensor SHA-256" in message and SHARD in message
    assert "'alpha'" not in message and "'gamma'" not in message
    with pytest.raises(CacheIntegrityError, match=r"'beta'.*SHA-256"):
        cache.read("beta", expect_policy_version=0)
    assert cache.read("alpha", expect_policy_version=0).num_positions == 6


def test_a_truncated_shard_is_a_clear_error(tmp_path: Path) -> None:
    cache = build(tmp_path)
    shard = tmp_path / SHARD
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 40])
    with pytest.raises(CacheIntegrityError) as caught:
        TeacherCache.open(tmp_path).validate()
    assert (
        f"shard {SHARD} is {len(data) - 40} bytes but the index records {len(data)}"
        in caught.value.message
    )
    assert "truncated" in caught.value.message
    with pytest.raises(CacheIntegrityError, match=f"{SHARD}.*(truncated|data region)"):
        cache.read("gamma", expect_policy_version=0)
    shard.write_bytes(data[:5])
    with pytest.raises(CacheIntegrityError, match="shorter than the 8-byte header-length prefix"):
        TeacherCache.open(tmp_path).read("alpha", expect_policy_version=0)


def test_an_edited_shard_hash_in_the_index_names_the_shard(tmp_path: Path) -> None:
    build(tmp_path)

    def change(payload):
        payload["shards"][SHARD]["sha256"] = "0" * 64

    edit_index(tmp_path, change)
    with pytest.raises(CacheIntegrityError) as caught:
        TeacherCache.open(tmp_path).validate()
    assert f"shard {SHARD} failed its file SHA-256 check" in caught.value.message
    assert "entry" not in caught.value.message


def test_an_edited_entry_hash_names_the_entry(tmp_path: Path) -> None:
    build(tmp_path)

    def change(payload):
        payload["entries"]["gamma"]["sha256"] = "1" * 64

    edit_index(tmp_path, change)
    with pytest.raises(CacheIntegrityError, match="entry 'gamma'"):
        TeacherCache.open(tmp_path).validate()


def test_a_header_length_of_2_pow_60_fails_fast(tmp_path: Path) -> None:
    hostile = tmp_path / "hostile.safetensors"
    hostile.write_bytes(struct.pack("<Q", 2**60) + b"{}" + b"\0" * 64)
    started = time.perf_counter()
    with pytest.raises(CacheIntegrityError, match="exceeds the 100000000-byte limit"):
        read_safetensors_header(hostile)
    assert time.perf_counter() - started < 1.0

    build(tmp_path / "cache")
    shard = tmp_path / "cache" / SHARD
    shard.write_bytes(struct.pack("<Q", 2**60) + shard.read_bytes()[8:])
    started = time.perf_counter()
    with pytest.raises(CacheIntegrityError, match=f"shard {SHARD} is malformed.*header length"):
        TeacherCache.open(tmp_path / "cache").validate()
    with pytest.raises(CacheIntegrityError, match="header length"):
        TeacherCache.open(tmp_path / "cache").read("alpha", expect_policy_version=0)
    assert time.perf_counter() - started < 1.0


def test_a_path_traversal_shard_name_is_rejected(tmp_path: Path) -> None:
    cache_dir = tmp_path / "a" / "b" / "cache"
    build(cache_dir, keys=("only",))
    (tmp_path / "a" / "x.safetensors").write_bytes((cache_dir / SHARD).read_bytes())
    evil = "../../x.safetensors"

    def change(payload):
        shard = payload["shards"].pop(SHARD)
        shard["name"] = evil
        payload["shards"][evil] = shard
        payload["entries"]["only"]["shard"] = evil

    edit_index(cache_dir, change)
    with pytest.raises(CacheIntegrityError) as caught:
        TeacherCache.open(cache_dir)
    assert evil in caught.value.message and "index" in caught.value.message
    fresh = build(tmp_path / "other")
    for name in (evil, "shard-1.safetensors", "/etc/passwd", "shard-00000.safetensors/../x"):
        with pytest.raises(CacheIntegrityError, match="shard-NNNNN"):
            fresh._shard_path(name)


def test_a_shard_that_is_a_symlink_is_rejected(tmp_path: Path) -> None:
    cache = build(tmp_path / "cache")
    outside = tmp_path / "outside.safetensors"
    shard = tmp_path / "cache" / SHARD
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(CacheIntegrityError, match="symbolic link"):
        cache.read("alpha", expect_policy_version=0)
    with pytest.raises(CacheIntegrityError, match="symbolic link"):
        cache.validate()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda p: p["entries"]["alpha"].update(shard="shard-00009.safetensors"), "unknown shard"),
        (lambda p: p["shards"][SHARD]["entries"].append("alpha"), "listed by shards|listed"),
        (lambda p: p["shards"][SHARD]["entries"].remove("alpha"), "does not list it"),
        (lambda p: p["entries"]["alpha"].update(top_k=3), "top_k"),
        (lambda p: p["entries"]["alpha"].update(tensors=["topk_indices"]), "lists tensors"),
        (lambda p: p.update(schema_version=99), "schema_version"),
        (lambda p: p["entries"]["alpha"].update(extra="x"), "extra"),
    ],
)
def test_an_inconsistent_index_is_rejected(tmp_path: Path, change, match: str) -> None:
    build(tmp_path)
    edit_index(tmp_path, change)
    with pytest.raises(CacheIntegrityError, match=match):
        TeacherCache.open(tmp_path)


def test_a_non_json_index_and_a_missing_shard(tmp_path: Path) -> None:
    build(tmp_path)
    (tmp_path / SHARD).unlink()
    with pytest.raises(CacheIntegrityError, match=f"shard {SHARD} is missing"):
        TeacherCache.open(tmp_path).validate()
    (tmp_path / INDEX_NAME).write_text("{not json")
    with pytest.raises(CacheIntegrityError, match="not valid UTF-8 JSON"):
        TeacherCache.open(tmp_path)


def test_an_entry_whose_header_record_changed_shape_is_rejected(tmp_path: Path) -> None:
    cache = build(tmp_path, keys=("one",))
    shard = tmp_path / SHARD
    data = shard.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    header[tensor_name("one", "topk_indices")]["shape"] = [K, 6]
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    text += b" " * (length - len(text))
    shard.write_bytes(data[:8] + text + data[8 + length :])
    with pytest.raises(CacheIntegrityError, match=r"is I32\[4, 6\], expected I32\[6, 4\]"):
        cache.read("one", expect_policy_version=0)


# -- the header parser on its own ------------------------------------------------------

F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "shorter than the 8-byte"),
        (b"\x01\x02\x03", "shorter than the 8-byte"),
        (struct.pack("<Q", 50) + b"{}", "truncated: the header declares 50"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not valid UTF-8 JSON"),
        (struct.pack("<Q", 5) + b"{abc}", "not valid UTF-8 JSON"),
        (header_file([1, 2]), "must be a JSON object"),  # type: ignore[arg-type]
        (header_file({"t": F32 | {"dtype": "F128"}}, b"\0" * 8), "unknown dtype"),
        (header_file({"t": F32 | {"shape": [-2]}}, b"\0" * 8), "invalid shape"),
        (header_file({"t": F32 | {"shape": [True, 2]}}, b"\0" * 8), "invalid shape"),
        (
            header_file({"t": F32 | {"data_offsets": [0, 16]}}, b"\0" * 8),
            "outside the 8-byte data region",
        ),
        (header_file({"t": F32 | {"data_offsets": [8, 0]}}, b"\0" * 8), "outside"),
        (header_file({"t": F32 | {"data_offsets": [0]}}, b"\0" * 8), "invalid data_offsets"),
        (header_file({"t": F32 | {"shape": [3]}}, b"\0" * 8), "= 12 bytes but its offsets span 8"),
        (
            header_file({"t": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
            "exactly dtype, shape and data_offsets",
        ),
        (header_file({"a": F32, "b": F32 | {"data_offsets": [4, 12]}}, b"\0" * 12), "overlaps"),
        (
            header_file({"a": F32, "b": F32 | {"data_offsets": [12, 20]}}, b"\0" * 20),
            "unaccounted bytes",
        ),
        (header_file({"a": F32}, b"\0" * 16), "holds 16 bytes but its tensors cover 8"),
        (header_file({"a": F32, "__metadata__": {"k": 1}}, b"\0" * 8), "__metadata__"),
        (header_file({"t": F32 | {"shape": [2**62, 2**62]}}, b"\0" * 8), "offsets span 8"),
    ],
)
def test_malformed_headers_are_integrity_errors(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(CacheIntegrityError, match=match):
        read_safetensors_header(path)


def test_duplicate_header_keys_are_rejected(tmp_path: Path) -> None:
    text = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 8)
    with pytest.raises(CacheIntegrityError, match="duplicate key"):
        read_safetensors_header(path)


def test_a_missing_file_is_an_integrity_error(tmp_path: Path) -> None:
    with pytest.raises(CacheIntegrityError, match="cannot be read"):
        read_safetensors_header(tmp_path / "absent.safetensors")


VALID = save(
    {
        "x": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "y": torch.tensor([1, 2], dtype=torch.int32),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=256),
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)).map(
            lambda edit: VALID[: edit[0]] + bytes([edit[1]]) + VALID[edit[0] + 1 :]
        ),
        st.integers(0, len(VALID)).map(lambda cut: VALID[:cut]),
    )
)
def test_arbitrary_bytes_never_crash_the_parser(content: bytes) -> None:
    try:
        header, start = parse_safetensors_header(content, len(content))
    except CacheIntegrityError:
        return
    infos = tensor_infos(header, start)
    assert all(start <= info.begin <= info.end <= len(content) for info in infos.values())
