"""Find the schedule config to compile a workload with: the records first, then fallbacks.

The order, for one workload on one device and target (each step asks every database in
turn, the user's first, so a hit in the user's database wins over the shipped records
at the same step, never across steps):

1. ``exact``: the fastest ok record of this workload on this exact device key (same
   hardware, driver, compilers and library versions);
2. ``driver_mismatch``: the fastest ok record of this workload on the same device
   family (same hardware) measured under other driver or library versions;
3. ``nearest_shape``: the tuned workload of the same op, dtype and options (the
   parameters its op class lists in ``defaults`` or ``choices``: epilogue, layout,
   stride, padding, dilation, groups, reduction kind, elementwise chain) on this device
   family whose shape dimensions are nearest in log-shape space; its config is adapted
   to the new shapes (:func:`adapt_config`) and checked against this device;
4. ``untuned``: ``Space.untuned()`` (a contraction's seed, from the device's
   properties; the default elsewhere).

Steps 2 to 4 log a warning: the kernel they give was not measured as it will run.
Shipped records are the ``*.jsonl`` files of ``records/`` at the repository root,
loaded once per process (per thread: SQLite connections stay in their thread) into an
in-memory database.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from autosched.errors import AutoschedError
from autosched.records.base import Database
from autosched.records.choice import chosen, settled
from autosched.records.record import OK, Record
from autosched.records.sqlite import MEMORY, SQLiteDatabase
from autosched.space.config import Config
from autosched.space.space import Space

if TYPE_CHECKING:
    from autosched.measure.cpu import HostCPU
    from autosched.measure.device import Device

log = logging.getLogger(__name__)

EXACT = "exact"
DRIVER_MISMATCH = "driver_mismatch"
NEAREST_SHAPE = "nearest_shape"
UNTUNED = "untuned"
PROVENANCES = (EXACT, DRIVER_MISMATCH, NEAREST_SHAPE, UNTUNED)

SHIPPED = "shipped"

# Fastest records tried per step: a record whose config no longer fits the space (an
# older autosched, other device limits) is skipped for the next one.
_CANDIDATES = 5
# Nearest tuned workloads tried before giving up on step 3.
_NEAREST_TRIES = 8
# Configs examined by adapt_config before it gives up.
_ADAPT_TRIES = 5000


@dataclass(frozen=True)
class Lookup:
    """What the lookup found.

    Attributes:
        config: the config to build; valid in the space it was looked up for.
        provenance: one of :data:`PROVENANCES`.
        record: the record the config comes from (for ``nearest_shape``, a record of
            another workload, adapted); None when untuned.
        database: label of the database that held ``record`` (its path, or
            ``"shipped"``); empty when untuned.
        distance: log-shape distance to the record's workload (0 unless nearest_shape).
    """

    config: Config
    provenance: str
    record: Record | None = None
    database: str = ""
    distance: float = 0.0


@dataclass(frozen=True)
class Source:
    """A database consulted by the lookup and the label it is reported under."""

    label: str
    db: Database


# -- shipped records ------------------------------------------------------------------------


def shipped_records_dir() -> Path:
    """``records/`` at the repository root, next to the ``autosched`` package."""
    return Path(__file__).resolve().parents[2] / "records"


_local = threading.local()


def shipped_database(directory: Path | None = None) -> SQLiteDatabase:
    """Every ``*.jsonl`` under ``directory`` (default :func:`shipped_records_dir`) in memory.

    Loaded once per process and thread; later calls return the same database. A
    missing directory gives an empty database; bad lines are skipped with a warning.
    """
    root = (directory or shipped_records_dir()).resolve()
    cache: dict[Path, SQLiteDatabase] = _local.__dict__.setdefault("shipped", {})
    db = cache.get(root)
    if db is None:
        from autosched.records.files import import_jsonl

        db = SQLiteDatabase(MEMORY)
        files = sorted(root.rglob("*.jsonl")) if root.is_dir() else []
        for path in files:
            report = import_jsonl(db, path)
            for number, message in report.errors:
                log.warning("shipped records %s:%d skipped: %s", path, number, message)
        log.debug("loaded %d shipped records from %d files in %s", len(db), len(files), root)
        cache[root] = db
    return db


# -- the lookup ---------------------------------------------------------------------------


@lru_cache(maxsize=64)
def device_keys(device: Device | HostCPU, target: str) -> tuple[str, str]:
    """(exact key, family) of ``device`` for ``target``; cached: fingerprints are costly."""
    return device.key(target), device.family(target)


def lookup_config(space: Space, *, device: Device | HostCPU, sources: Sequence[Source]) -> Lookup:
    """The config to compile ``space.workload`` with on ``device``, and where it came from.

    Args:
        space: the workload's space for the target and ``device``'s limits.
        device: the device the kernel will run on.
        sources: databases in priority order (the user's first, then the shipped ones).

    Returns:
        A :class:`Lookup`; its config always passes ``space.check``.
    """
    wl = space.workload
    target = space.target
    device_key, family = device_keys(device, target)

    found = _best_valid(space, sources, device_key=device_key)
    if found is not None:
        record, label = found
        log.info(
            "%s: exact record %s from %s (%.1f GFLOP/s)", wl, record.id, label, record.gflops or 0.0
        )
        return Lookup(Config.from_json(record.config), EXACT, record, label)
    log.info("%s: no record on this exact device (key %s)", wl, device_key)

    found = _best_valid(space, sources, device_family=family)
    if found is not None:
        record, label = found
        log.warning(
            "%s: no record under these driver and library versions; using record %s from %s, "
            "measured on the same hardware with other versions (%s)",
            wl,
            record.id,
            label,
            _versions_diff(record.device, device.fingerprint(target)),
        )
        return Lookup(Config.from_json(record.config), DRIVER_MISMATCH, record, label)
    log.info("%s: no record on this device family (%s)", wl, family)

    for source in sources:
        near = _nearest(space, source, device_key=device_key, family=family)
        if near is not None:
            config, record, distance = near
            log.warning(
                "%s was never tuned on this device; adapted the config of %s "
                "(record %s from %s, %.1f GFLOP/s, log-shape distance %.2f)",
                wl,
                _describe(record.workload),
                record.id,
                source.label,
                record.gflops or 0.0,
                distance,
            )
            return Lookup(config, NEAREST_SHAPE, record, source.label, distance)
    log.info("%s: no tuned %s of the same options on this device family", wl, wl.op)

    log.warning(
        "%s is untuned on this device: using an unmeasured schedule; run `autosched tune` for it",
        wl,
    )
    return Lookup(space.untuned(), UNTUNED)


def fallbacks(space: Space, found: Lookup) -> list[Lookup]:
    """``found``, then the space's untuned config and its default, each once: what a build
    tries in turn where TVM refuses a config (a record written by another version of
    the schedule code, say). The default is the config every space family can schedule
    (:func:`autosched.tvm.tasks.space_of` checks it)."""
    out = [found]
    for config in (space.untuned(), space.default()):
        if all(config.key != tried.config.key for tried in out):
            out.append(Lookup(config, UNTUNED))
    return out


def _best_valid(space: Space, sources: Sequence[Source], **where: str) -> tuple[Record, str] | None:
    """The first database's chosen record (:func:`autosched.records.choice.chosen`: the
    leader of the final side-by-side round) when its config fits ``space``, else its
    fastest ok record that does."""
    wl = space.workload
    for source in sources:
        top = source.db.best(wl.key, target=space.target, k=_CANDIDATES, **where)
        for record in (settled(source.db, top[0]), *top) if top else ():
            reason = space.check(Config.from_json(record.config))
            if reason is None:
                return record, source.label
            log.info(
                "record %s from %s does not fit this space: %s", record.id, source.label, reason
            )
    return None


def _versions_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    changed = [
        f"{k} {old.get(k)!r} -> {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]
    return "; ".join(changed) or "no difference in the fingerprint"


def _describe(workload_json: Mapping[str, Any]) -> str:
    from autosched.ops import workload_from_json

    try:
        return repr(workload_from_json(dict(workload_json)))
    except (AutoschedError, KeyError, TypeError):  # an op this version does not know
        return str(workload_json)


# -- step 3: nearest tuned shape ------------------------------------------------------------


def shape_and_options(workload_json: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, Any]]:
    """(shape dimensions, options incl. dtype) of a workload, split by its op's metadata.

    The parameters an op lists in ``defaults`` or ``choices`` (epilogue, layout, kind,
    ops, stride, pad, dilation, groups) are options: a record serves another shape only
    when they are all equal, since a config of a stride-2 or NHWC convolution says
    nothing about a stride-1 or NCHW one. The remaining integer parameters are shape
    dimensions, compared in log space. An option left out of the JSON takes its default.
    """
    from autosched.ops import OPS

    params = workload_json.get("params", {})
    cls = OPS.get(str(workload_json.get("op", "")))
    option_names = set(cls.defaults) | set(cls.choices) if cls is not None else set()
    shape: dict[str, int] = {}
    options: dict[str, Any] = {
        name: cls.defaults[name] for name in option_names if cls and name in cls.defaults
    }
    for name, value in params.items():
        if name not in option_names and isinstance(value, int) and not isinstance(value, bool):
            shape[name] = int(value)
        else:
            options[name] = value
    options["__dtype"] = workload_json.get("dtype", "float32")
    return shape, options


def shape_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Euclidean distance of two shapes in log space (natural log), inf if incomparable.

    Incomparable: different dimension names, or a dimension that is not positive.
    """
    if set(a) != set(b) or any(v <= 0 for v in (*a.values(), *b.values())):
        return math.inf
    return math.sqrt(sum((math.log(a[k]) - math.log(b[k])) ** 2 for k in a))


def _nearest(
    space: Space, source: Source, *, device_key: str, family: str
) -> tuple[Config, Record, float] | None:
    wl = space.workload
    own_key = wl.key
    shape, options = shape_and_options(wl.to_json())
    ranked = []
    for key, workload_json in _tuned_workloads(
        source.db, op=wl.op, family=family, target=space.target
    ):
        if key == own_key:
            continue
        other_shape, other_options = shape_and_options(workload_json)
        if other_options != options:
            continue
        distance = shape_distance(shape, other_shape)
        if math.isfinite(distance):
            ranked.append((distance, key))
    ranked.sort()
    for distance, key in ranked[:_NEAREST_TRIES]:
        record = chosen(source.db, key, device_key=device_key, target=space.target)
        record = record or chosen(source.db, key, device_family=family, target=space.target)
        if record is None:
            continue
        config = adapt_config(record.config, space)
        if config is not None:
            return config, record, distance
        log.info("the config of record %s cannot be adapted to %s", record.id, wl)
    return None


def _tuned_workloads(
    db: Database, *, op: str, family: str, target: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload key, workload) of each workload of ``op`` with an ok record on ``family``."""
    rows = _tuned_workloads_sqlite(db, op=op, family=family, target=target)
    if rows is not None:
        yield from rows
        return
    seen: set[str] = set()
    for record in db.query(op=op, device_family=family, target=target, status=OK):
        if record.workload_key not in seen:
            seen.add(record.workload_key)
            yield record.workload_key, record.workload


# One index seek per distinct workload of the op: a loose scan of the partial index of
# ok rows by workload_key (keys start with "<op>-", so the op is a key range), then one
# seek per key into the (workload_key, device_family) index. ``query(op=...)`` would read
# and decode every ok record of the family instead (hundreds of ms on 100k records).
# The literal ok-row condition must match the partial indexes of autosched.records.rows.
_OK_ROWS = "status = 'ok' AND latency_s IS NOT NULL"
_TUNED_SQL = f"""
WITH RECURSIVE keys(k) AS (
    SELECT (SELECT MIN(workload_key) FROM records
            WHERE {_OK_ROWS} AND workload_key > :lo AND workload_key < :hi)
    UNION ALL
    SELECT (SELECT MIN(workload_key) FROM records
            WHERE {_OK_ROWS} AND workload_key > keys.k AND workload_key < :hi)
    FROM keys WHERE keys.k IS NOT NULL
)
SELECT k, (SELECT workload FROM records
           WHERE {_OK_ROWS} AND workload_key = keys.k
             AND device_family = :family AND target = :target LIMIT 1)
FROM keys WHERE keys.k IS NOT NULL
"""


def _tuned_workloads_sqlite(
    db: Database, *, op: str, family: str, target: str
) -> list[tuple[str, dict[str, Any]]] | None:
    """The fast path for an SQLite file (read through its own read-only connection)."""
    import json

    if not isinstance(db, SQLiteDatabase) or os.fspath(db.path) == MEMORY:
        return None
    uri = f"file:{quote(os.fspath(db.path))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5.0)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute(
            _TUNED_SQL, {"lo": f"{op}-", "hi": f"{op}.", "family": family, "target": target}
        ).fetchall()
    except sqlite3.Error as exc:  # another layout: the generic path still works
        log.debug("fast workload scan of %s failed (%s); using query()", db.path, exc)
        return None
    finally:
        conn.close()
    return [(key, json.loads(text)) for key, text in rows if text is not None]


# -- adapting a config to another shape -----------------------------------------------------


def _logs(value: Any) -> tuple[float, ...] | None:
    """log2 of each element of a positive integer or tuple of them, else None."""
    items = value if isinstance(value, tuple) else (value,)
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
        return tuple(math.log2(v) for v in items)
    return None


def _distance(want: Any, want_logs: tuple[float, ...] | None, have: Any) -> float:
    """How far knob value ``have`` is from ``want``: Euclidean in log2 for (tuples of)
    positive integers, 0 or 1 for anything else (stages, fusion)."""
    if want == have:
        return 0.0
    have_logs = _logs(have)
    if want_logs is None or have_logs is None or len(want_logs) != len(have_logs):
        return 1.0
    return math.sqrt(sum((w - h) ** 2 for w, h in zip(want_logs, have_logs)))


def adapt_config(source: Mapping[str, Any], space: Space) -> Config | None:
    """The valid config of ``space`` nearest to ``source`` (a config of another shape).

    Each knob's choices are ranked by distance from the source value: (threads, reg)
    and (chunk, unroll) pairs by Euclidean distance of their log2 values, the vector
    width by its log2 ratio, stages and fusion by equality. Combinations are examined
    cheapest first (sum of the knobs' distances) until one passes ``space.check``, so
    a knob keeps its value whenever some valid config allows it, and when two knobs
    cannot both stay, the one whose change costs less moves. Knobs the source lacks
    start from ``space.default()``.

    Returns:
        The adapted config, or None if no valid config was found within the budget.
    """
    base = Config.from_json(source)
    default = space.default()
    ranked: list[list[tuple[float, Any]]] = []
    for knob in space.knobs:
        want = space.value(base if knob.name in base else default, knob.name)
        want_logs = _logs(want)
        ranked.append(
            sorted((_distance(want, want_logs, c), i, c) for i, c in enumerate(knob.choices))
        )
    names = [k.name for k in space.knobs]

    def cost(index: tuple[int, ...]) -> float:
        return sum(ranked[k][i][0] for k, i in enumerate(index))

    start = (0,) * len(ranked)
    heap = [(cost(start), start)]
    seen = {start}
    for _ in range(_ADAPT_TRIES):
        if not heap:
            break
        _, index = heapq.heappop(heap)
        config = space.make({n: ranked[k][i][2] for k, (n, i) in enumerate(zip(names, index))})
        if space.check(config) is None:
            return config
        for k in range(len(index)):
            if index[k] + 1 < len(ranked[k]):
                nxt = index[:k] + (index[k] + 1,) + index[k + 1 :]
                if nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(heap, (cost(nxt), nxt))
    return None
