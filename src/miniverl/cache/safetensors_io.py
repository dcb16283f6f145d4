"""The safetensors file format, read and written without a tensor library.

A safetensors file is ``u64 little-endian header length n`` + ``n`` bytes of UTF-8 JSON +
a data region. The JSON object maps tensor names to ``{"dtype", "shape", "data_offsets"}``
(offsets relative to the data region) plus an optional ``"__metadata__"`` object of
strings. Parsing it here, instead of through ``safetensors``/torch, is what lets
``miniverl cache stats|validate|prune`` run from a base install, and it lets every check
be bounded: a hostile file costs at most :data:`MAX_HEADER_BYTES` of memory and one
``fstat`` before it is rejected, never a crash or a huge allocation.

The structural rules enforced are the ones the reference implementation enforces when it
loads a file: known dtypes, non-negative integer shapes, ``dtype × shape`` agreeing with
the byte count, and tensors tiling the data region exactly (no overlap, no gap, no
trailing bytes).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniverl.errors import CacheIntegrityError

MAX_HEADER_BYTES = 100_000_000
"""Largest JSON header accepted (the reference implementation's limit)."""

HEADER_ALIGNMENT = 8
"""The header is space-padded so the data region starts on an 8-byte boundary."""

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
"""Bytes per element of every safetensors dtype this reader accepts."""

METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a parsed header; ``begin``/``end`` are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class RawTensor:
    """A tensor as bytes: what :func:`encode_safetensors` writes (little-endian, C order)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes


def _fail(where: str, problem: str) -> CacheIntegrityError:
    return CacheIntegrityError(f"{where}: {problem}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON object hook: a repeated key could hide a second, different tensor record."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_safetensors_header(
    prefix_and_header: bytes, file_size: int, *, where: str = "safetensors file"
) -> tuple[dict[str, Any], int]:
    """Validate the first ``8 + n`` bytes of a file of ``file_size`` bytes.

    Returns ``(header, data_start)``: the JSON object as parsed and the absolute offset of
    the data region. ``prefix_and_header`` may hold fewer bytes than declared (a truncated
    file), which is reported, not indexed past. Every problem is a
    :class:`CacheIntegrityError` naming ``where``.
    """
    if file_size < 8 or len(prefix_and_header) < 8:
        raise _fail(
            where, f"truncated: {file_size} bytes, shorter than the 8-byte header-length prefix"
        )
    length = int.from_bytes(prefix_and_header[:8], "little")
    if length > MAX_HEADER_BYTES:
        raise _fail(
            where,
            f"header length {length} exceeds the {MAX_HEADER_BYTES}-byte limit (corrupt or hostile file)",
        )
    if 8 + length > file_size:
        raise _fail(
            where,
            f"truncated: the header declares {length} bytes but the file holds {file_size - 8} after the prefix",
        )
    raw = prefix_and_header[8 : 8 + length]
    if len(raw) != length:
        raise _fail(where, f"truncated: read {len(raw)} of {length} header bytes")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(
            where, f"header is not valid UTF-8 JSON ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(header, dict):
        raise _fail(where, f"header must be a JSON object, got {type(header).__name__}")
    data_start = 8 + length
    tensors = _tensor_infos(header, data_start, file_size - data_start, where)
    _check_tiling(tensors, data_start, file_size - data_start, where)
    return header, data_start


def _tensor_infos(
    header: dict[str, Any], data_start: int, data_size: int, where: str
) -> list[TensorInfo]:
    metadata = header.get(METADATA_KEY)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _fail(where, "__metadata__ must be an object of strings")
    infos: list[TensorInfo] = []
    for name, record in header.items():
        if name == METADATA_KEY:
            continue
        label = f"tensor {name!r}"
        if not isinstance(record, dict) or set(record) != {"dtype", "shape", "data_offsets"}:
            raise _fail(
                where, f"{label} must be an object with exactly dtype, shape and data_offsets"
            )
        dtype, shape, offsets = record["dtype"], record["shape"], record["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise _fail(where, f"{label} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise _fail(
                where, f"{label} has an invalid shape {shape!r} (expected non-negative integers)"
            )
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
        ):
            raise _fail(where, f"{label} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_size:
            raise _fail(
                where,
                f"{label} has data_offsets [{begin}, {end}) outside the {data_size}-byte data region",
            )
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if expected != end - begin:
            raise _fail(
                where,
                f"{label} is {dtype}{list(shape)} = {expected} bytes but its offsets span {end - begin}",
            )
        infos.append(TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end))
    return infos


def _check_tiling(infos: list[TensorInfo], data_start: int, data_size: int, where: str) -> None:
    cursor = data_start
    for info in sorted(infos, key=lambda t: (t.begin, t.end)):
        if info.begin < cursor:
            raise _fail(where, f"tensor {info.name!r} overlaps the tensor before it")
        if info.begin > cursor:
            raise _fail(
                where, f"{info.begin - cursor} unaccounted bytes before tensor {info.name!r}"
            )
        cursor = info.end
    if cursor != data_start + data_size:
        raise _fail(
            where,
            f"the data region holds {data_size} bytes but its tensors cover {cursor - data_start}",
        )


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """Parse and validate the header of the file at ``path`` without loading any tensor.

    Returns ``(header, data_start)`` as :func:`parse_safetensors_header` does. Reads at most
    ``8 + min(declared length, file size)`` bytes; a missing or unreadable file, an absurd
    header length, non-JSON, offsets outside the file, overlapping tensors or a
    dtype/shape/byte-count disagreement is a :class:`CacheIntegrityError`.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) == 8:
                declared = int.from_bytes(prefix, "little")
                if declared <= MAX_HEADER_BYTES and 8 + declared <= size:
                    prefix += handle.read(declared)
    except OSError as exc:
        raise _fail(path.name, f"cannot be read ({exc.strerror or exc})") from None
    return parse_safetensors_header(prefix, size, where=path.name)


def tensor_infos(header: dict[str, Any], data_start: int) -> dict[str, TensorInfo]:
    """The tensors of a header already validated by :func:`parse_safetensors_header`."""
    out: dict[str, TensorInfo] = {}
    for name, record in header.items():
        if name == METADATA_KEY:
            continue
        begin, end = record["data_offsets"]
        out[name] = TensorInfo(
            name, record["dtype"], tuple(record["shape"]), data_start + begin, data_start + end
        )
    return out


def encode_safetensors(
    tensors: Iterable[RawTensor], metadata: dict[str, str] | None = None
) -> bytes:
    """Serialize raw tensors to safetensors bytes that the reference reader loads.

    Tensors are ordered by element size (largest first), then name, so every tensor is
    naturally aligned once the header is space-padded to :data:`HEADER_ALIGNMENT` (the
    reference writer's guarantee too); the data region is their concatenation with no gaps.
    """
    items = sorted(tensors, key=lambda t: (-DTYPE_SIZES[t.dtype], t.name))
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for item in items:
        if item.name == METADATA_KEY or item.name in header:
            raise ValueError(f"tensor name {item.name!r} is reserved or repeated")
        expected = math.prod(item.shape) * DTYPE_SIZES[item.dtype]
        if expected != len(item.data):
            raise ValueError(
                f"tensor {item.name!r} is {item.dtype}{list(item.shape)} = {expected} bytes, got {len(item.data)}"
            )
        header[item.name] = {
            "dtype": item.dtype,
            "shape": list(item.shape),
            "data_offsets": [offset, offset + len(item.data)],
        }
        offset += len(item.data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % HEADER_ALIGNMENT)
    return b"".join([len(text).to_bytes(8, "little"), text, *(item.data for item in items)])


__all__ = [
    "DTYPE_SIZES",
    "HEADER_ALIGNMENT",
    "MAX_HEADER_BYTES",
    "RawTensor",
    "TensorInfo",
    "encode_safetensors",
    "parse_safetensors_header",
    "read_safetensors_header",
    "tensor_infos",
]
