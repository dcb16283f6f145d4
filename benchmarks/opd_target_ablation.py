"""Which OPD targets move the student where: fit one batch of its own rollouts, by position subset.

A diagnostic, not a timing (docs/benchmark.md, "Where the forward-KL collapse comes from", uses it to explain why `opd`
collapses on calc_chain with the oracle teacher). From a shared cold start it collects ONE
cycle of the student's own rollouts with their teacher targets, exactly as the `opd` arm's
first cycle does, then fits that fixed batch for ``--steps`` optimizer steps keeping the
loss weight of only one subset of the positions, and reports greedy validation success
before and after. Every subset starts from the same weights and the same batch (the cycle
is deterministic at a seed), with a fresh optimizer.

The subsets, per episode, with "the first deviation" the first student token that differs
from the teacher's top-1 target:

- ``on_path``: positions up to and including the first deviation, i.e. states on the
  oracle's path, where the targets are the oracle's own tokens;
- ``same_turn``: after it, inside the turn that deviated;
- ``early_answer``: in a later turn where the student opened a final answer while a call was
  due; the withdrawn oracle wrote the oracle's final value inside the block there, and the fixed
  one targets nothing inside a block of the other kind (lab/teachers/oracle.py, point 4);
- ``later``: every other position in later turns: corrective re-calls from the last correct
  value, repeats, and blocks that follow the student's malformed text;
- ``after_first``: ``same_turn`` + ``early_answer`` + ``later``; ``all``: every position.

Fitting one batch for many steps is off-policy after the first step by construction, so the
on-policy check is not run; this script never trains an arm.

    PYTHONPATH=src python benchmarks/opd_target_ablation.py COLD_START_DIR \\
        [--recipe recipes/toy_calc_chain_oracle.yaml] [--seed 1] [--steps 60] \\
        [--subsets all,on_path,after_first] [override ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from miniverl.config.models import RunConfig
from miniverl.lab.config import load_recipe
from miniverl.lab.cycles import fit_fixed_batch
from miniverl.lab.run import start_run
from miniverl.schemas.text import FINAL_OPEN, TOOL_CALL_OPEN

SUBSETS = ("all", "on_path", "same_turn", "early_answer", "later", "after_first")
AFTER_FIRST = frozenset({"same_turn", "early_answer", "later"})


def position_kinds(sample: Any, tokenizer: Any) -> list[str | None]:
    """The subset of every aligned position of ``sample`` (None where it carries no weight)."""
    a = sample.alignment
    top1 = [int(t) for t in sample.provider.topk_indices[:, 0].tolist()]
    live = [i for i, w in enumerate(a.token_weights) if w > 0 and a.model_token_mask[i]]
    targets = a.student_target_positions
    turn = {i: sample.trajectory.span_at(targets[i]).turn_id for i in live}
    first = next((i for i in live if top1[i] != a.target_token_ids[i]), None)
    text: dict[int, str] = {}
    opening_target: dict[int, int] = {}
    for i in live:
        text[turn[i]] = text.get(turn[i], "") + tokenizer.decode([a.target_token_ids[i]])
        opening_target.setdefault(turn[i], top1[i])
    call_open = tokenizer.encode(TOOL_CALL_OPEN)[0]
    early = {t for t, s in text.items() if FINAL_OPEN in s and opening_target[t] == call_open}
    kinds: list[str | None] = [None] * len(a.token_weights)
    for i in live:
        if first is None or i <= first:
            kinds[i] = "on_path"
        elif turn[i] == turn[first]:
            kinds[i] = "same_turn"
        else:
            kinds[i] = "early_answer" if turn[i] in early else "later"
    return kinds


def keeps(subset: str, kind: str | None) -> bool:
    if kind is None:
        return False
    return subset == "all" or kind == subset or (subset == "after_first" and kind in AFTER_FIRST)


def fit_subset(
    config: RunConfig, cold_start: Path, subset: str, steps: int, workdir: Path
) -> dict[str, Any]:
    trainer = start_run(config, cold_start=cold_start, output_dir=workdir / subset)
    trainer.load_initial_weights()
    before = trainer.evaluate("ablation_before", temperature=0.0)
    source = trainer.source
    batch = source.samples(0, trainer.next_tasks(source.tasks_per_cycle))
    counts: dict[str, int] = {}
    kept = []
    for sample in batch.samples:
        kinds = position_kinds(sample, trainer.tokenizer)
        for kind in kinds:
            if kind is not None:
                counts[kind] = counts.get(kind, 0) + 1
        weights = [
            w if keeps(subset, kind) else 0.0
            for w, kind in zip(sample.alignment.token_weights, kinds, strict=True)
        ]
        if sum(weights) > 0:
            sample.alignment = sample.alignment.model_copy(update={"token_weights": weights})
            kept.append(sample)
    losses = fit_fixed_batch(trainer, kept, steps)
    after = trainer.evaluate("ablation_after", temperature=0.0)
    return {
        "subset": subset,
        "positions": counts,
        "episodes_fitted": len(kept),
        "episodes": len(batch.samples),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "solved_before": before["solved"],
        "solved_after": after["solved"],
        "tasks": after["tasks"],
        "split": after["split"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cold_start", type=Path, help="a shared cold start (seed-N/cold-start)")
    parser.add_argument(
        "overrides", nargs="*", help="dotted recipe overrides, e.g. train.lr=0.0003"
    )
    parser.add_argument("--recipe", default="recipes/toy_calc_chain_oracle.yaml")
    parser.add_argument("--seed", type=int, default=1, help="run.seed: the seed of the cold start")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--subsets", default="all,on_path,after_first")
    args = parser.parse_args()
    subsets = [s for s in args.subsets.split(",") if s]
    unknown = sorted(set(subsets) - set(SUBSETS))
    if unknown:
        parser.error(f"unknown subset(s) {', '.join(unknown)}; choose from {', '.join(SUBSETS)}")
    config = load_recipe(
        args.recipe,
        ["run.mode=opd", "loss.divergence=forward_kl", f"run.seed={args.seed}", *args.overrides],
    )
    with tempfile.TemporaryDirectory() as tmp:
        for subset in subsets:
            r = fit_subset(config, args.cold_start, subset, args.steps, Path(tmp))
            loss = (
                "no position kept"
                if r["loss_first"] is None
                else f"loss {r['loss_first']:.3f} -> {r['loss_last']:.3f} nats/token"
            )
            print(
                f"{subset:>12}: {r['episodes_fitted']}/{r['episodes']} episodes fitted, {loss}; "
                f"greedy {r['split']} solved {r['solved_before']} -> {r['solved_after']} "
                f"of {r['tasks']}  positions {r['positions']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
