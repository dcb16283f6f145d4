"""Cost of the two-level contrast bootstrap (``miniverl.lab.benchmark.stats``) at protocol size.

A contrast at one chain length of the calc_chain test split has ``seeds x 600`` paired task
outcomes. This times ``compare_arms`` (multinomial task level, 10,000 replicates) and, side
by side in the same process, a naive bootstrap that resamples every task index with
``random.choices``, and prints the ratio per replicate. Outcomes are synthetic Bernoulli
draws: the cost depends on the table's shape, not its values.

    PYTHONPATH=src python benchmarks/contrast_bootstrap.py [--seeds 10] [--tasks 600]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from miniverl.lab.benchmark.stats import DEFAULT_RESAMPLES, compare_arms, paired_differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=600)
    parser.add_argument("--naive-resamples", type=int, default=1000)
    args = parser.parse_args()
    rng = random.Random(0)
    arm = {s: [float(rng.random() < 0.6) for _ in range(args.tasks)] for s in range(args.seeds)}
    ref = {s: [float(rng.random() < 0.5) for _ in range(args.tasks)] for s in range(args.seeds)}

    started = time.perf_counter()
    result = compare_arms("arm", "reference", arm, ref)
    fast = (time.perf_counter() - started) / DEFAULT_RESAMPLES

    table = list(paired_differences(arm, ref).values())
    naive_rng = random.Random(1)
    started = time.perf_counter()
    for _ in range(args.naive_resamples):
        rows = [table[naive_rng.randrange(len(table))] for _ in table]
        statistics.fmean(statistics.fmean(naive_rng.choices(r, k=len(r))) for r in rows)
    naive = (time.perf_counter() - started) / args.naive_resamples

    print(f"table: {args.seeds} seeds x {args.tasks} tasks")
    print(
        f"compare_arms: {DEFAULT_RESAMPLES} replicates in {fast * DEFAULT_RESAMPLES:.2f} s ({1e6 * fast:.0f} us each)"
    )
    print(f"naive task-index resampling: {1e6 * naive:.0f} us per replicate")
    print(f"ratio naive / multinomial per replicate: {naive / fast:.1f}x")
    print(result.verdict)


if __name__ == "__main__":
    main()
