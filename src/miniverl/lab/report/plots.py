"""Figures for the offline report, rendered by matplotlib's SVG backend and inlined.

The report must open on an air-gapped machine and must not be able to fetch anything, so
every figure is post-processed before it is embedded: the XML prolog, DOCTYPE, metadata
block and namespace declarations (which all carry ``http://`` URIs) are removed,
``clip-path="url(#...)"`` references are dropped (axes are autoscaled, so nothing needs
clipping), ``xlink:href`` becomes the SVG 2 ``href``, and every ``id`` is prefixed so two
figures in one document can never collide. Text stays text (``svg.fonttype: none``) so
the figures are small and searchable. Figures are built with :class:`Figure` directly,
never through ``pyplot``, so rendering keeps no global state between reports.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from miniverl.config.modes import DEFAULT_MODE, MODES

SPAN_COLORS: dict[str, str] = {
    "system": "#9e9e9e",
    "user": "#b0b0b0",
    "tool_result": "#8d9db6",
    "assistant_text": "#f2b134",
    "assistant_tool_call": "#2a9d8f",
    "assistant_final": "#e76f51",
}
PHASE_COLORS: dict[str, str] = {m.name: m.color for m in MODES.values() if m.color is not None}
"""A step record's phase (its mode's name) -> its colour (``config/modes.py``)."""
_DEFAULT_COLOR = "#264653"
MAX_MARKED_POINTS = 120
OUTSIDE = {"fontsize": 7, "frameon": False, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}
"""Legends sit right of the axes, never on the data (the saved figure's tight box keeps them)."""
"""Series longer than this are drawn as plain lines: thousands of markers bloat the SVG."""

_RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "miniverl-report",
    "font.size": 9.0,
    "axes.titlesize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_PROLOG_RE = re.compile(r"^.*?(?=<svg\b)", re.DOTALL)
_METADATA_RE = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
_XMLNS_RE = re.compile(r'\s+xmlns(?::\w+)?="[^"]*"')
_CLIP_ATTR_RE = re.compile(r'\s+clip-path="url\(#[^"]*\)"')
_CLIP_DEF_RE = re.compile(r"<clipPath\b.*?</clipPath>\s*", re.DOTALL)
_ID_RE = re.compile(r'\bid="([^"]+)"')
_HREF_RE = re.compile(r'\b(?:xlink:)?href="#([^"]+)"')
_COMMENT_RE = re.compile(r"<!--.*?-->\s*", re.DOTALL)
_counter = itertools.count()


def inline_svg(fig: Figure) -> str:
    """Serialize ``fig`` to an ``<svg>`` element that references nothing outside itself."""
    buffer = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(
            buffer,
            format="svg",
            bbox_inches="tight",
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    return sanitize_svg(buffer.getvalue(), prefix=f"f{next(_counter)}-")


def sanitize_svg(svg: str, *, prefix: str) -> str:
    """Strip everything in a matplotlib SVG that names a URL, and namespace its ids."""
    svg = _PROLOG_RE.sub("", svg, count=1)
    svg = _METADATA_RE.sub("", svg)
    svg = _COMMENT_RE.sub("", svg)
    svg = _XMLNS_RE.sub("", svg)
    svg = _CLIP_ATTR_RE.sub("", svg)
    svg = _CLIP_DEF_RE.sub("", svg)
    svg = _ID_RE.sub(lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = _HREF_RE.sub(lambda m: f'href="#{prefix}{m.group(1)}"', svg)
    svg = re.sub(r"<svg\b", '<svg role="img"', svg, count=1)
    return svg.strip()


def _figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(_RC):
        return Figure(figsize=(width, height), layout="constrained")


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def learning_curves(
    steps: Sequence[Mapping[str, object]], series: Sequence[tuple[str, str]]
) -> str:
    """One small panel per ``(field, title)`` against ``global_optimizer_step``, colored by phase."""
    fig = _figure(2.3 * len(series), 2.3)
    with matplotlib.rc_context(_RC):
        axes = fig.subplots(1, len(series), squeeze=False)[0]
        phases = list(dict.fromkeys(str(s.get("phase")) for s in steps))
        for ax, (key, title) in zip(axes, series, strict=True):
            for phase in phases:
                xs, ys = [], []
                for s in steps:
                    value = s.get(key)
                    if (
                        s.get("phase") == phase
                        and isinstance(value, int | float)
                        and math.isfinite(float(value))
                    ):
                        xs.append(s.get("global_optimizer_step"))
                        ys.append(float(value))
                if xs:
                    ax.plot(
                        xs,
                        ys,
                        marker="o" if len(xs) <= MAX_MARKED_POINTS else None,
                        markersize=3,
                        linewidth=1.2,
                        color=PHASE_COLORS.get(phase, _DEFAULT_COLOR),
                        label=phase,
                    )
            ax.set_title(title)
            ax.set_xlabel("optimizer step")
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
            ax.grid(alpha=0.3)
            if not ax.lines:
                ax.text(
                    0.5,
                    0.5,
                    "not recorded",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    color="#777777",
                )
        handles, labels = axes[0].get_legend_handles_labels()
        if len(labels) > 1:
            axes[0].legend(handles, labels, **OUTSIDE)
    return inline_svg(fig)


def success_per_cycle(
    rollouts: Sequence[tuple[int, float]],
    held_out: Sequence[tuple[float, float, str]],
) -> str:
    """Rollout success per distillation cycle and held-out success where it was measured.

    ``rollouts``: ``(cycle, rate)``; ``held_out``: ``(x, rate, label)`` where stages before
    the first distillation cycle sit at negative ``x`` and carry their label.
    """
    return inline_svg(success_per_cycle_figure(rollouts, held_out))


def _success_axes(ax: Any, xlabel: str, ylabel: str, steps: Sequence[int] | None = None) -> None:
    """A success curve's percent axis, labels, integer ticks (at ``steps`` multiples when
    given), grid, and its legend right of the axes (or "not recorded" without a line)."""
    ax.set_ylim(-3, 108)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ticks = {"steps": list(steps)} if steps is not None else {}
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True, **ticks))
    ax.grid(alpha=0.3)
    if not ax.lines:
        ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(**OUTSIDE)


HELD_OUT_LABEL_OFFSETS = {"baseline": (-5, 6, "right"), "warm-up": (5, 6, "left")}
"""``(dx, dy, ha)`` in points per stage label. Baseline and warm-up sit half a cycle apart
left of cycle 0, which is the same pixel on a long run's axis: baseline's label reads
leftwards and warm-up's rightwards, so they never overlap whatever the rates."""


def success_per_cycle_figure(
    rollouts: Sequence[tuple[int, float]],
    held_out: Sequence[tuple[float, float, str]],
) -> Figure:
    """The matplotlib figure of :func:`success_per_cycle` (tests measure its labels)."""
    fig = _figure(6.4, 2.8)
    with matplotlib.rc_context(_RC):
        ax = fig.subplots()
        if rollouts:
            xs, ys = zip(*rollouts, strict=True)
            ax.plot(
                xs,
                [100.0 * y for y in ys],
                color=PHASE_COLORS[DEFAULT_MODE],
                linewidth=1.0,
                alpha=0.8,
                marker="o" if len(xs) <= MAX_MARKED_POINTS else None,
                markersize=2.5,
                label="rollout success (training prompts, sampled)",
            )
        if held_out:
            ax.plot(
                [x for x, _, _ in held_out],
                [100.0 * y for _, y, _ in held_out],
                color="#e76f51",
                linewidth=1.6,
                marker="s",
                markersize=4.5,
                label="held-out success (greedy unless configured)",
            )
            for x, y, label in held_out:
                if label:
                    dx, dy, ha = HELD_OUT_LABEL_OFFSETS.get(label, (0, 6, "center"))
                    ax.annotate(
                        label, (x, 100.0 * y), textcoords="offset points", xytext=(dx, dy),
                        ha=ha, fontsize=7, color="#555555",
                    )  # fmt: skip
        _success_axes(ax, "distillation cycle", "success (%)")
    return fig


ARM_COLORS = ("#2a9d8f", "#e76f51", "#264653", "#e9c46a")
"""Line colours of the arms of :func:`arm_curves`, in the arms' order."""


def arm_curves(
    curves: Mapping[str, Sequence[tuple[float, float]]], ceiling: float | None = None
) -> str:
    """Held-out success of each arm against updates after the shared start (``(x, rate)``
    points, rate in [0, 1]), and the teacher's own success as a dashed line."""
    return inline_svg(arm_curves_figure(curves, ceiling))


def arm_curves_figure(
    curves: Mapping[str, Sequence[tuple[float, float]]], ceiling: float | None = None
) -> Figure:
    """The matplotlib figure of :func:`arm_curves` (tests read its lines)."""
    fig = _figure(6.4, 2.8)
    with matplotlib.rc_context(_RC):
        ax = fig.subplots()
        for (name, points), color in zip(curves.items(), itertools.cycle(ARM_COLORS)):
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(
                    xs, [100.0 * y for y in ys], color=color, linewidth=1.6, marker="o",
                    markersize=3.5, label=name,
                )  # fmt: skip
        if ceiling is not None:
            ax.axhline(
                100.0 * ceiling, color="#555555", linestyle="--", linewidth=1.0,
                label="teacher (the ceiling)",
            )  # fmt: skip
        _success_axes(
            ax, "updates after the shared SFT warm-up", "held-out success (%)", [1, 2, 5, 10]
        )
    return fig


def success_bars(stages: Sequence[tuple[str, float]]) -> str:
    """Held-out success rate per evaluation stage, as percentages."""
    fig = _figure(max(3.0, 1.1 * len(stages) + 1.0), 2.4)
    with matplotlib.rc_context(_RC):
        ax = fig.subplots()
        labels = [name for name, _ in stages]
        values = [100.0 * rate for _, rate in stages]
        bars = ax.bar(labels, values, color=_DEFAULT_COLOR, width=0.6)
        for bar, value in zip(bars, values, strict=True):
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                value + 1.5,
                f"{value:.1f}%",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylim(0, 112)
        ax.set_ylabel("held-out success (%)")
        ax.grid(axis="y", alpha=0.3)
    return inline_svg(fig)


def counts_bars(
    title: str, counts: Mapping[str, Mapping[str, int]], *, normalize: bool = False
) -> str:
    """Grouped horizontal bars: one group per category, one bar per source (e.g. eval stage).

    ``normalize``: each source's bars are its share (%) of that source's trajectories, so a
    24-task evaluation and 3,200 training rollouts can be compared on one axis.
    """
    categories = sorted({c for per in counts.values() for c in per})
    sources = list(counts)
    fig = _figure(5.6, max(1.6, 0.32 * len(categories) * max(1, len(sources)) + 0.8))
    with matplotlib.rc_context(_RC):
        ax = fig.subplots()
        height = 0.8 / max(1, len(sources))
        palette = ["#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51", "#8d6cab"]
        for i, source in enumerate(sources):
            ys = [j + i * height for j in range(len(categories))]
            total = sum(counts[source].values()) if normalize else 0
            ax.barh(
                ys,
                [
                    (100.0 * counts[source].get(c, 0) / total if total else 0.0)
                    if normalize
                    else counts[source].get(c, 0)
                    for c in categories
                ],
                height=height,
                label=source,
                color=palette[i % len(palette)],
            )
        ax.set_yticks(
            [j + height * (len(sources) - 1) / 2 for j in range(len(categories))], categories
        )
        ax.invert_yaxis()
        ax.set_title(title)
        ax.set_xlabel("share of the source's trajectories (%)" if normalize else "trajectories")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax.grid(axis="x", alpha=0.3)
        if len(sources) > 1:
            ax.legend(**OUTSIDE)
    return inline_svg(fig)


def entropy_figure(
    steps: Sequence[Mapping[str, object]],
    by_span: Mapping[str, Sequence[float]],
    threshold: float | None,
) -> str:
    """Teacher entropy: the per-step mean and the per-token distribution by span type."""
    fig = _figure(7.2, 2.4)
    with matplotlib.rc_context(_RC):
        left, right = fig.subplots(1, 2)
        xs = [
            s["global_optimizer_step"]
            for s in steps
            if isinstance(s.get("teacher_entropy_mean"), int | float)
        ]
        ys = [
            float(s["teacher_entropy_mean"])
            for s in steps
            if isinstance(s.get("teacher_entropy_mean"), int | float)
        ]  # type: ignore[arg-type]
        if xs:
            left.plot(xs, ys, marker="o", markersize=3, color=_DEFAULT_COLOR)
        if threshold is not None:
            left.axhline(
                threshold,
                linestyle="--",
                linewidth=1,
                color="#e76f51",
                label=f"threshold {threshold:g}",
            )
            left.legend(**OUTSIDE)
        left.set_title("mean teacher entropy per step (nats)")
        left.set_xlabel("optimizer step")
        left.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        left.grid(alpha=0.3)
        series = {k: _finite(v) for k, v in by_span.items() if _finite(v)}
        if series:
            right.hist(
                list(series.values()),
                bins=20,
                stacked=True,
                label=list(series),
                color=[SPAN_COLORS.get(k, _DEFAULT_COLOR) for k in series],
            )
            right.legend(**OUTSIDE)
        else:
            right.text(
                0.5,
                0.5,
                "not recorded",
                ha="center",
                va="center",
                transform=right.transAxes,
                color="#777777",
            )
        right.set_title("teacher entropy per selected token (last cycle)")
        right.set_xlabel("nats")
        right.grid(alpha=0.3)
    return inline_svg(fig)


def benchmark_bars(
    arms: Sequence[str],
    means: Sequence[float | None],
    spreads: Sequence[tuple[float, float] | None],
    deltas: Sequence[float | None],
    intervals: Sequence[tuple[float, float] | None],
    baseline_arm: str | None,
) -> str:
    """Final success per arm (error bars: min..max over seeds) and the paired difference to the baseline arm (error bars: bootstrap 95% interval)."""
    panels = 2 if baseline_arm is not None and any(d is not None for d in deltas) else 1
    fig = _figure(3.6 * panels + 0.6, 2.8)
    with matplotlib.rc_context(_RC):
        axes = fig.subplots(1, panels, squeeze=False)[0]
        xs = list(range(len(arms)))
        values = [100.0 * (m or 0.0) for m in means]
        lower = [
            0.0 if s is None else 100.0 * (m or 0.0) - 100.0 * s[0]
            for m, s in zip(means, spreads, strict=True)
        ]
        upper = [
            0.0 if s is None else 100.0 * s[1] - 100.0 * (m or 0.0)
            for m, s in zip(means, spreads, strict=True)
        ]
        axes[0].bar(
            xs,
            values,
            color=_DEFAULT_COLOR,
            width=0.6,
            yerr=[lower, upper],
            capsize=4,
            ecolor="#444444",
        )
        axes[0].set_xticks(xs, list(arms), rotation=30, ha="right")
        axes[0].set_ylim(0, 112)
        axes[0].set_ylabel("held-out final success (%)")
        axes[0].set_title("final success (bars: min..max over seeds)")
        axes[0].grid(axis="y", alpha=0.3)
        if panels == 2:
            ax = axes[1]
            keep = [i for i, d in enumerate(deltas) if d is not None]
            dvals = [100.0 * float(deltas[i] or 0.0) for i in keep]
            dlo = [
                0.0 if intervals[i] is None else v - 100.0 * intervals[i][0]
                for i, v in zip(keep, dvals, strict=True)
            ]  # type: ignore[index]
            dhi = [
                0.0 if intervals[i] is None else 100.0 * intervals[i][1] - v
                for i, v in zip(keep, dvals, strict=True)
            ]  # type: ignore[index]
            colors = ["#2a9d8f" if v >= 0 else "#e76f51" for v in dvals]
            ax.bar(
                range(len(keep)),
                dvals,
                color=colors,
                width=0.6,
                yerr=[dlo, dhi],
                capsize=4,
                ecolor="#444444",
            )
            ax.axhline(0, color="#444444", linewidth=0.8)
            ax.set_xticks(range(len(keep)), [arms[i] for i in keep], rotation=30, ha="right")
            ax.set_ylabel("percentage points")
            has_interval = any(intervals[i] is not None for i in keep)
            ax.set_title(
                f"difference to {baseline_arm}"
                + (" (bars: 95% interval)" if has_interval else " (no interval below 3 seeds)")
            )
            ax.grid(axis="y", alpha=0.3)
    return inline_svg(fig)


__all__ = [
    "PHASE_COLORS",
    "SPAN_COLORS",
    "benchmark_bars",
    "counts_bars",
    "entropy_figure",
    "inline_svg",
    "learning_curves",
    "sanitize_svg",
    "success_bars",
]
