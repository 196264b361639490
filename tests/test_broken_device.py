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


def test_a_device_that_measures_nothing_is_given_up_and_its_failures_are_not_recorded(tmp_path):
    wl = autosched.workload("matmul", M=48, N=40, K=32)
    db_path = tmp_path / "records.db"
    before = _measure_folders()
    broken: list[str] = []

    def progress(event) -> None:
        if event.trial == GOOD and not broken:  # the second batch is in: break the device
            (folder,) = _measure_folders() - before
            shutil.rmtree(folder)
            with open(folder, "w") as f:
                f.write("not a folder\n")
            broken.append(folder)

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
    message = str(err.value)
    assert f"measured nothing in {BROKEN_IN_A_ROW} batches in a row" in message, message
    assert "Not a directory" in message and "a rerun resumes" in message, message
    with SQLiteDatabase(db_path) as db:
        records = db.query(workload_key=wl.key)
    # The two good batches and the second's control: nothing from the broken ones.
    assert len({r.config_key for r in records}) == GOOD
    assert len(records) == GOOD + 2  # each batch's control measured again
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]

    os.remove(broken[0])  # the device is back
    again = autosched.tune(
        wl, trials=3 * BATCH, batch=BATCH, target="llvm", db=db_path, timing=FAST, finalists=0
    )
    assert again.trials == 3 * BATCH and again.new_trials == 3 * BATCH - GOOD


def test_a_job_gives_up_a_broken_device_kind_and_goes_on_with_the_others(tmp_path):
    """The CLI's local job tunes one matmul on the OpenCL device and on the host CPU
    (llvm), each with its own measurement child and folder. The llvm one is broken once
    two of its batches are in: the job gives that device kind up, tops the OpenCL pair up,
    says which device it gave up and why, exits 1, and a rerun tops the llvm pair up."""
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
    folders = os.path.join(tempfile.gettempdir(), "autosched-measure-*")
    before = set(glob.glob(folders))
    proc = subprocess.Popen(
        [sys.executable, "-m", "autosched", *args, "--report", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    llvm_folder = None
    deadline = time.time() + 300
    while llvm_folder is None and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
        if not db_path.exists():
            continue
        with SQLiteDatabase(db_path) as db:
            llvm = db.query(target="llvm")
        if len(llvm) >= GOOD:
            # The llvm child's folder holds no PoCL cache: files only, no folders.
            (llvm_folder,) = [  # the job's two, made after it started
                f
                for f in set(glob.glob(folders)) - before
                if not any(e.is_dir() for e in os.scandir(f))
            ]
            shutil.rmtree(llvm_folder)
            with open(llvm_folder, "w") as f:
                f.write("not a folder\n")
    assert llvm_folder is not None, "the llvm pair never got two batches in"
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stderr[-3000:]
    # Logged when it happened, and said again at the end, after the job's table.
    gave_up = [line for line in stderr.splitlines() if line.startswith("autosched: ")]
    assert len(gave_up) == 1 and gave_up[0].startswith("autosched: llvm device"), stderr[-3000:]
    assert f"measured nothing in {BROKEN_IN_A_ROW} batches in a row" in gave_up[0]
    assert "left for a rerun" in gave_up[0]
    what = gave_up[0][len("autosched: ") :].split(";")[0]
    assert json.loads(out.read_text())["broken"] == [what]
    assert "Given up: llvm device" in report.read_text()
    with SQLiteDatabase(db_path) as db:
        records = db.query()
    by_target = {t: {r.config_key for r in records if r.target == t} for t in ("opencl", "llvm")}
    assert len(by_target["opencl"]) == trials
    assert GOOD <= len(by_target["llvm"]) < trials
    # At most the batch in flight when the device broke holds its failures.
    failed = [r for r in records if "Not a directory" in r.error]
    assert len(failed) <= BATCH, len(failed)

    os.remove(llvm_folder)
    rerun = subprocess.run(
        [sys.executable, "-m", "autosched", *args], capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    with SQLiteDatabase(db_path) as db:
        assert len({r.config_key for r in db.query(target="llvm")}) == trials
