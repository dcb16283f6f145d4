"""The teacher audit of one run's student rollouts under the oracle teacher before and after
the fix that removed its "stop now" targets.

Why: the fix is only shown by what the teacher targets at the student's own states. "Before"
is ``lab/teachers/oracle.py`` as of a given commit (default a918966, the last one with the EOS
fallback), read with ``git show`` and loaded as a separate module; "after" is the installed
code. Both are scored by ``lab/teachers/audit.py`` with the current oracle as the labeller.

    python benchmarks/oracle_audit_before_after.py RUN_DIR [--cycles 150-199] [--commit a918966]

RUN_DIR is a ``miniverl train`` run with ``lab.oracle_teacher`` whose trajectories.jsonl holds
the student's rollouts (any code version may have produced them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from miniverl.config.loading import load_resolved_config
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.lab.config import lab_of
from miniverl.lab.teachers.audit import (
    audit_trajectories,
    parse_cycles,
    render_audit,
    student_rollouts,
)
from miniverl.lab.teachers.oracle import OracleTeacher
from miniverl.models.factory import build_tokenizer
from miniverl.utils.runs import RunPaths

ROOT = Path(__file__).resolve().parents[1]


class _Labelled:
    """An old oracle teacher seen through the audit's interface: its one-hot targets, and every
    position targeted (the old code had no undefined positions: it targeted EOS there)."""

    def __init__(self, teacher: object) -> None:
        self.teacher = teacher

    def hidden_states_at(self, ids: list[int], positions: list[int]) -> object:
        return self.teacher.hidden_states_at(ids, positions)

    def project(self, hidden: object) -> object:
        return self.teacher.project(hidden)

    def target_mask(self, ids: list[int], positions: list[int]) -> list[bool]:
        return self.teacher.target_mask(ids, positions)


def old_oracle_class(commit: str) -> type:
    source = subprocess.run(
        ["git", "show", f"{commit}:src/miniverl/lab/teachers/oracle.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_oracle.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("old_oracle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_oracle"] = module
    spec.loader.exec_module(module)
    return module.OracleTeacher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--cycles", default=None)
    parser.add_argument("--commit", default="a918966")
    parser.add_argument("--json", type=Path, default=None, help="also write both audits here")
    args = parser.parse_args()
    config = load_resolved_config(args.run_dir)
    spec = lab_of(config).oracle_teacher
    if spec is None:
        sys.exit("the run has no lab.oracle_teacher")
    tokenizer = build_tokenizer(config)
    env = make_environment(config.environment.name, **config.environment.params)
    tasks = [t for split in build_splits(env, config.environment).values() for t in split]
    rollouts = student_rollouts(RunPaths(args.run_dir).trajectories, parse_cycles(args.cycles))
    labeller = OracleTeacher(tokenizer, env, tasks, smoothing=0.5)
    old = old_oracle_class(args.commit)(
        tokenizer, env, tasks, smoothing=spec.smoothing, off_path=spec.off_path
    )
    new = OracleTeacher(tokenizer, env, tasks, smoothing=spec.smoothing, off_path=spec.off_path)
    audits = {
        f"before ({args.commit})": audit_trajectories(
            _Labelled(old),
            labeller,
            rollouts,
            teacher_name=f"oracle {spec.off_path}, {args.commit}",
        ),
        "after": audit_trajectories(
            new, labeller, rollouts, teacher_name=f"oracle {spec.off_path}, this code"
        ),
    }
    for name, audit in audits.items():
        print(f"== {name}")
        print("\n".join(render_audit(audit)))
    if args.json is not None:
        args.json.write_text(
            json.dumps({k: a.to_dict() for k, a in audits.items()}, indent=2) + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
