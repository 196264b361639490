"""Conformance suite of the records database contract, run over every implementation
(an SQLite file, SQLite in memory, a real PostgreSQL server), plus the SQLite
specifics: durability under SIGKILL, several writers, bad paths, schema upgrades.
PostgreSQL's own tests are in test_records_postgres.py."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autosched.errors import InvalidInputError, RecordsError
from autosched.records import Database, Record, open_database
from autosched.records.record import canonical_json
from autosched.records.sqlite import SCHEMA_VERSION, SQLiteDatabase, default_db_path
from tests.records_factory import make_record


@pytest.fixture(params=["file", "memory", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a fresh database of each backend lives: a path or a URL."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "sub" / "records.db") if request.param == "file" else ":memory:"


@pytest.fixture
def db(target: str) -> Iterator[Database]:
    database = open_database(target)
    yield database
    database.close()


# -- the contract, over every implementation ------------------------------------------------


def test_implements_protocol(db: Database) -> None:
    assert isinstance(db, Database)


def test_add_then_query_round_trips_in_insertion_order(db: Database) -> None:
    records = [make_record(i, latency=(5 - i) * 1e-3) for i in range(4)]
    records.append(make_record(9, status="build_error"))
    ids = db.add(records)
    assert ids == sorted(ids) and len(set(ids)) == 5
    got = db.query()
    assert got == records
    assert [r.id for r in got] == ids
    assert isinstance(got[0].latencies, tuple)
    assert len(db) == 5


def test_query_filters_are_anded(db: Database) -> None:
    a = make_record(0)
    b = make_record(1, device_name="gpu")
    c = make_record(2, target="llvm")
    d = make_record(3, status="timeout")
    e = make_record(4, op="conv2d")
    f = make_record(5, m=128, driver="4.0")
    db.add([a, b, c, d, e, f])
    assert db.query(op="conv2d") == [e]
    assert db.query(target="llvm") == [c]
    assert db.query(device_key=b.device_key) == [b]
    # another driver of the same hardware is the same family
    assert db.query(device_family=a.device_family) == [a, d, e, f]
    assert db.query(device_key=f.device_key) == [f]
    assert db.query(status="timeout") == [d]
    assert db.query(workload_key=a.workload_key, status="ok") == [a, b, c]
    assert db.query(workload_key=a.workload_key, device_key=a.device_key) == [a, d]
    assert db.query(op="matmul", target="llvm", status="timeout") == []
    assert db.query(limit=2) == [a, b]
    assert db.query(limit=0) == []


def test_query_rejects_bad_filter_values(db: Database) -> None:
    with pytest.raises(InvalidInputError, match="'bogus'.*ok, invalid"):
        db.query(status="bogus")
    with pytest.raises(InvalidInputError, match="limit=-1"):
        db.query(limit=-1)


def test_best_returns_ok_records_fastest_first(db: Database) -> None:
    lats = [4e-3, 1e-3, 3e-3, 2e-3]
    records = [make_record(i, latency=lat) for i, lat in enumerate(lats)]
    failed = make_record(10, status="wrong_result")
    other_driver = make_record(11, driver="4.0", latency=0.5e-3)
    other_device = make_record(12, device_name="gpu", latency=0.1e-3)
    other_target = make_record(13, target="llvm", latency=0.2e-3)
    db.add([*records, failed, other_driver, other_device, other_target])
    wk, dk, fam = records[0].workload_key, records[0].device_key, records[0].device_family

    best = db.best(wk, device_key=dk, k=10)
    assert [r.latency_s for r in best] == sorted(lats)
    assert all(r.ok for r in best)
    assert db.best(wk, device_key=dk) == [records[1]]
    assert db.best(wk, device_family=fam, k=2) == [other_driver, records[1]]
    assert db.best(wk) == [other_device]
    assert db.best(wk, target="llvm") == [other_target]
    assert db.best(wk, device_key=dk, device_family=fam, target="opencl") == [records[1]]
    assert db.best(wk, device_key=dk, target="llvm") == []
    assert db.best("matmul-unknown") == []
    with pytest.raises(InvalidInputError, match="k=0"):
        db.best(wk, k=0)


def test_best_breaks_latency_ties_by_id(db: Database) -> None:
    records = [make_record(i, latency=1e-3) for i in range(3)]
    db.add(records)
    assert db.best(records[0].workload_key, k=3) == records


def test_duplicate_add_is_idempotent(db: Database) -> None:
    records = [make_record(i) for i in range(3)]
    ids = db.add(records)
    assert db.add(records) == ids
    assert db.add([records[1], make_record(7)])[0] == ids[1]
    assert len(db) == 4
    # a duplicate inside one batch is stored once too
    again = db.add([make_record(8), make_record(8)])
    assert again[0] == again[1]
    assert len(db) == 5
    # same config and run at another time is another measurement
    db.add([make_record(0, timestamp=5.0)])
    assert len(db) == 6
    assert db.add([]) == []


def test_measured_config_keys(db: Database) -> None:
    a = make_record(0)
    db.add(
        [
            a,
            make_record(1, status="build_error"),
            make_record(1, run_id="run-2"),
            make_record(2, driver="4.0"),
            make_record(3, target="llvm"),
            make_record(4, m=256),
        ]
    )
    keys = db.measured_config_keys(a.workload_key, device_key=a.device_key, target="opencl")
    assert keys == {"cfg-0000", "cfg-0001"}
    assert db.measured_config_keys(a.workload_key, device_key="nope", target="opencl") == set()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (make_record(5, status="exploded"), "status 'exploded'"),
        (make_record(5, status="ok", latency=math.nan), "latencies are"),
        (
            Record(**{**make_record(5).__dict__, "workload": {"params": {}}}),
            "op None",
        ),
        (Record(**{**make_record(5).__dict__, "latency_s": None}), "latency_s is None"),
        (Record(**{**make_record(5).__dict__, "config": {"f": object()}}), "config"),
        (Record(**{**make_record(5).__dict__, "device_key": ""}), "device_key"),
    ],
)
def test_batch_with_an_invalid_record_stores_nothing(
    db: Database, bad: Record, message: str
) -> None:
    db.add([make_record(100)])
    with pytest.raises(InvalidInputError, match=message) as info:
        db.add([make_record(0), make_record(1), bad, make_record(2)])
    assert "record 2 of the batch" in str(info.value)
    assert len(db) == 1
    # the connection is usable afterwards
    db.add([make_record(0)])
    assert len(db) == 2


def test_measurement_times_and_worker_round_trip_exactly(db: Database) -> None:
    start = 1_763_900_000.123456  # epoch seconds with microseconds: REAL would lose them
    timed = Record(
        **{
            **make_record(0).__dict__,
            "started_at": start,
            "ended_at": start + 0.000731,
            "worker": "node-7:4242",
        }
    )
    untimed = make_record(1)
    ids = db.add([timed, untimed])
    got = db.query()
    assert got == [timed, untimed] and [r.id for r in got] == ids
    assert got[0].started_at == start and got[0].ended_at == start + 0.000731
    assert got[1].started_at is None and got[1].ended_at is None and got[1].worker == ""
    # the times are not part of the identity: the same measurement with times is a duplicate
    assert db.add([Record(**{**untimed.__dict__, "worker": "other"})]) == [ids[1]]
    assert db.best(timed.workload_key, k=1)[0].worker == "node-7:4242"


def test_latest_round_is_the_last_side_by_side_round_that_measured_the_config(
    db: Database,
) -> None:
    def reading(i: int, ms: float, run: str, at: float, rounds: int = 3, **kw) -> Record:
        return make_record(
            i, latency=ms * 1e-3, run_id=run, timestamp=at, started_at=at, rounds=rounds, **kw
        )

    first = [reading(0, 1.1, "r1", 10.0), reading(1, 1.0, "r1", 10.0), reading(2, 1.2, "r1", 10.0)]
    second = [reading(0, 0.9, "r2", 20.0), reading(2, 1.3, "r2", 20.0)]
    search = [reading(1, 0.5, "r2", 30.0, rounds=0)]  # a later search reading: not a round
    other = [reading(1, 0.1, "r3", 40.0, driver="9.9")]  # another device's round
    failed = [
        Record(**{**reading(1, 1.0, "r4", 50.0).__dict__, "status": "timeout", "latency_s": None})
    ]
    db.add(first + second + search + other + failed)
    w, d = first[0].workload_key, first[0].device_key

    def latest(i: int) -> list[tuple[str, str]]:
        got = db.latest_round(w, device_key=d, config_key=f"cfg-{i:04d}")
        return [(r.config_key, r.run_id) for r in got]

    assert latest(1) == [("cfg-0001", "r1"), ("cfg-0000", "r1"), ("cfg-0002", "r1")]
    assert latest(0) == latest(2) == [("cfg-0000", "r2"), ("cfg-0002", "r2")]
    assert latest(7) == []
    with pytest.raises(InvalidInputError, match="config_key"):
        db.latest_round(w, device_key=d, config_key=None)  # type: ignore[arg-type]


def test_rounds_round_trip_and_are_checked(db: Database) -> None:
    final = make_record(0, started_at=5.0, rounds=3)
    search = make_record(1)
    db.add([final, search])
    assert [r.rounds for r in db.query()] == [3, 0]
    assert db.query()[0] == final
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(InvalidInputError, match="record rounds is"):
            db.add([Record(**{**make_record(2).__dict__, "rounds": bad})])
    assert len(db.query()) == 2


def test_context_manager_closes(target: str) -> None:
    with open_database(target) as database:
        database.add([make_record(0)])
    with pytest.raises(RecordsError, match="closed"):
        database.query()
    database.close()  # twice is harmless


# -- SQLite specifics ------------------------------------------------------------------------


def test_file_persists_and_has_wal_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "records.db"
    with SQLiteDatabase(path) as database:
        database.add([make_record(i) for i in range(3)])
    with SQLiteDatabase(path) as database:
        assert len(database) == 3
        assert database.best(make_record(0).workload_key)[0].config_key == "cfg-0000"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert int(version[0]) == SCHEMA_VERSION
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM records WHERE status = 'ok' AND latency_s IS NOT NULL "
        "AND workload_key = ? AND device_family = ? ORDER BY latency_s, id LIMIT 1",
        ("w", "f"),
    ).fetchall()
    assert "records_best_family" in str(plan)
    conn.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    SQLiteDatabase(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(RecordsError, match="schema version 99"):
        SQLiteDatabase(path)


# The layout of schema version 1, as autosched wrote it before the measurement times.
_SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload_key TEXT NOT NULL, workload TEXT NOT NULL, target TEXT NOT NULL,
    device_key TEXT NOT NULL, device_family TEXT NOT NULL, device TEXT NOT NULL,
    config_key TEXT NOT NULL, config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN
        ('ok', 'invalid', 'build_error', 'run_error', 'timeout', 'wrong_result')),
    error TEXT NOT NULL, latencies TEXT NOT NULL,
    latency_s REAL, spread REAL, gflops REAL, timestamp REAL NOT NULL,
    run_id TEXT NOT NULL, op TEXT NOT NULL,
    UNIQUE (workload_key, device_key, config_key, timestamp, run_id)
);
CREATE INDEX records_best_device ON records (workload_key, device_key, latency_s)
    WHERE status = 'ok' AND latency_s IS NOT NULL;
CREATE INDEX records_measured ON records (workload_key, device_key, target, config_key);
INSERT INTO meta VALUES ('schema_version', '1');
"""


def _old_database(path: Path, records: list[Record]) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V1)
    for r in records:
        conn.execute(
            "INSERT INTO records (workload_key, workload, target, device_key, device_family, "
            "device, config_key, config, status, error, latencies, latency_s, spread, gflops, "
            "timestamp, run_id, op) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                r.workload_key,
                canonical_json(r.workload),
                r.target,
                r.device_key,
                r.device_family,
                canonical_json(r.device),
                r.config_key,
                canonical_json(r.config),
                r.status,
                r.error,
                canonical_json(list(r.latencies)),
                r.latency_s,
                r.spread,
                r.gflops,
                r.timestamp,
                r.run_id,
                r.op,
            ),
        )
    conn.commit()
    conn.close()


def test_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = [make_record(i) for i in range(3)]
    _old_database(path, old)
    with SQLiteDatabase(path) as database:
        assert database.query() == old
        assert database.add(old) == [1, 2, 3]  # still the same measurements
        timed = Record(**{**make_record(3).__dict__, "started_at": 5.5, "worker": "w"})
        database.add([timed])
        assert database.query()[3] == timed
        assert database.best(old[0].workload_key)[0] == old[0]
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    columns = [row[1] for row in conn.execute("PRAGMA table_info(records)")]
    conn.close()
    assert int(version[0]) == SCHEMA_VERSION == 3
    assert columns[-4:] == ["started_at", "ended_at", "worker", "rounds"]
    assert [r.rounds for r in old] == [0, 0, 0]
    with SQLiteDatabase(path) as database:  # opening again changes nothing
        assert len(database) == 4


def test_processes_upgrading_one_old_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_database(path, [make_record(i) for i in range(3)])
    code = (
        "import sys, time\n"
        "from autosched.records.sqlite import SQLiteDatabase\n"
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
        "with SQLiteDatabase(sys.argv[1]) as db:\n"
        "    print(len(db))\n"
    )
    go = str(time.time() + 1.0)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), go], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [child.communicate(timeout=60)[0] for child in children]
    assert [child.returncode for child in children] == [0] * 4
    assert [out.strip() for out in outputs] == ["3"] * 4
    with SQLiteDatabase(path) as database:
        assert database.query()[0].worker == ""


def _assert_open_error(path: Path | str, reason: str) -> None:
    with pytest.raises(RecordsError) as info:
        SQLiteDatabase(path)
    text = str(info.value)
    assert "\n" not in text
    assert str(path) in text and reason in text, text
    assert text.startswith("cannot open records database")


def test_path_under_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a folder")
    _assert_open_error(tmp_path / "plain" / "x.db", "is not a directory")
    _assert_open_error(tmp_path / "plain" / "a" / "b" / "x.db", "is not a directory")


def test_directory_path_is_refused(tmp_path: Path) -> None:
    _assert_open_error(tmp_path, "is a directory")


def test_non_database_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("hello, this is not SQLite " * 100)
    _assert_open_error(path, "not a database")


def test_folder_that_refuses_new_files_is_refused() -> None:
    # sysfs refuses new files to every user, root included (a chmod 0500 folder does not
    # stop root, and access() says root may write there).
    path = Path("/sys") / "autosched-records.db"
    _assert_open_error(path, "permission denied")
    assert not path.exists()


def test_missing_file_without_create(tmp_path: Path) -> None:
    with pytest.raises(RecordsError, match="does not exist"):
        SQLiteDatabase(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_default_db_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "autosched" / "records.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_db_path() == Path.home() / ".local" / "share" / "autosched" / "records.db"


_WRITER = r"""
import sys
from autosched.records.record import Record
from autosched.records.sqlite import SQLiteDatabase

path, tag, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
db = SQLiteDatabase(path)
workload = {"op": "matmul", "params": {"M": 64, "N": 64, "K": 64, "epilogue": "none"},
            "dtype": "float32"}
device = {"platform": "Portable Computing Language", "device": "cpu", "driver_version": "3.1"}
b = 0
while batches < 0 or b < batches:
    db.add([
        Record(workload_key="matmul-k", workload=workload, target="opencl", device_key="d",
               device_family="f", device=device, config_key=f"c{i}", config={"i": i},
               status="ok", latencies=(1e-3,), latency_s=1e-3 + i * 1e-6, timestamp=float(b),
               run_id=f"{tag}-{b}")
        for i in range(size)
    ])
    b += 1
    if b == 1:
        print("ready", flush=True)
"""


def _writer(path: Path, tag: str, batches: int, size: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), tag, str(batches), str(size)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("delay", [1.0, 0.37])
def test_sigkill_mid_write_leaves_a_consistent_database(tmp_path: Path, delay: float) -> None:
    path = tmp_path / "killed.db"
    child = _writer(path, "kill", -1, 50)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        assert child.poll() is None, "the writer stopped before it was killed"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    count = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    per_batch = {n for (n,) in conn.execute("SELECT COUNT(*) FROM records GROUP BY run_id")}
    conn.close()
    assert count >= 50 and count % 50 == 0, count
    assert per_batch == {50}
    with SQLiteDatabase(path) as database:
        assert len(database) == count
        database.add([make_record(0)])
        assert len(database) == count + 1


def test_several_processes_write_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    SQLiteDatabase(path).close()
    writers = [_writer(path, f"w{n}", 20, 10) for n in range(3)]
    for writer in writers:
        writer.communicate(timeout=60)
        assert writer.returncode == 0
    with SQLiteDatabase(path) as database:
        assert len(database) == 3 * 20 * 10
