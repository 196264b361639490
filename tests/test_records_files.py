"""Records as files: JSON Lines export/import, merge, stats, prune, and the CLI, over
an SQLite file and a PostgreSQL database; records moved between the two."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autosched.cli import records_cmd
from autosched.errors import InvalidInputError, RecordsError
from autosched.records import Database, open_database
from autosched.records.files import (
    STATS_COLUMNS,
    ImportReport,
    export_jsonl,
    import_jsonl,
    merge,
    parse_line,
    prune,
    stats,
)
from autosched.records.record import STATUSES, Record, canonical_json
from autosched.records.sqlite import SQLiteDatabase
from tests.records_factory import make_record


def sample_records() -> list[Record]:
    """Two workloads x two devices, ok and failed records mixed."""
    records = []
    for m in (64, 128):
        for device_name in ("cpu", "gpu"):
            for i in range(5):
                status = "ok" if i < 3 else ("build_error" if i == 3 else "timeout")
                records.append(make_record(i, m=m, device_name=device_name, status=status))
    records.append(make_record(20, target="llvm"))
    return records


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each backend: a path or a URL."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "records.db")


@pytest.fixture
def db(target: str) -> Iterator[Database]:
    with open_database(target) as database:
        yield database


@pytest.fixture
def full_db(db: Database) -> Database:
    db.add(sample_records())
    return db


# -- export / import ------------------------------------------------------------------------


def test_export_import_round_trip(full_db: Database, tmp_path: Path) -> None:
    out = tmp_path / "out" / "records.jsonl"
    assert export_jsonl(full_db, out) == len(full_db)
    lines = out.read_text().splitlines()
    assert len(lines) == len(full_db)
    for line in lines:
        data = json.loads(line)
        assert canonical_json(data) == line
        assert data["format_version"] == 1

    with SQLiteDatabase(tmp_path / "copy.db") as copy:
        report = import_jsonl(copy, out)
        assert report == ImportReport(added=len(full_db), duplicates=0, errors=())
        assert copy.query() == full_db.query()


def test_gzip_export_and_import(full_db: Database, tmp_path: Path) -> None:
    """A path ending .gz is exported gzip-compressed, the same bytes each time; import
    tells gzip by its first bytes whatever the name, and a file cut short is refused
    whole, naming it, with nothing added."""
    out = tmp_path / "records.jsonl.gz"
    assert export_jsonl(full_db, out) == len(full_db)
    packed = out.read_bytes()
    assert packed[:2] == b"\x1f\x8b"
    assert len(gzip.decompress(packed).decode().splitlines()) == len(full_db)
    again = tmp_path / "again.jsonl.gz"
    export_jsonl(full_db, again)
    assert again.read_bytes() == packed  # no time stamp in the header
    renamed = tmp_path / "records.jsonl"  # gzip data under a plain name
    renamed.write_bytes(packed)
    for source in (out, renamed):
        with SQLiteDatabase(tmp_path / f"{source.name}.db") as copy:
            assert import_jsonl(copy, source) == ImportReport(len(full_db), 0, ())
            assert copy.query() == full_db.query()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with SQLiteDatabase(tmp_path / "cut.db") as copy:
        with pytest.raises(InvalidInputError, match=r"cut\.jsonl\.gz is gzip data cut short"):
            import_jsonl(copy, cut)
        assert len(copy) == 0


def test_measurement_times_travel_through_files_and_stay_out_when_unset(
    db: Database, tmp_path: Path
) -> None:
    timed = Record(
        **{**make_record(0).__dict__, "started_at": 1.7e9 + 0.5, "ended_at": 1.7e9 + 0.75}
    )
    db.add([timed, make_record(1)])
    out = tmp_path / "t.jsonl"
    export_jsonl(db, out)
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["started_at"] == 1.7e9 + 0.5 and "worker" not in first
    # a record without them is written as before, so older versions still import it
    assert not {"started_at", "ended_at", "worker"} & set(second)
    assert parse_line(canonical_json(first)) == timed
    with SQLiteDatabase(tmp_path / "copy.db") as copy:
        assert import_jsonl(copy, out).added == 2
        assert copy.query() == db.query()


def test_export_to_stream_with_filters(full_db: Database) -> None:
    buffer = io.StringIO()
    assert export_jsonl(full_db, buffer, target="llvm") == 1
    assert json.loads(buffer.getvalue())["target"] == "llvm"
    buffer = io.StringIO()
    gpu = make_record(0, device_name="gpu")
    count = export_jsonl(full_db, buffer, device_family=gpu.device_family, status="timeout")
    assert count == 2
    with pytest.raises(InvalidInputError, match="'bogus'"):
        export_jsonl(full_db, io.StringIO(), status="bogus")


def test_export_to_unwritable_path(full_db: Database, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    with pytest.raises(RecordsError, match="cannot write records file"):
        export_jsonl(full_db, tmp_path / "plain" / "out.jsonl")


def test_import_twice_adds_nothing(full_db: Database, tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    export_jsonl(full_db, out)
    with SQLiteDatabase(tmp_path / "copy.db") as copy:
        first = import_jsonl(copy, out)
        second = import_jsonl(copy, out)
        assert first.added == len(full_db)
        assert second == ImportReport(added=0, duplicates=len(full_db))
        assert len(copy) == len(full_db)
    # and into the database it came from
    assert import_jsonl(full_db, out).added == 0


def test_malformed_lines_are_reported_and_good_lines_kept(db: Database, tmp_path: Path) -> None:
    good = [make_record(i) for i in range(4)]

    def line(record: Record, **changes: Any) -> str:
        data = record.to_json()
        data.update(changes)
        return canonical_json(data)

    missing = good[0].to_json()
    del missing["status"], missing["config_key"]
    lines = [
        line(good[0]),  # 1
        "{not json",  # 2
        line(good[1]),  # 3
        "",  # 4 blank
        canonical_json(missing),  # 5
        line(make_record(7), format_version=2),  # 6
        line(make_record(8), status="exploded"),  # 7
        "[1, 2, 3]",  # 8
        line(make_record(9), colour="blue"),  # 9
        line(make_record(10), latency_s=None),  # 10
        "   ",  # 11 blank
        line(good[2]),  # 12
        line(make_record(11), workload={"params": {}}),  # 13
        line(good[3]),  # 14
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = import_jsonl(db, path)
    assert report.added == 4 and report.duplicates == 0
    assert [n for n, _ in report.errors] == [2, 5, 6, 7, 8, 9, 10, 13]
    messages = dict(report.errors)
    assert "not JSON" in messages[2]
    assert "config_key" in messages[5] and "status" in messages[5]
    assert "format_version 2" in messages[6]
    assert "'exploded'" in messages[7]
    assert "JSON object" in messages[8]
    assert "colour" in messages[9]
    assert "latency_s is None" in messages[10]
    assert "op" in messages[13]
    assert db.query() == good
    assert str(report) == "added 4, duplicates 0, rejected 8"


def test_import_from_a_stream_and_bad_bytes(db: Database, tmp_path: Path) -> None:
    stream = io.StringIO(canonical_json(make_record(0).to_json()) + "\n\n")
    assert import_jsonl(db, stream) == ImportReport(added=1)
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"  # a byte-order mark is tolerated
        + canonical_json(make_record(1).to_json()).encode()
        + b"\n\xff\xfe bad bytes\n"
    )
    report = import_jsonl(db, path)
    assert report.added == 1
    assert report.errors == ((2, "not UTF-8 text"),)


def test_import_missing_file(db: Database, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="missing.jsonl does not exist"):
        import_jsonl(db, tmp_path / "missing.jsonl")


# -- merge ----------------------------------------------------------------------------------


def test_merge_is_a_union_and_idempotent(tmp_path: Path) -> None:
    a = SQLiteDatabase(tmp_path / "a.db")
    b = SQLiteDatabase(tmp_path / "b.db")
    a.add([make_record(i) for i in range(5)])
    b.add([make_record(i) for i in range(3, 8)])
    with SQLiteDatabase(tmp_path / "dst.db") as dst:
        dst.add([make_record(0)])
        report = merge(dst, [a, b])
        assert report == ImportReport(added=7, duplicates=3)
        assert {r.config_key for r in dst.query()} == {f"cfg-{i:04d}" for i in range(8)}
        a.close()
        b.close()
        again = merge(dst, [tmp_path / "a.db", str(tmp_path / "b.db")])
        assert again.added == 0 and again.duplicates == 10
        assert len(dst) == 8
        with pytest.raises(RecordsError, match="does not exist"):
            merge(dst, [tmp_path / "nope.db"])
    assert not (tmp_path / "nope.db").exists()


# -- stats ----------------------------------------------------------------------------------


def test_stats_columns_and_values(full_db: Database) -> None:
    table = stats(full_db)
    assert tuple(table.columns) == STATS_COLUMNS
    assert len(table) == 5  # 2 workloads x 2 devices on opencl + 1 llvm
    row = table[(table.params == "K=64,M=64,N=64,epilogue=none") & (table.device == "cpu")]
    row = row[row.target == "opencl"].iloc[0]
    assert row["n"] == 5 and row["ok"] == 3
    assert row["build_error"] == 1 and row["timeout"] == 1 and row["run_error"] == 0
    assert row["best_latency_s"] == pytest.approx(1e-3)
    assert row["best_gflops"] == pytest.approx(2 * 64**3 / 1e-3 / 1e9)
    assert table["n"].sum() == len(full_db)

    only_errors = stats(full_db, status="timeout")
    assert (only_errors["ok"] == 0).all() and only_errors["best_gflops"].isna().all()
    empty = stats(full_db, op="conv2d")
    assert empty.empty and tuple(empty.columns) == STATS_COLUMNS


def test_stats_keeps_two_cpus_of_one_name_apart(db: Database) -> None:
    """A cloud VM names a Zen 4 and a Zen 5 both "AMD EPYC": one row each, the device
    named with its model; one device under two driver versions shares a row."""

    def on(cpu: str, i: int, latency: float, driver: str = "3.1") -> Record:
        r = make_record(i, device_name="AMD EPYC", driver=driver, latency=latency)
        device = {**r.device, "host_cpu": cpu}
        family = f"{r.device_family}-{cpu}"
        return Record(**{**r.__dict__, "device": device, "device_family": family})

    zen4, zen5 = "AuthenticAMD family 25 model 17", "AuthenticAMD family 26 model 2"
    db.add([on(zen4, 0, 2e-3), on(zen4, 1, 3e-3, driver="3.2"), on(zen5, 2, 1e-3)])
    table = stats(db)
    assert list(table.device) == ["AMD EPYC (family 25 model 17)", "AMD EPYC (family 26 model 2)"]
    assert list(table.n) == [2, 1]
    assert list(table.best_latency_s) == pytest.approx([2e-3, 1e-3])


# -- prune ----------------------------------------------------------------------------------


def test_prune_keep_top_and_drop_errors(full_db: Database) -> None:
    total = len(full_db)
    assert prune(full_db, keep_top=1, dry_run=True) == 8
    assert len(full_db) == total
    assert prune(full_db, keep_top=1) == 8  # 4 groups of 3 ok records keep 1 each
    assert len(full_db) == total - 8
    groups = {(r.workload_key, r.target, r.device_key) for r in full_db.query(status="ok")}
    for workload_key, target, device_key in groups:
        kept = full_db.query(workload_key=workload_key, target=target, device_key=device_key)
        fastest = "cfg-0020" if target == "llvm" else "cfg-0000"
        assert [r.config_key for r in kept if r.ok] == [fastest]
    assert prune(full_db, drop_errors=True, status=None, target="llvm") == 0
    assert prune(full_db, drop_errors=True) == 8
    assert all(r.ok for r in full_db.query())
    assert prune(full_db, keep_top=1, drop_errors=True) == 0


def test_prune_respects_filters(full_db: Database) -> None:
    gpu = make_record(0, device_name="gpu")
    removed = prune(full_db, drop_errors=True, device_family=gpu.device_family)
    assert removed == 4
    assert {r.device["device"] for r in full_db.query() if not r.ok} == {"cpu"}


def test_prune_rejects_bad_options(full_db: Database) -> None:
    with pytest.raises(InvalidInputError, match="nothing to prune"):
        prune(full_db)
    with pytest.raises(InvalidInputError, match="keep_top=0"):
        prune(full_db, keep_top=0)


# -- the CLI --------------------------------------------------------------------------------


def _cli(*argv: str | Path) -> int:
    parser = argparse.ArgumentParser(prog="autosched")
    subparsers = parser.add_subparsers(dest="command", required=True)
    records_cmd.add_parser(subparsers)
    args = parser.parse_args([str(a) for a in argv])
    assert args.func is records_cmd.run
    return records_cmd.run(args)


def test_cli_export_import_merge(
    full_db: Database, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = target
    out = tmp_path / "all.jsonl"
    assert _cli("records", "export", "--db", src, "-o", out) == 0
    assert len(out.read_text().splitlines()) == len(full_db)
    capsys.readouterr()

    assert _cli("records", "export", "--db", src, "--target", "llvm") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["target"] == "llvm"
    assert "exported 1 records" in captured.err

    bad = tmp_path / "bad.jsonl"
    bad.write_text(out.read_text().splitlines()[0] + "\n{oops\n")
    dst = tmp_path / "new" / "dst.db"
    assert _cli("records", "import", "--db", dst, out, bad) == 2
    captured = capsys.readouterr()
    n = len(full_db)
    assert captured.out.strip() == f"added {n}, duplicates 1, rejected 1"
    assert f"{bad}:2: rejected: not JSON" in captured.err
    assert _cli("records", "import", "--db", dst, out) == 0
    assert capsys.readouterr().out.strip() == f"added 0, duplicates {n}, rejected 0"

    other = tmp_path / "other.db"
    with SQLiteDatabase(other) as database:
        database.add([make_record(50), make_record(0)])
    assert _cli("records", "merge", "--db", dst, other, src) == 0
    assert capsys.readouterr().out.strip() == f"added 1, duplicates {n + 1}"


def test_cli_stats_and_prune(
    full_db: Database, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = target
    json_path = tmp_path / "stats.json"
    assert _cli("records", "stats", "--db", src, "--op", "matmul", "--json", json_path) == 0
    printed = capsys.readouterr().out
    assert "best_gflops" in printed and "K=64,M=128,N=64,epilogue=none" in printed
    rows = json.loads(json_path.read_text())
    assert len(rows) == 5 and set(rows[0]) == set(STATS_COLUMNS)
    assert sum(row["n"] for row in rows) == len(full_db)

    assert _cli("records", "stats", "--db", src, "--op", "conv2d") == 0
    assert capsys.readouterr().out.strip() == "no records match"

    total = len(full_db)
    assert _cli("records", "prune", "--db", src, "--drop-errors", "--dry-run") == 0
    assert capsys.readouterr().out.strip() == "would remove 8 records"
    assert len(full_db) == total
    assert _cli("records", "prune", "--db", src, "--keep-top", "2", "--drop-errors") == 0
    assert capsys.readouterr().out.strip() == "removed 12 records"
    assert len(full_db) == total - 12


def test_cli_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    # read-only actions do not create the default database
    with pytest.raises(RecordsError, match=r"xdg/autosched/records\.db does not exist"):
        _cli("records", "stats")
    with pytest.raises(InvalidInputError, match="nothing to prune"):
        with SQLiteDatabase(tmp_path / "r.db"):
            pass
        _cli("records", "prune", "--db", tmp_path / "r.db")
    with pytest.raises(InvalidInputError, match="keep_top=0"):
        _cli("records", "prune", "--db", tmp_path / "r.db", "--keep-top", "0")
    with pytest.raises(InvalidInputError, match="nope.jsonl does not exist"):
        _cli("records", "import", tmp_path / "nope.jsonl")
    with pytest.raises(InvalidInputError, match="nope.db does not exist"):
        _cli("records", "merge", "--db", tmp_path / "r.db", tmp_path / "nope.db")
    with pytest.raises(SystemExit) as info:
        _cli("records", "export", "--status", "great")
    assert info.value.code == 2
    # import creates the default database under XDG_DATA_HOME
    jsonl = tmp_path / "one.jsonl"
    jsonl.write_text(canonical_json(make_record(0).to_json()) + "\n")
    assert _cli("records", "import", jsonl) == 0
    assert (tmp_path / "xdg" / "autosched" / "records.db").is_file()


def test_stats_best_values_ignore_missing_gflops(db: Database) -> None:
    record = make_record(0)
    db.add([Record(**{**record.__dict__, "gflops": None})])
    row = stats(db).iloc[0]
    assert math.isnan(row["best_gflops"]) and row["best_latency_s"] == pytest.approx(1e-3)
    assert set(STATUSES) <= set(stats(db).columns)
