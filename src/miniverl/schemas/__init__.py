"""Data contracts (no torch): trajectories, alignment maps and the cache index."""

from miniverl.schemas.alignment import AlignmentMap
from miniverl.schemas.cache import CacheEntryRecord, CacheIndex, CacheProvenance, CacheShardRecord
from miniverl.schemas.trajectory import (
    CRITICAL_SPAN_TYPES,
    MODEL_GENERATED_SPAN_TYPES,
    TRAJECTORY_SCHEMA_VERSION,
    Span,
    SpanType,
    TerminationReason,
    ToolCallRecord,
    ToolResultRecord,
    Trajectory,
    Turn,
    VerificationRecord,
)

__all__ = [
    "CRITICAL_SPAN_TYPES",
    "MODEL_GENERATED_SPAN_TYPES",
    "TRAJECTORY_SCHEMA_VERSION",
    "AlignmentMap",
    "CacheEntryRecord",
    "CacheIndex",
    "CacheProvenance",
    "CacheShardRecord",
    "Span",
    "SpanType",
    "TerminationReason",
    "ToolCallRecord",
    "ToolResultRecord",
    "Trajectory",
    "Turn",
    "VerificationRecord",
]
