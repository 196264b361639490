"""One mapping of :class:`Record` to a table row, and the SQL both backends share.

A row holds one column per :class:`Record` field (dicts and tuples as canonical JSON
text, so a record reads back exactly as it was written) plus ``op``, which is derived
from the workload. The identity of a measurement -- the candidate key that makes
``add`` idempotent -- is :data:`KEY`: the same config of the same workload measured on
the same device at the same moment by the same run.

The statements are written with ``?`` placeholders; :func:`placeholders` turns them
into another driver's style (psycopg's ``%s``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from autosched.errors import InvalidInputError
from autosched.records.record import OK, STATUSES, Record

# Record fields in column order; ``op`` (derived from the workload) follows them.
FIELDS = (
    "workload_key",
    "workload",
    "target",
    "device_key",
    "device_family",
    "device",
    "config_key",
    "config",
    "status",
    "error",
    "latencies",
    "latency_s",
    "spread",
    "gflops",
    "timestamp",
    "run_id",
    "started_at",
    "ended_at",
    "worker",
    "rounds",
)
JSON_FIELDS = ("workload", "device", "config", "latencies")
_FLOAT_FIELDS = ("latency_s", "spread", "gflops", "timestamp", "started_at", "ended_at")
# The candidate key: a record with the same values is the same measurement.
KEY = ("workload_key", "device_key", "config_key", "timestamp", "run_id")
_KEY_INDEX = tuple(FIELDS.index(name) for name in KEY)

STATUS_LIST = ", ".join(f"'{s}'" for s in STATUSES)
# The partial indexes hold only ok rows with a latency, ordered by latency: ``best`` reads
# the first k entries of one of them. Their WHERE clause must appear literally in the
# query (not as a bound parameter) for the planner to use them.
OK_ROWS = "status = 'ok' AND latency_s IS NOT NULL"

# The readings of side-by-side rounds (``Record.rounds`` > 0) are few, and all that
# ``latest_round`` reads. Its ok condition leaves ``latency_s IS NOT NULL`` out (an ok
# record always has one: check_record) so that the planner cannot take the ``best``
# indexes, which hold every ok reading, for these.
ROUND_ROWS = "rounds > 0 AND status = 'ok'"
ROUNDS_INDEX = (
    "CREATE INDEX IF NOT EXISTS records_rounds "
    "ON records (workload_key, device_key, config_key, started_at) WHERE rounds > 0"
)

COLUMNS = ", ".join(("id", *FIELDS))
INSERT = (
    f"INSERT INTO records ({', '.join((*FIELDS, 'op'))}) "
    f"VALUES ({', '.join('?' * (len(FIELDS) + 1))})"
)
FIND = "SELECT id FROM records WHERE " + " AND ".join(f"{name} = ?" for name in KEY)
# Indexes shared by both backends (the SQL is the same in SQLite and PostgreSQL).
INDEXES = (
    f"CREATE INDEX IF NOT EXISTS records_best_device "
    f"ON records (workload_key, device_key, latency_s) WHERE {OK_ROWS}",
    f"CREATE INDEX IF NOT EXISTS records_best_family "
    f"ON records (workload_key, device_family, latency_s) WHERE {OK_ROWS}",
    f"CREATE INDEX IF NOT EXISTS records_best_workload "
    f"ON records (workload_key, latency_s) WHERE {OK_ROWS}",
    "CREATE INDEX IF NOT EXISTS records_measured "
    "ON records (workload_key, device_key, target, config_key)",
    ROUNDS_INDEX,
)


def placeholders(sql: str, style: str) -> str:
    """``sql`` with its ``?`` placeholders written as ``style`` (our SQL has no other ``?``)."""
    return sql.replace("?", style)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def dumps(value: Any) -> str:
    """Canonical JSON, strict: NaN and infinities are not JSON and are refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _check_optional_time(name: str, value: Any) -> None:
    if value is not None and not (_is_number(value) and math.isfinite(value)):
        raise InvalidInputError(
            f"record field {name} is {value!r}; expected a finite number or None"
        )


def check_record(record: Record) -> None:
    """Raise :class:`InvalidInputError` unless ``record`` can be stored as it is.

    Checks what the dataclass does not: field types, that keys are non-empty, the
    status is known, the dicts are JSON, numbers are finite and an ok record has a
    latency.
    """
    if not isinstance(record, Record):
        raise InvalidInputError(f"expected a Record, got {type(record).__name__}")
    for name in ("workload_key", "target", "device_key", "device_family", "config_key"):
        value = getattr(record, name)
        if not isinstance(value, str) or not value:
            raise InvalidInputError(
                f"record field {name} is {value!r}; expected a non-empty string"
            )
    for name in ("status", "error", "run_id", "worker"):
        value = getattr(record, name)
        if not isinstance(value, str):
            raise InvalidInputError(f"record field {name} is {value!r}; expected a string")
    if record.status not in STATUSES:
        raise InvalidInputError(
            f"record status {record.status!r} is not one of {', '.join(STATUSES)}"
        )
    for name in ("workload", "device", "config"):
        value = getattr(record, name)
        if not isinstance(value, dict):
            raise InvalidInputError(f"record field {name} is {value!r}; expected a dict")
        try:
            dumps(value)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"record field {name} is not plain JSON data: {exc}") from None
    op = record.workload.get("op")
    if not isinstance(op, str) or not op:
        raise InvalidInputError(
            f"record workload has op {op!r}; expected a non-empty string under 'op'"
        )
    if not isinstance(record.latencies, (tuple, list)) or not all(
        _is_number(x) and math.isfinite(x) for x in record.latencies
    ):
        raise InvalidInputError(
            f"record latencies are {record.latencies!r}; expected a tuple of finite numbers"
        )
    for name in ("latency_s", "spread", "gflops", "started_at", "ended_at"):
        _check_optional_time(name, getattr(record, name))
    if not isinstance(record.rounds, int) or isinstance(record.rounds, bool) or record.rounds < 0:
        raise InvalidInputError(
            f"record rounds is {record.rounds!r}; expected an integer >= 0 (0 for a search reading)"
        )
    if not (_is_number(record.timestamp) and math.isfinite(record.timestamp)):
        raise InvalidInputError(
            f"record timestamp is {record.timestamp!r}; expected a finite number"
        )
    if record.status == OK and record.latency_s is None:
        raise InvalidInputError(
            "record status is 'ok' but latency_s is None; an ok record needs a latency"
        )


def to_row(record: Record) -> tuple[Any, ...]:
    """The column values of ``record`` (``FIELDS`` then ``op``); checks it first."""
    check_record(record)
    values: list[Any] = []
    for name in FIELDS:
        value = getattr(record, name)
        if name in JSON_FIELDS:
            value = dumps(list(value) if name == "latencies" else value)
        elif name in _FLOAT_FIELDS and value is not None:
            value = float(value)
        values.append(value)
    values.append(record.op)
    return tuple(values)


def row_key(row: Sequence[Any]) -> tuple[Any, ...]:
    """The candidate key values of a row made by :func:`to_row`."""
    return tuple(row[i] for i in _KEY_INDEX)


def from_row(row: Sequence[Any]) -> Record:
    """A :class:`Record` from the columns ``id, *FIELDS`` (as :data:`COLUMNS` selects)."""
    data = dict(zip(("id", *FIELDS), row, strict=True))
    for name in JSON_FIELDS:
        data[name] = json.loads(data[name])
    data["latencies"] = tuple(data["latencies"])
    return Record(**data)


def check_filter(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"filter {name}={value!r} is not valid; expected a string or None")
    if name == "status" and value is not None and value not in STATUSES:
        raise InvalidInputError(f"status {value!r} is not one of {', '.join(STATUSES)}")


def check_count(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInputError(f"{name}={value!r} is not valid; expected an integer >= {minimum}")


# -- the read statements of the protocol -------------------------------------------------


def query_sql(filters: dict[str, str | None], limit: int | None) -> tuple[str, list[Any]]:
    """``query``: every given filter ANDed, in insertion order (by id)."""
    clauses: list[str] = []
    params: list[Any] = []
    for name, value in filters.items():
        check_filter(name, value)
        if value is not None:
            clauses.append(f"{name} = ?")
            params.append(value)
    sql = f"SELECT {COLUMNS} FROM records"
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY id"
    if limit is not None:
        check_count("limit", limit, minimum=0)
        sql += " LIMIT ?"
        params.append(limit)
    return sql, params


def best_sql(
    workload_key: str,
    *,
    target: str | None,
    device_key: str | None,
    device_family: str | None,
    k: int,
) -> tuple[str, list[Any]]:
    """``best``: the k fastest ok records of a workload, fastest first (ties by id)."""
    check_count("k", k, minimum=1)
    check_filter("workload_key", workload_key)
    clauses = [OK_ROWS, "workload_key = ?"]
    params: list[Any] = [workload_key]
    for name, value in (
        ("device_key", device_key),
        ("device_family", device_family),
        ("target", target),
    ):
        check_filter(name, value)
        if value is not None:
            clauses.append(f"{name} = ?")
            params.append(value)
    sql = (
        f"SELECT {COLUMNS} FROM records WHERE {' AND '.join(clauses)} "
        "ORDER BY latency_s, id LIMIT ?"
    )
    return sql, [*params, k]


def latest_round_sql(
    workload_key: str, *, device_key: str, config_key: str
) -> tuple[str, list[Any]]:
    """``latest_round``: the ok records of the latest side-by-side round (one run id, one
    start) on one device that measured a config, fastest first (ties by id)."""
    for name, value in (
        ("workload_key", workload_key),
        ("device_key", device_key),
        ("config_key", config_key),
    ):
        check_filter(name, value)
        if value is None:
            raise InvalidInputError(f"{name} is None; expected a string")
    mine = (
        "SELECT run_id, started_at FROM records WHERE workload_key = ? AND device_key = ? "
        f"AND config_key = ? AND {ROUND_ROWS} ORDER BY started_at DESC, id DESC LIMIT 1"
    )
    sql = (
        f"SELECT {COLUMNS} FROM records WHERE workload_key = ? AND device_key = ? "
        f"AND {ROUND_ROWS} AND (run_id, started_at) IN ({mine}) ORDER BY latency_s, id"
    )
    return sql, [workload_key, device_key, workload_key, device_key, config_key]


def measured_sql(workload_key: str, *, device_key: str, target: str) -> tuple[str, list[Any]]:
    """``measured_config_keys``: distinct config keys of a workload on one device."""
    for name, value in (
        ("workload_key", workload_key),
        ("device_key", device_key),
        ("target", target),
    ):
        check_filter(name, value)
    sql = (
        "SELECT DISTINCT config_key FROM records "
        "WHERE workload_key = ? AND device_key = ? AND target = ?"
    )
    return sql, [workload_key, device_key, target]
