"""A device that stops measuring anything mid-run is given up, its failures unrecorded.

Real processes end to end: a tune on the host CPU (llvm) whose measurement child loses
the folder it writes each kernel's library to after the second batch (the folder
becomes a file, as a full or vanished /tmp would leave it), so that every later
candidate, the batch's control too, fails to load. Recorded, those failures would mark
configs that run fine as broken for every later search and build; instead the run stops
after BROKEN_IN_A_ROW such batches with one clear error, the records hold exactly the
two good batches, and once the folder is back a rerun resumes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import autosched
from autosched.errors import DeviceError
from autosched.measure.runner import TimingOptions
from autosched.records.sqlite import SQLiteDatabase
from autosched.tuning.loop import BROKEN_IN_A_ROW

FAST = TimingOptions(warmup=0, min_repeats=2, max_repeats=3, min_time_s=0.0, passes=1)
BATCH = 8
GOOD = 2 * BATCH  # two batches (the default config is the first's last)


def _measure_folders() -> set[str]:
    root = tempfile.gettempdir()
    return set(glob.glob(os.path.join(root, f"autosched-measure-{os.getpid()}-*")))


def _break_at(event, before: set[str], broken: list[str]) -> None:
    """Once the second batch is in, make this tune's measurement folder a file."""
    if event.trial == GOOD and not broken:
        (folder,) = _measure_folders() - before
        shutil.rmtree(folder)
        with open(folder, "w") as f:
            f.write("not a folder\n")
        broken.append(folder)


def test_a_batch_the_device_measured_nothing_of_runs_again_in_a_fresh_child(tmp_path, caplog):
    wl = autosched.workload("matmul", M=48, N=40, K=32)
    before = _measure_folders()
    broken: list[str] = []
    result = autosched.tune(
        wl,
        trials=4 * BATCH,
        batch=BATCH,
        target="llvm",
        db=tmp_path / "records.db",
        timing=FAST,
        finalists=0,
        progress=lambda event: _break_at(event, before, broken),
    )
    assert broken and not os.path.exists(broken[0])  # the file went with the old child
    assert result.trials == result.new_trials == 4 * BATCH
    with SQLiteDatabase(tmp_path / "records.db") as db:
        records = db.query(workload_key=wl.key)
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    again = [r for r in caplog.records if "fresh measurement child" in r.getMessage()]
    assert len(again) == 1 and "Not a directory" in again[0].getMessage()


def test_a_device_that_measures_nothing_is_given_up_and_its_failures_are_not_recorded(
    tmp_path, monkeypatch
):
    wl = autosched.workload("matmul", M=48, N=40, K=32)
    db_path = tmp_path / "records.db"
    before = _measure_folders()
    broken: list[str] = []

    def progress(event) -> None:
        fresh = not broken
        _break_at(event, before, broken)
        if fresh and broken:  # and no fresh folder can be made either
            monkeypatch.setattr(tempfile, "tempdir", broken[0])

    with pytest.raises(DeviceError) as err:
        autosched.tune(
            wl,
            trials=6 * BATCH,
            batch=BATCH,
            target="llvm",
            db=db_path,
            timing=FAST,
            finalists=0,
            progress=progress,
        )
    monkeypatch.undo()
    message = str(err.value)
    assert f"measured nothing in {BROKEN_IN_A_ROW} batches in a row" in message, message
    assert "Not a directory" in message and "a rerun resumes" in message, message
    with SQLiteDatabase(db_path) as db:
        records = db.query(workload_key=wl.key)
    # The two good batches and the second's control: nothing from the broken ones.
    assert len({r.config_key for r in records}) == GOOD
    assert len(records) == GOOD + 1  # the second batch's control measured again
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]

    os.remove(broken[0])  # the device is back
    again = autosched.tune(
        wl, trials=3 * BATCH, batch=BATCH, target="llvm", db=db_path, timing=FAST, finalists=0
    )
    assert again.trials == 3 * BATCH and again.new_trials == 3 * BATCH - GOOD


def test_a_job_gives_up_a_device_that_stays_broken_and_a_rerun_tops_it_up(tmp_path):
    """The CLI's local job tunes one matmul on the OpenCL device and on the host CPU
    (llvm). Once two llvm batches are in, the job's temporary directory becomes a file:
    no kernel can be written, no fresh measurement child can have a folder, and the fault
    outlives every retry. The job gives each device kind that still had trials up, says
    which and why (stderr, --json, the report), exits 1, and records no more than the
    batch in flight per kind; with the directory back, a rerun tops both up."""
    # A short path of its own: the job's Unix sockets (its fork server's) live in it, and
    # those paths may not be longer than 107 bytes (pytest's tmp_path under xdist can be).
    scratch = Path(tempfile.mkdtemp(prefix="as-"))
    env = dict(os.environ, TMPDIR=str(scratch))
    try:
        _job_gives_up(tmp_path, scratch, env)
    finally:
        if scratch.is_dir():
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            scratch.unlink(missing_ok=True)


def _job_gives_up(tmp_path: Path, scratch: Path, env: dict[str, str]) -> None:
    trials = 48
    job = tmp_path / "night.toml"
    job.write_text(
        f'name = "night"\ntrials = {trials}\nbatch = {BATCH}\nseed = 1\n'
        '[[tasks]]\nop = "matmul"\nshape = "48,40,32"\ntargets = ["opencl", "llvm"]\n'
    )
    db_path = tmp_path / "records.db"
    out = tmp_path / "result.json"
    report = tmp_path / "night.html"
    args = ["job", "run", str(job), "--db", str(db_path), "--json", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "autosched", *args, "--report", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.time() + 300
    while scratch.is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
        if not db_path.exists():
            continue
        with SQLiteDatabase(db_path) as db:
            if len(db.query(target="llvm")) >= GOOD:
                shutil.rmtree(scratch)
                scratch.write_text("not a folder\n")
    assert scratch.is_file(), "the llvm pair never got two batches in"
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stderr[-3000:]
    # Logged when it happened, and said again at the end, after the job's table.
    gave_up = [line for line in stderr.splitlines() if line.startswith("autosched: ")]
    assert gave_up and any(line.startswith("autosched: llvm device") for line in gave_up), stderr
    for line in gave_up:
        assert f"measured nothing in {BROKEN_IN_A_ROW} batches in a row" in line, line
        assert "left for a rerun" in line, line
    whats = [line[len("autosched: ") :].split(";")[0] for line in gave_up]
    assert json.loads(out.read_text())["broken"] == whats
    assert report.read_text().count("Given up: ") == len(whats)
    with SQLiteDatabase(db_path) as db:
        records = db.query()
    assert GOOD <= len({r.config_key for r in records if r.target == "llvm"}) < trials
    # At most the batch in flight when the directory went holds its failures, per kind.
    failed = [r for r in records if not r.ok]
    assert len(failed) <= 2 * BATCH, [(r.target, r.status, r.error) for r in failed]

    scratch.unlink()  # the directory is back
    scratch.mkdir()
    rerun = subprocess.run(
        [sys.executable, "-m", "autosched", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    with SQLiteDatabase(db_path) as db:
        for target in ("opencl", "llvm"):
            assert len({r.config_key for r in db.query(target=target)}) >= trials


def test_a_tune_that_cannot_start_a_measurement_child_records_nothing_and_says_why(tmp_path):
    """A temporary directory whose path is too long for a Unix socket (108 bytes): the
    fork server that starts the build and measurement children cannot listen, so no
    candidate can be measured, and none is to blame. The tune records nothing, gives the
    device up with the cause in one line and exit 1; a rerun in a usable directory
    resumes from nothing lost."""
    long = Path(tempfile.mkdtemp(prefix="as-")) / ("x" * 110)
    long.mkdir()
    db_path = tmp_path / "records.db"
    args = ["tune", "--op", "matmul", "--shape", "48,40,32", "--target", "llvm"]
    args += ["--trials", str(2 * BATCH), "--batch", str(BATCH), "--db", str(db_path)]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autosched", *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, TMPDIR=str(long)),
        )
    finally:
        shutil.rmtree(long.parent, ignore_errors=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("autosched: error: llvm device "), proc.stderr[-3000:]
    assert f"measured nothing in {BROKEN_IN_A_ROW} batches in a row" in last, last
    assert "AF_UNIX path too long" in last and "a rerun resumes" in last, last
    with SQLiteDatabase(db_path) as db:
        assert db.query() == []

    rerun = subprocess.run(
        [sys.executable, "-m", "autosched", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    with SQLiteDatabase(db_path) as db:
        records = db.query()
    assert len({r.config_key for r in records}) >= 2 * BATCH
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]


def test_a_task_whose_batches_cannot_be_measured_is_given_up_alone(tmp_path):
    """Two tasks share the host CPU; every batch of one of them ends in an exception
    (a runner that cannot measure that workload). That task is given up after
    BROKEN_IN_A_ROW batches in a row, with nothing recorded for it; the device, which
    measures the other task's batches, is not, and that task reaches its trials."""
    import concurrent.futures as cf

    from autosched.measure.cpu import host_cpu
    from autosched.tuning import job_from_dict
    from autosched.tuning.loop import run_job
    from autosched.tuning.runner import LocalRunner

    class NoSoftmax(LocalRunner):
        def submit(self, slot, request):
            if request.workload["op"] != "softmax":
                return super().submit(slot, request)
            future: cf.Future = cf.Future()
            future.set_exception(RuntimeError("this runner cannot measure a softmax"))
            return future

    job = job_from_dict(
        {
            "name": "half",
            "trials": 2 * BATCH,
            "batch": BATCH,
            "tasks": [
                {"op": "softmax", "shape": "rows=64,cols=96", "targets": ["llvm"]},
                {"op": "matmul", "shape": "48,40,32", "targets": ["llvm"]},
            ],
        }
    )
    runner = NoSoftmax(host_cpu(), "llvm", timing=FAST)
    with SQLiteDatabase(tmp_path / "records.db") as db:
        try:
            result = run_job(job, runner, db, finalists=1)
        finally:
            runner.close()
        records = db.query()
    (given_up,) = result.broken
    assert given_up.startswith("softmax") and "RuntimeError: this runner cannot" in given_up
    assert f"{BROKEN_IN_A_ROW} batches in a row not measured" in given_up, given_up
    assert result.dropped_batches == BROKEN_IN_A_ROW and result.failed_batches == 0
    assert {r.op for r in records} == {"matmul"}
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert len({r.config_key for r in records}) >= 2 * BATCH


def test_a_device_whose_measurement_child_never_starts_is_given_up_from_the_first_batch(
    tmp_path, monkeypatch
):
    """The measurement child does not report in time (a driver that hangs opening the
    device; here the wait for it is cut to nothing): before anything was measured there
    is no control to tell the device's failure from the configs', but a child that
    could not start tells it. Nothing is recorded; the device is given up."""
    from autosched.errors import DeviceGivenUp
    from autosched.measure import worker

    monkeypatch.setattr(worker, "_START_TIMEOUT_S", 0.0)
    db_path = tmp_path / "records.db"
    with pytest.raises(DeviceGivenUp) as err:
        autosched.tune(
            autosched.workload("matmul", M=48, N=40, K=32),
            trials=2 * BATCH,
            batch=BATCH,
            target="llvm",
            db=db_path,
            timing=FAST,
            finalists=0,
        )
    assert "measurement worker did not start" in str(err.value), err.value
    with SQLiteDatabase(db_path) as db:
        assert db.query() == []
