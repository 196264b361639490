"""``autosched job run|status`` and ``autosched worker``: tuning jobs, locally or on a farm.

Wiring as the other command modules: :func:`add_parser` adds the commands, the parsed
namespace carries ``func``, bad input raises ``AutoschedError`` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

from autosched.cli.shared import check_writable, open_records, positive, say_dropped
from autosched.errors import InvalidInputError
from autosched.records.record import device_label
from autosched.space.space import ALL_TARGETS


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "job",
        help="run a tuning job (several tasks, several devices, a deadline) or show its state",
        description="A job file (TOML) lists tasks: op, shape and targets. `job run` tunes "
        "them on a local Dask cluster (one worker per local device) or on a farm "
        "(--scheduler); the records database is its only state, so rerunning resumes.",
    )
    sub = p.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="tune every task of a job file until done or the deadline")
    run.add_argument("job", metavar="JOB.toml")
    run.add_argument("--scheduler", metavar="ADDR", help="a farm's Dask scheduler, tcp://HOST:8786")
    run.add_argument(
        "--db", default=None, help="records database: a path, sqlite:///path or postgresql://..."
    )
    when = run.add_mutually_exclusive_group()
    when.add_argument("--hours", type=float, help="stop proposing after this many hours")
    when.add_argument("--until", metavar="HH:MM", help="stop proposing at this local time")
    run.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    run.add_argument(
        "--proposers",
        type=positive,
        default=None,
        metavar="N",
        help="threads proposing batches for different tasks and device kinds at once "
        "(default: with --scheduler, this machine's cores up to 8; else 1: the embedded "
        "cluster's devices share this machine's cores)",
    )
    run.add_argument(
        "--report", metavar="F.html", help="write the morning report (one HTML page) here"
    )
    _tls_args(run)
    run.set_defaults(func=cmd_job_run)
    status = sub.add_parser("status", help="done/left per task and device kind, from the records")
    status.add_argument("job", metavar="JOB.toml")
    status.add_argument(
        "--db", default=None, help="records database: a path, sqlite:///path or postgresql://..."
    )
    status.add_argument("--json", action="store_true", help="print the table as JSON instead")
    status.set_defaults(func=cmd_job_status)

    w = subparsers.add_parser(
        "worker",
        help="serve one device to a farm's Dask scheduler",
        description="Start a Dask worker (under a Nanny that restarts it) that owns one "
        "device and advertises it as a resource, so only batches for that kind of device "
        "reach it, one at a time.",
    )
    w.add_argument("--scheduler", required=True, metavar="ADDR", help="tcp://HOST:8786")
    w.add_argument(
        "--device", default=None, help="opencl: index, platform:device or part of a name"
    )
    w.add_argument("--target", choices=ALL_TARGETS, default="opencl")
    w.add_argument("--name", default=None, help="the worker's name in records and reports")
    _tls_args(w)
    w.set_defaults(func=cmd_worker)


def _tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS (a farm that crosses a network; all three or none)")
    g.add_argument("--tls-ca-file", metavar="PEM", help="the farm's CA certificate")
    g.add_argument("--tls-cert", metavar="PEM", help="this process's certificate")
    g.add_argument("--tls-key", metavar="PEM", help="this process's private key")


def _security(args: argparse.Namespace):
    from autosched.farm.worker import tls_security

    try:
        return tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    except OSError as exc:
        raise InvalidInputError(
            f"cannot read TLS file {exc.filename}: {exc.strerror}; accepted: PEM files"
        ) from None


def deadline_of(args: argparse.Namespace, now: dt.datetime | None = None) -> float | None:
    """``--hours`` or ``--until HH:MM`` (the next such local time) as epoch seconds."""
    now = now or dt.datetime.now()
    if args.hours is not None:
        if not args.hours > 0:
            raise InvalidInputError(f"--hours {args.hours:g} is not valid; accepted: a number > 0")
        return now.timestamp() + args.hours * 3600
    if args.until:
        try:
            hh, mm = (int(x) for x in args.until.split(":"))
            at = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
        except ValueError:
            raise InvalidInputError(
                f"--until {args.until!r} is not valid; accepted: HH:MM, e.g. 06:30"
            ) from None
        if at <= now:
            at += dt.timedelta(days=1)
        return at.timestamp()
    return None


class _JobProgress:
    """Live progress per task and device kind: trials done and left, best so far,
    devices alive, time to the deadline. A table redrawn in place on a terminal (rich);
    one line per batch otherwise (logs, CI)."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.live = None
        if stream.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(file=stream), auto_refresh=False, transient=False)
            self.live.start()

    def __call__(self, ev) -> None:
        left = ""
        if ev.deadline is not None:
            left = f", {max(0.0, ev.deadline - time.time()) / 60:.0f} min to the deadline"
        head = f"{ev.elapsed_s:.0f} s, {ev.devices} device(s) alive{left}"
        if self.live is None:
            pair = ev.pair
            best = (
                f"best {pair.best_gflops:.1f} GFLOP/s"
                if pair.best_gflops
                else "no valid kernel yet"
            )
            self.stream.write(
                f"{head}: {pair.name} {len(pair.measured)}/{pair.task.trials}  {best}\n"
            )
            self.stream.flush()
            return
        from rich.table import Table

        table = Table(title=head, title_justify="left", box=None, pad_edge=False)
        for col, just in (
            ("task", "left"),
            ("target", "left"),
            ("device", "left"),
            ("done", "right"),
            ("left", "right"),
            ("best GFLOP/s", "right"),
        ):
            table.add_column(col, justify=just)
        for pair in ev.pairs:
            best = f"{pair.best_gflops:.1f}" if pair.best_gflops else "-"
            done = len(pair.measured)
            table.add_row(
                pair.task.name,
                pair.task.target,
                pair.slot.name[:40],
                str(done),
                str(max(0, pair.task.trials - done)),
                best,
            )
        self.live.update(table, refresh=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def cmd_job_run(args: argparse.Namespace) -> int:
    from autosched.tuning import load_job

    job = load_job(args.job)
    for task in job.tasks:
        say_dropped(task.workload, task.target, task.name)
    deadline = deadline_of(args)
    db = open_records(args.db)
    try:
        # Refuse unwritable outputs before the night, not after it.
        for option, path in (("--report", args.report), ("--json", args.json)):
            if path:
                check_writable(path, option)
        result = _run(
            job,
            args.scheduler,
            db,
            deadline,
            _security(args) if args.scheduler else None,
            args.proposers,
        )
        if args.report:
            from autosched.report.job import write_job_report

            write_job_report(db, result, args.report)
    finally:
        db.close()
    rows = result.rows()
    print()
    for row in rows:
        speed = f"{row['speedup']:.1f}x the default" if row["speedup"] else "no side-by-side figure"
        best = f"{row['best_gflops']:.1f} GFLOP/s" if row["best_gflops"] else "no valid kernel"
        print(
            f"{row['task']:<28} {row['target']:<7} {row['device'][:36]:<36} "
            f"{row['trials']:>4}/{row['wanted']:<4} {best:>16}  {speed}"
        )
    stopped = " (deadline reached)" if result.deadline_reached else ""
    print(f"\n{result.new_trials} trials measured in {result.wall_s:.0f} s{stopped}")
    for what in result.unserved:
        print(
            f"autosched: no worker served {what}; its trials are left for a rerun", file=sys.stderr
        )
    for what in result.broken:
        print(f"autosched: {what}; its trials are left for a rerun", file=sys.stderr)
    if args.json:
        data = {
            "job": job.name,
            "wall_s": result.wall_s,
            "deadline_reached": result.deadline_reached,
            "failed_batches": result.failed_batches,
            "lost_batches": result.lost_batches,
            "dropped_batches": result.dropped_batches,
            "unserved": result.unserved,
            "broken": result.broken,
            "tasks": rows,
        }
        try:
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        except OSError as exc:
            raise InvalidInputError(f"cannot write --json {args.json}: {exc.strerror}") from None
    return 1 if result.unserved or result.broken else 0


def _need_dask() -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise InvalidInputError(
            "jobs and workers run on Dask distributed, which is not installed; accepted: "
            "install the farm extra (`EXTRAS=farm bash scripts/install.sh`, or "
            "`pip install 'autosched[farm]'`)"
        ) from None


def _run(job, scheduler: str | None, db, deadline: float | None, security=None, proposers=None):
    _need_dask()
    from distributed import Client

    from autosched.farm.runner import DaskRunner, local_cluster

    if scheduler:
        if scheduler.startswith("tls://") and security is None:
            raise InvalidInputError(
                f"--scheduler {scheduler} speaks TLS; accepted: --tls-ca-file, --tls-cert "
                "and --tls-key with the farm's certificates"
            )
        try:
            client = Client(scheduler, timeout="20s", security=security)
        except OSError as exc:
            raise InvalidInputError(
                f"cannot reach the Dask scheduler at {scheduler}: {exc}; accepted: the "
                "address `dask scheduler` printed, e.g. tcp://HOST:8786"
            ) from None
        runner = DaskRunner(client, address=scheduler, security=security, proposers=proposers)
        try:
            return _with_progress(job, runner, db, deadline)
        finally:
            runner.client.close()
    with local_cluster(job.targets()) as cluster, Client(cluster) as client:
        return _with_progress(job, DaskRunner(client, proposers=proposers), db, deadline)


def _with_progress(job, runner, db, deadline: float | None):
    from autosched.tuning.loop import run_job

    progress = _JobProgress()
    try:
        return run_job(job, runner, db, deadline=deadline, progress=progress)
    finally:
        progress.close()


def cmd_job_status(args: argparse.Namespace) -> int:
    from autosched.tuning import load_job

    job = load_job(args.job)
    db = open_records(args.db)
    try:
        rows = []
        for task in job.tasks:
            records = db.query(workload_key=task.workload.key, target=task.target)
            kinds: dict[str, list] = {}
            for r in records:
                kinds.setdefault(r.device_key, []).append(r)
            if not kinds:
                rows.append((task, "-", "(no device yet)", 0, None))
            for key, recs in kinds.items():
                done = len({r.config_key for r in recs})
                best = max((r.gflops or 0.0 for r in recs if r.ok), default=None)
                rows.append((task, key, device_label(recs[0].device, key), done, best))
    finally:
        db.close()
    out = [
        {
            "task": t.name,
            "target": t.target,
            "device_key": key,
            "device": name,
            "done": done,
            "left": max(0, t.trials - done),
            "best_gflops": best,
        }
        for t, key, name, done, best in rows
    ]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'task':<28} {'target':<7} {'device':<36} {'done':>5} {'left':>5} {'best GFLOP/s':>13}")
    for row in out:
        best = f"{row['best_gflops']:.1f}" if row["best_gflops"] else "-"
        print(
            f"{row['task']:<28} {row['target']:<7} {str(row['device'])[:36]:<36} "
            f"{row['done']:>5} {row['left']:>5} {best:>13}"
        )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    _need_dask()
    from autosched.farm.worker import resources_of, serve

    devices = [(args.target, args.device)]
    security = _security(args)
    resources_of(devices)  # opens the device here: a bad --device fails before Dask starts
    return serve(args.scheduler, devices, name=args.name, security=security)
