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
GOOD = 1 + 2 * BATCH  # the default config, measured alone first, and two batches


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
    # The two good batches and their controls: nothing from the broken ones.
    assert len({r.config_key for r in records}) == GOOD
    assert len(records) == GOOD + 2  # each batch's control measured again
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
