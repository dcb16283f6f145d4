"""Short summaries of policy-version lists: a long run has hundreds of versions.

``inspect`` and ``cache stats`` print these by default and the full list only when asked
(``--all-versions``), so a 400-cycle run stays readable in a terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

DEFAULT_SHOWN = 8


def _contiguous_runs(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def summarize_versions(versions: Iterable[int], *, shown: int = DEFAULT_SHOWN) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``"0-3, 7"``; more than ``shown`` runs are elided in the middle.

    The count of distinct versions is always stated, so elision never hides how many.
    """
    values = sorted({int(v) for v in versions})
    if not values:
        return "none"
    runs = _contiguous_runs(values)
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    if len(text) > shown:
        head, tail = text[: shown // 2], text[-(shown - shown // 2) :]
        text = [*head, f"... ({len(runs) - len(head) - len(tail)} more ranges)", *tail]
    return f"{len(values)} distinct: " + ", ".join(text)


def summarize_version_counts(counts: Mapping[int | str, int], *, shown: int = DEFAULT_SHOWN) -> str:
    """Per-version entry counts: all of them if few, else a range summary with min/max counts."""
    if not counts:
        return "none"
    items = sorted((int(v), int(n)) for v, n in counts.items())
    if len(items) <= shown:
        return ", ".join(f"v{v}: {n}" for v, n in items)
    per = [n for _, n in items]
    return (
        f"{summarize_versions([v for v, _ in items], shown=shown)} "
        f"({sum(per)} entries, {min(per)}-{max(per)} per version)"
    )


def all_version_counts(counts: Mapping[int | str, int]) -> str:
    return (
        ", ".join(f"v{v}: {n}" for v, n in sorted((int(v), int(n)) for v, n in counts.items()))
        or "none"
    )


__all__ = ["all_version_counts", "summarize_version_counts", "summarize_versions"]
