"""The teacher-target cache: safetensors shards plus a JSON index (docs/design.md §3.6).

Importing this package does not import torch: ``miniverl cache stats|validate|prune`` run
from a base install through :mod:`miniverl.cache.maintenance`. torch and safetensors are imported inside the methods that build
tensors (:meth:`TeacherCache.write`, :meth:`TeacherCache.flush`, :meth:`TeacherCache.read`).
"""

from miniverl.cache.layout import (
    INDEX_NAME,
    TENSOR_ORDER,
    decode_key,
    encode_key,
    index_dtype_code,
    tensor_name,
    validate_key,
)
from miniverl.cache.maintenance import ValidationReport
from miniverl.cache.safetensors_io import (
    MAX_HEADER_BYTES,
    RawTensor,
    TensorInfo,
    encode_safetensors,
    parse_safetensors_header,
    read_safetensors_header,
)
from miniverl.cache.store import TeacherCache
from miniverl.cache.targets import CacheableTargets, CachedTargets

__all__ = [
    "INDEX_NAME",
    "MAX_HEADER_BYTES",
    "TENSOR_ORDER",
    "CacheableTargets",
    "CachedTargets",
    "RawTensor",
    "TeacherCache",
    "TensorInfo",
    "ValidationReport",
    "decode_key",
    "encode_key",
    "encode_safetensors",
    "index_dtype_code",
    "parse_safetensors_header",
    "read_safetensors_header",
    "tensor_name",
    "validate_key",
]
