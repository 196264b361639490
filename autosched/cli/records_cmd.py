"""``autosched records``: export, import, merge, summarise and prune the records database.

Wiring: the main CLI calls :func:`add_parser` with its sub-parsers; the parsed
namespace carries ``func=run``, and :func:`run` returns the exit status. Bad input
raises :class:`~autosched.errors.AutoschedError` subclasses, which the main CLI turns
into one line and exit status 2.

Exit status of :func:`run`: 0 on success; 2 when ``import`` rejected some lines, each
named on stderr as ``FILE:LINE: rejected: why`` (the good lines are still stored, and
importing the file again stores nothing new).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from autosched.errors import InvalidInputError, RecordsError
from autosched.records.files import export_jsonl, import_jsonl, merge, prune, stats
from autosched.records.opener import open_database, sqlite_path
from autosched.records.record import STATUSES
from autosched.records.sqlite import default_db_path

ACTIONS = ("export", "import", "merge", "stats", "prune")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``records`` command and its actions to the main CLI's sub-parsers."""
    parser = subparsers.add_parser(
        "records",
        help="export, import, merge, summarise or prune measurement records",
        description="Work with the records database: every measurement autosched kept.",
    )
    actions = parser.add_subparsers(dest="records_command", metavar="ACTION", required=True)

    db_option = argparse.ArgumentParser(add_help=False)
    db_option.add_argument(
        "--db",
        default=None,
        metavar="PATH|URL",
        help="records database: a path, sqlite:///PATH or postgresql://USER@HOST[:PORT]/DB "
        f"(default: {default_db_path()})",
    )
    filters = argparse.ArgumentParser(add_help=False)
    group = filters.add_argument_group("filters (ANDed)")
    group.add_argument("--op", help="operator name, e.g. matmul")
    group.add_argument("--device-key", help="exact device fingerprint key")
    group.add_argument("--device-family", help="device family key (any driver version)")
    group.add_argument("--target", help="code generation target, e.g. opencl or llvm")
    group.add_argument("--status", choices=STATUSES, help="measurement status")

    export = actions.add_parser(
        "export",
        parents=[db_option, filters],
        help="write records as JSON Lines",
        description="Write the matching records as JSON Lines, one record per line.",
    )
    export.add_argument(
        "-o", "--output", default="-", metavar="PATH", help="output file (default: stdout)"
    )

    import_ = actions.add_parser(
        "import",
        parents=[db_option],
        help="add records from JSON Lines files",
        description="Add records from JSON Lines files; duplicates are skipped and bad "
        "lines reported by line number.",
    )
    import_.add_argument("files", nargs="+", metavar="FILE", help="JSON Lines file, - for stdin")

    merge_ = actions.add_parser(
        "merge",
        parents=[db_option],
        help="add every record of other records databases",
        description="Add every record of the source databases to --db (a union; repeatable). "
        "Sources and --db may be SQLite files or PostgreSQL URLs, so records move either way, "
        "e.g. records merge --db postgresql://me@dbhost/autosched ~/records.db",
    )
    merge_.add_argument(
        "sources", nargs="+", metavar="SRC_DB", help="source records database (path or URL)"
    )

    stats_ = actions.add_parser(
        "stats",
        parents=[db_option, filters],
        help="summarise records per workload and device",
        description="One row per operator, workload, target and device: counts per status, "
        "best GFLOP/s and best latency.",
    )
    stats_.add_argument("--json", type=Path, metavar="PATH", help="also write the table as JSON")

    prune_ = actions.add_parser(
        "prune",
        parents=[db_option, filters],
        help="delete slow or failed records",
        description="Delete records: keep the N fastest ok records per workload and device "
        "and/or drop failed ones. The only command that deletes.",
    )
    prune_.add_argument(
        "--keep-top", type=int, metavar="N", help="keep the N fastest ok records per workload"
    )
    prune_.add_argument("--drop-errors", action="store_true", help="delete every non-ok record")
    prune_.add_argument(
        "--dry-run", action="store_true", help="only say how many records would be deleted"
    )
    parser.set_defaults(func=run)


def _db_target(args: argparse.Namespace) -> str | Path:
    return args.db if getattr(args, "db", None) is not None else default_db_path()


def _filter_args(args: argparse.Namespace) -> dict[str, str | None]:
    return {
        "op": args.op,
        "device_key": args.device_key,
        "device_family": args.device_family,
        "target": args.target,
        "status": args.status,
    }


def _json_ready(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _json_ready(value.item())
    return value


def run(args: argparse.Namespace) -> int:
    """Carry out ``autosched records ACTION``; return the exit status."""
    action = getattr(args, "records_command", None)
    if action not in ACTIONS:
        raise InvalidInputError(
            f"records action {action!r} is not known; accepted: {', '.join(ACTIONS)}"
        )
    path = _db_target(args)
    if action == "export":
        with open_database(path, create=False) as db:
            if args.output == "-":
                count = export_jsonl(db, sys.stdout, **_filter_args(args))
                sys.stdout.flush()
                print(f"exported {count} records", file=sys.stderr)
            else:
                count = export_jsonl(db, args.output, **_filter_args(args))
                print(f"exported {count} records to {args.output}", file=sys.stderr)
        return 0

    if action == "import":
        missing = [f for f in args.files if f != "-" and not Path(f).is_file()]
        if missing:
            raise InvalidInputError(
                f"records file {missing[0]} does not exist or is not a file; "
                "pass JSON Lines files written by 'autosched records export'"
            )
        added = duplicates = rejected = 0
        with open_database(path) as db:
            for name in args.files:
                report = import_jsonl(db, sys.stdin if name == "-" else name)
                added += report.added
                duplicates += report.duplicates
                rejected += report.rejected
                label = "<stdin>" if name == "-" else name
                for number, message in report.errors:
                    print(f"{label}:{number}: rejected: {message}", file=sys.stderr)
        print(f"added {added}, duplicates {duplicates}, rejected {rejected}")
        return 2 if rejected else 0

    if action == "merge":
        for source in args.sources:
            file = sqlite_path(source)
            if file is not None and not file.is_file():
                raise InvalidInputError(
                    f"source records database {source} does not exist or is not a file"
                )
        with open_database(path) as db:
            report = merge(db, args.sources)
        print(f"added {report.added}, duplicates {report.duplicates}")
        return 0

    if action == "stats":
        with open_database(path, create=False) as db:
            table = stats(db, **_filter_args(args))
        if table.empty:
            print("no records match")
        else:
            print(table.to_string(index=False))
        if args.json is not None:
            rows = [
                {k: _json_ready(v) for k, v in row.items()}
                for row in table.to_dict(orient="records")
            ]
            try:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
            except OSError as exc:
                reason = (exc.strerror or str(exc)).lower()
                raise RecordsError(f"cannot write {args.json}: {reason}") from None
        return 0

    # prune
    with open_database(path, create=False) as db:
        removed = prune(
            db,
            keep_top=args.keep_top,
            drop_errors=args.drop_errors,
            dry_run=args.dry_run,
            **_filter_args(args),
        )
    print(f"{'would remove' if args.dry_run else 'removed'} {removed} records")
    return 0
