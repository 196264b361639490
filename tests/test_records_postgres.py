"""PostgreSQL specifics, with real processes on a real server: concurrent writers, a
server restarted mid-batch, two processes creating the schema at once, passwords kept
out of every message; the opener; records moved SQLite -> PostgreSQL -> file and back.

The contract itself runs over PostgreSQL in test_records.py and test_records_files.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from autosched.cli import records_cmd
from autosched.errors import InvalidInputError, RecordsError
from autosched.records import Record, open_database
from autosched.records.opener import describe, sqlite_path
from autosched.records.postgres import SCHEMA_VERSION, PostgresDatabase, redact
from autosched.records.sqlite import SQLiteDatabase
from tests.pg_server import PASSWORD_USER, PgServer
from tests.records_factory import make_record

ROOT = Path(__file__).resolve().parent.parent
# The role's password has characters that URLs must escape.
PASSWORD = "s3cr3t:P@55/x"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )


# -- several writer processes -------------------------------------------------------------

_WRITER = r"""
import json, sys, time
import numpy as np
from autosched.records import open_database
from tests.records_factory import make_record

url, seed, go = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
pool = [make_record(i, latency=1e-3 + i * 1e-6) for i in range(120)]
order = np.random.default_rng(seed).permutation(len(pool))
db = open_database(url)
time.sleep(max(0.0, go - time.time()))
ids, added = {}, 0
for start in range(0, len(order), 15):
    # overlapping batches: each one repeats the previous batch's last five records
    batch = [pool[i] for i in order[max(0, start - 5):start + 15]]
    got, new = db.add_counting(batch)
    added += new
    ids.update((r.config_key, i) for r, i in zip(batch, got))
db.close()
print(json.dumps({"added": added, "ids": ids}))
"""


def test_concurrent_writers_store_every_record_exactly_once(pg_url: str) -> None:
    open_database(pg_url).close()  # the schema, so the writers race on records only
    go = str(time.time() + 1.5)
    writers = [_spawn(_WRITER, pg_url, str(seed), go) for seed in range(4)]
    results = []
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        results.append(json.loads(out))
    with open_database(pg_url) as db:
        stored = db.query()
    assert len(stored) == 120
    assert len({r.config_key for r in stored}) == 120
    assert sum(r["added"] for r in results) == 120  # each record added by exactly one writer
    truth = {r.config_key: r.id for r in stored}
    for result in results:  # every writer was told the stored record's id
        assert result["ids"] == truth
    assert stored == sorted(stored, key=lambda r: r.id)


# -- a server restarted while a writer is in its transaction --------------------------------

_ONE_BATCH = r"""
import json, logging, sys
from autosched.records.postgres import PostgresDatabase
from tests.records_factory import make_record

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
db = PostgresDatabase(sys.argv[1], timeout=90.0)
print("ready", flush=True)
ids, added = db.add_counting([make_record(i, run_id="restart") for i in range(50)])
print(json.dumps({"ids": ids, "added": added}), flush=True)
"""


def _wait_for(predicate, what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_server_restart_mid_batch_stores_the_batch_once(pg_server: PgServer, pg_url: str) -> None:
    open_database(pg_url).close()
    admin = psycopg.connect(pg_url, autocommit=True)
    # Hold every key bucket, so the writer blocks inside its transaction.
    admin.execute("SELECT pg_advisory_lock(k) FROM generate_series(0, 1023) AS k")
    writer = _spawn(_ONE_BATCH, pg_url)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"

        def writer_waits() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'autosched' "
                "AND wait_event_type = 'Lock' AND state = 'active'"
            ).fetchone()
            return row is not None and row[0] == 1

        _wait_for(writer_waits, "the writer to block in its transaction")
        pg_server.restart(pause_s=1.0, mode="immediate")  # like a crash of the server
        out, err = writer.communicate(timeout=120)
    finally:
        writer.kill()
        admin.close()
    assert writer.returncode == 0, err
    assert "retrying" in err  # it did fail over, and the retry did the work
    result = json.loads(out.strip().splitlines()[-1])
    assert result["added"] == 50
    with open_database(pg_url) as db:
        stored = db.query()
    assert [r.id for r in stored] == result["ids"]
    assert stored == [make_record(i, run_id="restart") for i in range(50)]


def test_lost_commit_acknowledgement_is_retried_without_duplicates(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The commit lands, then the connection drops before the client hears of it: the
    # retry must find the rows, not store them twice. (The real failure needs a network
    # fault at the exact moment; the restart test above covers a real dropped server.)
    db = PostgresDatabase(pg_url)
    real_insert = PostgresDatabase._insert
    calls = []

    def commit_then_lose(conn, batch):
        calls.append(len(batch))
        result = real_insert(conn, batch)
        if len(calls) == 1:
            conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(PostgresDatabase, "_insert", staticmethod(commit_then_lose))
    records = [make_record(i) for i in range(10)]
    ids, added = db.add_counting(records)
    assert calls == [10, 10]
    assert added == 0  # the second attempt found them all: stored by the first
    assert db.query() == records and [r.id for r in db.query()] == ids
    db.close()


def test_terminated_session_reconnects(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with open_database(pg_url) as db, psycopg.connect(pg_url, autocommit=True) as admin:
        db.add([make_record(0)])
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'autosched'"
        )
        with caplog.at_level(logging.WARNING, logger="autosched.records.postgres"):
            db.add([make_record(1)])
            assert len(db) == 2
        assert "retrying" in caplog.text


# -- the schema ---------------------------------------------------------------------------

_OPENER = r"""
import sys, time
from autosched.records import open_database
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
with open_database(sys.argv[1]) as db:
    print(len(db))
"""


def test_processes_creating_the_schema_at_once(pg_url: str) -> None:
    go = str(time.time() + 1.5)
    openers = [_spawn(_OPENER, pg_url, go) for _ in range(4)]
    for opener in openers:
        out, err = opener.communicate(timeout=60)
        assert opener.returncode == 0, err
        assert out.strip() == "0"
    with psycopg.connect(pg_url) as conn:
        versions = conn.execute("SELECT value FROM records_meta").fetchall()
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename IN ('records', 'records_meta')"
        ).fetchone()
    assert versions == [(str(SCHEMA_VERSION),)] and tables == (2,)


def test_times_are_double_precision(pg_url: str) -> None:
    open_database(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        types = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'records' AND column_name IN "
                "('timestamp', 'started_at', 'ended_at', 'latency_s', 'id')"
            ).fetchall()
        )
    assert types == {
        "id": "bigint",
        "timestamp": "double precision",
        "started_at": "double precision",
        "ended_at": "double precision",
        "latency_s": "double precision",
    }


def test_best_reads_a_partial_index(pg_url: str) -> None:
    with open_database(pg_url) as db:
        db.add([make_record(i) for i in range(20)])
    with psycopg.connect(pg_url) as conn:
        partial = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'records' "
            "AND indexdef LIKE '%WHERE ((status = ''ok''::text) AND (latency_s IS NOT NULL))'"
        ).fetchall()
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(
            "EXPLAIN SELECT id FROM records WHERE status = 'ok' AND latency_s IS NOT NULL "
            "AND workload_key = 'w' AND device_family = 'f' ORDER BY latency_s, id LIMIT 1"
        ).fetchall()
    assert sorted(name for (name,) in partial) == [
        "records_best_device",
        "records_best_family",
        "records_best_workload",
    ]
    assert "records_best_" in str(plan)  # the literal ok-row condition matches them


def test_version_1_tables_are_upgraded_in_place(pg_url: str) -> None:
    old = [make_record(i) for i in range(3)]
    with open_database(pg_url) as db:
        db.add(old)
    with psycopg.connect(pg_url) as conn:  # back to version 1: no rounds column
        conn.execute("ALTER TABLE records DROP COLUMN rounds")
        conn.execute("UPDATE records_meta SET value = '1'")
    with open_database(pg_url) as db:
        assert db.query() == old
        final = make_record(3, started_at=9.0, rounds=3)
        db.add([final])
        assert db.query()[3] == final
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SELECT value FROM records_meta").fetchall()
    assert version == [(str(SCHEMA_VERSION),)] and SCHEMA_VERSION == 2


def test_newer_schema_is_refused(pg_url: str) -> None:
    open_database(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE records_meta SET value = '99'")
    with pytest.raises(RecordsError, match="schema version 99.*upgrade autosched"):
        open_database(pg_url)


def test_database_without_tables_is_not_created_when_reading(pg_url: str) -> None:
    with pytest.raises(RecordsError, match="holds no records tables"):
        open_database(pg_url, create=False)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('records')").fetchone() == (None,)


def test_missing_psycopg_says_which_extra(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails
    with pytest.raises(RecordsError, match=r"psycopg 3.*autosched\[farm\]"):
        open_database(pg_url)


def test_psycopg_is_imported_only_for_a_server() -> None:
    code = (
        "import sys, autosched.records, autosched.records.files, autosched.tuner\n"
        "from autosched.records import open_database\n"
        "open_database(':memory:').close()\n"
        "print('psycopg' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert done.stdout.strip() == "False", done.stderr


# -- passwords ----------------------------------------------------------------------------


def _password_url(server: PgServer, database: str, password: str = PASSWORD) -> str:
    return (
        f"postgresql://{PASSWORD_USER}:{quote(password, safe='')}@127.0.0.1:"
        f"{server.port}/{database}"
    )


def _assert_hidden(text: str, password: str = PASSWORD) -> None:
    for form in (password, quote(password, safe=""), "P@55"):
        assert form not in text, text


def test_password_appears_in_no_message_repr_or_log(
    pg_server: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    pg_server.psql(f"ALTER ROLE {PASSWORD_USER} PASSWORD '{PASSWORD}'")
    name = pg_server.new_database()
    url = _password_url(pg_server, name)
    caplog.set_level(logging.DEBUG, logger="autosched")
    shown: list[str] = []

    db = open_database(url)
    db.add([make_record(0)])
    assert len(db) == 1  # the password was right
    shown += [repr(db), str(db), db.location, describe(url), redact(url)]
    assert db.location == f"postgresql://{PASSWORD_USER}:***@127.0.0.1:{pg_server.port}/{name}"
    with psycopg.connect(pg_server.url(name)) as admin:  # a dropped session: retried, logged
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'autosched'"
        )
    db.add([make_record(1)])
    db.close()
    failures = [
        lambda: db.query(),  # closed
        lambda: open_database(_password_url(pg_server, name, "WRONG" + PASSWORD)),
        lambda: open_database(_password_url(pg_server, "no_such_database")),
        lambda: open_database(url.replace(f":{pg_server.port}/", ":notaport/")),
        lambda: open_database(
            f"{pg_server.url(name, user=PASSWORD_USER)}?password="
            + quote("WRONG" + PASSWORD, safe="")
        ),
        lambda: open_database(url.replace("postgresql://", "mysql://")),
        lambda: open_database(url, create=False).add([make_record(2, status="nope")]),
    ]
    for fail in failures:
        with pytest.raises((RecordsError, InvalidInputError)) as info:
            fail()
        shown.append(str(info.value))
        shown.append("".join(traceback.format_exception(info.value)))
    assert any("password authentication failed" in text for text in shown)
    assert any("no_such_database" in text for text in shown)
    shown.append(caplog.text)
    assert "retrying" in caplog.text
    for text in shown:
        _assert_hidden(text)
        _assert_hidden(text, "WRONG" + PASSWORD)


# -- the opener ---------------------------------------------------------------------------


def test_opener_forms(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_database("plain.db") as db:
        assert isinstance(db, SQLiteDatabase) and db.path == Path("plain.db")
    with open_database(tmp_path / "p.db") as db:
        assert isinstance(db, SQLiteDatabase)
    with open_database("sqlite:///rel/r.db") as db:  # three slashes: relative
        assert db.path == Path("rel/r.db")
    with open_database(f"sqlite:///{tmp_path}/abs.db") as db:  # four: absolute
        assert db.path == tmp_path / "abs.db"
    with open_database("sqlite:///:memory:") as db:
        assert isinstance(db, SQLiteDatabase) and len(db) == 0
    assert sqlite_path(pg_url) is None
    with open_database(pg_url) as db:
        assert isinstance(db, PostgresDatabase)
    with open_database(pg_url.replace("postgresql://", "postgres://")) as db:
        assert isinstance(db, PostgresDatabase)
    for bad in ("", "mysql://me@host/db", "sqlite://host/x.db", "sqlite://"):
        with pytest.raises(InvalidInputError, match=r"accepted: a file path, sqlite:///PATH"):
            open_database(bad)
    with pytest.raises(RecordsError, match="does not exist"):
        open_database("sqlite:///missing.db", create=False)


def test_unreachable_server_fails_at_once(pg_server: PgServer) -> None:
    port = pg_server.port + 1 if pg_server.port < 65535 else pg_server.port - 1
    start = time.monotonic()
    with pytest.raises(RecordsError, match="cannot open records database postgresql://"):
        open_database(f"postgresql://nobody@127.0.0.1:{port}/x")
    assert time.monotonic() - start < 10


# -- moving records between backends through the CLI ---------------------------------------


def _cli(*argv: str | Path) -> int:
    parser = argparse.ArgumentParser(prog="autosched")
    subparsers = parser.add_subparsers(dest="command", required=True)
    records_cmd.add_parser(subparsers)
    return records_cmd.run(parser.parse_args([str(a) for a in argv]))


def test_cli_moves_records_sqlite_to_postgres_to_file_and_back(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src.db"
    records = [make_record(i, status="ok" if i % 3 else "timeout") for i in range(12)]
    records.append(
        Record(**{**make_record(40).__dict__, "started_at": 1.7e9 + 0.25, "worker": "n1:7"})
    )
    with SQLiteDatabase(src) as db:
        db.add(records)

    assert _cli("records", "merge", "--db", pg_url, src) == 0
    assert capsys.readouterr().out.strip() == "added 13, duplicates 0"
    assert _cli("records", "merge", "--db", pg_url, f"sqlite:///{src}") == 0
    assert capsys.readouterr().out.strip() == "added 0, duplicates 13"

    from_sqlite, from_pg = tmp_path / "sqlite.jsonl", tmp_path / "pg.jsonl"
    assert _cli("records", "export", "--db", src, "-o", from_sqlite) == 0
    assert _cli("records", "export", "--db", pg_url, "-o", from_pg) == 0
    assert from_pg.read_text() == from_sqlite.read_text()  # ids are not exported
    assert len(from_pg.read_text().splitlines()) == 13

    assert _cli("records", "stats", "--db", pg_url, "--status", "timeout") == 0
    assert "timeout" in capsys.readouterr().out

    back = tmp_path / "back.db"
    assert _cli("records", "merge", "--db", back, pg_url) == 0
    assert _cli("records", "import", "--db", back, from_pg) == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        "added 13, duplicates 0",
        "added 0, duplicates 13, rejected 0",
    ]
    with SQLiteDatabase(back) as db, open_database(pg_url) as pg:
        assert db.query() == pg.query() == records

    fresh = pg_url.rsplit("/", 1)[0] + "/postgres"
    with pytest.raises(RecordsError, match="holds no records tables"):
        _cli("records", "export", "--db", fresh)
