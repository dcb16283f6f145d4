"""Summaries of trajectory files for ``miniverl inspect`` (no torch).

The provenance numbers come from the span partition, the same source the training
masks come from, so a file that claims tool output is trainable is reported that way
(and, since every record is re-validated during the walk, fails to load at all).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl.schemas.trajectory import (
    CONTEXT_SPAN_TYPES,
    CRITICAL_SPAN_TYPES,
    MODEL_GENERATED_SPAN_TYPES,
    Trajectory,
)
from miniverl.trajectory.io import iter_trajectories
from miniverl.utils.io import read_json

SPAN_TEXT_PREVIEW = 400


def provenance_check() -> dict[str, list[str]]:
    """The rule set a summary was computed under, for auditing without the source."""
    return {
        "trainable_span_types": sorted(t.value for t in MODEL_GENERATED_SPAN_TYPES),
        "critical_span_types": sorted(t.value for t in CRITICAL_SPAN_TYPES),
        "context_span_types_excluded_from_loss": sorted(t.value for t in CONTEXT_SPAN_TYPES),
    }


@dataclass
class TrajectoryRow:
    trajectory_id: str
    task_id: str
    tokens: int
    model_tokens: int
    critical_tokens: int
    termination_reason: str
    solved: bool | None
    policy_version: int
    source: str | None

    @classmethod
    def of(cls, t: Trajectory) -> TrajectoryRow:
        return cls(
            trajectory_id=t.trajectory_id,
            task_id=t.task_id,
            tokens=t.length,
            model_tokens=sum(t.model_generated_mask),
            critical_tokens=sum(t.critical_mask),
            termination_reason=t.termination_reason.value,
            solved=None if t.verification is None else t.verification.solved,
            policy_version=t.policy_version,
            source=t.metadata.get("source"),
        )


@dataclass
class SpanRow:
    span_type: str
    start: int
    end: int
    tokens: int
    in_loss: bool
    text: str


@dataclass
class FileSummary:
    path: str
    trajectories: int = 0
    tokens: int = 0
    model_tokens: int = 0
    critical_tokens: int = 0
    graded: int = 0
    solved: int = 0
    policy_versions: list[int] = field(default_factory=list)
    termination: dict[str, int] = field(default_factory=dict)
    tools: dict[str, int] = field(default_factory=dict)
    tokenizer_fingerprints: list[str] = field(default_factory=list)
    tokens_by_span_type: dict[str, int] = field(default_factory=dict)
    failure_categories: dict[str, int] = field(default_factory=dict)
    ungraded_termination: dict[str, int] = field(default_factory=dict)
    rows: list[TrajectoryRow] = field(default_factory=list)
    spans: list[SpanRow] | None = None

    @property
    def model_token_fraction(self) -> float:
        return self.model_tokens / self.tokens if self.tokens else 0.0

    @property
    def solve_rate(self) -> float:
        """Solved over *graded* (trajectories that gave a final answer); see :attr:`success_rate`."""
        return self.solved / self.graded if self.graded else 0.0

    @property
    def success_rate(self) -> float:
        """Solved over *every* trajectory: an episode that ended without an answer counts as a
        failure here, as it does in held-out success."""
        return self.solved / self.trajectories if self.trajectories else 0.0

    @property
    def answered_wrong(self) -> int:
        return self.graded - self.solved

    @property
    def without_answer(self) -> int:
        """Trajectories that ended without a final answer (so were never graded)."""
        return self.trajectories - self.graded

    @property
    def without_answer_by_reason(self) -> dict[str, int]:
        """:attr:`without_answer` split by termination reason, most frequent first."""
        return self.ungraded_termination

    def outcome(self) -> dict[str, Any]:
        """Every trajectory in exactly one bucket: solved, answered wrong or without an answer."""
        return {
            "trajectories": self.trajectories,
            "solved": self.solved,
            "answered_wrong": self.answered_wrong,
            "without_answer": self.without_answer,
            "without_answer_by_reason": self.without_answer_by_reason,
            "success_rate": round(self.success_rate, 6),
            "solve_rate_of_graded": round(self.solve_rate, 6),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "trajectories": self.trajectories,
            "tokens": self.tokens,
            "model_tokens": self.model_tokens,
            "model_token_fraction": round(self.model_token_fraction, 6),
            "critical_tokens": self.critical_tokens,
            "graded": self.graded,
            "solved": self.solved,
            "solve_rate": round(self.solve_rate, 6),
            "success_rate": round(self.success_rate, 6),
            "outcome": self.outcome(),
            "policy_versions": self.policy_versions,
            "termination": self.termination,
            "tools": self.tools,
            "failure_categories": self.failure_categories,
            "tokenizer_fingerprints": self.tokenizer_fingerprints,
            "tokens_by_span_type": self.tokens_by_span_type,
            "trajectory_rows": [vars(r) for r in self.rows],
            "spans": None if self.spans is None else [vars(s) for s in self.spans],
            "provenance_check": provenance_check(),
        }


def run_vocab_size(path: str | Path) -> int | None:
    """The tokenizer vocabulary recorded in the ``manifest.json`` beside ``path``, if any.

    Token ids are checked against it, so an id past the embedding table is a schema error
    even in the torch-free ``inspect``.
    """
    manifest = Path(path).parent / "manifest.json"
    if not manifest.is_file():
        return None
    tokenizer = read_json(manifest).get("tokenizer")
    vocab = tokenizer.get("vocab_size") if isinstance(tokenizer, dict) else None
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


def summarize_file(
    path: str | Path, *, trajectory_id: str | None = None, limit: int = 5, spans: bool = False
) -> FileSummary:
    """Validate every record of ``path`` and summarize it (or one trajectory of it).

    Raises ``SchemaValidationError`` naming ``<path>:<lineno>`` on the first bad record,
    even when ``trajectory_id`` selects another one: a file is only summarized whole.
    """
    summary = FileSummary(path=str(path))
    versions: set[int] = set()
    fingerprints: list[str] = []
    termination: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    by_type: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    ungraded: Counter[str] = Counter()
    for t in iter_trajectories(path, vocab_size=run_vocab_size(path)):
        if trajectory_id is not None and t.trajectory_id != trajectory_id:
            continue
        summary.trajectories += 1
        summary.tokens += t.length
        summary.model_tokens += sum(t.model_generated_mask)
        summary.critical_tokens += sum(t.critical_mask)
        if t.verification is not None:
            summary.graded += 1
            summary.solved += int(t.verification.solved)
            if t.verification.failure_category:
                failures[t.verification.failure_category] += 1
        else:
            ungraded[t.termination_reason.value] += 1
        versions.add(t.policy_version)
        if t.tokenizer_fingerprint not in fingerprints:
            fingerprints.append(t.tokenizer_fingerprint)
        termination[t.termination_reason.value] += 1
        for turn in t.turns:
            if turn.tool_call is not None and turn.tool_call.valid:
                tools[turn.tool_call.name] += 1
        by_type.update(t.token_counts_by_span_type())
        if len(summary.rows) < limit:
            summary.rows.append(TrajectoryRow.of(t))
        if spans and trajectory_id is not None:
            summary.spans = [
                SpanRow(
                    s.span_type.value,
                    s.start,
                    s.end,
                    s.length,
                    s.is_model_generated,
                    s.text[:SPAN_TEXT_PREVIEW],
                )
                for s in t.spans
            ]
    summary.policy_versions = sorted(versions)
    summary.termination = dict(termination.most_common())
    summary.tools = dict(tools.most_common())
    summary.tokenizer_fingerprints = fingerprints
    summary.tokens_by_span_type = dict(by_type.most_common())
    summary.failure_categories = dict(failures.most_common())
    summary.ungraded_termination = dict(ungraded.most_common())
    return summary
