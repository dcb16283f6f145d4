"""The teacher gate of saved weights: is this teacher competent at this student's states?

A diagnostic, not a timing: it scores a teacher's safetensors file against a student's under a
recipe (``gate_of_weight_files`` in ``src/miniverl/lab/teachers/gate.py``) and prints the
gate with its breakdown, on and off the oracle's path, and by how many turns the student has
wasted so far (turn index minus oracle steps done). docs/benchmark.md uses it to check
candidate toy teachers before a long protocol.

    PYTHONPATH=src python benchmarks/teacher_gate_probe.py STUDENT.safetensors \\
        TEACHER.safetensors [--recipe recipes/toy_calc_chain.yaml] [--tasks 60] [override ...]

TEACHER ``oracle`` scores the smoothed oracle teacher of a recipe with
``lab.oracle_teacher`` (``--recipe recipes/toy_calc_chain_oracle.yaml``), which has no file.
"""

from __future__ import annotations

import argparse
import collections

from miniverl.config.models import RunConfig
from miniverl.lab.teachers.gate import gate_of_weight_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student")
    parser.add_argument("teacher", help="safetensors file, or 'oracle' (lab.oracle_teacher)")
    parser.add_argument("overrides", nargs="*", help="dotted recipe overrides")
    parser.add_argument("--recipe", default="recipes/toy_calc_chain.yaml")
    parser.add_argument("--tasks", type=int, default=None)
    args = parser.parse_args()
    config = RunConfig.from_yaml(args.recipe, args.overrides)
    teacher = None if args.teacher == "oracle" else args.teacher
    r = gate_of_weight_files(config, args.student, teacher, tasks=args.tasks)
    on_path = r.actions - r.off_path_actions
    print(
        f"gate {r.value:.3f} ({r.correct}/{r.actions} student-visited states); "
        f"on the oracle's path {r.correct - r.off_path_correct}/{on_path}; "
        f"off it {r.off_path_correct}/{r.off_path_actions}; "
        f"at oracle states {r.oracle_state_correct}/{r.oracle_state_actions}; "
        f"student solved {r.student_solved}/{r.episodes} at T={r.temperature}"
    )
    wasted: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for action in r.per_action:
        row = wasted[action["turn"] - action["steps_done"]]
        row[0] += int(action["reproduced"])
        row[1] += 1
    for turns in sorted(wasted):
        print(f"  {turns} wasted turns: {wasted[turns][0]}/{wasted[turns][1]} reproduced")


if __name__ == "__main__":
    main()
