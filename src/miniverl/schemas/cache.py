"""Schemas of the teacher-cache ``index.json`` (read by the torch-free ``miniverl cache``).

A cache directory holds ``shard-NNNNN.safetensors`` files and one ``index.json`` that
records provenance, the policy version of every entry and SHA-256 checksums of every
entry's tensor bytes and every shard file.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CACHE_SCHEMA_VERSION = 1
SHARD_NAME_PATTERN = r"^shard-\d{5}\.safetensors$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"

CacheTensorName = Literal["topk_indices", "topk_log_probs", "tail_log_prob", "teacher_entropy"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheProvenance(_Strict):
    """Where every target in the cache came from; a reader refuses a mismatch."""

    teacher_model_id: str
    teacher_revision: str | None = None
    tokenizer_fingerprint: str
    loss_mode: Literal["bucketed"] = "bucketed"
    top_k: int = Field(ge=1)
    temperature: float = Field(gt=0)
    vocab_size: int = Field(ge=1)
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    teacher_mode: Literal["standard", "privileged_context"] = "standard"


class CacheEntryRecord(_Strict):
    """One trajectory's teacher targets, stored as tensors ``<key>/<name>`` in one shard."""

    key: str = Field(min_length=1, max_length=512)
    trajectory_id: str
    policy_version: int = Field(
        ge=0, description="Rollout policy version the targets were produced for."
    )
    alignment_digest: str = Field(pattern=SHA256_PATTERN)
    policy_fingerprint: str | None = Field(
        None,
        description="Fingerprint of the weights that sampled the trajectory (miniverl.models.fingerprint).",
    )
    shard: str = Field(pattern=SHARD_NAME_PATTERN)
    num_positions: int = Field(ge=0)
    top_k: int = Field(ge=1)
    tensors: list[str]
    sha256: str = Field(
        pattern=SHA256_PATTERN,
        description="SHA-256 of the entry's tensor bytes, in `tensors` order.",
    )
    teacher_entropy_mean: float | None = None


class CacheShardRecord(_Strict):
    name: str = Field(pattern=SHARD_NAME_PATTERN)
    sha256: str = Field(pattern=SHA256_PATTERN)
    size_bytes: int = Field(ge=0)
    entries: list[str]


class CacheIndex(_Strict):
    schema_version: int = CACHE_SCHEMA_VERSION
    created_at: str
    updated_at: str
    provenance: CacheProvenance
    entries: dict[str, CacheEntryRecord] = Field(default_factory=dict)
    shards: dict[str, CacheShardRecord] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> CacheIndex:
        if self.schema_version != CACHE_SCHEMA_VERSION:
            raise ValueError(
                f"cache index schema_version {self.schema_version}, this build reads version {CACHE_SCHEMA_VERSION}"
            )
        for key, entry in self.entries.items():
            if entry.key != key:
                raise ValueError(f"entry stored under {key!r} names itself {entry.key!r}")
            if entry.shard not in self.shards:
                raise ValueError(f"entry {key!r} points at unknown shard {entry.shard!r}")
        for name, shard in self.shards.items():
            if shard.name != name:
                raise ValueError(f"shard stored under {name!r} names itself {shard.name!r}")
            for key in shard.entries:
                if key not in self.entries:
                    raise ValueError(f"shard {name!r} lists unknown entry {key!r}")
        return self


__all__ = [
    "CACHE_SCHEMA_VERSION",
    "SHARD_NAME_PATTERN",
    "CacheEntryRecord",
    "CacheIndex",
    "CacheProvenance",
    "CacheShardRecord",
]
