"""The torch-free safetensors reader and writer agree with the safetensors library."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load, save

from miniverl.cache import (
    RawTensor,
    encode_safetensors,
    parse_safetensors_header,
    read_safetensors_header,
)
from miniverl.cache.safetensors_io import tensor_infos

TENSORS = {
    "a/topk_indices": torch.arange(12, dtype=torch.int32).reshape(3, 4),
    "a/topk_log_probs": torch.linspace(-3, -0.1, 12, dtype=torch.bfloat16).reshape(3, 4),
    "a/tail_log_prob": torch.tensor([-1.0, float("-inf"), -2.5], dtype=torch.float16),
    "b/teacher_entropy": torch.tensor([0.5, 1.5], dtype=torch.float32),
    "b/big": torch.arange(5, dtype=torch.int64),
    "empty/rows": torch.empty((0, 4), dtype=torch.float32),
}
CODES = {
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}


def raw(name: str, tensor: torch.Tensor) -> RawTensor:
    data = tensor.contiguous().view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    return RawTensor(name, CODES[tensor.dtype], tuple(tensor.shape), data)


def test_hand_written_files_load_with_the_library(tmp_path: Path) -> None:
    blob = encode_safetensors([raw(n, t) for n, t in TENSORS.items()], {"format": "pt"})
    path = tmp_path / "hand.safetensors"
    path.write_bytes(blob)
    assert (8 + int.from_bytes(blob[:8], "little")) % 8 == 0
    with safe_open(path, framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
        assert sorted(handle.keys()) == sorted(TENSORS)
        for name, tensor in TENSORS.items():
            loaded = handle.get_tensor(name)
            assert loaded.dtype == tensor.dtype and torch.equal(loaded, tensor), name
    assert all(torch.equal(load(blob)[n], t) for n, t in TENSORS.items())


def test_library_files_parse_identically(tmp_path: Path) -> None:
    path = tmp_path / "lib.safetensors"
    blob = save(TENSORS, metadata={"k": "v"})
    path.write_bytes(blob)
    header, start = read_safetensors_header(path)
    assert header["__metadata__"] == {"k": "v"}
    infos = tensor_infos(header, start)
    assert sorted(infos) == sorted(TENSORS)
    for name, tensor in TENSORS.items():
        info = infos[name]
        assert info.dtype == CODES[tensor.dtype] and info.shape == tuple(tensor.shape)
        assert blob[info.begin : info.end] == raw(name, tensor).data
    assert parse_safetensors_header(blob, len(blob)) == (header, start)


def test_the_writer_aligns_every_tensor_like_the_library() -> None:
    mine = encode_safetensors([raw(n, t) for n, t in TENSORS.items()])
    theirs = save(TENSORS)
    mine_infos = tensor_infos(*parse_safetensors_header(mine, len(mine)))
    their_infos = tensor_infos(*parse_safetensors_header(theirs, len(theirs)))
    assert len(mine) == len(theirs)
    for name, info in mine_infos.items():
        other = their_infos[name]
        assert (info.dtype, info.shape) == (other.dtype, other.shape)
        assert mine[info.begin : info.end] == theirs[other.begin : other.end]
        assert info.begin % {"I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2}[info.dtype] == 0


def test_the_writer_refuses_inconsistent_tensors() -> None:
    with pytest.raises(ValueError, match="bytes"):
        encode_safetensors([RawTensor("x", "F32", (3,), b"\0" * 8)])
    with pytest.raises(ValueError, match="reserved or repeated"):
        encode_safetensors(
            [RawTensor("x", "F32", (1,), b"\0" * 4), RawTensor("x", "F32", (1,), b"\0" * 4)]
        )
