"""Records on a PostgreSQL server through psycopg 3: the SQLite contract, many writers.

Layout: a ``records`` table with the columns of :mod:`autosched.records.rows` (dicts
and tuples as canonical JSON text, so a record reads back exactly as written; every
time and latency DOUBLE PRECISION, since REAL would round epoch seconds to minutes),
an identity ``id``, the partial indexes that ``best`` reads, and a ``records_meta``
table holding the schema version. The candidate key ``rows.KEY`` is unique.

Writes: each :meth:`PostgresDatabase.add` is one transaction. It first takes an
advisory lock per key bucket of the batch, in sorted order, so writers with
overlapping batches queue instead of deadlocking, then inserts with ``ON CONFLICT
DO NOTHING``: a record already stored (by anyone, or by an earlier attempt of this
batch whose commit acknowledgement was lost) is found, not stored again.

Retries: a serialization failure, a deadlock, or a dropped connection (the server
restarted, an administrator ended the session, the network blinked) retries the
whole transaction on a fresh connection, backing off up to ``timeout`` seconds in
all; every other error is raised at once. Reads retry the same way.

Schema: a new database gets its tables, an older one its upgrades, under
``pg_advisory_xact_lock`` in one transaction, so processes opening a fresh database
at once do not race. A database written by a newer schema is refused.

The URL's password never appears in messages, logs or reprs (see :func:`redact`);
prefer ``~/.pgpass`` or ``PGPASSWORD`` to a password in the URL.

psycopg is imported only when a PostgreSQL database is opened; it comes with the
``farm`` extra.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from autosched.errors import InvalidInputError, RecordsError
from autosched.records import rows
from autosched.records.reads import SQLReads
from autosched.records.record import Record

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
SCHEMES = ("postgresql", "postgres")

T = TypeVar("T")

# Arbitrary constant naming the schema lock among advisory locks (any fixed bigint).
_SCHEMA_LOCK = 0x6175746F73636864  # "autoschd"
# Writers lock key buckets, not keys, so a 100,000-record import holds a bounded
# number of locks (PostgreSQL's lock table is shared and small).
_KEY_BUCKETS = 1024
_RETRY_SQLSTATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03"})

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS records_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
)""",
    f"""CREATE TABLE IF NOT EXISTS records (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workload_key TEXT NOT NULL,
    workload TEXT NOT NULL,
    target TEXT NOT NULL,
    device_key TEXT NOT NULL,
    device_family TEXT NOT NULL,
    device TEXT NOT NULL,
    config_key TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ({rows.STATUS_LIST})),
    error TEXT NOT NULL,
    latencies TEXT NOT NULL,
    latency_s DOUBLE PRECISION,
    spread DOUBLE PRECISION,
    gflops DOUBLE PRECISION,
    timestamp DOUBLE PRECISION NOT NULL,
    run_id TEXT NOT NULL,
    started_at DOUBLE PRECISION,
    ended_at DOUBLE PRECISION,
    worker TEXT NOT NULL DEFAULT '',
    op TEXT NOT NULL,
    rounds INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT records_key UNIQUE ({", ".join(rows.KEY)})
)""",
    *rows.INDEXES,
)
# Statements that take a database of version N to N + 1. 2: rounds.
_UPGRADES: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE records ADD COLUMN rounds INTEGER NOT NULL DEFAULT 0", rows.ROUNDS_INDEX),
}

_INSERT = rows.placeholders(rows.INSERT, "%s") + " ON CONFLICT DO NOTHING RETURNING id"
_FIND = rows.placeholders(rows.FIND, "%s")
_LOCK_KEYS = (
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT unnest(%s::bigint[]) AS k ORDER BY k) AS s"
)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise RecordsError(
            "records on PostgreSQL need psycopg 3, which is not installed; install the farm "
            "extra: pip install 'autosched[farm]' (or EXTRAS=farm bash scripts/install.sh)"
        ) from None
    return psycopg


# -- URLs and secrets --------------------------------------------------------------------


def _secrets(url: str) -> list[str]:
    """The password(s) in ``url``, as written and decoded."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        found += [v for k, v in parse_qsl(parts.query) if k == "password"]
    except ValueError:  # e.g. a bad port: fall back to the text between ':' and '@'
        head = url.split("://", 1)[-1].split("/", 1)[0]
        found = [head.rpartition("@")[0].partition(":")[2]] if "@" in head else []
    out: list[str] = []
    for secret in found:
        for form in (secret, unquote(secret), quote(unquote(secret), safe="")):
            if form and form not in out:
                out.append(form)
    return sorted(out, key=len, reverse=True)


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (in the user part and the query)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.partition(':')[0]}:***@{host}"
        query = urlencode(
            [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)], safe="*"
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return scrub(url, _secrets(url))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` on one line with every secret replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return " ".join(text.split())


def _lock_id(key: tuple[Any, ...]) -> int:
    digest = hashlib.blake2b(rows.dumps(list(key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % _KEY_BUCKETS


class PostgresDatabase(SQLReads):
    """Records in a PostgreSQL database (the server and the database must exist).

    Implements :class:`autosched.records.base.Database` and honours its contract, like
    :class:`~autosched.records.sqlite.SQLiteDatabase`, with the same extras: a context
    manager, ``len(db)``, :meth:`add_counting` and :meth:`delete`.

    Args:
        url: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB[?...]`` (or ``postgres://``);
            anything libpq reads, e.g. ``?sslmode=require``.
        create: when False, a database without the records tables raises instead of
            getting them.
        timeout: seconds to keep retrying a transaction that failed for a transient
            reason (a dropped connection, a deadlock) before giving up.
        connect_timeout: seconds one connection attempt may take.

    Raises:
        RecordsError: psycopg is missing, the server cannot be reached, the database
            holds no records tables and ``create`` is False, or it was written by a
            newer schema.
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ) -> None:
        if not isinstance(url, str) or urlsplit(url).scheme not in SCHEMES:
            raise InvalidInputError(
                f"{redact(str(url))!r} is not a PostgreSQL URL; "
                "accepted: postgresql://USER@HOST[:PORT]/DB"
            )
        self._psycopg = _psycopg()
        self._url = url
        self._secrets = _secrets(url)
        self._location = redact(url)
        self._timeout = float(timeout)
        self._connect_timeout = max(1, round(connect_timeout))
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        try:
            self._conn = self._connect()
            self._setup(self._conn, create=create)
        except self._psycopg.Error as exc:
            self.close()
            raise RecordsError(
                f"cannot open records database {self._location}: {self._reason(exc)}"
            ) from None
        except RecordsError:
            self.close()
            raise
        self._closed = False
        logger.debug("opened records database %s", self._location)

    # -- connections and retries -------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        return self._psycopg.connect(
            self._url,
            autocommit=True,
            connect_timeout=self._connect_timeout,
            application_name="autosched",
        )

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise RecordsError(f"records database {self._location} is closed")
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _reason(self, exc: BaseException) -> str:
        return scrub(str(exc) or type(exc).__name__, self._secrets)

    def _retryable(self, exc: BaseException) -> bool:
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate:
            return sqlstate in _RETRY_SQLSTATES or sqlstate.startswith("08")
        # No SQLSTATE: libpq lost the connection or could not open a new one.
        return isinstance(exc, self._psycopg.OperationalError)

    def _run(self, action: str, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``work(connection)``, retried on transient failures until ``timeout`` runs out."""
        start = time.monotonic()
        delay = 0.05
        attempt = 1
        while True:
            try:
                return work(self._connection())
            except self._psycopg.Error as exc:
                spent = time.monotonic() - start
                if not self._retryable(exc) or spent + delay > self._timeout:
                    retried = f" (after {attempt} attempts in {spent:.1f} s)" if attempt > 1 else ""
                    raise RecordsError(
                        f"cannot {action} records database {self._location}: "
                        f"{self._reason(exc)}{retried}"
                    ) from None
                logger.warning(
                    "records database %s: %s failed (%s); retrying in %.2f s",
                    self._location,
                    action,
                    self._reason(exc),
                    delay,
                )
                if self._conn is not None and self._conn.broken:
                    self._conn.close()
                    self._conn = None
                time.sleep(delay)
                delay = min(2 * delay, 1.0)
                attempt += 1

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        sql = rows.placeholders(sql, "%s")
        return self._run("read", lambda conn: conn.execute(sql, params).fetchall())

    # -- the schema --------------------------------------------------------------------
    def _setup(self, conn: psycopg.Connection[Any], *, create: bool) -> None:
        version = self._schema_version(conn)
        if version == SCHEMA_VERSION:
            return
        self._check_not_newer(version)
        if version is None and not create:
            raise RecordsError(
                f"records database {self._location} holds no records tables; "
                "pass --db with an existing records database (or import into it first)"
            )
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            # Not _schema_version(): after waiting for the lock, this session's catalog
            # snapshot may predate the tables that the lock holder created, while a
            # statement on the table itself takes a fresh look.
            conn.execute(_SCHEMA[0])
            row = conn.execute(
                "SELECT value FROM records_meta WHERE key = 'schema_version'"
            ).fetchone()
            version = int(row[0]) if row else None
            if version is None:
                for statement in _SCHEMA[1:]:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO records_meta (key, value) VALUES ('schema_version', %s)",
                    (str(SCHEMA_VERSION),),
                )
                logger.info("created the records tables in %s", self._location)
                return
            self._check_not_newer(version)
            for step in range(version, SCHEMA_VERSION):
                for statement in _UPGRADES[step]:
                    conn.execute(statement)
            conn.execute(
                "UPDATE records_meta SET value = %s WHERE key = 'schema_version'",
                (str(SCHEMA_VERSION),),
            )

    @staticmethod
    def _schema_version(conn: psycopg.Connection[Any]) -> int | None:
        if conn.execute("SELECT to_regclass('records_meta')").fetchone()[0] is None:
            return None
        row = conn.execute("SELECT value FROM records_meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else None

    def _check_not_newer(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise RecordsError(
                f"records database {self._location} has schema version {version}, newer "
                f"than this autosched reads ({SCHEMA_VERSION}); upgrade autosched"
            )

    # -- the Database protocol ---------------------------------------------------------
    @property
    def location(self) -> str:
        """Where the records are, for messages: the URL without its password."""
        return self._location

    def add(self, records: Sequence[Record]) -> list[int]:
        """Store ``records`` in one transaction; return their ids (existing id for duplicates).

        A duplicate has the candidate key (workload_key, device_key, config_key,
        timestamp, run_id) of a record already stored or earlier in the batch.

        Raises:
            InvalidInputError: a record cannot be stored; nothing of the batch is stored.
            RecordsError: the database cannot be written (after retries); nothing of the
                batch is stored.
        """
        return self.add_counting(records)[0]

    def add_counting(self, records: Sequence[Record]) -> tuple[list[int], int]:
        """Like :meth:`add`, and also say how many records were new (not duplicates).

        A retry after a commit whose acknowledgement was lost counts that batch's
        records as duplicates: they were stored once, by the first attempt.
        """
        batch: list[tuple[Any, ...]] = []
        for index, record in enumerate(records):
            try:
                batch.append(rows.to_row(record))
            except InvalidInputError as exc:
                raise InvalidInputError(
                    f"cannot add records: record {index} of the batch: {exc}"
                ) from None
        if not batch:
            return [], 0
        ids, added = self._run("write", lambda conn: self._insert(conn, batch))
        logger.debug(
            "stored %d records (%d duplicates) in %s", added, len(ids) - added, self._location
        )
        return ids, added

    @staticmethod
    def _insert(
        conn: psycopg.Connection[Any], batch: list[tuple[Any, ...]]
    ) -> tuple[list[int], int]:
        first: dict[tuple[Any, ...], int] = {}
        for index, row in enumerate(batch):
            first.setdefault(rows.row_key(row), index)
        id_of: dict[tuple[Any, ...], int] = {}
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(_LOCK_KEYS, (sorted({_lock_id(key) for key in first}),))
            cur.executemany(_INSERT, [batch[i] for i in first.values()], returning=True)
            for key in first:
                found = cur.fetchone()
                if found is not None:
                    id_of[key] = int(found[0])
                cur.nextset()
            added = len(id_of)
            missing = [key for key in first if key not in id_of]
            if missing:
                cur.executemany(_FIND, missing, returning=True)
                for key in missing:
                    id_of[key] = int(cur.fetchone()[0])
                    cur.nextset()
        return [id_of[rows.row_key(row)] for row in batch], added

    def close(self) -> None:
        """Close the connection; closing twice is harmless."""
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- beyond the protocol -----------------------------------------------------------
    def delete(self, ids: Iterable[int]) -> int:
        """Remove the records with these ids in one transaction; return how many went.

        Only pruning deletes; everything else in autosched treats records as append-only.
        """
        wanted = sorted({int(i) for i in ids})
        if not wanted:
            return 0

        def work(conn: psycopg.Connection[Any]) -> int:
            with conn.transaction():
                return conn.execute("DELETE FROM records WHERE id = ANY(%s)", (wanted,)).rowcount

        removed = self._run("write", work)
        logger.info("deleted %d records from %s", removed, self._location)
        return removed

    def __repr__(self) -> str:
        return f"PostgresDatabase({self._location!r})"
