"""Can the student fit the teacher at its own post-error states? A fixed-batch overfit check.

A diagnostic, not a timing: the positive control's first defect check (docs/benchmark.md, "The
positive control with a learned teacher"). From a cold start it collects ``--cycles`` cycles of
the student's own rollouts with their teacher targets, exactly as the ``opd`` arm's first
cycles do, keeps the episodes with a refused call (the checked tool's ``ok: false`` or a parse
error), and scores the student's greedy (top-1) token against the teacher's top-1 target at
every targeted position after the first refusal, teacher-forced, before and after fitting that
fixed batch for ``--passes`` passes with the loss kept on exactly those positions.

"The corrective turn" is the turn right after the first refusal; it is *reproduced* when the
student's top-1 is the teacher's at every targeted position of it, i.e. greedy decoding from
that state writes the teacher's correction. If a fixed batch cannot be fitted there, no number
of OPD cycles teaches recovery to this student; if it can, what fails is learning it from fresh
states (generalisation or budget). Fitting one batch many times is off-policy after the first
step by construction; this script never trains an arm.

    PYTHONPATH=src python benchmarks/recovery_overfit.py COLD_START_DIR \\
        [--recipe recipes/toy_calc_chain_oracle.yaml] [--cycles 4] [--passes 100] \\
        [--as-checked] [override ...]

``--as-checked`` scores a cold start warmed up on the plain ``calc_chain`` in the checked one
(as the positive control's first pilot did with ``results/positive_control/test-context``):
the cold start is copied and its recorded environment parameters gain ``checked: true``; the
student's weights (SHA-256 checked on load) are the same, only the tool's answers differ.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from miniverl.lab.config import load_recipe
from miniverl.lab.cycles import fit_fixed_batch
from miniverl.lab.run import start_run
from miniverl.training.recipe import OPDTrainer


def first_refused_turn(trajectory: Any) -> int | None:
    """The turn of the first call the tool or the parser refused, or None."""
    for turn in trajectory.turns:
        refused_call = turn.tool_call is not None and turn.tool_call.valid is False
        refused_result = turn.tool_result is not None and not turn.tool_result.ok
        if refused_call or refused_result:
            return int(turn.turn_id)
    return None


def post_error_positions(sample: Any) -> tuple[list[int], list[int]]:
    """``(after, corrective)``: alignment indices with a target in a turn after the first
    refusal, and those of them in the turn right after it."""
    refused = first_refused_turn(sample.trajectory)
    if refused is None:
        return [], []
    a = sample.alignment
    targets = a.student_target_positions
    after, corrective = [], []
    for i, weight in enumerate(a.token_weights):
        if weight <= 0 or not a.model_token_mask[i]:
            continue
        turn = sample.trajectory.span_at(targets[i]).turn_id
        if turn > refused:
            after.append(i)
            if turn == refused + 1:
                corrective.append(i)
    return after, corrective


@torch.no_grad()
def agreement(trainer: OPDTrainer, samples: Sequence[Any]) -> dict[str, Any]:
    """Teacher-forced top-1 agreement of the student with the teacher's top-1 target after
    the first refusal, and corrective turns reproduced whole."""
    trainer.student.set_train(False)
    hits = total = turns_ok = turns = 0
    for sample in samples:
        after, corrective = post_error_positions(sample)
        if not after:
            continue
        a = sample.alignment
        teacher = sample.provider.topk_indices[:, 0]
        positions = [a.student_prediction_positions[i] for i in after]
        logits = trainer.student.project(
            trainer.student.hidden_states_at(list(sample.trajectory.token_ids), positions)
        )
        mine = logits.argmax(dim=-1).tolist()
        match = {i: int(m) == int(teacher[i]) for i, m in zip(after, mine, strict=True)}
        hits += sum(match.values())
        total += len(match)
        if corrective:
            turns += 1
            turns_ok += all(match[i] for i in corrective)
    return {"agree": hits, "positions": total, "reproduced": turns_ok, "turns": turns}


def keep_only(sample: Any, indices: Sequence[int]) -> Any:
    """``sample`` with the loss weight of every position outside ``indices`` set to 0."""
    kept = set(indices)
    weights = [w if i in kept else 0.0 for i, w in enumerate(sample.alignment.token_weights)]
    sample.alignment = sample.alignment.model_copy(update={"token_weights": weights})
    return sample


def as_checked(cold_start: Path, workdir: Path) -> Path:
    """A copy of ``cold_start`` whose recorded environment is the checked ``calc_chain``."""
    from miniverl.training.cold_start import COLD_START_IDENTITY, COLD_START_MARKER

    copy = workdir / "cold-start-checked"
    shutil.copytree(cold_start, copy)
    marker = json.loads((copy / COLD_START_MARKER).read_text(encoding="utf-8"))
    identity = marker[COLD_START_IDENTITY]
    identity["environment_params"] = {**identity["environment_params"], "checked": True}
    (copy / COLD_START_MARKER).write_text(json.dumps(marker), encoding="utf-8")
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cold_start", type=Path, help="a shared cold start (seed-N/cold-start)")
    parser.add_argument("overrides", nargs="*", help="dotted recipe overrides")
    parser.add_argument("--recipe", default="recipes/toy_calc_chain_oracle.yaml")
    parser.add_argument("--cycles", type=int, default=4, help="cycles of rollouts collected")
    parser.add_argument("--passes", type=int, default=100)
    parser.add_argument("--as-checked", action="store_true", help="see the module docstring")
    args = parser.parse_args()
    config = load_recipe(
        args.recipe, ["run.mode=opd", "loss.divergence=forward_kl", *args.overrides]
    )
    with tempfile.TemporaryDirectory() as tmp:
        cold = as_checked(args.cold_start, Path(tmp)) if args.as_checked else args.cold_start
        trainer = start_run(config, cold_start=cold, output_dir=Path(tmp) / "run")
        trainer.load_initial_weights()
        source, samples, episodes = trainer.source, [], 0
        for cycle in range(args.cycles):
            batch = source.samples(cycle, trainer.next_tasks(source.tasks_per_cycle))
            episodes += len(batch.samples)
            for sample in batch.samples:
                after, _ = post_error_positions(sample)
                if after:
                    samples.append(keep_only(sample, after))
        before = agreement(trainer, samples)
        losses = fit_fixed_batch(trainer, samples, args.passes) if samples else []
        after = agreement(trainer, samples)
    print(
        f"{len(samples)} of {episodes} student episodes have a refused call; "
        f"{before['positions']} targeted positions after it, {before['turns']} corrective turns"
    )
    for name, r in (("before", before), (f"after {args.passes} passes", after)):
        share = r["agree"] / r["positions"] if r["positions"] else float("nan")
        print(
            f"{name:>18}: top-1 agreement {r['agree']}/{r['positions']} ({share:.3f}); "
            f"corrective turns reproduced {r['reproduced']}/{r['turns']}"
        )
    if losses:
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} nats/token over {len(losses)} steps")


if __name__ == "__main__":
    main()
