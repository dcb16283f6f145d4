"""Summaries of trajectory files for ``miniverl inspect`` (no torch).

The provenance numbers come from the span partition, the same source the training
masks come from, so a file that claims tool output is trainable is reported that way
(and, since every record is re-validated during the walk, fails to load at all).

A run's ``trajectories.jsonl`` holds oracle traces (SFT warm-up), student rollouts and
teacher samples side by side, and ``eval_trajectories.jsonl`` the evaluation episodes: a
solve rate over all of them mixes a scripted 100% with what the student does, so every
outcome is also counted per origin (:func:`origin_of`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
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
"""Characters of a span's text kept by ``inspect --spans`` (the token range is always whole)."""

ORIGIN_NAMES: dict[str, tuple[str, str]] = {
    "student": ("student rollout", "student rollouts"),
    "teacher": ("teacher sample", "teacher samples"),
    "oracle": ("oracle trace", "oracle traces"),
    "eval": ("evaluation episode", "evaluation episodes"),
    "unknown": ("trajectory of unrecorded origin", "trajectories of unrecorded origin"),
}
"""Origin -> (singular, plural) as ``inspect`` prints them, in the order it prints them."""

ORACLE_SOURCES = frozenset({"oracle", "corrective", "noisy_oracle"})
"""``metadata["source"]`` of scripted traces: the oracle's solution, with or without injected
noise (``agent/loop.py``, ``lab/teachers/toy_fit.py``)."""


def origin_of(metadata: Mapping[str, Any]) -> str:
    """Which of :data:`ORIGIN_NAMES` produced a trajectory, from what its writer recorded.

    An evaluation episode carries ``eval_tag`` (``training/evaluate.py``) whoever sampled it;
    a sampled episode's ``source`` is ``policy`` whichever model held the policy, so a
    teacher's is told apart by ``teacher_sampled`` (fresh teacher samples) or
    ``offline_kd_pool`` (the offline-KD pool), both set by ``training/sources.py``.
    """
    source = metadata.get("source")
    if "eval_tag" in metadata:
        return "eval"
    if source in ORACLE_SOURCES:
        return "oracle"
    if (
        source == "privileged_teacher_render"
        or metadata.get("teacher_sampled")
        or metadata.get("offline_kd_pool")
    ):
        return "teacher"
    if source == "policy":
        return "student"
    return "unknown"


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``"1 trajectory"``, ``"3 trajectories"``: ``count`` with the noun that agrees with it."""
    word = singular if count == 1 else (plural_form or f"{singular}s")
    return f"{count} {word}"


def count_origin(count: int, origin: str) -> str:
    """``"1 oracle trace"``, ``"2 student rollouts"``."""
    singular, plural_form = ORIGIN_NAMES[origin]
    return plural(count, singular, plural_form)


_ATOM = re.compile(r"<\|[^|<>\s]*\|>|</?[A-Za-z_][\w-]*>|\s+|[^\s<]+|<")
"""Pieces of a line of span text between which a line may break: a chat marker
(``<|name|>``), a protocol tag (``<name>``, ``</name>``), a run of whitespace or a word.
Tokenizers keep each marker and tag as one token and start a new token at whitespace, so a
break between two pieces falls between tokens, never inside a word."""


def wrap_span_text(text: str, width: int) -> list[str]:
    """``text`` as display lines of at most ``width`` characters, broken only between pieces
    of :data:`_ATOM`; a newline in the text ends a line and shows as a literal ``\\n``.

    A single piece longer than ``width`` gets a line of its own and is never cut. Whitespace
    where a line wraps is dropped (the token range, not this preview, is the exact record).
    """
    out: list[str] = []
    logical = text.split("\n")
    for index, line in enumerate(logical):
        atoms = _ATOM.findall(line)
        if index < len(logical) - 1:
            atoms.append("\\n")
        current, wrapped = "", False
        for atom in atoms:
            if current.strip() and len(current) + len(atom) > width:
                out.append(current.rstrip())
                current, wrapped = "", True
            if wrapped and not current and atom.isspace():
                continue
            current += atom
        out.append(current.rstrip())
    while len(out) > 1 and not out[-1]:
        out.pop()
    return out


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
    origin: str

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
            origin=origin_of(t.metadata),
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
class OriginOutcome:
    """How the trajectories of one origin ended: solved, answered wrong or without an answer."""

    trajectories: int = 0
    graded: int = 0
    solved: int = 0
    ungraded_termination: Counter[str] = field(default_factory=Counter)

    def add(self, t: Trajectory) -> None:
        self.trajectories += 1
        if t.verification is None:
            self.ungraded_termination[t.termination_reason.value] += 1
        else:
            self.graded += 1
            self.solved += int(t.verification.solved)

    def outcome(self) -> dict[str, Any]:
        """The same buckets as :meth:`FileSummary.outcome`, for this origin alone."""
        return {
            "trajectories": self.trajectories,
            "solved": self.solved,
            "answered_wrong": self.graded - self.solved,
            "without_answer": self.trajectories - self.graded,
            "without_answer_by_reason": dict(self.ungraded_termination.most_common()),
            "success_rate": round(self.solved / self.trajectories, 6) if self.trajectories else 0.0,
            "solve_rate_of_graded": round(self.solved / self.graded, 6) if self.graded else 0.0,
        }


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
    origins: dict[str, OriginOutcome] = field(default_factory=dict)
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
            "outcome_by_origin": {name: o.outcome() for name, o in self.origins.items()},
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
    origins: dict[str, OriginOutcome] = {}
    for t in iter_trajectories(path, vocab_size=run_vocab_size(path)):
        if trajectory_id is not None and t.trajectory_id != trajectory_id:
            continue
        summary.trajectories += 1
        summary.tokens += t.length
        summary.model_tokens += sum(t.model_generated_mask)
        summary.critical_tokens += sum(t.critical_mask)
        origins.setdefault(origin_of(t.metadata), OriginOutcome()).add(t)
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
    summary.origins = {name: origins[name] for name in ORIGIN_NAMES if name in origins}
    return summary
