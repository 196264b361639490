"""Tuning end to end on the real device: correct kernels, faster than the default, resumable."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

import autosched
from autosched.measure.build import build
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.config import Config
from autosched.space.select import make_space
from tests.conftest import make_data, marked_processes

QUICK = TimingOptions(warmup=1, min_repeats=3, max_repeats=30, min_time_s=0.02)


@pytest.mark.timed
@pytest.mark.parametrize("strategy", ["model", "random", "tpe"])
def test_tuned_kernel_is_correct_and_beats_the_default(tmp_path, device, strategy):
    wl = autosched.workload("matmul", M=128, N=128, K=128, epilogue="bias_relu")
    db = tmp_path / "records.db"
    seen = []
    result = autosched.tune(
        wl, trials=12, batch=6, strategy=strategy, db=db, seed=1, timing=QUICK, progress=seen.append
    )
    assert result.trials == 12 and result.new_trials == 12
    assert [e.trial for e in seen] == list(range(1, 13))
    assert result.best is not None and result.default is not None
    # Measured side by side at the end; a tuner that cannot beat the untuned schedule is useless.
    assert result.speedup > 2.0, (result.best.gflops, result.default.gflops)
    # The reported best kernel, rebuilt from its stored record, computes the reference.
    with SQLiteDatabase(db) as store:
        best = store.best(wl.key, device_key=device.key(), target="opencl")[0]
        assert len(store.query(workload_key=wl.key, device_key=device.key())) >= 12
    space = make_space(wl, limits=device.limits)
    program = build(space, Config.from_json(best.config))
    with MeasureWorker(device) as w:
        assert w.measure(program, make_data(wl, seed=7), QUICK).status == "ok"


def test_rerun_resumes_without_measuring_again(tmp_path, device):
    wl = autosched.workload("matmul", M=64, N=64, K=64)
    db = tmp_path / "r.db"
    first = autosched.tune(wl, trials=6, batch=3, strategy="random", db=db, seed=3, timing=QUICK)
    assert first.new_trials == 6
    again = autosched.tune(wl, trials=6, batch=3, strategy="random", db=db, seed=3, timing=QUICK)
    assert again.new_trials == 0 and again.trials == 6
    more = autosched.tune(wl, trials=9, batch=3, strategy="random", db=db, seed=4, timing=QUICK)
    assert more.new_trials == 3 and more.trials == 9
    with SQLiteDatabase(db) as store:
        searched = {r.config_key for r in store.query(workload_key=wl.key)}
    assert len(searched) >= 9


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autosched", *args],
        capture_output=True,
        text=True,
        timeout=600,
        **kw,
    )


def test_kill_mid_run_then_rerun_resumes(tmp_path):
    db = tmp_path / "kill.db"
    cmd = [
        sys.executable,
        "-m",
        "autosched",
        "tune",
        "--op",
        "matmul",
        "--shape",
        "96,64,64",
        "--trials",
        "13",  # the default, then four whole batches: a loaded machine that lets the
        "--batch",  # run finish before the kill still leaves 1 + 3n rows
        "3",
        "--strategy",
        "random",
        "--db",
        str(db),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 180
    while time.time() < deadline and _stored(db) < 4:
        time.sleep(0.2)
    assert _stored(db) >= 4, "no batch was stored in time"
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner, its build pool and its measuring worker
    proc.wait()
    with sqlite3.connect(db) as c:
        assert c.execute("pragma integrity_check").fetchone()[0] == "ok"
        before = c.execute("select count(*) from records").fetchone()[0]
    assert before % 3 == 0  # whole batches of 3 (the default the first's last)
    out = tmp_path / "resume.json"
    done = _cli(*cmd[3:], "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["trials"] == 13
    assert result["new_trials"] == 13 - before
    with sqlite3.connect(db) as c:
        keys = [k for (k,) in c.execute("select config_key from records order by id")]
    # The search phase (before the finalists are re-measured) never repeats a config:
    # nothing the killed run measured was measured again.
    assert len(set(keys[:13])) == 13


def test_a_tuner_killed_alone_leaves_no_child_and_no_fork_server_behind(tmp_path):
    """SIGKILL reaches the tuning process only: its build workers and measurement child,
    forked by a fork server, see it gone and exit, and the server with them."""
    db = tmp_path / "alone.db"
    mark = f"killed-alone-{os.getpid()}-{time.time()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "autosched", "tune", "--op", "matmul", "--shape", "96,64,64",
         "--trials", "40", "--batch", "4", "--strategy", "random", "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, AUTOSCHED_TEST_MARK=mark),
    )  # fmt: skip
    deadline = time.time() + 180
    while time.time() < deadline and not _stored(db):
        time.sleep(0.2)
    assert _stored(db) > 0, "no record was stored in time"
    # The server and the children it forked (not the tuner, a child of this process).
    running = marked_processes(mark)
    assert len(running) >= 3, running
    proc.kill()
    proc.wait()
    deadline = time.time() + 20
    while (left := marked_processes(mark)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


def _stored(db) -> int:
    """Records the tuner has committed to ``db`` so far (0 before it made the file)."""
    if not db.exists():  # connecting would create it
        return 0
    try:
        with sqlite3.connect(db) as c:
            return c.execute("select count(*) from records").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_build_workers_and_measurement_children_start_with_tvm_imported(tmp_path):
    """They are forked from a server that imported TVM once (about 3.5 s a process)."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        "from autosched.measure.lifeline import child_context\n\n"
        "def probe(queue):\n"
        "    queue.put('tvm' in sys.modules)\n\n"
        "if __name__ == '__main__':\n"
        "    ctx = child_context(tvm=True)\n"
        "    queue = ctx.Queue()\n"
        "    child = ctx.Process(target=probe, args=(queue,))\n"
        "    child.start()\n"
        "    print('parent', 'tvm' in sys.modules, 'child', queue.get(timeout=60))\n"
        "    child.join()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["parent", "False", "child", "True"], out.stdout


def test_tune_json_has_what_scripts_read(tmp_path):
    out = tmp_path / "t.json"
    res = _cli(
        "tune",
        "--op",
        "matmul",
        "--shape",
        "M=64,N=32,K=16",
        "--epilogue",
        "bias",
        "--trials",
        "4",
        "--batch",
        "2",
        "--strategy",
        "random",
        "--db",
        str(tmp_path / "j.db"),
        "--json",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    for key in ("workload", "device", "trials", "best", "default_gflops", "history"):
        assert key in data
    assert set(data["best"]) >= {"gflops", "latency_s", "config"}
    assert data["best"]["gflops"] > 0 and data["trials"] == 4
    assert [h["trial"] for h in data["history"]] == [1, 2, 3, 4]
    assert all(set(h) >= {"trial", "gflops", "status"} for h in data["history"])
    assert "GFLOP/s" in res.stdout and "speedup" in res.stdout
    best = _cli(
        "best",
        "--op",
        "matmul",
        "--shape",
        "64,32,16",
        "--epilogue",
        "bias",
        "--db",
        str(tmp_path / "j.db"),
        "--json",
        str(tmp_path / "b.json"),
    )
    assert best.returncode == 0, best.stderr
    assert json.loads((tmp_path / "b.json").read_text())["best"]["config"] == data["best"]["config"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--op", "conv9", "--shape", "1,2,3"], "unknown op 'conv9'; accepted: matmul"),
        (["--op", "matmul", "--shape", "8,8"], "malformed"),
        (["--op", "matmul", "--shape", "8,-8,8"], "not positive"),
        (["--op", "matmul", "--shape", "8,x,8"], "not an integer"),
        (["--op", "matmul", "--shape", "8,8,8", "--trials", "0"], "integer >= 1"),
        (["--op", "matmul", "--shape", "8,8,8", "--device", "99"], "no device '99'"),
        (["--op", "matmul", "--shape", "8,8,8", "--db", "/etc/hostname/x.db"], "/etc/hostname"),
        (
            ["--op", "matmul", "--shape", "8,8,8", "--strategy", "annealing"],
            "accepted: model, random, tpe",
        ),
        (
            ["--op", "matmul", "--shape", "8,8,8", "--epilogue", "gelu"],
            "accepted: none, bias, bias_relu",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, fragment):
    res = _cli("tune", *args)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("tuning ")]
    assert len(lines) == 1 and fragment in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_a_device_session_measures_every_workload_in_one_child(device):
    """A job sends one device batches of many workloads in turn (a model's tasks): its
    session keeps one measurement child for all of them, loads each batch's own test data
    (two seeds of one workload share its key, not its data: a stale reference would fail
    the check), and ends the child when it closes."""
    from autosched.tuning.runner import BatchRequest, DeviceSession

    matmul = autosched.workload("matmul", M=64, N=64, K=64)
    softmax = autosched.workload("softmax", rows=64, cols=128)
    session = DeviceSession(device, "opencl", keep=1, timing=QUICK)  # keep 1: tuners go
    pids = set()
    try:
        for wl, seed in [(matmul, 0), (softmax, 0), (matmul, 1), (matmul, 0), (softmax, 2)]:
            space = make_space(wl, target="opencl", limits=device.limits)
            request = BatchRequest(
                wl.to_json(), "opencl", device.key("opencl"), (space.default().to_json(),), seed
            )
            (rec,) = session.run(request)
            assert rec.status == "ok", (wl, seed, rec.error)
            pids.add(session._worker._proc.pid)
        child = session._worker._proc
        assert len(pids) == 1 and child.is_alive()
    finally:
        session.close()
    assert not child.is_alive()


def _measured(i: int, latency: float, status: str = "ok"):
    from tests.records_factory import make_record

    return make_record(i, latency=latency, status=status, config_key=f"c{i}")


def _with_config(record, i: int):
    config = Config({"tile": i})
    return dataclasses.replace(record, config=config.to_json(), config_key=config.key)


def test_a_batch_is_scaled_by_how_fast_its_control_ran_and_the_control_is_the_best_so_far():
    from autosched.tuning.control import MIN_NEW, BatchControl

    control = BatchControl()
    first = [_with_config(_measured(i, lat), i) for i, lat in enumerate([3e-3, 1e-3, 2e-3])]
    assert control.scale(first, None) == first  # no control: as measured
    new = [Config({"tile": i}) for i in range(3, 3 + MIN_NEW)]
    best = control.control(new)
    assert best is not None and best.key == first[1].config_key  # the fastest the search saw
    assert control.control(new[: MIN_NEW - 1]) is None  # a small batch goes without
    assert control.control([*new, best]) is None  # the best is in the batch anyway
    # The machine ran this batch 1.5x slow: the control took 1.5 ms against its 1 ms.
    batch = [_with_config(_measured(i, 0.9e-3 * 1.5), i) for i in range(3, 3 + MIN_NEW)]
    again = _with_config(_measured(1, 1.5e-3), 1)
    seen = control.scale([*batch[:2], again, *batch[2:]], best)
    assert [r.config_key for r in seen] == [r.config_key for r in batch]  # control left out
    assert all(abs(r.latency_s - 0.9e-3) < 1e-12 for r in seen)
    assert all(abs(r.gflops - b.gflops * 1.5) < 1e-9 for r, b in zip(seen, batch))
    # The batch's fastest is the search's best now, at its scaled figure.
    assert (
        control.control([Config({"tile": 99 + i}) for i in range(MIN_NEW)]).key
        == seen[0].config_key
    )
    # A control that failed says nothing about the machine: the batch stays as measured.
    failed = _with_config(_measured(3, 0.0, status="run_error"), 3)
    later = [_with_config(_measured(i, 2e-3), i) for i in range(20, 20 + MIN_NEW)]
    assert control.scale([*later, failed], Config({"tile": 3})) == later


def test_a_tune_times_its_best_again_in_each_batch_and_stores_that_record(tmp_path, device):
    db_path = tmp_path / "records.db"
    wl = autosched.workload("matmul", M=64, N=64, K=64)
    result = autosched.tune(
        wl, trials=16, batch=6, strategy="model", db=db_path, seed=3, timing=QUICK, finalists=0
    )
    # Batches: 6 configs (the default the last), then 6 and 4 new configs, each of these
    # two with the best so far.
    assert result.trials == 16 and len(result.history) == 16
    assert len({r.config_key for r in result.history}) == 16
    db = SQLiteDatabase(db_path)
    try:
        stored = sorted(db.query(workload_key=wl.key), key=lambda r: r.id)
    finally:
        db.close()
    assert len(stored) == 18  # every measurement kept as taken, the two controls' too
    keys = [r.config_key for r in stored]
    again = [i for i, k in enumerate(keys) if k in keys[:i]]
    assert len(again) == 2
    for i in again:  # each control is a config that ran before: timed again, not a trial
        assert any(r.ok and r.config_key == keys[i] for r in stored[:i])


def test_a_batch_is_timed_in_interleaved_passes_that_share_out_the_repeats(device):
    """Each pass times every config of the batch with its share of the repeats (but one
    far behind the batch's fastest after the first); the samples are pooled, and the
    records of an interleaved batch span it together (one window on the device, as the
    finalists' rounds do)."""
    from autosched.tuning.runner import BatchRequest, DeviceSession

    timing = TimingOptions(warmup=0, min_repeats=6, max_repeats=6, min_time_s=0.0, passes=3)
    part = timing.per_pass()
    assert (part.min_repeats, part.max_repeats, part.passes) == (2, 2, 1)
    assert TimingOptions(min_repeats=3, max_repeats=100, passes=3).per_pass().max_repeats == 34
    wl = autosched.workload("matmul", M=64, N=64, K=64)
    space = make_space(wl, target="opencl", limits=device.limits)
    configs = [space.default()]
    while len(configs) < 3:
        c = space.sample(np.random.default_rng(len(configs)), 1)[0]
        if c.key not in {k.key for k in configs}:
            configs.append(c)
    request = BatchRequest(
        wl.to_json(), "opencl", device.key("opencl"), tuple(c.to_json() for c in configs)
    )
    for passes, shared in ((3, True), (1, False)):
        session = DeviceSession(device, "opencl", timing=dataclasses.replace(timing, passes=passes))
        try:
            records = session.run(request)
        finally:
            session.close()
        assert all(r.ok for r in records), records
        fastest = min(records, key=lambda r: r.latency_s)
        assert len(fastest.latencies) == 6
        for r in records:  # a config far behind after its first pass is not timed again
            assert len(r.latencies) == 6 or (
                passes == 3 and len(r.latencies) == 2 and r.latency_s > 2 * fastest.latency_s
            ), (passes, r.latencies, fastest.latency_s)
        starts = [r.started_at for r in records]
        assert (len(set(starts)) == 1) is shared, (passes, starts)
        if not shared:  # one after another: no record's span reaches into the next one's
            assert all(a.ended_at <= b.started_at for a, b in zip(records, records[1:]))


def test_a_batch_s_control_is_timed_in_every_pass_however_its_first_came_out(device):
    """A config far behind the batch's fastest after the first pass is left there, but
    not the batch's control: its figure is what the whole batch is scaled by, so one slow
    pass of it must not stand alone."""
    from autosched.tuning.runner import BatchRequest, DeviceSession

    timing = TimingOptions(warmup=0, min_repeats=6, max_repeats=6, min_time_s=0.0, passes=3)
    wl = autosched.workload("matmul", M=256, N=256, K=256)
    space = make_space(wl, target="opencl", limits=device.limits)
    fast, slow = space.untuned(), space.default()  # vector tiles; one scalar per item
    configs = tuple(c.to_json() for c in (fast, slow))
    counts = {}
    for control in ("", slow.key):
        session = DeviceSession(device, "opencl", timing=timing)
        try:
            records = session.run(
                BatchRequest(wl.to_json(), "opencl", device.key("opencl"), configs, control=control)
            )
        finally:
            session.close()
        assert all(r.ok for r in records), records
        by_key = {r.config_key: r for r in records}
        assert by_key[slow.key].latency_s > 2.5 * by_key[fast.key].latency_s  # far behind
        counts[control] = len(by_key[slow.key].latencies)
    assert counts == {"": 2, slow.key: 6}


def test_a_session_closed_during_a_batch_ends_the_batch_as_a_lost_one(device):
    """A farm worker told to stop closes its device's session while a batch is timed in
    a Dask thread (a tune's Ctrl-C closes it the same way). The batch ends there, as a
    lost batch, which a job proposes again: not on and on in a fresh measurement child
    per config after the close (the code before), and not as a HarnessError, which
    would stop the whole job."""
    import threading

    from autosched.tuning.runner import BatchRequest, DeviceSession, LostBatch

    wl = autosched.workload("matmul", M=256, N=256, K=256)
    space = make_space(wl, target="opencl", limits=device.limits)
    configs = {c.key: c for c in space.sample(np.random.default_rng(3), 12)}
    request = BatchRequest(
        wl.to_json(), "opencl", device.key("opencl"), tuple(c.to_json() for c in configs.values())
    )
    session = DeviceSession(device, "opencl")
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(session.run(request))
        except Exception as exc:  # noqa: BLE001 - what the batch ended with is the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.time() + 240
    while (session._worker is None or session._worker._proc is None) and thread.is_alive():
        assert time.time() < deadline, "the batch never reached its timing"
        time.sleep(0.02)  # built in full; the measurement child has started
    worker = session._worker
    session.close()
    thread.join(240)
    assert not thread.is_alive()
    (ended,) = outcome
    assert isinstance(ended, LostBatch), ended
    assert worker._proc is None  # no child started after the close


def test_a_build_that_kills_its_worker_is_its_config_s_build_error():
    # A pool that breaks before its first build asks a fresh worker to run a no-op:
    # it does, so the crash was the config's (a whole process not able to start its
    # workers raises HarnessError instead: test_cli_tune's main-guard test).
    from autosched.measure.build import BuildResult
    from autosched.tuner import BuildPool

    pool = BuildPool(1, target="llvm")
    try:
        crashed = pool.result(pool.submit_call(os._exit, 3), 120)
        assert crashed.status == "build_error" and crashed.error == "build worker crashed"
        fine = pool.result(pool.submit_call(BuildResult, None, "invalid", "x"), 120)
        assert fine.status == "invalid"  # the pool it pinged builds on
    finally:
        pool.close()
