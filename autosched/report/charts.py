"""The report's charts as inline SVG text (matplotlib, no pyplot state, no files).

Every function takes plain numbers and returns one ``<svg>`` element ready to paste
into HTML: text stays text (``svg.fonttype = none``), so charts are small and sharp,
and each chart gets its own id salt so that two charts on one page never share an
element id with different content.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Colour of each run, in order of first appearance (matplotlib's tab10, colour-blind safe
# enough for up to a handful of runs); greys and red are kept for default and best.
RUN_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
)
DEFAULT_COLOUR = "#7f7f7f"
BEST_COLOUR = "#d62728"
FAILED_COLOUR = "#b0b0b0"

_salt = itertools.count()


def run_colour(index: int) -> str:
    return RUN_COLOURS[index % len(RUN_COLOURS)]


@dataclass(frozen=True)
class Series:
    """One run's points: x (trial number or seconds) and GFLOP/s (None = failed)."""

    label: str
    x: Sequence[float]
    gflops: Sequence[float | None]
    colour: str


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _to_svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    rc = {
        "svg.fonttype": "none",
        "svg.hashsalt": f"autosched-report-{next(_salt)}",
        "font.family": ["DejaVu Sans", "Liberation Sans", "sans-serif"],
    }
    with matplotlib.rc_context(rc):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    # Only the <svg> element belongs in the page: drop the XML prolog and DOCTYPE.
    start = text.find("<svg")
    text = text[start:] if start >= 0 else text
    # The RDF metadata block says only "an SVG image made by matplotlib".
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)
    # Scale with the page: the viewBox keeps the aspect ratio.
    return re.sub(
        r'<svg([^>]*?) width="[^"]*" height="[^"]*"',
        r'<svg\1 preserveAspectRatio="xMidYMid meet"',
        text,
        count=1,
    )


def _style(ax, *, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _best_so_far(values: Sequence[float | None], start: float = 0.0) -> np.ndarray:
    out = np.empty(len(values))
    best = start
    for i, v in enumerate(values):
        if v is not None and v > best:
            best = v
        out[i] = best
    return out


def progress(
    runs: Sequence[Series],
    *,
    xlabel: str,
    default_gflops: float | None,
    overall: bool,
    best: tuple[float, float] | None = None,
) -> str:
    """Best-so-far GFLOP/s against trial number or time, one colour per run.

    Args:
        runs: each run's measurements in order; failed ones (None) are drawn at 0.
        xlabel: the x axis label.
        default_gflops: level of the untuned schedule (dashed line), if known.
        overall: also draw the best so far over all runs together (x must then be one
            common axis, such as the trial number).
        best: ``(x, gflops)`` of the best measurement, marked with a star.
    """
    fig, ax = _figure(6.4, 3.7)
    several = len(runs) > 1
    for s in runs:
        x = np.asarray(s.x, dtype=float)
        ok = np.array([g is not None for g in s.gflops], dtype=bool)
        y = np.array([g if g is not None else np.nan for g in s.gflops], dtype=float)
        if ok.any():
            size = 10 if len(x) > 60 else 18
            ax.scatter(x[ok], y[ok], s=size, color=s.colour, alpha=0.5, linewidths=0, zorder=2)
        if (~ok).any():
            ax.scatter(
                x[~ok], np.zeros(int((~ok).sum())), s=16, marker="x", color=FAILED_COLOUR, zorder=2
            )
        if len(x):
            ax.step(
                x,
                _best_so_far(s.gflops),
                where="post",
                color=s.colour,
                linewidth=1.6,
                label=f"{s.label} best so far" if several else "best so far",
                zorder=3,
            )
    if overall and several:
        xs = np.concatenate([np.asarray(s.x, dtype=float) for s in runs])
        gs: list[float | None] = [g for s in runs for g in s.gflops]
        order = np.argsort(xs, kind="stable")
        ax.step(
            xs[order],
            _best_so_far([gs[i] for i in order]),
            where="post",
            color="#222222",
            linewidth=1.2,
            linestyle=(0, (4, 2)),
            label="all runs best so far",
            zorder=4,
        )
    if default_gflops is not None:
        ax.axhline(
            default_gflops,
            color=DEFAULT_COLOUR,
            linestyle=":",
            linewidth=1.6,
            label=f"default schedule {_num(default_gflops)}",
            zorder=1,
        )
    if best is not None:
        ax.scatter(
            [best[0]],
            [best[1]],
            marker="*",
            s=160,
            color=BEST_COLOUR,
            edgecolors="white",
            linewidths=0.6,
            label=f"best {_num(best[1])}",
            zorder=5,
        )
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    _style(ax, xlabel=xlabel, ylabel="GFLOP/s")
    ax.legend(loc="best", fontsize=8, frameon=True, framealpha=0.9)
    return _to_svg(fig)


def hbars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    xlabel: str,
    colours: Sequence[str] | None = None,
    value_format: str = "{:.3g}",
) -> str:
    """Horizontal bars, first label on top, each bar labelled with its value."""
    n = len(labels)
    fig, ax = _figure(6.4, max(1.6, 0.32 * n + 0.9))
    y = np.arange(n)[::-1]
    vals = np.asarray(values, dtype=float)
    ax.barh(y, vals, color=list(colours) if colours else "#4c78a8", height=0.65, zorder=2)
    ax.set_yticks(y, labels, fontsize=9)
    top = float(vals.max()) if n and vals.max() > 0 else 1.0
    for yi, v in zip(y, vals):
        ax.text(v + top * 0.01, yi, value_format.format(v), va="center", fontsize=8)
    ax.set_xlim(0, top * 1.15)
    _style(ax, xlabel=xlabel, ylabel="")
    ax.grid(False, axis="y")
    return _to_svg(fig)


def finalists(
    labels: Sequence[str],
    search: Sequence[tuple[float, float, float] | None],
    final: Sequence[tuple[float, float, float]],
) -> str:
    """Search-phase vs re-measured GFLOP/s of each finalist, with quartile whiskers.

    ``search`` and ``final`` hold ``(q1, median, q3)`` in GFLOP/s per finalist.
    """
    n = len(labels)
    fig, ax = _figure(6.4, max(1.8, 0.45 * n + 1.0))
    y = np.arange(n)[::-1].astype(float)
    for yi, s, f in zip(y, search, final):
        if s is not None:
            ax.plot([s[1], f[1]], [yi + 0.12, yi - 0.12], color="#cccccc", linewidth=1, zorder=1)
    for offset, data, colour, label in (
        (0.12, search, "#4c78a8", "search phase"),
        (-0.12, final, "#f58518", "re-measured side by side"),
    ):
        pts = [(yi + offset, d) for yi, d in zip(y, data) if d is not None]
        if not pts:
            continue
        ys = np.array([p[0] for p in pts])
        med = np.array([p[1][1] for p in pts])
        lo = med - np.array([p[1][0] for p in pts])
        hi = np.array([p[1][2] for p in pts]) - med
        ax.errorbar(
            med,
            ys,
            xerr=np.vstack([lo, hi]),
            fmt="o",
            color=colour,
            ecolor=colour,
            elinewidth=1.4,
            capsize=3,
            markersize=5,
            label=label,
            zorder=3,
        )
    ax.set_yticks(y, labels, fontsize=9)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlim(left=0)
    _style(ax, xlabel="GFLOP/s (dot: median; whiskers: quartiles of the timed repeats)", ylabel="")
    ax.grid(False, axis="y")
    ax.legend(loc="best", fontsize=8, framealpha=0.9)
    return _to_svg(fig)


def _num(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}"
