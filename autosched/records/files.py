"""Records as files: JSON Lines export and import, merging, summaries and pruning.

Export writes one :meth:`Record.to_json` per line as canonical JSON (gzip-compressed
to a path ending ``.gz``, as replay samples and farm exports are kept); import reads it
back, plain or gzip (told by the file's first bytes, whatever its name), keeps every
good line and reports each bad one by line number. Because the
database ignores duplicate records, importing or merging the same data twice adds
nothing the second time.

Everything here works on any :class:`~autosched.records.base.Database`; only
:func:`prune` needs a database that can delete (``delete``, which both the SQLite and
the PostgreSQL database have).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import logging
import math
import os
import sys
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from autosched.errors import InvalidInputError, RecordsError
from autosched.records.base import Database
from autosched.records.opener import open_database
from autosched.records.record import STATUSES, Record, canonical_json, device_label
from autosched.records.rows import check_record

if TYPE_CHECKING:
    import pandas

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip file

# Fields a JSON line must carry, and every field it may carry.
_REQUIRED = tuple(
    f.name
    for f in dataclasses.fields(Record)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)
_ACCEPTED = frozenset({f.name for f in dataclasses.fields(Record)} | {"format_version"})

STATS_COLUMNS = (
    "op",
    "workload_key",
    "params",
    "target",
    "device",
    "n",
    *STATUSES,
    "best_gflops",
    "best_latency_s",
)


@dataclass(frozen=True)
class ImportReport:
    """What an import or merge did.

    Attributes:
        added: records stored that were not there before.
        duplicates: records skipped because an identical one was already stored.
        errors: ``(line number, message)`` of every rejected line, 1-based.
    """

    added: int = 0
    duplicates: int = 0
    errors: tuple[tuple[int, str], ...] = ()

    @property
    def rejected(self) -> int:
        return len(self.errors)

    def __str__(self) -> str:
        return f"added {self.added}, duplicates {self.duplicates}, rejected {self.rejected}"


def _filters(
    op: str | None,
    device_key: str | None,
    device_family: str | None,
    target: str | None,
    status: str | None,
) -> dict[str, str | None]:
    if status is not None and status not in STATUSES:
        raise InvalidInputError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    return {
        "op": op,
        "device_key": device_key,
        "device_family": device_family,
        "target": target,
        "status": status,
    }


def _add(db: Database, records: Sequence[Record]) -> tuple[int, int]:
    """Add in one transaction; return (added, duplicates)."""
    if not records:
        return 0, 0
    counting = getattr(db, "add_counting", None)
    if callable(counting):
        _, added = counting(records)
    elif isinstance(db, Sized):
        before = len(db)
        db.add(records)
        added = len(db) - before
    else:  # cannot tell duplicates apart: count distinct ids
        added = len(set(db.add(records)))
    return added, len(records) - added


# -- export ------------------------------------------------------------------------------


def write_atomically(
    out: str | os.PathLike[str],
    chunks: Iterable[str],
    *,
    what: str,
    hint: str,
    compress: bool = False,
) -> Path:
    """Write ``chunks`` to ``out`` through a temporary file renamed into place
    (gzip-compressed with ``compress``, with no time stamp in its header, so the same
    text gives the same bytes).

    A reader never sees half a file, and a failed write leaves no temporary behind.
    The file gets the usual 0644 permissions (``mkstemp`` would leave 0600).

    Raises:
        RecordsError: naming the path, why, and ``hint``.
    """
    path = Path(out).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as raw:
                target: Any = raw
                if compress:
                    target = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
                with io.TextIOWrapper(target, encoding="utf-8", newline="\n") as handle:
                    handle.writelines(chunks)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise RecordsError(f"cannot write {what} {path}: {reason}; {hint}") from None
    return path


def export_jsonl(
    db: Database,
    out: TextIO | PathLike,
    *,
    op: str | None = None,
    device_key: str | None = None,
    device_family: str | None = None,
    target: str | None = None,
    status: str | None = None,
) -> int:
    """Write the matching records as JSON Lines, in insertion order; return how many.

    A path is written to a temporary file next to it and renamed into place, so a
    reader never sees half a file; a path ending ``.gz`` is written gzip-compressed.

    Raises:
        InvalidInputError: a filter value is not valid.
        RecordsError: the file cannot be written.
    """
    records = db.query(**_filters(op, device_key, device_family, target, status))
    lines = (canonical_json(record.to_json()) + "\n" for record in records)
    if not isinstance(out, (str, os.PathLike)):
        for line in lines:
            out.write(line)
        return len(records)
    path = write_atomically(
        out,
        lines,
        what="records file",
        hint="pass a writable output path",
        compress=Path(out).suffix == ".gz",
    )
    logger.info("exported %d records to %s", len(records), path)
    return len(records)


# -- import ------------------------------------------------------------------------------
def numbered_lines(source: TextIO | PathLike) -> Iterator[tuple[int, str | None]]:
    """(line number, text) pairs of a records file (plain or gzip, told by its first
    bytes) or open text stream; text is None for a line that is not UTF-8.

    Raises:
        InvalidInputError: the file does not exist, or is gzip data cut short or corrupt.
        RecordsError: the file cannot be read.
    """
    if not isinstance(source, (str, os.PathLike)):
        yield from enumerate(source, start=1)
        return
    path = Path(source).expanduser()
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise InvalidInputError(
            f"records file {path} does not exist; pass a JSON Lines file written by export"
        ) from None
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise RecordsError(f"cannot read records file {path}: {reason}") from None
    with handle:
        if handle.peek(len(GZIP_MAGIC))[: len(GZIP_MAGIC)] != GZIP_MAGIC:
            yield from _decoded(handle)
            return
        number = 0
        try:
            for number, text in _decoded(gzip.GzipFile(fileobj=handle, mode="rb")):
                yield number, text
        except (EOFError, OSError, zlib.error):  # cut short, or not gzip past its magic
            raise InvalidInputError(
                f"records file {path} is gzip data cut short or corrupt ({number} lines read); "
                "nothing was imported from it: pass the whole file as export wrote it"
            ) from None


def _decoded(lines: Iterable[bytes]) -> Iterator[tuple[int, str | None]]:
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            yield number, None
            continue
        yield number, text.lstrip("\ufeff") if number == 1 else text


def parse_line(text: str) -> Record:
    """One JSON line -> a storable :class:`Record`; raises InvalidInputError saying why not."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise InvalidInputError("not JSON: a number has too many digits") from None
    except RecursionError:
        raise InvalidInputError("not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"expected a JSON object, got {type(data).__name__}")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise InvalidInputError(f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - _ACCEPTED)
    if unknown:
        raise InvalidInputError(
            f"unknown field(s) {', '.join(unknown)}; accepted: {', '.join(sorted(_ACCEPTED))}"
        )
    data.pop("id", None)  # the destination assigns its own ids
    try:
        record = Record.from_json(data)
        check_record(record)
    except OverflowError:  # an integer too large for a float, e.g. a latency of 10**400
        huge = sorted(name for name, value in data.items() if _too_large(value))
        raise InvalidInputError(
            f"field(s) {', '.join(huge)} hold a number too large for a float"
        ) from None
    except InvalidInputError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(str(exc)) from None
    return record


def _too_large(value: Any) -> bool:
    if isinstance(value, list):
        return any(_too_large(v) for v in value)
    return isinstance(value, int) and abs(value) > sys.float_info.max


def import_jsonl(db: Database, source: TextIO | PathLike) -> ImportReport:
    """Add the records of a JSON Lines file, plain or gzip, (or open text stream) to ``db``.

    Good lines are added in one transaction; bad lines (not JSON, missing or unknown
    fields, another format_version, an unknown status, values that cannot be stored)
    are skipped and reported with their line number. Blank lines are ignored.

    Raises:
        InvalidInputError: the file does not exist, or is gzip data cut short or
            corrupt (then nothing of it is added).
        RecordsError: the file cannot be read or the database cannot be written.
    """
    records: list[Record] = []
    errors: list[tuple[int, str]] = []
    for number, text in numbered_lines(source):
        if text is None:
            errors.append((number, "not UTF-8 text"))
            continue
        if not text.strip():
            continue
        try:
            records.append(parse_line(text))
        except InvalidInputError as exc:
            errors.append((number, str(exc)))
    added, duplicates = _add(db, records)
    report = ImportReport(added=added, duplicates=duplicates, errors=tuple(errors))
    logger.info("imported records: %s", report)
    return report


# -- merge -------------------------------------------------------------------------------
def merge(dst_db: Database, src_dbs: Iterable[Database | PathLike]) -> ImportReport:
    """Add every record of each source to ``dst_db`` (one transaction per source).

    Sources may be open databases, or paths and URLs that ``open_database`` reads
    (opened, never created), so records move between SQLite and PostgreSQL either way.
    Merging is a union and idempotent: records already in ``dst_db`` count as duplicates.
    """
    added = duplicates = 0
    for src in src_dbs:
        if isinstance(src, (str, os.PathLike)):
            with open_database(src, create=False) as opened:
                records = opened.query()
        else:
            records = src.query()
        a, d = _add(dst_db, records)
        added += a
        duplicates += d
    return ImportReport(added=added, duplicates=duplicates)


# -- stats -------------------------------------------------------------------------------
def _params_text(workload: dict[str, Any]) -> str:
    from autosched.ops import params_text  # a fused function's script: one line

    text = params_text(workload)
    if text is not None:
        return text
    params = workload.get("params")
    if isinstance(params, dict):
        return ",".join(f"{k}={params[k]}" for k in sorted(params))
    return canonical_json(params)


def stats(
    db: Database,
    *,
    op: str | None = None,
    device_key: str | None = None,
    device_family: str | None = None,
    target: str | None = None,
    status: str | None = None,
) -> pandas.DataFrame:
    """Summary table: one row per (op, workload_key, target, device family).

    Columns: :data:`STATS_COLUMNS` -- ``params`` (the shapes, ``K=64,M=64,...``),
    ``device`` (its name, and the CPU's model where the fingerprint holds it), ``n``
    records, a count per status, ``best_gflops`` and ``best_latency_s`` among ok records
    (NaN when none). Records of one device under different drivers share a row; two
    CPUs of one name (a cloud VM names a Zen 4 and a Zen 5 both ``AMD EPYC``) do not.
    Rows are sorted by op, workload_key, target, device.
    """
    records = db.query(**_filters(op, device_key, device_family, target, status))
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    counts: dict[tuple[str, str, str, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(STATUSES, 0)
    )
    for record in records:
        key = (record.op, record.workload_key, record.target, record.device_family)
        row = groups.setdefault(
            key,
            {
                "device": device_label(record.device),
                "params": _params_text(record.workload),
                "best_gflops": math.nan,
                "best_latency_s": math.nan,
            },
        )
        counts[key][record.status] += 1
        if record.ok:
            if record.gflops is not None and not record.gflops <= row["best_gflops"]:
                row["best_gflops"] = float(record.gflops)
            if record.latency_s is not None and not record.latency_s >= row["best_latency_s"]:
                row["best_latency_s"] = float(record.latency_s)
    rows = []
    for key in sorted(groups, key=lambda k: (*k[:3], groups[k]["device"], k[3])):
        op_, workload_key, target_, _family = key
        rows.append(
            {
                "op": op_,
                "workload_key": workload_key,
                "params": groups[key]["params"],
                "target": target_,
                "device": groups[key]["device"],
                "n": sum(counts[key].values()),
                **counts[key],
                "best_gflops": groups[key]["best_gflops"],
                "best_latency_s": groups[key]["best_latency_s"],
            }
        )
    import pandas as pd  # only here: it costs ~150 ms to import

    frame = pd.DataFrame(rows, columns=list(STATS_COLUMNS))
    for name in ("n", *STATUSES):
        frame[name] = frame[name].astype("int64")
    for name in ("best_gflops", "best_latency_s"):
        frame[name] = frame[name].astype("float64")
    return frame


# -- prune -------------------------------------------------------------------------------
def prune(
    db: Database,
    *,
    keep_top: int | None = None,
    drop_errors: bool = False,
    op: str | None = None,
    device_key: str | None = None,
    device_family: str | None = None,
    target: str | None = None,
    status: str | None = None,
    dry_run: bool = False,
) -> int:
    """Delete records in one transaction; return how many were (or would be) removed.

    Among the records matching the filters: with ``keep_top``, keep only the
    ``keep_top`` fastest ok records per (workload_key, target, device_key) and remove
    the other ok ones; with ``drop_errors``, remove every record that is not ok.
    Removed configs no longer count as measured, so a later tuning run may measure them
    again.

    Raises:
        InvalidInputError: neither option given, or ``keep_top`` is not an integer >= 1.
        RecordsError: ``db`` cannot delete records.
    """
    if keep_top is None and not drop_errors:
        raise InvalidInputError(
            "nothing to prune: pass keep_top (an integer >= 1) and/or drop_errors=True"
        )
    if keep_top is not None and (
        not isinstance(keep_top, int) or isinstance(keep_top, bool) or keep_top < 1
    ):
        raise InvalidInputError(f"keep_top={keep_top!r} is not valid; expected an integer >= 1")
    delete = getattr(db, "delete", None)
    if not callable(delete):
        raise RecordsError(
            f"{type(db).__name__} cannot delete records; prune needs a database with a "
            "delete method, such as SQLiteDatabase or PostgresDatabase"
        )
    records = db.query(**_filters(op, device_key, device_family, target, status))
    doomed: list[int] = []
    if drop_errors:
        doomed.extend(r.id for r in records if not r.ok and r.id is not None)
    if keep_top is not None:
        by_group: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
        for record in records:
            if record.ok and record.id is not None:
                by_group[(record.workload_key, record.target, record.device_key)].append(record)
        for group in by_group.values():
            group.sort(key=lambda r: (r.latency_s, r.id))
            doomed.extend(r.id for r in group[keep_top:] if r.id is not None)
    if dry_run:
        return len(doomed)
    removed = int(delete(doomed))
    logger.info("pruned %d records", removed)
    return removed
