"""The diagnostic parts of a report section: failures by kind, which features the cost
model relies on, and how the finalists re-measured side by side compare with their
search-phase measurement (the noise)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autosched.report import charts
from autosched.report.markup import (
    DASH,
    esc,
    figure,
    fmt_config,
    fmt_gflops,
    fmt_pct,
    fmt_time,
    tabulate,
)

if TYPE_CHECKING:
    from autosched.records.record import Record
    from autosched.report.sections import FinalRound, Importance, Section

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


def _quartile_gflops(r: Record) -> tuple[float, float, float] | None:
    """(q1, median, q3) of a record's GFLOP/s over its timed repeats."""
    if not r.ok or not r.gflops or not r.latency_s or not r.latencies:
        return None
    flops = r.gflops * 1e9 * r.latency_s
    q1, q3 = np.percentile(np.asarray(r.latencies), [25, 75])
    return flops / q3 / 1e9, r.gflops, flops / q1 / 1e9


def errors(s: Section, anchor: str) -> str:
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
        + tabulate(
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


def importance(imp: Importance, anchor: str) -> str:
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
    table = tabulate(("#", "feature", "share", "meaning"), rows, numeric=(0, 2), wrap=(3,))
    text = (
        f'<p class="note">Cost model <code>{esc(imp.model)}</code> (<code>make_model()</code>) '
        f"fitted on {scope}. Importance: {esc(imp.method)}. The features are what the model "
        "sees of a config: quantities derived from the knobs (and the shape), top "
        f"{len(imp.features)} shown.</p>"
    )
    return head + f'<div class="split"><div>{table}{text}</div>{figure(chart, "")}</div>'


def noise(s: Section, anchor: str) -> str:
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
        if s.best is not None and f.final.id == s.best.id:
            tag += ' <span class="badge chosen">compilers take</span>'
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
    table = tabulate(
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
        chart = figure(
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
