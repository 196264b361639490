"""Render report sections (:class:`autosched.report.Section`) as one self-contained HTML page.

No scripts and nothing fetched: the CSS is in the page, the charts are inline SVG, and
long error messages fold away in ``<details>``. Every value from the records is escaped.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autosched.report import charts

if TYPE_CHECKING:
    from autosched.records.record import Record
    from autosched.report import FinalRound, Importance, Section

DASH = "\u2013"

# What the cost model's features mean (``Space.describe``); unknown names show bare.
FEATURES = {
    "log_threads": "work-items per work-group (log2)",
    "log_groups": "work-groups, or tasks on llvm (log2)",
    "log_reg": "register tile: outputs per work-item (log2)",
    "log_vec": "explicit vector width (log2)",
    "vec_regs": "vector registers of accumulators",
    "log_chunk": "reduction chunk (log2)",
    "log_unroll": "unrolled reduction steps (log2)",
    "log_red": "reduction length (log2)",
    "log_work_items": "work-items in total (log2)",
    "item_loads_per_step": "loads per work-item per reduction step",
    "intensity": "accumulators per load (operand reuse)",
    "local_bytes": "local memory per work-group",
    "staged": "inputs staged in local memory",
    "fuse": "epilogue fused into the main kernel",
    "inner_reg": "register tile of the innermost axis",
    "inner_threads": "work-items along the innermost axis",
    "group_footprint_kb": "operand footprint of a work-group per chunk (KiB)",
    "unrolled_body": "size of the unrolled loop body",
    "reduce_block": "reduction outside the register tiles (llvm)",
    "pass_footprint_kb": "operands one register tile streams per pass (KiB)",
    "packed": "inputs packed into contiguous buffers (llvm)",
    "pack_kb": "bytes packed per task (KiB)",
    "log_tasks_per_core": "parallel tasks per core (log2)",
    "imbalance": "load imbalance of tasks over cores",
    "log_tiles_per_task": "register tiles per task (log2)",
    "tile_inner_last": "innermost mid loop on the last axis (llvm)",
    "w_log_outputs": "output elements (log2)",
    "w_log_flops": "floating point work (log2)",
}

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #dde1e8; --soft: #f5f7fa; --accent: #2f5fa7; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 "DejaVu Sans", "Liberation Sans", Arial, sans-serif;
       color: var(--fg); background: #fff; }
main { max-width: 1220px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 0 0 12px; padding-bottom: 6px; border-bottom: 2px solid var(--accent); }
h3 { font-size: 16px; margin: 26px 0 8px; color: var(--accent); }
h4 { font-size: 14px; margin: 16px 0 6px; }
p { margin: 6px 0; }
.muted, .note { color: var(--muted); }
.note { font-size: 12.5px; }
code, .mono { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 12.5px; }
nav ol { margin: 8px 0 0; padding-left: 22px; }
nav li { margin: 2px 0; }
a { color: var(--accent); text-decoration: none; }
section.workload { margin-top: 30px; padding: 20px 22px 10px; border: 1px solid var(--line);
                   border-radius: 8px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr max-content 1fr; gap: 3px 14px;
           margin: 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: 6px 0 4px; font-size: 13px; }
th, td { padding: 4px 9px; border-bottom: 1px solid var(--line); text-align: left;
         vertical-align: top; white-space: nowrap; }
th { background: var(--soft); font-weight: 600; border-bottom: 1px solid #c9ced8; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.wrap { white-space: normal; min-width: 200px; max-width: 640px; overflow-wrap: anywhere; }
tr.hl td { background: #fff6e0; }
.scroll { overflow-x: auto; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 14px; }
figure { margin: 0; }
figure svg { display: block; width: 100%; height: auto; }
figcaption { font-size: 12.5px; color: var(--muted); margin-top: 2px; }
.badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 11.5px;
         background: #e8eef8; color: var(--accent); margin-left: 4px; }
.badge.default { background: #eeeeee; color: #555; }
.zero { color: #a0a6b1; }
.empty { padding: 8px 12px; background: var(--soft); border-radius: 6px; color: var(--muted); }
details summary { cursor: pointer; color: var(--muted); }
details pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 4px 0; font-size: 12px;
              background: var(--soft); padding: 6px 8px; border-radius: 4px; }
.split { display: grid; grid-template-columns: minmax(0, 1.1fr) minmax(0, 1fr); gap: 16px;
         align-items: start; }
.narrow { max-width: 600px; margin-top: 8px; }
footer { margin-top: 32px; font-size: 12.5px; color: var(--muted); }
"""


# -- formatting --------------------------------------------------------------------------
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt_gflops(value: float | None) -> str:
    """GFLOP/s as the report prints it: 2 decimals below 100, 1 above."""
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}"


def fmt_latency(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return DASH
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} \u00b5s"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def fmt_pct(fraction: float | None, *, signed: bool = False) -> str:
    if fraction is None or not math.isfinite(fraction):
        return DASH
    return f"{100 * fraction:+.1f}%" if signed else f"{100 * fraction:.1f}%"


def fmt_ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:.2f}\u00d7"


def fmt_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def fmt_knob(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "\u00d7".join(str(v) for v in value)
    return str(value)


def fmt_config(config: Mapping[str, Any]) -> str:
    return "  ".join(f"{k}={fmt_knob(config[k])}" for k in knob_order(config))


def knob_order(names: Iterable[str]) -> list[str]:
    """Tiles first, then vector width, staging, then the rest, each alphabetical."""

    def rank(name: str) -> tuple[int, str]:
        for i, prefix in enumerate(("tile.", "vec", "stage.", "reduce_at", "tile_inner")):
            if name.startswith(prefix):
                return i, name
        return 9, name

    return sorted(set(names), key=rank)


def _table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: Sequence[int] = (),
    highlight: Sequence[bool] | None = None,
    wrap: Sequence[int] = (),
    cls: str = "",
) -> str:
    """A table; cells are HTML already (escape values before passing them)."""
    num = set(numeric)
    head = "".join(
        f'<th class="num">{h}</th>' if i in num else f"<th>{h}</th>" for i, h in enumerate(headers)
    )
    body = []
    for r, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            klass = "num" if i in num else "wrap" if i in wrap else ""
            cells.append(f'<td class="{klass}">{cell}</td>' if klass else f"<td>{cell}</td>")
        hl = ' class="hl"' if highlight is not None and highlight[r] else ""
        body.append(f"<tr{hl}>{''.join(cells)}</tr>")
    klass = f' class="{cls}"' if cls else ""
    return (
        f'<div class="scroll"><table{klass}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{caption}</figcaption></figure>"


def _quartile_gflops(r: Record) -> tuple[float, float, float] | None:
    """(q1, median, q3) of a record's GFLOP/s over its timed repeats."""
    if not r.ok or not r.gflops or not r.latency_s or not r.latencies:
        return None
    flops = r.gflops * 1e9 * r.latency_s
    q1, q3 = np.percentile(np.asarray(r.latencies), [25, 75])
    return flops / q3 / 1e9, r.gflops, flops / q1 / 1e9


# -- the page ----------------------------------------------------------------------------
def _split(workload: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(shape parameters, options) of a workload, each in the order its op lists them.

    Options are the parameters with a fixed set of values (the op's ``choices``: epilogue,
    layout, reduction kind, elementwise chain); everything else is shape text, strides
    and padding included. An op this version does not know: its string parameters are
    options, the rest shapes, alphabetically.
    """
    from autosched.ops import OPS

    params = workload.get("params", {})
    if not isinstance(params, Mapping):
        return [], []
    cls = OPS.get(str(workload.get("op", "")))
    if cls is None:
        names = sorted(params)
        options = {k for k in names if isinstance(params[k], str)}
    else:
        known = [k for k in cls.shape_params if k in params]
        names = known + sorted(k for k in params if k not in cls.shape_params)
        options = set(cls.choices)
    shape = [(k, params[k]) for k in names if k not in options]
    return shape, [(k, params[k]) for k in names if k in options]


def shape_params(workload: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The workload's shape parameters (not options such as the epilogue), in the order
    its op lists them (``Workload.shape_params``)."""
    return _split(workload)[0]


def option_params(workload: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The workload's options (the op's ``choices``: epilogue, layout, kind, ops)."""
    return _split(workload)[1]


def _shape(workload: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape_params(workload))


def _options(workload: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in option_params(workload))


def _title(s: Section) -> str:
    from autosched.ops import OPS

    defaults = OPS[s.op].defaults if s.op in OPS else {}
    shown = [f"{k}={v}" for k, v in option_params(s.workload) if defaults.get(k) != v]
    extra = f" ({', '.join(shown)})" if shown else ""
    return (
        f"{s.op} {_shape(s.workload)}{extra} on {s.device.get('name', s.device_key)} ({s.target})"
    )


def render(
    sections: Sequence[Section], *, source: str, filters: Mapping[str, str] | None = None
) -> str:
    """The whole page: a title, a table of contents, then one block per section."""
    filters = filters or {}
    shown = ", ".join(f"{k} {esc(v)}" for k, v in filters.items()) or "none"
    toc = "".join(
        f'<li><a href="#s{i}">{esc(_title(s))}</a> '
        f'<span class="muted">{s.trials} trials, best {fmt_gflops(s.best.gflops if s.best else None)} '
        "GFLOP/s</span></li>"
        for i, s in enumerate(sections, start=1)
    )
    body = "\n".join(_section(s, f"s{i}") for i, s in enumerate(sections, start=1))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="autosched report">
<title>autosched report: {len(sections)} workload{"s" if len(sections) != 1 else ""}</title>
<style>{CSS}</style>
</head>
<body>
<main>
<header>
<h1>autosched tuning report</h1>
<p class="muted">Records from <code>{esc(source)}</code>; filters: {shown}; made {esc(fmt_time(time.time()))}.
{len(sections)} section{"s" if len(sections) != 1 else ""}, one per workload and device.</p>
<nav><ol>{toc}</ol></nav>
</header>
{body}
<footer>
<p>GFLOP/s = useful floating point work / median latency of the timed repeats; a record
counts only when its output matched the numpy reference. Spread = inter-quartile range of
the timed repeats divided by their median. Finalists are the best configs re-measured
round-robin, side by side with the default schedule, at the end of a tuning run.</p>
</footer>
</main>
</body>
</html>
"""


def _section(s: Section, anchor: str) -> str:
    parts = [
        f'<section class="workload" id="{anchor}">',
        f"<h2>{esc(_title(s))}</h2>",
        _header(s, anchor),
        _progress(s, anchor),
        _comparison(s, anchor),
        _top(s, anchor),
        _errors(s, anchor),
        _importance(s.importance, anchor),
        _noise(s, anchor),
        "</section>",
    ]
    return "\n".join(parts)


def _header(s: Section, anchor: str) -> str:
    d = s.device
    first = min(r.timestamp for r in s.records)
    last = max(r.timestamp for r in s.records)
    driver = d.get("driver_version", DASH)
    if d.get("pocl_version"):
        driver = f"{driver} (PoCL {d['pocl_version']})"
    facts = [
        ("operator", s.op),
        ("device", d.get("name", DASH)),
        ("shapes", _shape(s.workload)),
        ("platform", d.get("platform", DASH)),
        ("options", _options(s.workload) or DASH),
        ("driver", driver),
        ("dtype", s.workload.get("dtype", DASH)),
        ("device type", f"{d.get('type', DASH)}, {d.get('compute_units', DASH)} compute units"),
        ("target", s.target),
        (
            ("LLVM / mcpu", f"{d.get('llvm_version', DASH)} / {d.get('mcpu', DASH)}")
            if s.target == "llvm"
            else ("OpenCL", d.get("version") or DASH)
        ),
        ("trials", f"{s.trials} configs measured ({len(s.records)} records, {s.n_ok} ok)"),
        ("TVM / autosched", f"{d.get('tvm_version', DASH)} / {d.get('autosched_version', DASH)}"),
        ("time span", f"{fmt_time(first)} \u2192 {fmt_time(last)} ({fmt_duration(last - first)})"),
        ("device key / family", f"{s.device_key} / {s.device_family}"),
        ("runs", str(len(s.runs))),
        ("workload key", s.workload_key),
    ]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    rows = [
        (
            f'<span style="color:{charts.run_colour(i)}">\u25a0</span> <code>{esc(r.run_id)}</code>',
            esc(fmt_time(r.start)),
            esc(fmt_duration(r.end - r.start)),
            str(r.trials),
            str(r.finalists),
            fmt_gflops(r.best_gflops),
        )
        for i, r in enumerate(s.runs)
    ]
    runs = _table(
        ("run", "first record", "span", "search trials", "re-measured", "best GFLOP/s (search)"),
        rows,
        numeric=(3, 4, 5),
    )
    return f'<div id="{anchor}-header"><dl class="facts">{dl}</dl><h4>Runs</h4>{runs}</div>'


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


def _progress(s: Section, anchor: str) -> str:
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
        + _figure(by_trial, caption_trial)
        + _figure(by_time, caption_time)
        + "</div>"
    )


def _comparison(s: Section, anchor: str) -> str:
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
            "re-measurement"
            if any(s.best.id == f.final.id for r in s.final_rounds for f in r.finalists)
            else "search phase"
        )
        rows.append(
            (
                "tuned best",
                s.best.gflops,
                s.best.latency_s,
                f"fastest record in the database (record {s.best.id}, run {s.best.run_id}, {phase})",
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
    table = _table(
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
    return head + table + text + f'<div class="narrow">{_figure(chart, "")}</div>'


def _top(s: Section, anchor: str) -> str:
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
    table = _table(
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


def _errors(s: Section, anchor: str) -> str:
    head = f'<h3 id="{anchor}-errors">Errors by kind</h3>'
    total = sum(e.count for e in s.errors)
    rows = []
    for e in s.errors:
        if e.count:
            first_line = e.example.strip().splitlines()[0] if e.example.strip() else "(no message)"
            short = first_line if len(first_line) <= 160 else first_line[:157] + "..."
            example = (
                f"<details><summary><code>{esc(short)}</code></summary>"
                f"<pre>{esc(e.example[:4000])}</pre></details>"
                if e.example.strip() != short
                else f"<code>{esc(short)}</code>"
            )
        else:
            example = '<span class="zero">none</span>'
        count = str(e.count) if e.count else '<span class="zero">0</span>'
        rows.append((f"<code>{esc(e.status)}</code>", count, example))
    rows.append(("<b>ok</b>", str(s.n_ok), f"of {len(s.records)} records"))
    note = (
        f"{total} of {len(s.records)} records failed."
        if total
        else f"None of the {len(s.records)} records failed."
    )
    return (
        head
        + _table(
            ("status", "records", "example message (first of its kind)"),
            rows,
            numeric=(1,),
            wrap=(2,),
        )
        + f'<p class="note">{note} invalid: rejected by the space or device limits before a '
        "build; build_error: TVM or the OpenCL compiler failed; run_error: launch failed or "
        "the worker crashed; timeout: killed after the time limit; wrong_result: output did "
        "not match the reference.</p>"
    )


def _importance(imp: Importance, anchor: str) -> str:
    head = f'<h3 id="{anchor}-importance">Knob importance (cost model)</h3>'
    scope = (
        f"{imp.n_records} records ({imp.n_ok} ok) of {imp.n_workloads} "
        f"{imp.op} workload{'s' if imp.n_workloads != 1 else ''} on device family "
        f"<code>{esc(imp.device_family)}</code>, target {esc(imp.target)}"
    )
    if not imp.features:
        return head + f'<p class="empty">No importances: {esc(imp.reason)}. Data: {scope}.</p>'
    labels = [name for name, _ in imp.features]
    chart = charts.hbars(
        labels,
        [100 * share for _, share in imp.features],
        xlabel="share of importance (%)",
        value_format="{:.1f}%",
    )
    rows = [
        (str(i), f"<code>{esc(name)}</code>", fmt_pct(share), esc(FEATURES.get(name, "")))
        for i, (name, share) in enumerate(imp.features, start=1)
    ]
    table = _table(("#", "feature", "share", "meaning"), rows, numeric=(0, 2), wrap=(3,))
    text = (
        f'<p class="note">Cost model <code>{esc(imp.model)}</code> (<code>make_model()</code>) '
        f"fitted on {scope}. Importance: {esc(imp.method)}. The features are what the model "
        "sees of a config: quantities derived from the knobs (and the shape), top "
        f"{len(imp.features)} shown.</p>"
    )
    return head + f'<div class="split"><div>{table}{text}</div>{_figure(chart, "")}</div>'


def _noise(s: Section, anchor: str) -> str:
    head = f'<h3 id="{anchor}-noise">Noise: finalists re-measured</h3>'
    if not s.final_rounds:
        return head + (
            '<p class="empty">No finalists were re-measured for this workload and device '
            "(records from a tuning run end with them; these records do not).</p>"
        )
    return head + "".join(_round(s, rnd) for rnd in s.final_rounds)


def _round(s: Section, rnd: FinalRound) -> str:
    rows = []
    for f in rnd.finalists:
        tag = ' <span class="badge default">default</span>' if f.is_default else ""
        change = (
            f.final.gflops / f.search.gflops - 1.0
            if f.search is not None and f.search.gflops and f.final.gflops
            else None
        )
        rows.append(
            (
                f"{f.final_rank}{tag}",
                str(f.search_rank) if f.search_rank else DASH,
                fmt_gflops(f.search.gflops if f.search else None),
                fmt_pct(f.search.spread if f.search else None),
                fmt_gflops(f.final.gflops),
                fmt_pct(f.final.spread),
                str(len(f.final.latencies)),
                fmt_pct(change, signed=True),
                f'<span class="mono">{esc(fmt_config(f.final.config))}</span>',
            )
        )
    table = _table(
        (
            "final #",
            "search #",
            "search GFLOP/s",
            "spread",
            "re-measured GFLOP/s",
            "spread",
            "repeats",
            "change",
            "config",
        ),
        rows,
        numeric=(1, 2, 3, 4, 5, 6, 7),
        highlight=[f.is_default for f in rnd.finalists],
        wrap=(8,),
    )
    tuned = [f for f in rnd.finalists if not f.is_default and f.search_rank]
    lines = []
    if tuned:
        leader = min(tuned, key=lambda f: f.search_rank or 0)
        if leader.final_rank == 1:
            lines.append(
                f"The search-phase leader among the finalists (search rank {leader.search_rank}) "
                "is still the fastest when re-measured."
            )
        else:
            winner = rnd.finalists[0]
            lines.append(
                f"Ranking changed: the search-phase leader (search rank {leader.search_rank}) "
                f"is re-measured #{leader.final_rank}; the fastest re-measured config had "
                f"search rank {winner.search_rank or DASH}."
            )
    if rnd.kendall_tau is not None:
        lines.append(
            f"Kendall \u03c4 between the search-phase and re-measured order of the "
            f"{sum(f.search is not None for f in rnd.finalists)} finalists: "
            f"{rnd.kendall_tau:+.2f} (1 = same order)."
        )
    changes = [
        abs(f.final.gflops / f.search.gflops - 1.0)
        for f in rnd.finalists
        if f.search is not None and f.search.gflops and f.final.gflops
    ]
    if changes:
        lines.append(
            f"Median |change| re-measured vs search phase: {fmt_pct(float(np.median(changes)))}; "
            f"median re-measured spread: "
            f"{fmt_pct(float(np.median([f.final.spread or 0.0 for f in rnd.finalists])))}."
        )
    labels = [
        f"#{f.final_rank} " + ("default" if f.is_default else f"(search #{f.search_rank or DASH})")
        for f in rnd.finalists
    ]
    finals = [_quartile_gflops(f.final) for f in rnd.finalists]
    chart = ""
    if all(q is not None for q in finals):
        chart = _figure(
            charts.finalists(
                labels,
                [_quartile_gflops(f.search) if f.search else None for f in rnd.finalists],
                finals,  # type: ignore[arg-type]
            ),
            "Each finalist's search-phase and side-by-side measurement; "
            "whiskers span the quartiles of its timed repeats.",
        )
    started = next((r.start for r in s.runs if r.run_id == rnd.run_id), None)
    when = f", run started {fmt_time(started)}" if started is not None else ""
    return (
        f"<h4>Run <code>{esc(rnd.run_id)}</code>{esc(when)}: {len(rnd.finalists)} configs "
        "re-measured round-robin</h4>"
        + table
        + '<p class="note">search # ranks the config among the search-phase measurements '
        "the run picked its finalists from; change = re-measured vs search-phase GFLOP/s.</p>"
        + "".join(f'<p class="note">{line}</p>' for line in lines)
        + (f'<div class="narrow">{chart}</div>' if chart else "")
    )
