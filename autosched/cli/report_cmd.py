"""``autosched report``: one self-contained HTML page about the records of a database.

Wiring: the main CLI calls :func:`add_parser` with its sub-parsers; the parsed
namespace carries ``func=run``, and :func:`run` returns the exit status. Bad input
(a missing database, no matching records, a bad vendor figure) raises
:class:`~autosched.errors.AutoschedError` subclasses, which the main CLI turns into
one line and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from autosched.cost_model import DEFAULT_KIND, KINDS
from autosched.errors import InvalidInputError
from autosched.records.sqlite import default_db_path


def _gflops(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; accepted: GFLOP/s as a number > 0"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not valid; accepted: GFLOP/s as a number > 0")
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``report`` command to the main CLI's sub-parsers."""
    parser = subparsers.add_parser(
        "report",
        help="write an HTML report of the records (charts, top configs, errors, noise)",
        description="Write one self-contained HTML page (no scripts, no network) with a "
        "section per workload and device: best GFLOP/s against trials and time, the "
        "fastest configs, errors by kind, the cost model's feature importances, default "
        "vs tuned vs vendor, and the noise of the finalists re-measured at the end of a run.",
    )
    parser.add_argument(
        "--db",
        default=None,
        metavar="PATH|URL",
        help="records database, a path or postgresql://USER@HOST/DB; never created "
        f"(default: {default_db_path()})",
    )
    parser.add_argument("--op", help="only this operator, e.g. matmul")
    parser.add_argument("--device-key", help="only this exact device fingerprint key")
    parser.add_argument("--target", help="only this code generation target, e.g. opencl or llvm")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("report.html"),
        metavar="PATH",
        help="HTML file to write (default: report.html)",
    )
    parser.add_argument(
        "--vendor-gflops",
        type=_gflops,
        default=None,
        metavar="GFLOPS",
        help="a vendor library's GFLOP/s to compare every workload with",
    )
    parser.add_argument(
        "--measure-vendor",
        action="store_true",
        help="time a numpy baseline of each workload on this CPU now, as a vendor figure "
        "(matmul, dense, batch_matmul: numpy's BLAS, e.g. OpenBLAS; conv2d: im2col + BLAS; "
        "depthwise and row-wise ops: plain numpy)",
    )
    parser.add_argument(
        "--model",
        choices=KINDS,
        default=DEFAULT_KIND,
        help=f"cost model whose feature importances are shown (default {DEFAULT_KIND})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the cost model (default 0)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the report; print where; return the exit status (0)."""
    from autosched.records.opener import open_database, sqlite_path
    from autosched.report import write_report

    db = args.db if args.db is not None else default_db_path()
    file = sqlite_path(db)
    if file is not None and not file.is_file():
        raise InvalidInputError(
            f"records database {db} does not exist; pass --db with an existing records database"
        )
    # A server database is opened here; the report reads it like any Database.
    opened = open_database(db, create=False) if file is None else None
    try:
        path = write_report(
            opened or file,
            args.output,
            op=args.op,
            device_key=args.device_key,
            target=args.target,
            vendor_gflops=args.vendor_gflops,
            measure_vendor=args.measure_vendor,
            model_kind=args.model,
            seed=args.seed,
        )
    finally:
        if opened is not None:
            opened.close()
    print(f"wrote {path}", file=sys.stderr)
    return 0
