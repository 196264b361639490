"""The speed parts of a report section: best GFLOP/s so far (by trial and by time), the
default schedule against the tuned one and a vendor figure, and the fastest configs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autosched.report import charts
from autosched.report.markup import (
    DASH,
    esc,
    figure,
    fmt_gflops,
    fmt_knob,
    fmt_latency,
    fmt_pct,
    fmt_ratio,
    knob_order,
    tabulate,
)

if TYPE_CHECKING:
    from autosched.report.sections import Section


def _run_series(s: Section, *, by_time: bool) -> list[charts.Series]:
    starts = {r.run_id: r.start for r in s.runs}
    colours = {r.run_id: charts.run_colour(i) for i, r in enumerate(s.runs)}
    xs: dict[str, list[float]] = {}
    ys: dict[str, list[float | None]] = {}
    for trial, r in enumerate(s.search, start=1):
        x = r.timestamp - starts[r.run_id] if by_time else float(trial)
        xs.setdefault(r.run_id, []).append(x)
        ys.setdefault(r.run_id, []).append(r.gflops if r.ok else None)
    return [
        charts.Series(f"run {run_id[:8]}", xs[run_id], ys[run_id], colours[run_id])
        for run_id in starts
        if run_id in xs
    ]


def progress(s: Section, anchor: str) -> str:
    head = f'<h3 id="{anchor}-progress">Best GFLOP/s so far</h3>'
    if not s.search:
        return head + '<p class="empty">No search-phase records.</p>'
    default = s.default_search.gflops if s.default_search else None
    ok = [(i, r) for i, r in enumerate(s.search, start=1) if r.ok and r.gflops is not None]
    best_trial = max(ok, key=lambda t: t[1].gflops or 0.0) if ok else None
    starts = {r.run_id: r.start for r in s.runs}
    by_trial = charts.progress(
        _run_series(s, by_time=False),
        xlabel="trial (search-phase measurements, in order)",
        default_gflops=default,
        overall=True,
        best=(best_trial[0], best_trial[1].gflops) if best_trial else None,
    )
    by_time = charts.progress(
        _run_series(s, by_time=True),
        xlabel="seconds since the run's first record",
        default_gflops=default,
        overall=False,
        best=(
            (best_trial[1].timestamp - starts[best_trial[1].run_id], best_trial[1].gflops)
            if best_trial
            else None
        ),
    )
    several = len(s.runs) > 1
    caption_trial = (
        "Dots: each trial's GFLOP/s (x at 0: failed); line: best so far"
        + (" per run, dashed black: over all runs" if several else "")
        + "; dotted grey: the default schedule; star: the best trial."
    )
    caption_time = (
        "The same trials against wall-clock time from the records' timestamps"
        + (", each run from its own start" if several else "")
        + " (building and startup before the first record are not shown)."
    )
    return (
        head
        + '<div class="charts">'
        + figure(by_trial, caption_trial)
        + figure(by_time, caption_time)
        + "</div>"
    )


def comparison(s: Section, anchor: str) -> str:
    head = f'<h3 id="{anchor}-compare">Default vs tuned vs vendor</h3>'
    default_ref = s.default_final or s.default_search
    rows: list[tuple[str, float, float | None, str, str]] = []  # label, gflops, lat, note, colour
    if s.default_search and s.default_search.gflops:
        rows.append(
            (
                "default schedule",
                s.default_search.gflops,
                s.default_search.latency_s,
                "search phase, first measurement",
                charts.DEFAULT_COLOUR,
            )
        )
    final_round = next(
        (r for r in reversed(s.final_rounds) if any(f.is_default for f in r.finalists)), None
    )
    if s.default_final and s.default_final.gflops and final_round:
        rows.append(
            (
                "default schedule, re-measured",
                s.default_final.gflops,
                s.default_final.latency_s,
                f"side by side at the end of run {final_round.run_id}",
                "#a9a9a9",
            )
        )
    if s.best is not None and s.best.gflops:
        phase = (
            "leader of the final side-by-side round"
            if any(s.best.id == f.final.id for r in s.final_rounds for f in r.finalists)
            else "search phase"
        )
        where = f"record {s.best.id}, run {s.best.run_id}, {phase}"
        rows.append(
            (
                "tuned best",
                s.best.gflops,
                s.best.latency_s,
                f"what compilers take from the database ({where})",
                charts.BEST_COLOUR,
            )
        )
    if final_round is not None:
        top = final_round.finalists[0]
        if top.final.gflops:
            rows.append(
                (
                    "tuned, re-measured",
                    top.final.gflops,
                    top.final.latency_s,
                    f"fastest finalist side by side with the default, run {final_round.run_id}",
                    "#f08080",
                )
            )
    for v in s.vendor:
        rows.append((v.label, v.gflops, None, v.source, "#54a24b"))
    if not rows:
        return head + '<p class="empty">No successful measurement to compare.</p>'
    vendor_ref = s.vendor[0].gflops if s.vendor else None
    ref = default_ref.gflops if default_ref is not None else None
    table_rows = [
        (
            esc(label),
            fmt_gflops(g),
            fmt_latency(lat),
            fmt_ratio(g / ref) if ref else DASH,
            fmt_pct(g / vendor_ref) if vendor_ref else DASH,
            esc(note),
        )
        for label, g, lat, note, _ in rows
    ]
    table = tabulate(
        (
            "",
            "GFLOP/s",
            "latency",
            "\u00d7 default",
            f"% of {esc(s.vendor[0].label)}" if s.vendor else "% of vendor",
            "measured",
        ),
        table_rows,
        numeric=(1, 2, 3, 4),
        wrap=(5,),
    )
    summary = []
    if final_round is not None and s.default_final is not None:
        top = final_round.finalists[0]
        if top.final.latency_s and s.default_final.latency_s:
            summary.append(
                f"Speedup over the default schedule, measured side by side at the end of run "
                f"<code>{esc(final_round.run_id)}</code>: "
                f"<b>{fmt_ratio(s.default_final.latency_s / top.final.latency_s)}</b>."
            )
    if ref:
        summary.append(
            f"\u00d7 default is relative to the default's "
            f"{'re-measured' if s.default_final else 'search-phase'} {fmt_gflops(ref)} GFLOP/s."
        )
    if not s.vendor:
        summary.append(
            "No vendor figure: pass <code>--vendor-gflops</code>, or "
            "<code>--measure-vendor</code> to time the numpy baseline (its BLAS for "
            "contractions) on this CPU."
        )
    elif any(v.source.startswith("numpy") for v in s.vendor):
        summary.append(
            "numpy runs on this machine's CPU: a fair reference only when the tuned device "
            "is this CPU (e.g. PoCL's CPU device)."
        )
    chart = charts.hbars(
        [label for label, *_ in rows],
        [g for _, g, *_ in rows],
        xlabel="GFLOP/s",
        colours=[c for *_, c in rows],
        value_format="{:,.2f}",
    )
    text = "".join(f'<p class="note">{line}</p>' for line in summary)
    return head + table + text + f'<div class="narrow">{figure(chart, "")}</div>'


def top_configs(s: Section, anchor: str) -> str:
    head = f'<h3 id="{anchor}-top">Top configs</h3>'
    if not s.top:
        return head + '<p class="empty">No config ran correctly.</p>'
    knobs = knob_order(k for row in s.top for k in row.record.config)
    rows = []
    for row in s.top:
        r = row.record
        tag = '<span class="badge default">default</span>' if row.is_default else ""
        spread_range = (
            f"{fmt_gflops(row.gflops_min)}{DASH}{fmt_gflops(row.gflops_max)}"
            if row.measured > 1 and row.gflops_max > row.gflops_min
            else DASH
        )
        rows.append(
            (
                f"{row.rank}{tag}",
                fmt_gflops(r.gflops),
                fmt_latency(r.latency_s),
                fmt_pct(r.spread),
                str(row.measured),
                spread_range,
                *(
                    f'<span class="mono">{esc(fmt_knob(r.config.get(k, DASH)))}</span>'
                    for k in knobs
                ),
            )
        )
    table = tabulate(
        (
            "#",
            "GFLOP/s",
            "latency",
            "spread",
            "measured",
            "GFLOP/s range",
            *(f'<span class="mono">{esc(k)}</span>' for k in knobs),
        ),
        rows,
        numeric=(1, 2, 3, 4, 5),
        highlight=[row.is_default for row in s.top],
    )
    if s.target == "llvm":
        legend = (
            "tile.&lt;spatial axis&gt; = mid loop \u00d7 register tile; tile.&lt;reduction "
            "axis&gt; = chunk \u00d7 unroll; stage = global (in place) or pack."
        )
    else:
        legend = (
            "tile.&lt;spatial axis&gt; = work-items per group \u00d7 register tile; "
            "tile.&lt;reduction axis&gt; = chunk \u00d7 unroll; stage = global or local memory."
        )
    return (
        head
        + table
        + (
            f'<p class="note">Ranked by each config\'s fastest measurement (GFLOP/s, latency and '
            f"spread are that measurement's); measured = records of the config, re-measurements "
            f"included. {legend}</p>"
        )
    )
