"""What each arm's student does first at the fixed recovery states, and whether it then solves.

A diagnostic, not a timing. The fixed-state endpoint (``lab/benchmark/fixed_states.py``)
counts the cold start's deviated held-out episodes that a policy, replayed to the state after
the first flagged error, ends solved. A count alone cannot say *where* a student fails:
whether it does not copy the step the error message names, copies it and errs later, or
answers instead. This script replays every stored state of a benchmark run directory for the
cold start and each arm's final student (greedy, as the endpoint does) and sorts the first
action after the error:

- ``named``: a well-formed call of exactly the step the message names ("the next step is
  A op B");
- ``repeat``: a well-formed call of the expression the error refused;
- ``other``: a well-formed call of another expression;
- ``malformed``: a call the environment cannot parse;
- ``answer``: no call: a final answer, or a turn without a call or an answer.

It prints, per policy over the seeds it finds, the states, how many start with each action,
and how many end solved (all, and after a ``named`` first action), then the same per seed;
``--json`` writes the figures. ``--contrast A,B`` (repeatable) prints ``named_first``, the share
of a seed's states whose first action is ``named``, as A minus B paired by seed: the mean
difference in percentage points, its 95% t-interval over seeds and the two-sided t-test p
(``miniverl.lab.benchmark.stats``), as ``results/toy_positive_control/action-test/protocol.yaml``
pre-registers it. The solved counts equal the cells' ``fixed_state_recovery``
(the same replay, :func:`~miniverl.lab.teachers.gate.continue_from`).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/fixed_state_actions.py \\
        runs/refit-test-a runs/refit-test-b [--seeds 21,22] [--json OUT.json] \\
        [--contrast opd,offline_kd ...]

Each ``RUN_ROOT`` is a ``miniverl benchmark`` output directory: ``seed-S/cold-start`` (weights and
``fixed-states.jsonl``) and ``seed-S/ARM`` run directories with a final checkpoint.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from miniverl.lab.benchmark.fixed_states import (
    FIXED_STATES_FILE,
    load_final_student,
    stored_states,
)
from miniverl.lab.teachers.fitting import turn_spans
from miniverl.lab.teachers.gate import continue_from, first_off_path_turns
from miniverl.utils.runs import RunPaths

ACTIONS = ("named", "repeat", "other", "malformed", "answer")
_NAMED = re.compile(r"the next step is (-?\d+ [-+*] -?\d+)")


def first_action(episode: Any, turn: int, tokenizer: Any) -> str:
    """The kind of ``episode``'s turn ``turn`` (the first the policy played) against the step
    the last error message before it names."""
    spans = turn_spans(episode)
    if turn not in spans:
        return "answer"
    named = _NAMED.findall(tokenizer.decode(episode.token_ids[: spans[turn][0]]))
    played = next((t for t in episode.turns if t.turn_id == turn), None)
    if played is None or played.is_final or played.tool_call is None:
        return "answer"
    call = played.tool_call
    if not call.valid:
        return "malformed"
    expression = _expression(call)
    if named and expression == named[-1]:
        return "named"
    refused = [t.tool_call for t in episode.turns if t.turn_id < turn and t.tool_call is not None]
    return (
        "repeat"
        if refused and refused[-1].valid and expression == _expression(refused[-1])
        else "other"
    )


def _expression(call: Any) -> str:
    return " ".join(str(call.arguments.get("expression", "")).split())


def tally(policy: Any, environment: Any, tasks: list, states: list, rollout: Any) -> dict:
    """First actions and solved counts of ``policy`` continuing from every state."""
    by_id = {t.task_id: t for t in tasks}
    first_off = first_off_path_turns(environment, by_id, states, policy.tokenizer)
    counts: Counter[str] = Counter()
    for episode in states:
        turn = first_off.get(episode.trajectory_id)
        if turn is None:
            continue
        cont = continue_from(policy, environment, by_id[episode.task_id], episode, turn, rollout)
        action = first_action(cont, turn, policy.tokenizer)
        counts["states"] += 1
        counts[action] += 1
        counts["solved"] += int(cont.solved)
        counts[f"solved_after_{action}"] += int(cont.solved)
    return dict(counts)


def seed_tally(seed_dir: Path) -> dict[str, dict]:
    """Every policy of one seed: the cold start, then each arm with a final checkpoint."""
    cold = seed_dir / "cold-start"
    arms = sorted(
        p
        for p in seed_dir.iterdir()
        if p.is_dir() and p.name != "cold-start-run" and RunPaths(p).final_checkpoint.exists()
    )
    if not arms or not (cold / FIXED_STATES_FILE).is_file():
        raise SystemExit(
            f"{seed_dir}: needs cold-start/{FIXED_STATES_FILE} and at least one arm run directory "
            "with a final checkpoint (a benchmark run with eval.fixed_state_recovery=true)"
        )
    stored = stored_states(arms[0], cold)
    replay = (stored.environment, stored.tasks, stored.states, stored.config.rollout)
    out = {"cold-start": tally(stored.policy, *replay)}
    for arm in arms:
        load_final_student(stored.policy, arm)
        out[arm.name] = tally(stored.policy, *replay)
    return out


def line(name: str, c: dict) -> str:
    n = c.get("states", 0)
    parts = [f"{a} {c.get(a, 0)}" for a in ACTIONS]
    return (
        f"{name:24s} states {n:4d} | first action: {', '.join(parts)} | solved {c.get('solved', 0)}"
        f" (after named {c.get('solved_after_named', 0)} of {c.get('named', 0)})"
    )


def named_first_contrast(per_seed: dict[str, dict[str, dict]], a: str, b: str) -> dict[str, Any]:
    """``a`` minus ``b`` on ``named_first`` (percentage points), paired by seed: the per-seed
    differences, their mean, 95% t-interval and two-sided t-test p."""
    from miniverl.lab.benchmark.stats import t_interval, t_test_p

    diffs = []
    for seed, policies in per_seed.items():
        if policies[a]["states"] != policies[b]["states"]:
            raise ValueError(f"seed {seed}: {a} and {b} answered different states")
        n = policies[a]["states"]
        diffs.append(100 * (policies[a].get("named", 0) - policies[b].get("named", 0)) / n)
    low, high = t_interval(diffs)
    mean = sum(diffs) / len(diffs)
    return {"diffs": diffs, "mean": mean, "low": low, "high": high, "p": t_test_p(diffs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_roots", type=Path, nargs="+", metavar="RUN_ROOT")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--contrast", action="append", default=[], metavar="A,B")
    args = parser.parse_args()
    wanted = None if args.seeds is None else {s.strip() for s in args.seeds.split(",")}
    per_seed: dict[str, dict[str, dict]] = {}
    seed_dirs = sorted(
        (d for root in args.run_roots for d in root.glob("seed-*")),
        key=lambda d: int(d.name.removeprefix("seed-")),
    )
    if not seed_dirs:
        raise SystemExit("no seed-S directory under " + ", ".join(map(str, args.run_roots)))
    for seed_dir in seed_dirs:
        seed = seed_dir.name.removeprefix("seed-")
        if wanted is None or seed in wanted:
            per_seed[seed] = seed_tally(seed_dir)
    total: dict[str, Counter] = {}
    for policies in per_seed.values():
        for name, c in policies.items():
            total.setdefault(name, Counter()).update(c)
    print(f"over seeds {', '.join(per_seed)}:")
    for name, c in total.items():
        print(line(name, c))
    for seed, policies in per_seed.items():
        print(f"seed {seed}:")
        for name, c in policies.items():
            print("  " + line(name, c))
    contrasts = {}
    for pair in args.contrast:
        a, b = (name.strip() for name in pair.split(","))
        c = contrasts[f"{a} - {b}"] = named_first_contrast(per_seed, a, b)
        print(
            f"named_first {a} - {b}: {c['mean']:+.1f} pp, 95% t-interval "
            f"[{c['low']:+.1f}, {c['high']:+.1f}], p = {c['p']:.3g} over {len(c['diffs'])} seeds"
        )
    if args.json is not None:
        record = {"per_seed": per_seed, "contrasts": contrasts}
        args.json.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
