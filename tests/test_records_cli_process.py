"""``autosched records import`` and ``export`` in their own processes, as a user runs
them: bad lines named with their numbers, gzip files, exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autosched.records.record import canonical_json
from autosched.records.sqlite import SQLiteDatabase
from tests.records_factory import make_record

SAMPLE = [make_record(i, m=m) for m in (64, 128) for i in range(4)]


def test_cli_import_of_a_file_with_bad_lines_end_to_end(tmp_path: Path) -> None:
    """``autosched records import`` in its own process: the good lines are stored once,
    each bad line is named with its number and why, and the exit status is 2."""
    good = [make_record(i) for i in range(3)]
    missing = good[0].to_json()
    del missing["device_key"]
    lines = [
        canonical_json(good[0].to_json()),  # 1
        "{not json",  # 2
        canonical_json(missing),  # 3
        canonical_json(good[1].to_json()),  # 4
        "",  # 5 blank
        json.dumps(dict(make_record(5).to_json(), gflops=10**400)),  # 6
        "[" * 100_000,  # 7
        "1" * 5000,  # 8
        canonical_json(good[1].to_json()),  # 9: the same record again
        canonical_json(dict(make_record(6).to_json(), status="exploded")),  # 10
        canonical_json(good[2].to_json()),  # 11
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    db = tmp_path / "records.db"

    def run() -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "xdg"))
        return subprocess.run(
            [sys.executable, "-m", "autosched", "records", "import", "--db", str(db), str(path)],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip

    first = run()
    assert first.returncode == 2, first.stderr
    assert first.stdout.strip() == "added 3, duplicates 1, rejected 6"
    rejected = [line for line in first.stderr.splitlines() if line.strip()]
    assert "Traceback" not in first.stderr
    why = {
        2: "not JSON",
        3: "missing field(s) device_key",
        6: "gflops hold a number too large",
        7: "nested too deeply",
        8: "too many digits",
        10: "'exploded'",
    }
    assert len(rejected) == len(why), first.stderr
    for line, (number, reason) in zip(rejected, why.items()):
        assert line.startswith(f"{path}:{number}: rejected: ") and reason in line, line
    with SQLiteDatabase(db, create=False) as store:
        assert store.query() == good

    again = run()
    assert again.returncode == 2 and again.stdout.strip() == "added 0, duplicates 4, rejected 6"
    assert again.stderr == first.stderr
    with SQLiteDatabase(db, create=False) as store:
        assert store.query() == good


def test_cli_gzip_records_end_to_end(tmp_path: Path) -> None:
    """In its own processes: ``export -o F.jsonl.gz`` writes gzip that ``import`` reads
    back; a copy cut short is one line on stderr, exit status 2, and no record."""
    src, dst, cut_db = tmp_path / "src.db", tmp_path / "dst.db", tmp_path / "cut.db"
    with SQLiteDatabase(src) as database:
        database.add(SAMPLE)
    out, cut = tmp_path / "all.jsonl.gz", tmp_path / "cut.jsonl.gz"

    def cli(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "xdg"))
        return subprocess.run(
            [sys.executable, "-m", "autosched", "records", *map(str, argv)],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip

    assert cli("export", "--db", src, "-o", out).returncode == 0
    done = cli("import", "--db", dst, out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"added {len(SAMPLE)}, duplicates 0, rejected 0"
    cut.write_bytes(out.read_bytes()[:-40])
    failed = cli("import", "--db", cut_db, cut)
    assert failed.returncode == 2
    assert failed.stderr.strip().count("\n") == 0 and "Traceback" not in failed.stderr
    assert "is gzip data cut short or corrupt" in failed.stderr
    with SQLiteDatabase(cut_db) as database:
        assert len(database) == 0
