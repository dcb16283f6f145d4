"""What a teacher targets at the states a student visited: ``miniverl teacher-audit``.

Why: a teacher is code under test. Before a comparison of objectives means anything, the
teacher's targets at the *student's own* states have to be looked at, because that is where
on-policy distillation differs from off-policy KD and where a defective teacher hides (an
EOS or "close the block now" target at a state that looks like an on-path state is not a
policy a student can realise). The audit re-scores stored student rollouts with the run's
teacher and sorts every student-generated position into one class:

- ``on_path``: the turn so far is a prefix of the oracle's action for that turn;
- ``after_error``: the same, in a turn that follows a flagged tool error (an observation
  with ``"ok": false``): the corrective call;
- ``deviated``: the turn has left the oracle's action (inside a deviated block or prose).

Per class it counts positions with and without a target (an oracle teacher's
``target_mask`` drops positions where its continuation is undefined), the teacher's top-1
target tokens, its agreement with the oracle's label (the next token of the action, which
exists on the path and after an error), and its EOS and closing-tag targets. The oracle's
action per turn is read from the transcript by the same rule the oracle teacher uses
(``lab/teachers/oracle.py``), for any teacher.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl.errors import RunDirectoryError
from miniverl.schemas.text import (
    ASSISTANT_HEADER,
    FINAL_CLOSE,
    IM_END,
    IM_START,
    TOOL_CALL_CLOSE,
    TOOL_RESULT_CLOSE,
    TOOL_RESULT_OPEN,
)
from miniverl.schemas.trajectory import Trajectory

CLASSES = ("on_path", "after_error", "deviated")
CLOSING = (TOOL_CALL_CLOSE, FINAL_CLOSE, IM_END)
TOP = 8
_RESULT = re.compile(
    re.escape(TOOL_RESULT_OPEN) + r"\n(.*?)\n" + re.escape(TOOL_RESULT_CLOSE), re.S
)


@dataclass
class ClassAudit:
    """One position class: counts over every student-generated position in it."""

    positions: int = 0
    targeted: int = 0
    labelled: int = 0
    agree: int = 0
    eos: int = 0
    closing: int = 0
    top: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            "targeted": self.targeted,
            "untargeted": self.positions - self.targeted,
            "labelled": self.labelled,
            "agreement": round(self.agree / self.labelled, 4) if self.labelled else None,
            "eos_targets": self.eos,
            "closing_tag_targets": self.closing,
            "top_targets": [[piece, n] for piece, n in self.top.most_common(TOP)],
        }


@dataclass
class TeacherAudit:
    teacher: str
    trajectories: int
    classes: dict[str, ClassAudit] = field(
        default_factory=lambda: {c: ClassAudit() for c in CLASSES}
    )

    def to_dict(self) -> dict[str, Any]:
        return {
            "teacher": self.teacher,
            "trajectories": self.trajectories,
            "classes": {name: audit.to_dict() for name, audit in self.classes.items()},
            "eos_targets": sum(a.eos for a in self.classes.values()),
        }


def _after_error(context: str) -> bool:
    """The turn that follows ``context`` answers a flagged tool error: the last message before
    it is a tool observation whose ``ok`` is not true."""
    last = context[context.rfind(IM_START) :]
    found = _RESULT.search(last)
    if found is None or not last.startswith(f"{IM_START}user\n{TOOL_RESULT_OPEN}"):
        return False
    try:
        payload = json.loads(found.group(1))
    except json.JSONDecodeError:
        return True
    return not (isinstance(payload, dict) and payload.get("ok") is True)


def _is_closing(piece: str) -> bool:
    return piece.startswith("<") and any(tag.startswith(piece) for tag in CLOSING) and piece != "<"


def audit_trajectories(
    teacher: Any,
    labeller: Any,
    trajectories: Iterable[Trajectory],
    *,
    teacher_name: str,
) -> TeacherAudit:
    """Re-score ``trajectories`` with ``teacher`` and class every model position.

    ``labeller`` is an oracle teacher over the same tasks (:class:`OracleTeacher`); it says
    which turn each position is in and the oracle's action for it. ``teacher`` is any
    backend (``hidden_states_at`` + ``project``); where it has a ``target_mask`` the positions
    it rejects count as untargeted.
    """
    tok = labeller.tokenizer
    eos = tok.eos_token_id
    audit = TeacherAudit(teacher=teacher_name, trajectories=0)
    mask = getattr(teacher, "target_mask", None)
    for traj in trajectories:
        audit.trajectories += 1
        targets = [j for s in traj.spans if s.is_model_generated for j in range(s.start, s.end)]
        if not targets:
            continue
        states = [p - 1 for p in targets]
        keep = mask(traj.token_ids, targets) if mask is not None else [True] * len(targets)
        scored = [s for s, k in zip(states, keep, strict=True) if k]
        top1: dict[int, int] = {}
        if scored:
            logp = teacher.project(teacher.hidden_states_at(list(traj.token_ids), scored))
            top1 = dict(zip(scored, logp.argmax(dim=-1).tolist(), strict=True))
        text = tok.decode(list(traj.token_ids))
        offsets = _char_offsets(tok, traj.token_ids)
        for p, (generated, action) in zip(
            states, labeller.turn_states(traj.token_ids, states), strict=True
        ):
            on_path = action.startswith(generated)
            if not on_path:
                name = "deviated"
            else:
                header = text.rfind(ASSISTANT_HEADER, 0, offsets[p + 1])
                name = "after_error" if _after_error(text[:header]) else "on_path"
            cls = audit.classes[name]
            cls.positions += 1
            if p not in top1:
                continue
            target = top1[p]
            cls.targeted += 1
            piece = tok.decode([target])
            cls.top[piece] += 1
            cls.eos += target == eos
            cls.closing += _is_closing(piece)
            rest = action[len(generated) :] if on_path else ""
            if rest:
                cls.labelled += 1
                cls.agree += target == tok.encode(rest)[0]
    return audit


def _char_offsets(tok: Any, ids: Sequence[int]) -> list[int]:
    offsets = [0]
    for token in ids:
        offsets.append(offsets[-1] + len(tok.decode([token])))
    return offsets


def parse_cycles(spec: str | None) -> tuple[int, int] | None:
    """``"150-199"`` or ``"7"`` -> an inclusive cycle range; None for every cycle."""
    if spec is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", spec)
    if match is None:
        raise RunDirectoryError(
            f"--cycles {spec!r} is not a cycle or a range",
            hint="give one cycle (e.g. 7) or an inclusive range (e.g. 150-199)",
        )
    lo = int(match.group(1))
    hi = int(match.group(2)) if match.group(2) else lo
    if hi < lo:
        raise RunDirectoryError(f"--cycles {spec!r} ends before it starts", hint="write LOW-HIGH")
    return lo, hi


def student_rollouts(path: Path, cycles: tuple[int, int] | None = None) -> list[Trajectory]:
    """The student's own training rollouts of a run (not oracle traces, teacher samples or
    evaluation episodes), optionally only those of ``cycles``."""
    from miniverl.trajectory.io import iter_trajectories

    if not path.is_file():
        raise RunDirectoryError(
            f"{path} not found",
            hint="point teacher-audit at a directory written by 'miniverl train'",
        )
    out = []
    for traj in iter_trajectories(path):
        meta = traj.metadata
        if meta.get("source") != "policy" or meta.get("teacher_sampled") or "cycle" not in meta:
            continue
        if cycles is not None and not cycles[0] <= int(meta["cycle"]) <= cycles[1]:
            continue
        out.append(traj)
    return out


def audit_run(
    run_dir: str | Path, *, cycles: str | None = None, limit: int | None = None
) -> TeacherAudit:
    """Audit the teacher of a finished (or interrupted) run on its stored student rollouts."""
    from miniverl.config.loading import load_resolved_config
    from miniverl.environments.registry import make_environment
    from miniverl.environments.tasks_file import build_splits
    from miniverl.lab.teachers.oracle import OracleTeacher
    from miniverl.models.factory import build_tokenizer
    from miniverl.utils.runs import RunPaths

    paths = RunPaths(run_dir)
    config = load_resolved_config(run_dir)
    rollouts = student_rollouts(paths.trajectories, parse_cycles(cycles))
    if limit is not None:
        rollouts = rollouts[-limit:]
    if not rollouts:
        raise RunDirectoryError(
            f"{paths.trajectories} holds no student rollouts"
            + ("" if cycles is None else f" in cycles {cycles}"),
            hint="audit a run whose mode samples from the student (opd, gkd_mix), or widen --cycles",
        )
    tokenizer = build_tokenizer(config)
    environment = make_environment(config.environment.name, **config.environment.params)
    splits = build_splits(environment, config.environment)
    tasks = [t for split in splits.values() for t in split]
    labeller = OracleTeacher(tokenizer, environment, tasks, smoothing=0.5)
    teacher, name = load_run_teacher(config, paths, tokenizer, splits)
    return audit_trajectories(teacher, labeller, rollouts, teacher_name=name)


def load_run_teacher(
    config: Any, paths: Any, tokenizer: Any, splits: dict[str, list[Any]]
) -> tuple[Any, str]:
    """The run's teacher, rebuilt from its config and the teacher the run recorded: the oracle
    teacher, its teacher checkpoint, its fitted toy teacher (``<run>/toy-teacher.safetensors``)
    or its fitted HF adapter (the file its ``eval.json`` names, checked against its SHA-256)."""
    from safetensors.torch import load_file

    from miniverl.errors import CheckpointError
    from miniverl.lab.config import lab_of
    from miniverl.lab.teachers.oracle import build_oracle_teacher
    from miniverl.lab.teachers.toy_fit import TOY_TEACHER_FILE
    from miniverl.training.assembly import build_run_runtime
    from miniverl.utils.hashing import sha256_file

    lab = lab_of(config)
    models = config.models
    if lab.oracle_teacher is not None:
        tasks = [t for split in splits.values() for t in split]
        teacher = build_oracle_teacher(config, tokenizer, tasks, "cpu")
        return teacher, f"oracle ({teacher.off_path})"
    record: dict[str, Any] = {}
    if paths.eval_json.is_file():
        record = json.loads(paths.eval_json.read_text(encoding="utf-8")).get("teacher") or {}
    adapter = Path(record["adapter"]) if record.get("adapter") else None
    if adapter is not None and (
        not adapter.is_file() or sha256_file(adapter) != record.get("adapter_sha256")
    ):
        raise CheckpointError(
            f"the run's teacher adapter {adapter} is no longer on disk or does not match "
            "the SHA-256 the run recorded",
            hint="audit a finished run whose teacher adapter directory still exists "
            "(lab.teacher_fit.cache_dir)",
        )
    runtime = build_run_runtime(config, tokenizer, "cpu", with_teacher=True, teacher=adapter)
    teacher = runtime.teacher
    if adapter is not None:
        digest = str(record.get("digest", ""))[:12]
        return teacher, f"hf ({models.teacher.model_id}, shared backbone, adapter {digest})"
    if runtime.teacher_checkpoint is not None:
        checkpoint = runtime.teacher_checkpoint
        return teacher, f"checkpoint {checkpoint['path']} ({checkpoint['sha256'][:12]})"
    if models.backend == "toy":
        weights = paths.root / TOY_TEACHER_FILE
        if not weights.is_file():
            raise CheckpointError(
                f"{weights} not found: the run's fitted toy teacher is missing",
                hint="audit the run directory 'miniverl train' wrote (it keeps the toy teacher there)",
            )
        teacher.load_full_state_dict(load_file(str(weights)))
        return teacher, f"toy ({models.teacher.model_id})"
    return teacher, f"hf ({models.teacher.model_id})"


def render_audit(audit: TeacherAudit) -> list[str]:
    """Plain lines of a console table, one class a block."""
    lines = [f"teacher {audit.teacher}: {audit.trajectories} student rollouts re-scored"]
    for name, cls in audit.classes.items():
        d = cls.to_dict()
        agree = "-" if d["agreement"] is None else f"{d['agreement']:.3f} of {d['labelled']}"
        lines.append(
            f"  {name:<12} positions {d['positions']:>7}  targeted {d['targeted']:>7}  "
            f"untargeted {d['untargeted']:>6}  agreement {agree}  EOS {d['eos_targets']}  "
            f"closing tags {d['closing_tag_targets']}"
        )
        top = ", ".join(f"{json.dumps(piece)} {n}" for piece, n in d["top_targets"])
        lines.append(f"  {'':<12} top targets: {top or '-'}")
    return lines


__all__ = [
    "CLASSES",
    "ClassAudit",
    "TeacherAudit",
    "audit_run",
    "audit_trajectories",
    "load_run_teacher",
    "parse_cycles",
    "render_audit",
    "student_rollouts",
]
