"""Tuning jobs end to end: real Dask clusters on loopback, real workers, real kernels.

Each test runs the `autosched` CLI in subprocesses, as a farm's users do, and checks the
records database afterwards: every task topped up to its trials, every candidate stored
once, reruns resuming, a SIGKILLed worker survived.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from autosched.records import open_database
from autosched.records.choice import chosen
from autosched.records.record import device_label
from autosched.records.sqlite import SQLiteDatabase
from autosched.tuning.control import MIN_NEW
from tests.browser import chart_blue, screenshot
from tests.conftest import marked_processes

JOB = """\
name = "smoke"
trials = {trials}
batch = 4
seed = 1

[[tasks]]
op = "matmul"
shape = "128,128,128"
targets = ["opencl", "llvm"]

[[tasks]]
op = "softmax"
shape = "rows=256,cols=128"
targets = ["opencl"]
"""


THIRD_TASK = """
[[tasks]]
op = "elementwise"
shape = "rows=256,cols=256,ops=add+relu"
targets = ["llvm"]
"""


def _cli(*args: str, timeout: float = 300, mark: str = "") -> subprocess.CompletedProcess:
    """Run the CLI; ``mark`` goes into the environment of every process it starts."""
    env = dict(os.environ, AUTOSCHED_TEST_MARK=mark) if mark else None
    return subprocess.run(
        [sys.executable, "-m", "autosched", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _check_topped_up(
    db_path: Path | str,
    trials: int,
    pairs: int,
    *,
    runs: int = 1,
    finalists: int = 3,
    final_may_fail: bool = False,
) -> None:
    """Every (workload, device) pair has exactly ``trials`` distinct candidates, and a
    candidate has more than one record only as a batch's control (the best so far,
    timed again in a batch of ``MIN_NEW`` or more new candidates) or as a finalist
    re-measured at the end of one of ``runs`` job runs (each re-measures its best few
    and the default)."""

    records = _records(db_path)
    by_pair: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        by_pair[(r.workload_key, r.device_key, r.target)][r.config_key] += 1
    assert len(by_pair) == pairs, sorted(by_pair)
    # No two measurements overlap in time on one device (a re-measurement of the
    # finalists is one interleaved session: its records share their start).
    spans: dict[str, dict] = collections.defaultdict(dict)
    for r in records:
        if r.started_at is not None:
            ends = spans[r.device_key]
            ends[r.started_at] = max(ends.get(r.started_at, 0.0), r.ended_at)
    for key, device_spans in spans.items():
        ordered = sorted(device_spans.items())
        for (_, end), (start, _) in zip(ordered, ordered[1:]):
            assert end <= start, (key, end, start)
    for pair, counts in by_pair.items():
        assert len(counts) == trials, (pair, len(counts))
        again = sum(n - 1 for n in counts.values())
        controls = runs * (trials // MIN_NEW)  # at most one per batch of MIN_NEW or more
        assert again <= (finalists + 1) * runs + controls, (pair, counts)
    # The finalists' records say they were timed side by side, and what compilers take
    # is the leader of such a round (``final_may_fail``: unless the round's timings all
    # failed, as a one-second limit can make them; only ok records are kept).
    side_by_side = collections.Counter(
        (r.workload_key, r.device_key, r.target) for r in records if r.rounds
    )
    db = open_database(db_path, create=False)
    try:
        for pair in by_pair:
            assert side_by_side[pair] <= (finalists + 2) * runs, (pair, side_by_side)
            picked = chosen(db, pair[0], device_key=pair[1], target=pair[2])
            if side_by_side[pair] or not final_may_fail:
                assert side_by_side[pair] > 0, (pair, side_by_side)
                assert picked is not None and picked.rounds == 3, (pair, picked)
    finally:
        db.close()


@pytest.mark.timed
def test_a_local_job_tops_up_every_task_on_every_device_kind_and_resumes(tmp_path):
    job = tmp_path / "night.toml"
    job.write_text(JOB.format(trials=8))
    db = tmp_path / "records.db"
    out = tmp_path / "result.json"
    report = tmp_path / "morning" / "night.html"
    report.parent.mkdir()
    mark = f"local-job-{os.getpid()}-{time.time()}"
    first = _cli(
        "job", "run", str(job), "--db", str(db), "--json", str(out), "--report", str(report),
        mark=mark,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert not marked_processes(mark), "processes left behind after the job"
    result = json.loads(out.read_text())
    assert {(t["task"], t["target"]) for t in result["tasks"]} == {
        ("matmul 128,128,128", "opencl"),
        ("matmul 128,128,128", "llvm"),
        ("softmax rows=256,cols=128", "opencl"),
    }
    for task in result["tasks"]:
        assert task["trials"] == 8 and task["new_trials"] == 8, task
        # The winner was re-measured side by side with the default schedule.
        assert task["best_gflops"] > 0 and task["speedup"] > 1.0, task
    assert "24 trials measured" in first.stdout
    # The morning report: the job's table (best, default, numpy, ratios, workers), then
    # a section per task and device kind.
    page = report.read_text()
    assert "<h1>autosched job smoke</h1>" in page and "The job" in page
    assert page.count("8/8 (8 tonight)") == 3, page[:3000]
    assert "best / numpy" in page and "ended by every task reaching its trials" in page
    assert 'id="s3"' in page and 'id="s4"' not in page  # three sections
    # As a person sees it in a browser: text, tables and the sections' curves drawn.
    image = screenshot(report, tmp_path / "night.png", height=3000)
    assert 0.03 < float(np.any(image < 0.9, axis=-1).mean()) < 0.7
    assert chart_blue(image) > 500
    _check_topped_up(db, trials=8, pairs=3)
    # Nothing but autosched's own lines reaches the terminal.
    noise = [
        line
        for line in first.stderr.splitlines()
        if line.strip() and "GFLOP/s" not in line and "no valid kernel" not in line
    ]
    assert not noise, noise

    again = _cli("job", "run", str(job), "--db", str(db), "--json", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 trials measured" in again.stdout
    assert all(t["new_trials"] == 0 for t in json.loads(out.read_text())["tasks"])
    _check_topped_up(db, trials=8, pairs=3, runs=2)

    # A larger budget tops up; status tells done and left from the records alone.
    job.write_text(JOB.format(trials=12))
    status = _cli("job", "status", str(job), "--db", str(db), "--json")
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)
    assert sorted((r["done"], r["left"]) for r in rows) == [(8, 4)] * 3
    with SQLiteDatabase(db, create=False) as store:  # the device named as stats names it
        fingerprints = {r.device_key: r.device for r in store.query()}
    assert all(r["device"] == device_label(fingerprints[r["device_key"]]) for r in rows)
    more = _cli("job", "run", str(job), "--db", str(db))
    assert more.returncode == 0, more.stderr[-3000:]
    assert "12 trials measured" in more.stdout
    _check_topped_up(db, trials=12, pairs=3, runs=3)


def test_job_files_and_options_are_checked_before_anything_runs(tmp_path):
    job = tmp_path / "bad.toml"
    job.write_text(JOB.format(trials=8).replace('op = "softmax"', 'op = "softmaxx"'))
    bad = _cli("job", "run", str(job), "--db", str(tmp_path / "r.db"), timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1, bad.stderr
    assert f"{job}:12: tasks[1].op = 'softmaxx' is not valid" in bad.stderr
    assert not (tmp_path / "r.db").exists()
    job.write_text(JOB.format(trials=8))
    late = _cli("job", "run", str(job), "--until", "25:99", timeout=60)
    assert late.returncode == 2 and "--until '25:99' is not valid; accepted: HH:MM" in late.stderr
    nowhere = _cli("job", "run", str(job), "--scheduler", "tcp://127.0.0.1:9", timeout=120)
    assert nowhere.returncode == 2 and nowhere.stderr.count("\n") == 1, nowhere.stderr
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in nowhere.stderr


# -- a farm on loopback: a real `dask scheduler` and `autosched worker` processes ---------


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(env or os.environ, PYTHONUNBUFFERED="1")
    # A process group of its own: a kill takes the nanny, its worker and their children.
    return subprocess.Popen(
        args, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env
    )


def _scheduler(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    file = tmp_path / "scheduler.json"
    proc = _spawn(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--no-dashboard", "--scheduler-file", str(file)],
        tmp_path / "scheduler.log",
    )  # fmt: skip
    for _ in range(300):
        if file.exists() and file.stat().st_size:
            return proc, json.loads(file.read_text())["address"]
        time.sleep(0.1)
    raise AssertionError((tmp_path / "scheduler.log").read_text())


def _worker(tmp_path: Path, address: str, target: str, name: str) -> subprocess.Popen:
    args = ["worker", "--scheduler", address, "--target", target, "--name", name]
    return _spawn([sys.executable, "-m", "autosched", *args], tmp_path / f"{name}.log")


def _farm_job(job: Path, address: str, db: Path, out: Path) -> subprocess.Popen:
    """``autosched job run`` on the farm at ``address``, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "autosched", "job", "run", str(job), "--scheduler", address,
         "--db", str(db), "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _group_alive(proc: subprocess.Popen) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if _group_alive(proc):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + 30
    for proc in procs:
        # poll() reaps the group's leader: a zombie still answers kill(0) as alive.
        while proc.poll() is None or _group_alive(proc):
            if time.time() > deadline:
                break
            time.sleep(0.2)
        if _group_alive(proc):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def farm(tmp_path):
    procs: list[subprocess.Popen] = []
    sched, address = _scheduler(tmp_path)
    procs.append(sched)
    yield address, procs
    _stop(procs)
    left = [p.pid for p in procs if _group_alive(p)]
    assert not left, f"process groups left behind: {left}"


def _signal_mask(pid: int, field: str) -> set[int]:
    """The signals in a process's SigIgn, SigBlk or SigCgt line of /proc/PID/status."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    (line,) = [x for x in status.splitlines() if x.startswith(field + ":")]
    bits = int(line.split()[1], 16)
    return {n for n in range(1, 65) if bits >> (n - 1) & 1}


def _records(db_path: Path | str) -> list:
    if isinstance(db_path, Path) and not db_path.exists():
        return []
    db = open_database(db_path)
    try:
        return db.query()
    finally:
        db.close()


def test_a_farm_job_survives_a_worker_killed_mid_batch(tmp_path, farm):
    address, procs = farm
    ocl = _worker(tmp_path, address, "opencl", "ocl-1")
    cpu = _worker(tmp_path, address, "llvm", "cpu-1")
    procs += [ocl, cpu]
    job = tmp_path / "night.toml"
    job.write_text(JOB.format(trials=12) + THIRD_TASK)  # three [[tasks]], four pairs
    db = tmp_path / "records.db"
    out = tmp_path / "result.json"
    run = _farm_job(job, address, db, out)
    # Once the OpenCL worker has delivered a batch, it is busy with the next: kill it,
    # nanny, worker process and measurement child together, and bring up a new one.
    deadline = time.time() + 240
    while time.time() < deadline and run.poll() is None:
        if any(r.target == "opencl" for r in _records(db)):
            break
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(ocl.pid, signal.SIGKILL)
    ocl.wait(timeout=10)
    procs.append(_worker(tmp_path, address, "opencl", "ocl-2"))
    stdout, stderr = run.communicate(timeout=400)
    assert run.returncode == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["tasks"]) == 4
    assert all(t["trials"] == 12 for t in result["tasks"]), result["tasks"]
    _check_topped_up(db, trials=12, pairs=4)
    # The two OpenCL workers had the same device: one device kind, one set of records,
    # measured by the first worker and, after its death, by its replacement.
    records = _records(db)
    assert len({r.device_key for r in records if r.target == "opencl"}) == 1
    assert {r.worker for r in records if r.target == "opencl"} == {"ocl-1", "ocl-2"}
    assert {r.worker for r in records if r.target == "llvm"} == {"cpu-1"}


def _dask_worker(tmp_path: Path, address: str, name: str) -> subprocess.Popen:
    args = ["--nworkers", "1", "--nthreads", "1", "--resources", "batch=1", "--name", name]
    return _spawn(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--no-dashboard", *args],
        tmp_path / f"{name}.log",
    )


def test_a_batch_whose_result_dies_with_its_worker_is_read_when_computed_again(tmp_path, farm):
    """A batch finishes and its worker is killed before the job reads the result (the
    killed-worker test met this once): the future is no longer finished, the runner
    reports it as not done rather than as an empty batch, and returns the result Dask
    computes again on another worker."""
    from distributed import Client, wait

    from autosched.farm.runner import _NOT_YET, DaskRunner, _outcome

    address, procs = farm
    first = _dask_worker(tmp_path, address, "first")
    procs.append(first)
    client = Client(address, timeout="60s")
    try:
        client.wait_for_workers(1, timeout=120)
        fut = client.submit(os.getpid, resources={"batch": 1}, pure=False)
        wait([fut], timeout=120)
        ran_on = fut.result()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        deadline = time.time() + 60
        while fut.status == "finished" and time.time() < deadline:
            time.sleep(0.05)
        assert fut.status in ("lost", "pending"), fut.status
        assert _outcome(fut) is _NOT_YET  # and at once: nothing can compute it now
        procs.append(_dask_worker(tmp_path, address, "second"))
        runner = DaskRunner(client)
        got: list = []
        while not got and time.time() < deadline + 60:
            got = runner.wait([fut], 1.0)
        assert got and got[0][0] is fut
        assert isinstance(got[0][1], int) and got[0][1] != ran_on, got
    finally:
        client.close()


def test_a_tls_farm_runs_with_certificates_and_refuses_a_client_without(tmp_path):
    ca_key, ca = tmp_path / "ca.key", tmp_path / "ca.pem"
    key, csr, cert = tmp_path / "farm.key", tmp_path / "farm.csr", tmp_path / "farm.pem"
    ssl = ["openssl", "req", "-nodes", "-newkey", "rsa:2048", "-subj"]
    subprocess.run([*ssl, "/CN=farm-ca", "-x509", "-days", "1", "-keyout", ca_key, "-out", ca],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run([*ssl, "/CN=dask-internal", "-keyout", key, "-out", csr],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
                    "-CAcreateserial", "-days", "1", "-out", cert],
                   check=True, capture_output=True)  # fmt: skip
    tls = ["--tls-ca-file", str(ca), "--tls-cert", str(cert), "--tls-key", str(key)]
    file = tmp_path / "scheduler.json"
    procs = [
        _spawn(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls",
             "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(file), *tls],
            tmp_path / "scheduler.log",
        )
    ]  # fmt: skip
    try:
        for _ in range(300):
            if file.exists() and file.stat().st_size:
                break
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:")
        procs.append(
            _spawn(
                [sys.executable, "-m", "autosched", "worker", "--scheduler", address,
                 "--target", "llvm", "--name", "tls-cpu", *tls],
                tmp_path / "worker.log",
            )
        )  # fmt: skip
        job = tmp_path / "tls.toml"
        job.write_text('name = "tls"\ntrials = 4\nbatch = 4\n[[tasks]]\nop = "matmul"\n'
                       'shape = "64,64,64"\ntargets = ["llvm"]\n')  # fmt: skip
        db = tmp_path / "records.db"
        ok = _cli("job", "run", str(job), "--scheduler", address, "--db", str(db), *tls)
        assert ok.returncode == 0, ok.stderr[-3000:]
        assert "4 trials measured" in ok.stdout
        bare = _cli("job", "run", str(job), "--scheduler", address, "--db", str(db), timeout=120)
        assert bare.returncode == 2 and bare.stderr.count("\n") == 1, bare.stderr[-3000:]
        assert "speaks TLS; accepted: --tls-ca-file, --tls-cert and --tls-key" in bare.stderr
        # Plain TCP to the TLS port: the scheduler never completes a handshake.
        plain = address.replace("tls://", "tcp://")
        refused = _cli("job", "run", str(job), "--scheduler", plain, "--db", str(db), timeout=120)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"cannot reach the Dask scheduler at {plain}" in refused.stderr
        half = _cli("job", "run", str(job), "--scheduler", address, "--tls-cert", str(cert))
        assert half.returncode == 2
        assert "TLS needs --tls-ca-file, --tls-cert and --tls-key together" in half.stderr
    finally:
        _stop(procs)


def _die(request):
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_poison_batch_ends_as_error_records_and_the_job_goes_on(tmp_path):
    """A batch that kills every worker it lands on: Dask gives up on it after its allowed
    failures (KilledWorker), the job stores its candidates as run errors and tops the
    task up with others. The cluster also has an llvm device that no task needs."""
    import dask
    from distributed import Client

    from autosched.farm.runner import DaskRunner, local_cluster
    from autosched.farm.worker import resource_name
    from autosched.tuning import job_from_dict
    from autosched.tuning.loop import run_job

    class PoisonSecondBatch(DaskRunner):
        poisoned: list = []

        def submit(self, slot, request):
            if request.workload["op"] == "softmax" and request.rounds == 0:
                self.poisoned.append(request)
                if len(self.poisoned) == 2:
                    return self.client.submit(
                        _die, request, resources={resource_name(slot.device_key): 1}, pure=False
                    )
            return super().submit(slot, request)

    job = job_from_dict(
        {
            "name": "poison",
            "trials": 12,
            "batch": 4,
            "tasks": [
                {"op": "softmax", "shape": "rows=256,cols=128"},
                {"op": "matmul", "shape": "64,64,64"},
            ],
        }
    )
    db = SQLiteDatabase(tmp_path / "records.db")
    mark = f"poison-{os.getpid()}-{time.time()}"  # every process started below inherits it
    os.environ["AUTOSCHED_TEST_MARK"] = mark
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        with local_cluster(["opencl", "llvm"]) as cluster, Client(cluster) as client:
            runner = PoisonSecondBatch(client)
            assert {s.target for s in runner.slots()} == {"opencl", "llvm"}
            result = run_job(job, runner, db, finalists=0)
    records = db.query()
    db.close()
    del os.environ["AUTOSCHED_TEST_MARK"]
    # The SIGKILLed workers' build and measurement children died with them.
    deadline = time.time() + 30
    while (left := marked_processes(mark)) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left behind: {left}"
    assert result.failed_batches == 1
    poison = {_config_key(c) for c in PoisonSecondBatch.poisoned[1].configs}
    failed = [r for r in records if r.status == "run_error"]
    # Every new config of the batch; its control (the best so far, measured before it)
    # did not fail: the batch did.
    ran = {r.config_key for r in records if r.ok}
    assert {r.config_key for r in failed} == poison - ran and len(poison & ran) <= 1
    assert all("KilledWorker" in r.error for r in failed)
    # Every task topped up on the one device kind it needs; the llvm device got nothing.
    assert {r.target for r in records} == {"opencl"}
    for op in ("softmax", "matmul"):  # twelve trials each, and no config proposed twice
        keys = [r.config_key for r in records if r.op == op]
        again = [k for i, k in enumerate(keys) if k in keys[:i]]
        assert len(set(keys)) == 12 and len(again) <= 12 // MIN_NEW, (op, again)


def _config_key(config_json):
    from autosched.space.config import Config

    return Config.from_json(config_json).key


def test_a_target_no_worker_serves_is_waited_for_then_left_for_a_rerun(tmp_path):
    """The farm has an OpenCL device and no llvm one: the job tunes what it can, waits
    the given time for an llvm worker, then ends saying which target none served."""
    from distributed import Client

    from autosched.farm.runner import DaskRunner, local_cluster
    from autosched.tuning import job_from_dict
    from autosched.tuning.loop import run_job

    job = job_from_dict(
        {
            "name": "half",
            "trials": 8,
            "batch": 4,
            "tasks": [{"op": "matmul", "shape": "64,64,64", "targets": ["opencl", "llvm"]}],
        }
    )
    db = SQLiteDatabase(tmp_path / "records.db")
    with local_cluster(["opencl"]) as cluster, Client(cluster) as client:
        start = time.time()
        result = run_job(job, DaskRunner(client), db, finalists=0, device_wait_s=3.0)
        wall = time.time() - start
    records = db.query()
    db.close()
    assert result.unserved == ["target llvm"] and result.broken == [], result
    assert wall >= 3.0
    assert {r.target for r in records} == {"opencl"}
    assert len({r.config_key for r in records}) == 8


def test_a_kernel_past_its_time_limit_is_killed_and_the_job_goes_on(tmp_path):
    """The untuned 1024^3 matmul runs for about half a second per launch on a CPU; with a
    one-second limit per candidate its measurement child is killed (``timeout``), a
    fresh one takes over on the same worker, and the job finishes."""
    job = tmp_path / "hang.toml"
    job.write_text(
        'name = "hang"\ntrials = 4\nbatch = 4\ntimeout = 1\n[[tasks]]\nop = "matmul"\n'
        'shape = "1024,1024,1024"\ntargets = ["opencl"]\n'
    )
    db = tmp_path / "records.db"
    run = _cli("job", "run", str(job), "--db", str(db))
    assert run.returncode == 0, run.stderr[-3000:]
    _check_topped_up(db, trials=4, pairs=1, final_may_fail=True)
    records = _records(db)
    timeouts = [r for r in records if r.status == "timeout"]
    assert timeouts and all("1" in r.error for r in timeouts), [
        (r.status, r.error) for r in records
    ]


def test_the_job_and_its_workers_ride_out_a_scheduler_restart(tmp_path):
    """The scheduler is SIGKILLed mid-job and started again on the same address: the
    batches it held are proposed again, the workers serve the new scheduler, the job's
    client reconnects and the job finishes with every candidate stored once."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    address = f"tcp://127.0.0.1:{port}"
    args = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
            "--port", str(port), "--no-dashboard"]  # fmt: skip
    procs = [_spawn(args, tmp_path / "scheduler-1.log")]
    try:
        time.sleep(2)
        procs += [_worker(tmp_path, address, t, f"w-{t}") for t in ("opencl", "llvm")]
        job = tmp_path / "night.toml"
        job.write_text(JOB.format(trials=12))
        db = tmp_path / "records.db"
        out = tmp_path / "result.json"
        run = subprocess.Popen(
            [sys.executable, "-m", "autosched", "job", "run", str(job), "--scheduler", address,
             "--db", str(db), "--json", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.time() + 240
        while time.time() < deadline and run.poll() is None:
            if len(_records(db)) >= 8:
                break
            time.sleep(0.2)
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(timeout=10)
        time.sleep(1)
        procs.append(_spawn(args, tmp_path / "scheduler-2.log"))
        stdout, stderr = run.communicate(timeout=400)
        assert run.returncode == 0, stderr[-3000:]
        assert "batch lost with the scheduler" in stderr, stderr[-3000:]
        assert all(t["trials"] == 12 for t in json.loads(out.read_text())["tasks"])
        _check_topped_up(db, trials=12, pairs=3)
    finally:
        _stop(procs)
    assert not [p.pid for p in procs if _group_alive(p)]


def test_batches_reach_only_workers_of_their_device_kind(tmp_path, farm):
    """Three device kinds on one machine: PoCL's and Mesa rusticl's OpenCL CPU devices
    and the llvm host. Each task is tuned on every kind of its target, and a batch for
    one kind never reaches another's worker (a worker refuses such a batch, which would
    show as a run_error record)."""
    address, procs = farm
    rusticl_env = dict(os.environ, RUSTICL_ENABLE="llvmpipe")
    listed = subprocess.run(
        [sys.executable, "-m", "autosched", "devices"], capture_output=True, text=True,
        env=rusticl_env, check=True,
    ).stdout  # fmt: skip
    assert "llvmpipe" in listed and "pthread" in listed, listed
    procs.append(_worker(tmp_path, address, "llvm", "cpu"))
    procs.append(
        _spawn(
            [sys.executable, "-m", "autosched", "worker", "--scheduler", address,
             "--device", "pthread", "--name", "pocl"],
            tmp_path / "pocl.log",
        )
    )  # fmt: skip
    procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "autosched", "worker", "--scheduler", address,
             "--device", "llvmpipe", "--name", "rusticl"],
            stdout=(tmp_path / "rusticl.log").open("w"), stderr=subprocess.STDOUT,
            start_new_session=True, env=rusticl_env,
        )
    )  # fmt: skip
    job = tmp_path / "route.toml"
    job.write_text(
        'name = "route"\ntrials = 4\nbatch = 4\n[[tasks]]\nop = "matmul"\n'
        'shape = "64,64,64"\ntargets = ["opencl", "llvm"]\n'
    )
    db = tmp_path / "records.db"
    run = _cli("job", "run", str(job), "--scheduler", address, "--db", str(db))
    assert run.returncode == 0, run.stderr[-3000:]
    records = _records(db)
    kinds = {(r.target, r.device_key, r.device["name"]) for r in records}
    assert sorted(t for t, _, _ in kinds) == ["llvm", "opencl", "opencl"], kinds
    names = [n for t, _, n in kinds if t == "opencl"]
    assert any("llvmpipe" in n for n in names) and any("pthread" in n for n in names), names
    assert not [r for r in records if r.status == "run_error"]
    assert {r.worker for r in records if "llvmpipe" in r.device["name"]} == {"rusticl"}
    assert {r.worker for r in records if "pthread" in r.device["name"]} == {"pocl"}
    _check_topped_up(db, trials=4, pairs=3)
    # Two CPU cores cannot run 64^3 at a teraflop: every timing is physical.
    assert all(r.gflops < 1000 for r in records if r.ok), max(r.gflops for r in records if r.ok)


def test_a_worker_whose_device_breaks_stops_taking_its_batches_and_the_others_finish(
    tmp_path, farm
):
    """Two workers own the host CPU: one llvm device kind, two devices. Once the second
    has measured a batch, its temporary directory becomes a file: it can write no kernel
    and start no fresh measurement child. It measures nothing in BROKEN_IN_A_ROW batches
    in a row (each not recorded, and proposed again), says so in its log and stops taking
    the kind's batches; the first worker tops the task up, and the job ends well with
    nothing failed recorded beyond the batch the fault cut in two."""
    from autosched.tuning.loop import BROKEN_IN_A_ROW

    address, procs = farm
    # A short path of its own (the worker's fork server's Unix socket lives in it).
    scratch = Path(tempfile.mkdtemp(prefix="as-"))
    procs.append(_worker(tmp_path, address, "llvm", "sound"))
    procs.append(
        _spawn(
            [sys.executable, "-m", "autosched", "worker", "--scheduler", address,
             "--target", "llvm", "--name", "frail"],
            tmp_path / "frail.log",
            env=dict(os.environ, TMPDIR=str(scratch)),
        )
    )  # fmt: skip
    trials, batch = 40, 4
    job = tmp_path / "two.toml"
    job.write_text(
        f'name = "two"\ntrials = {trials}\nbatch = {batch}\nseed = 1\n[[tasks]]\n'
        'op = "matmul"\nshape = "48,40,32"\ntargets = ["llvm"]\n'
    )
    db = tmp_path / "records.db"
    out = tmp_path / "result.json"
    run = _farm_job(job, address, db, out)
    broke = False
    try:
        deadline = time.time() + 300
        while run.poll() is None and time.time() < deadline and not broke:
            if any(r.worker == "frail" for r in _records(db)):
                shutil.rmtree(scratch)
                scratch.write_text("not a folder\n")
                broke = True
            time.sleep(0.2)
        _, stderr = run.communicate(timeout=600)
    finally:
        if scratch.is_dir():
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            scratch.unlink(missing_ok=True)
    assert broke, "the second worker measured no batch"
    assert run.returncode == 0, stderr[-3000:]
    frail = (tmp_path / "frail.log").read_text()
    assert "worker frail gives up" in frail and "restart the worker" in frail, frail[-3000:]
    result = json.loads(out.read_text())
    assert result["broken"] == [] and result["dropped_batches"] >= BROKEN_IN_A_ROW, result
    records = _records(db)
    assert len({r.config_key for r in records}) == trials
    assert {r.worker for r in records} == {"sound", "frail"}
    failed = [r for r in records if not r.ok]
    assert len(failed) <= batch, [(r.worker, r.status, r.error) for r in failed]


def test_a_job_rides_out_a_postgresql_restart_and_never_shows_its_password(tmp_path, pg_server):
    """The records server crashes and comes back mid-job: the batch being written is
    retried until it commits once, and the job tops every task up. The job runs verbose
    on a password-protected role: the password is in no terminal line, JSON, report or
    error message (the restart's retries included), in plain or URL-escaped form."""
    from urllib.parse import quote

    from tests.pg_server import PASSWORD_USER

    password = "n1ght:J@b/s3cret"
    pg_server.psql(f"ALTER ROLE {PASSWORD_USER} PASSWORD '{password}'")
    name = pg_server.new_database()
    url = (
        f"postgresql://{PASSWORD_USER}:{quote(password, safe='')}@127.0.0.1:{pg_server.port}/{name}"
    )
    job = tmp_path / "night.toml"
    job.write_text(JOB.format(trials=12))
    out, report = tmp_path / "result.json", tmp_path / "night.html"
    run = subprocess.Popen(
        [sys.executable, "-m", "autosched", "-v", "job", "run", str(job), "--db", url,
         "--json", str(out), "--report", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and run.poll() is None and len(_records(url)) < 8:
        time.sleep(0.2)
    assert run.poll() is None, run.communicate()[1][-3000:]
    pg_server.restart(pause_s=3.0)
    stdout, stderr = run.communicate(timeout=400)
    assert run.returncode == 0, stderr[-3000:]
    assert "36 trials measured" in stdout
    _check_topped_up(url, trials=12, pairs=3)

    status = _cli("job", "status", str(job), "--db", url)
    wrong = _cli("job", "status", str(job), "--db", url.replace("n1ght", "WRONG"), timeout=60)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1, wrong.stderr
    shown = "\n".join(
        [stdout, stderr, status.stdout, status.stderr, wrong.stdout, wrong.stderr,
         out.read_text(), report.read_text()]
    )  # fmt: skip
    assert f"{PASSWORD_USER}:***@" in report.read_text()
    for form in (password, quote(password, safe=""), "J@b", "s3cret"):
        assert form not in shown, form


def test_ctrl_c_ends_a_job_with_one_line_and_no_process_left(tmp_path):
    """SIGINT to the job's whole process group, as a terminal's Ctrl-C sends it: the
    client closes its cluster in order, says how to resume, and every worker, build
    and measurement process is gone."""
    job = tmp_path / "night.toml"
    job.write_text(JOB.format(trials=64))
    db = tmp_path / "records.db"
    mark = f"ctrl-c-{os.getpid()}-{time.time()}"
    # A terminal's foreground job has SIGINT at its default. The test runner may not: a
    # shell without job control starts background commands (CI's, say) with SIGINT
    # ignored, every child inherits that across exec, and Python then installs no handler.
    run = subprocess.Popen(
        [sys.executable, "-m", "autosched", "job", "run", str(job), "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ, AUTOSCHED_TEST_MARK=mark),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.time() + 240
        while time.time() < deadline and run.poll() is None and len(_records(db)) < 4:
            time.sleep(0.2)
        caught = _signal_mask(run.pid, "SigCgt")
        os.killpg(run.pid, signal.SIGINT)
        stdout, stderr = run.communicate(timeout=120)
        assert run.returncode == 130, (
            f"the job caught SIGINT: {signal.SIGINT in caught}; "
            f"{[x for x in stderr.splitlines() if 'ignored' in x or 'Interrupt' in x]}\n"
            f"{stderr[-3000:]}"
        )
        assert stderr.rstrip().splitlines()[-1] == (
            "autosched: interrupted; measured batches are saved, rerun the same command to resume"
        )
        assert "Traceback" not in stderr, stderr[-3000:]
        deadline = time.time() + 30
        while (left := marked_processes(mark)) and time.time() < deadline:
            time.sleep(0.5)
        assert not left, f"processes left behind: {left}"
    finally:  # a failure here must not leave a job measuring beside the next tests
        for left in marked_processes(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(left.split(":")[0]), signal.SIGKILL)


def test_a_closing_worker_keeps_quiet_about_the_heartbeat_its_close_cut():
    """The traceback a Dask worker logs when its own close cuts a heartbeat in flight is
    dropped; the same failure while the worker runs is still logged."""
    import asyncio
    import logging

    from distributed import Scheduler, Worker

    from autosched.farm.worker import ClosingHeartbeat

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord(
            "distributed.worker", logging.ERROR, __file__, 1, message, None, None
        )

    heartbeat = "Failed to communicate with scheduler during heartbeat."

    async def main() -> tuple[bool, bool, bool]:
        async with Scheduler(host="127.0.0.1", port=0, dashboard=False) as s:
            worker = await Worker(s.address, nthreads=1)
            quiet = ClosingHeartbeat(worker)
            running = quiet.filter(record(heartbeat))
            await worker.close()
            return running, quiet.filter(record(heartbeat)), quiet.filter(record("other"))

    running, closed, other = asyncio.run(main())
    assert running and not closed and other
