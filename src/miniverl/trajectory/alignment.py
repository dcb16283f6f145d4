"""Build :class:`AlignmentMap` s: the only place target j becomes prediction j - 1.

``standard`` teacher mode reads the student's own tokens, so the map is the identity.
``privileged_context`` inserts an oracle block, so every shared position shifts; the
shift is recomputed per span by ``segment_key`` and checked token by token rather than
assumed constant.
"""

from __future__ import annotations

from collections.abc import Sequence

from miniverl.errors import AlignmentError, TokenizerMismatchError
from miniverl.schemas.alignment import AlignmentMap
from miniverl.schemas.trajectory import Span, Trajectory
from miniverl.trajectory.masks import prediction_positions, validate_target_positions


def check_fingerprints(student: str, teacher: str) -> None:
    if student != teacher:
        raise TokenizerMismatchError(
            f"student and teacher tokenizers differ ({student[:12]} vs {teacher[:12]}); "
            "miniVERL currently supports same-tokenizer distillation only"
        )


def _check_weights(targets: Sequence[int], weights: Sequence[float] | None) -> list[float]:
    if weights is None:
        return [1.0] * len(targets)
    if len(weights) != len(targets):
        raise AlignmentError(f"got {len(weights)} weights for {len(targets)} target positions")
    return [float(w) for w in weights]


def identity_alignment(
    trajectory: Trajectory, target_positions: Sequence[int], weights: Sequence[float] | None = None
) -> AlignmentMap:
    """Alignment for a teacher that reads the byte-identical transcript."""
    targets = list(target_positions)
    w = _check_weights(targets, weights)
    validate_target_positions(targets, trajectory.model_generated_mask)
    predictions = prediction_positions(targets)
    return AlignmentMap(
        trajectory_id=trajectory.trajectory_id,
        student_prediction_positions=predictions,
        teacher_prediction_positions=list(predictions),
        target_token_ids=[trajectory.token_ids[j] for j in targets],
        model_token_mask=[trajectory.model_generated_mask[j] for j in targets],
        token_weights=w,
        span_types=trajectory.span_types_at(targets),
    )


def segment_key_of(span: Span) -> str:
    """The span's ``segment_key``, or :class:`AlignmentError` when it has none."""
    key = span.segment_key
    if key is None:
        raise AlignmentError(
            f"span {span.span_type.value} at [{span.start},{span.end}) has no 'segment_key' metadata; "
            "build trajectories with TranscriptBuilder so every span carries its segment identity"
        )
    return key


def build_alignment_map(
    trajectory: Trajectory,
    target_positions: Sequence[int],
    weights: Sequence[float] | None = None,
    teacher: Trajectory | None = None,
) -> AlignmentMap:
    """Map student targets to student and teacher prediction positions.

    ``teacher=None`` (standard mode) gives :func:`identity_alignment`. With a teacher
    render, spans are matched by ``segment_key``; for a target j in student span s and
    its counterpart t, the teacher target is ``t.start + (j - s.start)``, and both sides
    then subtract one. Target ids must be identical on both sides.
    """
    if teacher is None:
        return identity_alignment(trajectory, target_positions, weights)
    check_fingerprints(trajectory.tokenizer_fingerprint, teacher.tokenizer_fingerprint)
    targets = list(target_positions)
    w = _check_weights(targets, weights)
    validate_target_positions(targets, trajectory.model_generated_mask)

    teacher_spans: dict[str, Span] = {}
    for tspan in teacher.spans:
        key = segment_key_of(tspan)
        if key in teacher_spans:
            raise AlignmentError(
                f"teacher render contains duplicate segment key {key!r}; keys must be unique"
            )
        teacher_spans[key] = tspan
    counterpart: dict[int, Span] = {}
    for index, span in enumerate(trajectory.spans):
        key = segment_key_of(span)
        tspan = teacher_spans.get(key)
        if tspan is None:
            raise AlignmentError(
                f"student span {span.span_type.value} {key!r} at [{span.start},{span.end}) has no counterpart in the teacher render; "
                "the privileged render must keep every student segment"
            )
        if tspan.length != span.length:
            raise AlignmentError(
                f"segment {key!r} has {span.length} student tokens but {tspan.length} teacher tokens; "
                "the shared content must tokenize identically on both sides"
            )
        counterpart[index] = tspan

    span_index = {id(s): i for i, s in enumerate(trajectory.spans)}
    teacher_targets: list[int] = []
    for j in targets:
        span = trajectory.span_at(j)
        tspan = counterpart[span_index[id(span)]]
        k = tspan.start + (j - span.start)
        if k == 0:
            raise AlignmentError(
                "a target token landed at teacher position 0, which has no preceding prediction position"
            )
        a, b = trajectory.token_ids[j], teacher.token_ids[k]
        if a != b:
            raise AlignmentError(
                f"target token mismatch at student position {j} / teacher position {k}: {a} != {b}"
            )
        teacher_targets.append(k)

    return AlignmentMap(
        trajectory_id=trajectory.trajectory_id,
        student_prediction_positions=prediction_positions(targets),
        teacher_prediction_positions=prediction_positions(teacher_targets),
        target_token_ids=[trajectory.token_ids[j] for j in targets],
        model_token_mask=[trajectory.model_generated_mask[j] for j in targets],
        token_weights=w,
        span_types=trajectory.span_types_at(targets),
    )
