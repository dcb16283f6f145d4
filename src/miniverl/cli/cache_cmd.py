"""``miniverl cache stats|validate|prune``: inspect and maintain a teacher cache without torch.

Everything here reads ``index.json`` and the safetensors headers/bytes directly through
:mod:`miniverl.cache`, which imports no tensor library at module level, so these commands
work from a base install and on caches received from elsewhere. A
:class:`~miniverl.errors.MiniverlError` is printed as message + hint with exit status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from miniverl.cache import maintenance
from miniverl.cli.common import console, handles_errors
from miniverl.errors import ConfigError
from miniverl.utils.runlock import maintenance_lock
from miniverl.utils.versions import all_version_counts, summarize_version_counts

cache_app = typer.Typer(
    help="Inspect, verify and prune a teacher-target cache (torch-free).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DirArgument = Annotated[Path, typer.Argument(help="Teacher cache directory (holds index.json).")]


def _human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


@cache_app.command()
@handles_errors
def stats(
    directory: DirArgument,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    all_versions: Annotated[
        bool, typer.Option("--all-versions", help="List every policy version, not a summary.")
    ] = False,
) -> None:
    """Entries, positions, K, bytes per position, policy versions and shards, from the index."""
    info = maintenance.stats(directory)
    if json_out:
        sys.stdout.write(json.dumps(info, indent=2, sort_keys=True) + "\n")
        return
    per_position = info["bytes_per_position"]
    table = Table(title=f"teacher cache {directory}", show_header=True)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    rows = [
        (
            "teacher",
            info["teacher_model_id"]
            + (f" @ {info['teacher_revision']}" if info["teacher_revision"] else ""),
        ),
        ("teacher mode", info["teacher_mode"]),
        ("tokenizer", info["tokenizer_fingerprint"][:16] + "..."),
        (
            "loss mode",
            f"{info['loss_mode']} (K = {info['top_k']}, V = {info['vocab_size']}, temperature {info['temperature']})",
        ),
        ("storage", f"log-probs {info['dtype']}, indices {info['index_dtype']}"),
        ("entries", str(info["entries"])),
        ("positions", str(info["positions"])),
        ("K", str(info["top_k"])),
        (
            "bytes per position",
            "n/a (no positions)"
            if per_position is None
            else f"{per_position:.1f} (bf16 full logits: {info['full_logits_bf16_bytes_per_position']}, "
            f"{info['compression_ratio']:.1f}x smaller)",
        ),
        (
            "versions",
            all_version_counts(info["versions"])
            if all_versions
            else summarize_version_counts(info["versions"]),
        ),
        ("shards", str(info["shards"])),
        ("total bytes", f"{info['total_bytes']} ({_human_bytes(info['total_bytes'])})"),
    ]
    if info["unreferenced_files"]:
        rows.append(("unreferenced files", ", ".join(info["unreferenced_files"])))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


@cache_app.command()
@handles_errors
def validate(directory: DirArgument) -> None:
    """Recompute every shard and entry SHA-256 and check the structure; non-zero exit on any problem."""
    report = maintenance.validate(directory)
    console.print(report.summary(), markup=False, soft_wrap=True)


@cache_app.command()
@handles_errors
def prune(
    directory: DirArgument,
    keep_version: Annotated[
        list[int],
        typer.Option(
            "--keep-version",
            help="Policy version to keep (repeatable); every other version is removed.",
        ),
    ],
) -> None:
    """Remove entries of every policy version not kept; compact or delete the affected shards.

    Refused while a run that owns the cache (``<run>/teacher-cache``) is being written."""
    with maintenance_lock(directory):
        _prune_locked(directory, keep_version)


def _prune_locked(directory: Path, keep_version: list[int]) -> None:
    index = maintenance.open_index(directory)
    present = sorted(int(v) for v in maintenance.stats(directory, index)["versions"])
    negative = sorted(v for v in keep_version if v < 0)
    if negative:
        raise ConfigError(
            f"--keep-version {negative[0]} is negative; policy versions are >= 0",
            hint=f"versions present in {directory}: {present or 'none'}",
        )
    unknown = sorted(set(keep_version) - set(present))
    if unknown:
        raise ConfigError(
            f"--keep-version {unknown[0]} is not a policy version in {directory}; "
            "pruning would keep nothing you asked for",
            hint=f"versions present: {present or 'none'} (see 'miniverl cache stats {directory}')",
        )
    result = maintenance.prune(directory, keep_version, index=index)
    console.print(
        f"pruned {directory}: removed {result['removed_entries']} entries, kept {result['kept_entries']} "
        f"(versions {result['kept_versions'] or 'none'}); deleted {len(result['deleted_shards'])} shard(s), "
        f"compacted {len(result['compacted_shards'])}; {result['bytes_before']} -> {result['bytes_after']} bytes",
        markup=False,
        soft_wrap=True,
    )
    if result["removed_unreferenced_files"]:
        console.print(
            f"removed unreferenced files: {', '.join(result['removed_unreferenced_files'])}",
            markup=False,
        )


__all__ = ["cache_app"]
