"""What a teacher writes where the held-out state gate asks it to recover.

A diagnostic, not a timing. It reruns the held-out state gate of a recipe's teacher against a
stored cold start exactly as the benchmark does (``evaluate_state_gate``: the cold-start
student's episodes at the rollout temperature on the gate's validation tasks, seed
``run.seed``), prints the gate's figures, then every recovery episode: the student's episode
and the teacher's greedy continuation from the student's first off-path turn, decoded. Then
each privileged prediction the gate scored as a miss: the transcript before the turn, the
student's turn up to the position and the teacher's top-1 token there. It writes a scratch run
directory (``OUT``) and nothing else.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/teacher_recovery_probe.py \\
        recipes/smollm2_calc_chain_checked.yaml runs/smol-pilot2/seed-1/cold-start /tmp/probe \\
        run.seed=1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import miniverl.lab.teachers.gate as gate
from miniverl.environments.registry import make_environment
from miniverl.environments.tasks_file import build_splits
from miniverl.lab.config import load_recipe
from miniverl.lab.run import start_run


def _text(tokenizer: Any, trajectory: Any) -> str:
    first = min(s.start for s in trajectory.spans if str(s.span_type).startswith("assistant"))
    return tokenizer.decode(trajectory.token_ids[first:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("cold_start", type=Path)
    parser.add_argument("out", type=Path, help="scratch run directory")
    parser.add_argument("overrides", nargs="*", help="dotted recipe overrides")
    args = parser.parse_args()
    cfg = load_recipe(args.recipe, args.overrides)
    trainer = start_run(cfg, cold_start=args.cold_start, output_dir=args.out)
    trainer.load_initial_weights()
    continuations: list[Any] = []
    students: list[Any] = []

    class Recording(gate.RolloutRunner):  # type: ignore[name-defined,misc]
        def rollout(self, *a: Any, **k: Any) -> Any:
            continuations.append(super().rollout(*a, **k))
            return continuations[-1]

        def rollout_batch(self, *a: Any, **k: Any) -> Any:
            out = super().rollout_batch(*a, **k)
            students.extend(out)
            return out

    gate.RolloutRunner = Recording  # type: ignore[misc]
    privileged: list[tuple[str, str, str]] = []
    judge = gate.privileged_prediction

    def recording_judge(
        context: str, turn_so_far: str, predicted: str, rule: str = "any_new_number"
    ) -> bool:
        leaked = judge(context, turn_so_far, predicted, rule)
        if leaked:
            privileged.append((context, turn_so_far, predicted))
        return leaked

    gate.privileged_prediction = recording_judge  # type: ignore[assignment]
    env = make_environment(cfg.environment.name, **cfg.environment.params)
    splits = build_splits(env, cfg.environment)
    result = gate.evaluate_state_gate(
        trainer.teacher,
        trainer.student,
        env,
        splits["eval"][: cfg.lab.teacher_gate.tasks],
        cfg.rollout,
        seed=cfg.run.seed,
        fit_task_ids=[t.task_id for t in splits["train"]],
        batch_size=cfg.eval.batch_size,
        privileged_rule=cfg.lab.teacher_gate.privileged,
    )
    figures = {
        "on_path_agreement": result.on_path_agreement,
        "off_path_agreement": result.off_path_agreement,
        "recovered": result.recovered,
        "recovery_states": result.recovery_states,
    }
    print(json.dumps(figures))
    for context, so_far, predicted in privileged:
        print("===== privileged prediction")
        print("--- transcript before the turn (last 600 characters):\n" + context[-600:])
        print(f"--- the student's turn so far: {so_far!r}")
        print(f"--- the teacher's top-1 next token: {predicted!r}")
    tokenizer = trainer.student.tokenizer
    by_id = {s.trajectory_id: s for s in students}
    for cont in continuations:
        print(f"===== {cont.trajectory_id} solved={cont.solved}")
        student = by_id.get(cont.trajectory_id.removesuffix(":recovery"))
        if student is not None:
            print("--- student:\n" + _text(tokenizer, student))
        print("--- teacher's continuation:\n" + _text(tokenizer, cont))


if __name__ == "__main__":
    main()
