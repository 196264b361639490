"""bench/peers' MetaSchedule llvm runs: a program the run measured along the way (the one
its best-so-far stood on at a checkpoint) is rebuilt from the trace its measure callback
saw, and computes what the reference does.

Real parts: TVM MetaSchedule tuning a small matmul for the host CPU (its own builder and
runner), TVM codegen, autosched's measuring worker checking each rebuilt program.

The tune runs in a fresh interpreter (spawned) holding the modules it needs, as in
bench/peers' own process: importing MetaSchedule's tensor intrinsics calls
``inspect.stack()`` once per TVMScript function, and each call walks every loaded
module. On a Zen 4 that import took 21 s with TVM's 2,000 modules loaded and 69 s with
3,900 (pandas, scikit-learn, Dask distributed, matplotlib and the rest that the other
test files import into a test worker); in CI this test took 154-184 s.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

from autosched.measure.cpu import host_cpu
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import workload
from tests.conftest import make_data

FAST = TimingOptions(warmup=0, min_repeats=2, max_repeats=5, min_time_s=0.0)


def _tune_rebuild_measure() -> dict:
    """MetaSchedule's trials of a small matmul, and three of them rebuilt from their
    traces and measured: what the test checks."""
    from bench import peers_ms
    from bench.tune_llvm import metaschedule, trace_program

    wl = workload("matmul", M=48, N=64, K=32)
    TrialLog, _, _ = peers_ms._classes()
    log = TrialLog(wl.flops(), time.perf_counter())
    metaschedule(wl, trials=6, batch=6, seed=0, measure_callbacks=[log])
    entries = [e for e in log.entries if e["gflops"] is not None]
    rebuilt = []
    if entries:
        best = max(entries, key=lambda e: e["gflops"])
        data = make_data(wl)
        with MeasureWorker(host_cpu(), timeout_s=30) as worker:
            for entry in (entries[0], entries[-1], best):
                program = trace_program(wl, entry["trace"])
                outcome = worker.measure(program, data, FAST)
                rebuilt.append((program.library[:4], outcome.status, outcome.error))
    return {"trials": len(log.entries), "measured": len(entries), "rebuilt": rebuilt}


def test_programs_rebuilt_from_metaschedules_trial_traces_compute_the_reference():
    # Not a multiprocessing Pool: its daemonic workers may not start the measuring worker.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        got = pool.submit(_tune_rebuild_measure).result()
    assert got["trials"] == 6 and got["measured"] >= 3, got
    assert len(got["rebuilt"]) == 3
    for head, status, error in got["rebuilt"]:
        assert head == b"\x7fELF"
        assert status == "ok", error
