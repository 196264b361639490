"""bench/peers' MetaSchedule llvm runs: a program the run measured along the way (the one
its best-so-far stood on at a checkpoint) is rebuilt from the trace its measure callback
saw, and computes what the reference does.

Real parts: TVM MetaSchedule tuning a small matmul for the host CPU (its own builder and
runner), TVM codegen, autosched's measuring worker checking each rebuilt program.
"""

from __future__ import annotations

import time

from autosched.measure.cpu import host_cpu
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import workload
from bench import peers_ms
from bench.tune_llvm import metaschedule, trace_program
from tests.conftest import make_data

FAST = TimingOptions(warmup=0, min_repeats=2, max_repeats=5, min_time_s=0.0)


def test_programs_rebuilt_from_metaschedules_trial_traces_compute_the_reference():
    wl = workload("matmul", M=48, N=64, K=32)
    TrialLog, _, _ = peers_ms._classes()
    log = TrialLog(wl.flops(), time.perf_counter())
    metaschedule(wl, trials=6, batch=6, seed=0, measure_callbacks=[log])
    entries = [e for e in log.entries if e["gflops"] is not None]
    assert len(log.entries) == 6 and len(entries) >= 3
    best = max(entries, key=lambda e: e["gflops"])
    data = make_data(wl)
    with MeasureWorker(host_cpu(), timeout_s=30) as worker:
        for entry in (entries[0], entries[-1], best):
            program = trace_program(wl, entry["trace"])
            assert program.library.startswith(b"\x7fELF")
            outcome = worker.measure(program, data, FAST)
            assert outcome.status == "ok", outcome.error
