"""``AlignmentMap``: which student and teacher distributions predict which token.

Entry i says: the student distribution at ``student_prediction_positions[i]`` and the
teacher distribution at ``teacher_prediction_positions[i]`` both predict
``target_token_ids[i]``, with weight ``token_weights[i]``. Six parallel lists; only
``trajectory.alignment`` builds them (it performs the j -> j-1 conversion).
"""

from __future__ import annotations

import itertools
from collections import Counter

from pydantic import BaseModel, ConfigDict, model_validator

from miniverl.utils.hashing import sha256_json

_PARALLEL = (
    "teacher_prediction_positions",
    "target_token_ids",
    "model_token_mask",
    "token_weights",
    "span_types",
)


class AlignmentMap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectory_id: str
    student_prediction_positions: list[int]
    teacher_prediction_positions: list[int]
    target_token_ids: list[int]
    model_token_mask: list[bool]
    token_weights: list[float]
    span_types: list[str]

    @model_validator(mode="after")
    def _validate(self) -> AlignmentMap:
        expected = len(self.student_prediction_positions)
        for name in _PARALLEL:
            size = len(getattr(self, name))
            if size != expected:
                raise ValueError(f"alignment field {name!r} has length {size}, expected {expected}")
        if expected == 0:
            return self
        if any(p < 0 for p in self.student_prediction_positions):
            raise ValueError("student prediction positions must be >= 0")
        if any(p < 0 for p in self.teacher_prediction_positions):
            raise ValueError("teacher prediction positions must be >= 0")
        pos = self.student_prediction_positions
        if any(b <= a for a, b in itertools.pairwise(pos)):
            raise ValueError("student prediction positions must be strictly increasing")
        if any(w < 0 for w in self.token_weights):
            raise ValueError("token weights must be non-negative")
        for is_model, weight in zip(self.model_token_mask, self.token_weights, strict=True):
            if not is_model and weight != 0.0:
                raise ValueError(
                    "a non-model token was given a non-zero weight; tool/user/system tokens must never contribute to the distillation loss"
                )
        return self

    @property
    def num_positions(self) -> int:
        return len(self.student_prediction_positions)

    @property
    def total_weight(self) -> float:
        """Sum of raw weights: the per-trajectory loss normalizer."""
        return float(sum(self.token_weights))

    def is_identity(self) -> bool:
        return self.student_prediction_positions == self.teacher_prediction_positions

    def counts_by_span_type(self) -> dict[str, int]:
        return dict(Counter(self.span_types))

    @property
    def student_target_positions(self) -> list[int]:
        """Target positions j in student space (prediction position + 1)."""
        return [p + 1 for p in self.student_prediction_positions]

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the map; recorded with cached targets."""
        return sha256_json(self.model_dump(mode="json"))


__all__ = ["AlignmentMap"]
