"""The morning report of a tuning job: one HTML page a person reads after the night.

On top, the job: per task and device kind the trials, the best kernel against the
default schedule (re-measured side by side at the end) and against the vendor library
(numpy on this host's CPU, timed when the report is made), failures by kind and the
workers that measured; the job's wall time, whether the deadline ended it, batches
that failed or were lost and proposed again, workers seen and lost. Below, the usual
report section for every task on every device (curves, fastest configs, errors).
"""

from __future__ import annotations

import collections
import logging
import os
from pathlib import Path
from typing import Any

from autosched.records.base import Database
from autosched.records.files import write_atomically
from autosched.records.record import STATUSES
from autosched.report import collect
from autosched.report.html import render
from autosched.report.markup import esc, fmt_duration, fmt_gflops, fmt_ratio, tabulate
from autosched.report.sections import Section
from autosched.tuning.loop import JobResult

log = logging.getLogger(__name__)


def build_job_report(db: Database, result: JobResult, *, measure_vendor: bool = True) -> str:
    """The job's page (HTML text); ``db`` holds the job's records."""
    keys = {p.task.workload.key for p in result.pairs}
    sections = collect(db, workload_keys=keys, measure_vendor=measure_vendor) if keys else []
    by_key = {(s.workload_key, s.target, s.device_key): s for s in sections}
    intro = _summary(result, by_key)
    return render(
        sections,
        source=repr(db),
        heading=f"autosched job {result.job.name}",
        intro=intro,
    )


def write_job_report(
    db: Database, result: JobResult, out: str | os.PathLike[str], **options: Any
) -> Path:
    """Write :func:`build_job_report` to ``out`` atomically."""
    text = build_job_report(db, result, **options)
    path = write_atomically(out, [text], what="report", hint="pass a writable --report path")
    log.info("wrote the job report to %s", path)
    return path


def _summary(result: JobResult, sections: dict[tuple[str, str, str], Section]) -> str:
    rows = []
    for pair, row in zip(result.pairs, result.rows()):
        section = sections.get((row["workload"], row["target"], row["device_key"]))
        vendor = section.vendor[0].gflops if section and section.vendor else None
        best = row["best_gflops"]
        mine = [r for r in pair.history if r.timestamp >= result.started]
        failures = collections.Counter(r.status for r in mine if not r.ok)
        failed = ", ".join(f"{n} {s}" for s in STATUSES if (n := failures.get(s))) or "none"
        workers = sorted({r.worker for r in mine if r.worker})
        rows.append(
            [
                esc(row["task"]),
                esc(row["target"]),
                esc(row["device"]),
                f"{row['trials']}/{row['wanted']} ({row['new_trials']} tonight)",
                fmt_gflops(best),
                fmt_gflops(row["default_gflops"]),
                fmt_gflops(vendor),
                fmt_ratio(row["speedup"]),
                fmt_ratio(best / vendor if best and vendor else None),
                esc(failed),
                esc(", ".join(workers) or "-"),
            ]
        )
    table = tabulate(
        [
            "task", "target", "device", "trials", "best GFLOP/s", "default", "numpy",
            "best / default", "best / numpy", "failures", "measured by",
        ],
        rows,
        numeric=(4, 5, 6, 7, 8),
    )  # fmt: skip
    ended = "the deadline" if result.deadline_reached else "every task reaching its trials"
    lost = ", ".join(result.workers_lost) or "none"
    facts = [
        f"Wall time {fmt_duration(result.wall_s)}, ended by {ended}.",
        f"Workers seen: {esc(', '.join(result.workers_seen) or 'none')}; lost: {esc(lost)}.",
        f"Batches that failed on every worker they reached: {result.failed_batches}; "
        f"batches lost with the scheduler and proposed again: {result.lost_batches}; "
        f"batches not measured (the device failed) and proposed again: "
        f"{result.dropped_batches}.",
    ]
    if result.unserved:
        facts.append(f"No worker served: {esc('; '.join(result.unserved))}.")
    for what in result.broken:
        facts.append(f"Given up: {esc(what)}.")
    items = "".join(f"<li>{f}</li>" for f in facts)
    return (
        f'<section id="job"><h2>The job</h2><ul>{items}</ul>{table}'
        '<p class="muted">Best and default were re-measured side by side at the end of the '
        "job; numpy was timed on this host's CPU when the report was made.</p></section>"
    )
