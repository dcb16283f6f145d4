"""Teacher-cache size and throughput (docs/design.md §3.6).

Two measurements:

1. Bytes per cached position for K = 16 and 64 at V = 151,936 (Qwen-sized vocabulary), with
   float32 and bfloat16 log-prob storage and int32 ids, against ``V × 2`` bytes for bf16
   full logits. The per-position figure is both computed from the layout
   (``K·(4 + b) + b + 4``: ids, top-k log-probs, tail, float32 entropy; ``b`` bytes per
   log-prob) and measured from a real flushed cache, with and without shard headers.
2. Throughput of a cache of ``entries × positions`` positions (default 400 × 250 = 100k,
   K = 16, float32) on this machine: stage + flush, validate (both SHA-256 levels), read
   (verified) and prune (compaction of half the shards' entries), in positions per second.

Targets are synthetic (random ids and log-probs): the cache's cost does not depend on them.

    PYTHONPATH=src python benchmarks/cache_throughput.py [--entries 400] [--positions 250]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from miniverl.cache import TeacherCache
from miniverl.schemas.cache import CacheProvenance

QWEN_VOCAB = 151_936
LOG_PROB_BYTES = {"float32": 4, "bfloat16": 2}


def provenance(top_k: int, dtype: str, vocab: int = QWEN_VOCAB) -> CacheProvenance:
    return CacheProvenance(
        teacher_model_id="synthetic-teacher",
        tokenizer_fingerprint="0" * 64,
        top_k=top_k,
        temperature=1.0,
        vocab_size=vocab,
        dtype=dtype,  # type: ignore[arg-type]
    )


def synthetic_targets(
    n: int, k: int, vocab: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random ``[n, k]`` ids and decreasing log-probs, an ``[n]`` tail and entropy."""
    log_probs = -torch.rand(n, k, generator=generator).mul(10).sort(dim=-1).values
    return {
        "topk_indices": torch.randint(0, vocab, (n, k), generator=generator, dtype=torch.int64),
        "topk_log_probs": log_probs,
        "tail_log_prob": -torch.rand(n, generator=generator).mul(5),
        "teacher_entropy": torch.rand(n, generator=generator).mul(3),
    }


def stage(
    cache: TeacherCache, entries: int, positions: int, k: int, vocab: int, seed: int = 0
) -> None:
    generator = torch.Generator().manual_seed(seed)
    for i in range(entries):
        key = f"synthetic-{i:06d}"
        cache.write(
            key,
            synthetic_targets(positions, k, vocab, generator),
            trajectory_id=key,
            policy_version=i % 2,
            alignment_digest=hashlib.sha256(key.encode()).hexdigest(),
        )


def size_table(root: Path) -> list[dict[str, Any]]:
    rows = []
    full = QWEN_VOCAB * 2
    for k in (16, 64):
        for dtype, b in LOG_PROB_BYTES.items():
            directory = root / f"size-k{k}-{dtype}"
            cache = TeacherCache(directory, provenance(k, dtype))
            stage(cache, entries=8, positions=250, k=k, vocab=QWEN_VOCAB)
            cache.flush()
            stats = cache.stats()
            layout = k * (4 + b) + b + 4
            assert stats["bytes_per_position"] == layout
            rows.append(
                {
                    "K": k,
                    "log_prob_dtype": dtype,
                    "bytes_per_position": layout,
                    "without_entropy": layout - 4,
                    "file_bytes_per_position": round(stats["file_bytes_per_position"], 1),
                    "bf16_full_logits_bytes": full,
                    "compression_ratio": round(full / layout, 1),
                }
            )
            shutil.rmtree(directory)
    return rows


def throughput(root: Path, entries: int, positions: int, k: int, dtype: str) -> dict[str, Any]:
    directory = root / "throughput"
    total = entries * positions
    cache = TeacherCache(directory, provenance(k, dtype), max_entries_per_shard=256)

    started = time.perf_counter()
    stage(cache, entries, positions, k, QWEN_VOCAB, seed=1)
    staged = time.perf_counter()
    shards = cache.flush()
    flushed = time.perf_counter()
    report = TeacherCache.open(directory).validate()
    validated = time.perf_counter()
    reader = TeacherCache.open(directory, reuse_across_policy_versions=True)
    for key in reader:
        reader.read(key, expect_policy_version=None)
    read_done = time.perf_counter()
    pruned = TeacherCache.open(directory).prune([0])
    prune_done = time.perf_counter()

    write_s = flushed - started
    return {
        "entries": entries,
        "positions": total,
        "K": k,
        "log_prob_dtype": dtype,
        "shards": len(shards),
        "cache_bytes": report.bytes_verified,
        "stage_s": round(staged - started, 3),
        "flush_s": round(flushed - staged, 3),
        "write_positions_per_s": round(total / write_s),
        "validate_s": round(validated - flushed, 3),
        "validate_positions_per_s": round(total / (validated - flushed)),
        "validate_MB_per_s": round(report.bytes_verified / (validated - flushed) / 1e6, 1),
        "write_plus_validate_positions_per_s": round(total / (validated - started)),
        "read_verified_positions_per_s": round(total / (read_done - validated)),
        "prune_half_s": round(prune_done - read_done, 3),
        "prune_kept_entries": pruned["kept_entries"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=400)
    parser.add_argument("--positions", type=int, default=250, help="positions per entry")
    parser.add_argument("--top-k", type=int, default=16)
    parser.add_argument("--dtype", choices=sorted(LOG_PROB_BYTES), default="float32")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of tables"
    )
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    with tempfile.TemporaryDirectory(prefix="miniverl-cache-bench-") as tmp:
        root = Path(tmp)
        sizes = size_table(root)
        speed = throughput(root, args.entries, args.positions, args.top_k, args.dtype)

    if args.json:
        print(json.dumps({"sizes": sizes, "throughput": speed}, indent=2))
        return
    print(f"bytes per cached position at V = {QWEN_VOCAB:,} (int32 ids, float32 entropy)")
    print(
        f"{'K':>4} {'log-probs':>9} {'B/pos':>6} {'no entropy':>10} {'file B/pos':>10} {'bf16 logits':>11} {'ratio':>7}"
    )
    for row in sizes:
        print(
            f"{row['K']:>4} {row['log_prob_dtype']:>9} {row['bytes_per_position']:>6} {row['without_entropy']:>10} "
            f"{row['file_bytes_per_position']:>10} {row['bf16_full_logits_bytes']:>11,} {row['compression_ratio']:>6}x"
        )
    print()
    print(
        f"throughput: {speed['entries']} entries x {args.positions} positions = {speed['positions']:,} positions, "
        f"K = {speed['K']}, {speed['log_prob_dtype']}, {speed['shards']} shards, {speed['cache_bytes'] / 1e6:.1f} MB"
    )
    for label, key in (
        ("write (stage + flush)", "write_positions_per_s"),
        ("validate (shard + entry SHA-256)", "validate_positions_per_s"),
        ("write + validate", "write_plus_validate_positions_per_s"),
        ("read (verified)", "read_verified_positions_per_s"),
    ):
        print(f"  {label:<34} {speed[key]:>12,} positions/s")
    print(
        f"  stage {speed['stage_s']} s, flush {speed['flush_s']} s, validate {speed['validate_s']} s "
        f"({speed['validate_MB_per_s']} MB/s), prune to one version {speed['prune_half_s']} s"
    )


if __name__ == "__main__":
    main()
