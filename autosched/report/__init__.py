"""Reports a person reads: one self-contained HTML page about what the records hold.

:func:`build_report` turns the records of a database into one HTML page with a
section per workload and device (exact fingerprint): a header (operator, shapes,
device, driver, target, trials, time span), the best GFLOP/s so far against trial
number and against time, the fastest configs, failures by kind, which features the
cost model learned to rely on, the default schedule against the tuned one and a
vendor library, and how the finalists re-measured at the end of a run compare with
their search-phase measurement. The page has no scripts and loads nothing: CSS is
inline and charts are inline SVG.

The parts: :mod:`~autosched.report.sections` (what a section holds),
:mod:`~autosched.report.aggregate` (records to sections: runs, finalists, the default),
:mod:`~autosched.report.importance` (the cost model's feature importances),
:mod:`~autosched.report.vendor` (numpy baselines), and the page:
:mod:`~autosched.report.html` with its parts and :mod:`~autosched.report.charts`.

Example::

    from autosched.report import write_report
    write_report("records.db", "report.html", op="matmul")
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autosched.cost_model import DEFAULT_KIND, KINDS
from autosched.errors import InvalidInputError
from autosched.records.base import Database
from autosched.records.files import write_atomically
from autosched.records.record import Record
from autosched.report.aggregate import SpaceCache, build_section, device_limits
from autosched.report.html import render
from autosched.report.importance import knob_importance
from autosched.report.markup import option_params, shape_params
from autosched.report.sections import (
    ConfigRow,
    ErrorKind,
    Finalist,
    FinalRound,
    Importance,
    RunInfo,
    Section,
    VendorFigure,
)
from autosched.report.vendor import VENDOR_OPS, time_vendor

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


# -- vendor reference --------------------------------------------------------------------
def measure_numpy(
    workload: Mapping[str, Any], *, min_time_s: float = 0.2, seed: int = 0
) -> VendorFigure:
    """Time the numpy baseline of a workload (:mod:`autosched.report.vendor`) on this CPU.

    Contractions call numpy's BLAS (e.g. OpenBLAS): matmul, dense and batch matmul
    directly, conv2d through im2col; the row-wise operators are plain numpy. See
    :func:`autosched.report.vendor.time_vendor` for how it is timed.

    Raises:
        InvalidInputError: an op or dtype without a baseline.
    """
    t = time_vendor(workload, min_time_s=min_time_s, seed=seed)
    blas = f" with {t.blas}, {t.threads}" if t.blas else ""
    return VendorFigure(
        gflops=t.gflops,
        source=f"numpy {np.__version__} {t.method}{blas}, on the host CPU when this report "
        f"was made; median of {t.repeats} repeats",
        label=f"numpy ({t.blas.split()[0]})" if t.blas else "numpy",
    )


# -- the report --------------------------------------------------------------------------
def _open(db: Database | PathLike) -> tuple[Database, str, bool]:
    if not isinstance(db, (str, os.PathLike)):
        return db, repr(db), False
    from autosched.records import open_database

    path = Path(db).expanduser()
    if not path.is_file():
        raise InvalidInputError(
            f"records database {path} does not exist; pass --db with an existing records database"
        )
    return open_database(path, create=False), str(path), True


def _check_vendor(value: Any, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise InvalidInputError(f"{name}={value!r} is not valid; accepted: a number > 0 (GFLOP/s)")
    return float(value)


def collect(
    db: Database | PathLike,
    *,
    op: str | None = None,
    device_key: str | None = None,
    target: str | None = None,
    vendor_gflops: float | Mapping[str, float] | None = None,
    measure_vendor: bool = False,
    model_kind: str = DEFAULT_KIND,
    seed: int = 0,
    workload_keys: Collection[str] | None = None,
) -> list[Section]:
    """The report's sections, one per (workload, target, device key); see :func:`build_report`.

    ``workload_keys`` keeps only those workloads (a job's tasks).
    """
    if model_kind not in KINDS:
        raise InvalidInputError(
            f"cost model kind {model_kind!r} is not known; accepted: {', '.join(KINDS)}"
        )
    vendors: dict[str | None, float] = {}
    if isinstance(vendor_gflops, Mapping):
        for key, value in vendor_gflops.items():
            vendors[str(key)] = _check_vendor(value, f"vendor_gflops[{key!r}]")
    elif vendor_gflops is not None:
        vendors[None] = _check_vendor(vendor_gflops, "vendor_gflops")
    database, label, owned = _open(db)
    try:
        records = database.query(op=op, device_key=device_key, target=target)
        if workload_keys is not None:
            records = [r for r in records if r.workload_key in workload_keys]
        if not records:
            everything = database.query()
            if not everything:
                raise InvalidInputError(
                    f"records database {label} holds no records; run `autosched tune` first"
                )
            asked = ", ".join(
                f"{name} {value!r}"
                for name, value in (("op", op), ("device key", device_key), ("target", target))
                if value is not None
            )
            held = "; ".join(
                f"{name}: {', '.join(sorted({str(getattr(r, attr)) for r in everything}))}"
                for name, attr in (
                    ("ops", "op"),
                    ("device keys", "device_key"),
                    ("targets", "target"),
                )
            )
            raise InvalidInputError(f"no records in {label} match {asked}; it holds {held}")
        groups: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
        for r in records:
            groups[(r.workload_key, r.target, r.device_key)].append(r)
        spaces = SpaceCache()
        importances: dict[tuple[str, str, str], Importance] = {}
        measured: dict[str, VendorFigure] = {}
        sections = []
        for (_, tgt, _), recs in groups.items():
            first = recs[0]
            family_key = (first.op, first.device_family, tgt)
            if family_key not in importances:
                family = database.query(op=first.op, device_family=first.device_family, target=tgt)
                importances[family_key] = knob_importance(
                    family, device=first.device, kind=model_kind, seed=seed, spaces=spaces
                )
            vendor: list[VendorFigure] = []
            given = vendors.get(first.workload_key, vendors.get(None))
            if given is not None:
                vendor.append(VendorFigure(given, "given (--vendor-gflops)", "vendor (given)"))
            if measure_vendor and first.op in VENDOR_OPS:
                if first.workload_key not in measured:
                    measured[first.workload_key] = measure_numpy(first.workload, seed=seed)
                vendor.append(measured[first.workload_key])
            sections.append(
                build_section(
                    database,
                    recs,
                    spaces=spaces,
                    importance=importances[family_key],
                    vendor=tuple(vendor),
                )
            )
    finally:
        if owned:
            database.close()
    sections.sort(key=_section_order)
    return sections


def _section_order(s: Section) -> tuple:
    shape = tuple(v if isinstance(v, (int, float)) else 0 for _, v in shape_params(s.workload))
    options = tuple(str(v) for _, v in option_params(s.workload))
    return (s.op, shape, options, s.target, str(s.device.get("name", "")), s.device_key)


def build_report(
    db: Database | PathLike,
    *,
    op: str | None = None,
    device_key: str | None = None,
    target: str | None = None,
    vendor_gflops: float | Mapping[str, float] | None = None,
    measure_vendor: bool = False,
    model_kind: str = DEFAULT_KIND,
    seed: int = 0,
) -> str:
    """One self-contained HTML page about the matching records (no scripts, no network).

    Args:
        db: a records database, or the path of an existing SQLite records file (never
            created).
        op, device_key, target: keep only records of this operator, exact device
            fingerprint key and code generation target (None: any).
        vendor_gflops: a vendor library's GFLOP/s to compare with: one number for every
            workload, or a mapping from workload key to GFLOP/s.
        measure_vendor: also time the numpy baseline of each workload (its BLAS for
            contractions, see :mod:`autosched.report.vendor`) on this machine's CPU, now.
        model_kind: cost model whose feature importances are shown (``make_model`` kind).
        seed: seeds the cost model and any held-out split.

    Returns:
        The HTML text.

    Raises:
        InvalidInputError: the database file does not exist, holds no records, or none
            match the filters; a bad vendor figure or model kind.
        RecordsError: the database cannot be opened or read.
    """
    sections = collect(
        db,
        op=op,
        device_key=device_key,
        target=target,
        vendor_gflops=vendor_gflops,
        measure_vendor=measure_vendor,
        model_kind=model_kind,
        seed=seed,
    )
    label = os.fspath(db) if isinstance(db, (str, os.PathLike)) else repr(db)
    filters = {"op": op, "device key": device_key, "target": target}
    return render(sections, source=label, filters={k: v for k, v in filters.items() if v})


def write_report(db: Database | PathLike, out: PathLike, **options: Any) -> Path:
    """Write :func:`build_report` to ``out`` (atomically: a temporary file renamed into place).

    Args:
        db: as for :func:`build_report`.
        out: the HTML file to write; its folder is created.
        options: keyword options of :func:`build_report`.

    Returns:
        The path written.

    Raises:
        RecordsError: ``out`` cannot be written; and whatever :func:`build_report` raises.
    """
    text = build_report(db, **options)
    path = write_atomically(out, [text], what="report", hint="pass a writable -o path")
    log.info("wrote report of %d bytes to %s", len(text), path)
    return path


__all__ = [
    "ConfigRow",
    "ErrorKind",
    "FinalRound",
    "Finalist",
    "Importance",
    "RunInfo",
    "Section",
    "VendorFigure",
    "build_report",
    "collect",
    "device_limits",
    "knob_importance",
    "measure_numpy",
    "write_report",
]
