"""The peers benchmark's output: the summary as a table, the curves as a PNG."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.peers_summary import CHECKPOINTS, by_tuner


def fmt_cell(v, width: int, digits: int = 1) -> str:
    """``v`` right-aligned in ``width`` columns: a number with ``digits`` decimals, or "-"."""
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, str):
        return f"{v:>{width}}"
    return f"{v:>{width}.{digits}f}"


def print_table(summary: Sequence[dict], *, trials: int, out=sys.stdout) -> None:
    checkpoints = [n for n in CHECKPOINTS if n < trials]
    head = (
        f"{'tuner':<21}{'runs':>5}{'trials':>7}"
        + "".join(f"{'@' + str(n):>7}" for n in checkpoints)
        + f"{'best':>7}"
        + "".join(f"{'re@' + str(n):>7}" for n in checkpoints)
        + f"{'retimed':>8}{'vendor':>7}{'t95':>6}{'reach':>6}{'t95 s':>7}"
        + f"{'t95tgt':>7}{'reach':>6}{'wall s':>8}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for e in summary:
        line = f"{e['tuner']:<21}{e['runs']:>5}{fmt_cell(e['trials'], 7, 0)}"
        line += "".join(fmt_cell(e.get(f"best_at_{n}"), 7) for n in checkpoints)
        of_vendor = e["of_vendor"]
        line += fmt_cell(e["best_gflops"], 7)
        line += "".join(fmt_cell(e.get(f"retimed_at_{n}"), 7) for n in checkpoints)
        line += (
            f"{fmt_cell(e['retimed_gflops'], 8)}"
            f"{fmt_cell(None if of_vendor is None else f'{100 * of_vendor:.0f}%', 7)}"
            f"{fmt_cell(e['trials_to_95'], 6, 0)}{e['reached_95']:>6}"
            f"{fmt_cell(e['wall_to_95'], 7, 0)}"
            f"{fmt_cell(e.get('trials_to_95_target'), 7, 0)}{e.get('reached_95_target', '-'):>6}"
            f"{fmt_cell(e['wall_s'], 8, 0)}"
        )
        if e["failed_runs"]:
            line += f"  ({e['failed_runs']} failed)"
        print(line, file=out)


def plot(rows: Sequence[dict], path: Path, *, title: str, vendor_gflops: float | None) -> None:
    """Best-so-far GFLOP/s against trials and against wall seconds, one colour per tuner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_w) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    colors = plt.get_cmap("tab10")
    for i, (tuner, rs) in enumerate(by_tuner(rows).items()):
        color = colors(i % 10)
        curves = []
        for r in rs:
            if not r["curve"]:
                continue
            scale = r["stopwatch_scale"] or 1.0
            curve = [g * scale for g in r["curve"]]
            curves.append(curve)
            x = np.arange(1, len(curve) + 1)
            ax_t.step(x, curve, where="post", color=color, alpha=0.25, lw=0.8)
            # Held to the end of the run: tuners spend time after their last trial too.
            wall = [*r["trial_wall_s"], max(r["wall_s"], r["trial_wall_s"][-1])]
            ax_w.step(wall, [*curve, curve[-1]], where="post", color=color, alpha=0.8, lw=1.2)
        if curves:
            n = min(len(c) for c in curves)
            mean = np.mean([c[:n] for c in curves], axis=0)
            ax_t.step(np.arange(1, n + 1), mean, where="post", color=color, lw=2, label=tuner)
    for ax in (ax_t, ax_w):
        if vendor_gflops:
            label = "vendor library" if ax is ax_t else None
            ax.axhline(vendor_gflops, color="k", ls="--", lw=1, label=label)
        ax.grid(alpha=0.3)
    ax_t.set_xlabel("trials")
    ax_w.set_xscale("log")
    ax_w.set_xlabel("wall seconds since the tuner started (log)")
    ax_t.set_ylabel("best-so-far GFLOP/s (peers rescaled to the shared harness)")
    ax_t.set_title("mean over seeds (bold), each seed (faint)")
    ax_w.set_title("each seed")
    # Below the panels: inside, the legend hides curves.
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=9)
    fig.suptitle(textwrap.fill(title, 110))
    fig.tight_layout(rect=(0, 0.08 + 0.04 * ((len(labels) - 1) // 5), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
