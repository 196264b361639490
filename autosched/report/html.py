"""Render report sections (:class:`~autosched.report.sections.Section`) as one HTML page.

No scripts and nothing fetched: the CSS is in the page, the charts are inline SVG, and
long error messages fold away in ``<details>``. Every value from the records is escaped.
This module makes the page and each section's header; the other parts of a section come
from :mod:`~autosched.report.speed` and :mod:`~autosched.report.diagnostics`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from autosched.report import charts, diagnostics, speed
from autosched.report.markup import (
    DASH,
    esc,
    fmt_duration,
    fmt_gflops,
    fmt_time,
    options_text,
    shape_text,
    tabulate,
    title,
)

if TYPE_CHECKING:
    from autosched.report.sections import Section

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
.badge.chosen { background: #e3f0e3; color: #2d6a2d; }
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


def render(
    sections: Sequence[Section],
    *,
    source: str,
    filters: Mapping[str, str] | None = None,
    heading: str = "autosched tuning report",
    intro: str = "",
) -> str:
    """The whole page: a title, a table of contents, then one block per section.

    ``intro`` (HTML) goes between the header and the sections: a job's summary.
    """
    filters = filters or {}
    shown = ", ".join(f"{k} {esc(v)}" for k, v in filters.items()) or "none"
    toc = "".join(
        f'<li><a href="#s{i}">{esc(title(s))}</a> '
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
<h1>{esc(heading)}</h1>
<p class="muted">Records from <code>{esc(source)}</code>; filters: {shown}; made {esc(fmt_time(time.time()))}.
{len(sections)} section{"s" if len(sections) != 1 else ""}, one per workload and device.</p>
<nav><ol>{toc}</ol></nav>
</header>
{intro}
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
        f"<h2>{esc(title(s))}</h2>",
        _header(s, anchor),
        _script(s),
        speed.progress(s, anchor),
        speed.comparison(s, anchor),
        speed.top_configs(s, anchor),
        diagnostics.errors(s, anchor),
        diagnostics.importance(s.importance, anchor),
        diagnostics.noise(s, anchor),
        "</section>",
    ]
    return "\n".join(parts)


def _script(s: Section) -> str:
    """A model's fused function in full, folded: the heading says it in one line."""
    script = (s.workload.get("params") or {}).get("script")
    if not isinstance(script, str):
        return ""
    return f"<details><summary>the function (TVMScript)</summary><pre>{esc(script)}</pre></details>"


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
        ("shapes", shape_text(s.workload)),
        ("platform", d.get("platform", DASH)),
        ("options", options_text(s.workload) or DASH),
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
    runs = tabulate(
        ("run", "first record", "span", "search trials", "re-measured", "best GFLOP/s (search)"),
        rows,
        numeric=(3, 4, 5),
    )
    return f'<div id="{anchor}-header"><dl class="facts">{dl}</dl><h4>Runs</h4>{runs}</div>'
