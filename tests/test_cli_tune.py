"""`autosched tune` as a newcomer meets it: one line and exit 2 for bad input before
any other output, a clean terminal, and numpy beside the tuned kernel at the end."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import marked_processes


def _tune(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autosched", "tune", "--op", "matmul", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--shape", "64,64,64", "--device", "99"], "no device '99'; accepted: an index"),
        (["--shape", "64,64,64", "--db", "/etc/hostname/x.db"], "cannot open records database"),
        (["--shape", "64,64,64", "--db", "/proc/x.db"], "cannot open records database"),
        (
            ["--shape", "100000,100000,100000"],
            "needs 111.8 GiB for its tensors",
        ),
        (["--shape", "64,64,64", "--json", "/etc/hostname/out.json"], "cannot write --json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_output(tmp_path, args, expected):
    if "--db" not in args:
        args = [*args, "--db", str(tmp_path / "r.db")]
    res = _tune(*args, "--trials", "2", timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("autosched: error: "), res.stderr
    assert expected in res.stderr
    assert "Traceback" not in res.stderr


def test_a_huge_shape_names_the_device_and_the_host_memory(tmp_path):
    res = _tune("--shape", "100000,100000,100000", "--db", str(tmp_path / "r.db"), timeout=60)
    assert re.search(r"device '.+' has [\d.]+ GiB global memory, the host has [\d.]+ GiB available",
                     res.stderr), res.stderr  # fmt: skip
    assert not (tmp_path / "r.db").exists()


def test_the_terminal_shows_only_autosched_and_the_table_has_numpy(tmp_path):
    out = tmp_path / "result.json"
    res = _tune("--shape", "128,128,128", "--trials", "12", "--batch", "4",
                "--db", str(tmp_path / "r.db"), "--json", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    progress = re.compile(r"^\s*\d+/12  best (-|[\d.]+ GFLOP/s)  (\d+ s left|done)$")
    lines = res.stderr.splitlines()
    assert lines[0].startswith("tuning matmul(M=128, N=128, K=128")
    assert all(progress.match(line) for line in lines[1:]), lines
    assert len(lines) == 13
    table = res.stdout
    for row in ("tuned kernel", "default schedule", "numpy ("):
        assert row in table, table
    vendor = json.loads(out.read_text())["vendor"]
    assert vendor["gflops"] > 0 and vendor["name"].startswith("numpy")
    # PoCL's device is the host CPU: the numpy row is a peer on it, and says nothing else.
    assert "host CPU" not in table


def test_on_a_gpu_the_numpy_row_says_it_ran_on_the_host_cpu():
    from autosched.cli import vendor_note

    assert vendor_note("matmul, 16 threads", "cpu") == "matmul, 16 threads"
    assert vendor_note("matmul, 16 threads", "gpu") == (
        "matmul, 16 threads; on the host CPU, not the gpu"
    )


SCRIPT = """
import sys
from autosched.cli import main
{guard}sys.exit(main(["tune", "--op", "softmax", "--shape", "256,128", "--trials", "8",
                      "--batch", "4", "--db", sys.argv[1]]))
"""


def test_a_script_without_a_main_guard_stores_nothing_and_says_why(tmp_path):
    # The build workers start from a fork server that imports the main module again:
    # an unguarded script tuned there too (its batches failed, stored as run_error),
    # and its workers died (every config stored as "build worker crashed"), so that a
    # guarded rerun found every trial measured and none that ran.
    from autosched.records.sqlite import SQLiteDatabase

    db = tmp_path / "records.db"
    script = tmp_path / "tune_it.py"
    script.write_text(SCRIPT.format(guard=""))
    run = subprocess.run(
        [sys.executable, str(script), str(db)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("autosched: error: the build workers die as they start")
    assert 'if __name__ == "__main__":' in last
    with SQLiteDatabase(db) as records:
        assert records.query() == []
    script.write_text(SCRIPT.format(guard='if __name__ == "__main__":\n    '))
    run = subprocess.run(
        [sys.executable, str(script), str(db)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    with SQLiteDatabase(db) as records:
        mine = [r for r in records.query() if r.op == "softmax"]
    assert sum(r.ok for r in mine) >= 8 and not [r for r in mine if not r.ok]


@pytest.mark.parametrize(
    ("sig", "group", "code", "said"),
    [
        (signal.SIGINT, False, 130, "interrupted"),
        (signal.SIGTERM, False, 143, "terminated (SIGTERM)"),
        (signal.SIGTERM, True, 143, "terminated (SIGTERM)"),  # systemd's, Slurm's stop
    ],
)
def test_a_stop_mid_batch_ends_the_batch_there_and_leaves_nothing_behind(
    tmp_path, sig, group, code, said
):
    """Ctrl-C while a batch is timed. Closing the session killed the batch's measurement
    child, but the batch went on in the runner's thread, starting a fresh child for each
    config left (after the close, in the folder the close had removed; PoCL made it again)
    until its last: the exit waited 13 s for that, the batch's progress lines came after
    the "interrupted" line, and the folder of kernels stayed in the temporary directory.
    SIGTERM (a service manager's or a batch scheduler's stop) ended the process on the
    spot, saying nothing and leaving that folder; it now stops the tune as Ctrl-C does.
    Sent to the whole process group (a service manager's stop), it also ends the build
    and measurement children: the batch's configs left then came back as run errors,
    and nothing that came back after the signal may be stored as their records."""
    db = tmp_path / "t.db"
    # Short: multiprocessing's fork server listens on a socket in it (108 bytes at most).
    temp = Path(tempfile.mkdtemp(prefix="as-"))
    mark = f"stop-tune-{os.getpid()}-{time.time()}"
    run = subprocess.Popen(
        [sys.executable, "-m", "autosched", "tune", "--op", "matmul", "--shape", "256,256,256",
         "--trials", "64", "--batch", "16", "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TMPDIR=str(temp), AUTOSCHED_TEST_MARK=mark),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=group,
    )  # fmt: skip
    lines: list[tuple[bool, str]] = []  # (after the signal, line)
    first_batch = threading.Event()
    sent = threading.Event()

    def read() -> None:
        assert run.stderr is not None
        for line in run.stderr:
            lines.append((sent.is_set(), line))
            if re.match(r"\s*\d+/64\b", line):
                first_batch.set()  # a batch's lines come all at once as it is stored

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first_batch.wait(240), "".join(x for _, x in lines)[-3000:]
        # The second batch is built in full, then timed: the measurement child's PoCL
        # compiles each program into its folder as its timing starts.
        timed = len(list(temp.glob("autosched-measure-*/**/*.so")))
        deadline = time.time() + 120
        while len(list(temp.glob("autosched-measure-*/**/*.so"))) <= timed:
            assert time.time() < deadline and run.poll() is None, "no program timed"
            time.sleep(0.05)
        stored = _records(db)
        sent.set()
        if group:
            os.killpg(run.pid, sig)
        else:
            run.send_signal(sig)
        run.wait(timeout=120)
        reader.join(30)
    finally:
        run.kill()
        left_in_temp = list(temp.iterdir())
        shutil.rmtree(temp, ignore_errors=True)
    after = "".join(x for late, x in lines if late)
    assert run.returncode == code, after[-3000:]
    assert after == (
        f"autosched: {said}; measured batches are saved, rerun the same command to resume\n"
    )  # no config of the second batch came in after the signal
    assert left_in_temp == []
    assert _records(db) == stored  # the first batch's, nothing since
    deadline = time.time() + 30  # the fork server and the children see their parent gone
    while (left := marked_processes(mark)) and time.time() < deadline:
        time.sleep(0.5)
    assert left == []


def _records(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return sorted(conn.execute("SELECT config_key, status FROM records").fetchall())
