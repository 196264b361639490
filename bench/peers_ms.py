"""TVM MetaSchedule as a peer: ``tune_tir`` with its XGBoost cost model, on llvm and OpenCL.

llvm: MetaSchedule as it comes (its local builder and runner), through
``bench.tune_llvm.metaschedule``. OpenCL: the TVM wheel has no OpenCL runtime, so a
``PyBuilder`` lowers each candidate with :func:`autosched.measure.build.opencl_program`
and a ``PyRunner`` times it with autosched's measurement worker, as autosched's own
candidates are timed. The target carries the PoCL device's real limits, since
MetaSchedule's GPU rules size thread blocks and shared memory from them.

Both record every trial in MetaSchedule's order through a measure callback; the
database keeps no order.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import time
from typing import Any

import numpy as np

from autosched.measure.device import Device
from autosched.measure.program import KernelProgram
from autosched.measure.runner import TestData, TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.records.record import OK
from bench.peers_metrics import checkpoint_leaders

log = logging.getLogger(__name__)


def _classes():
    """MetaSchedule subclasses, defined on first use so importing this module stays cheap."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

    @derived_object
    class TrialLog(PyMeasureCallback):
        """Every measured candidate, in order: GFLOP/s (None if it failed) and when."""

        def __init__(self, flops: float, start: float) -> None:
            super().__init__()
            self.flops = flops
            self.start = start
            self.entries: list[dict[str, Any]] = []

        def apply(
            self, task_scheduler, task_id, measure_candidates, builder_results, runner_results
        ):
            now = time.perf_counter() - self.start
            for c, b, r in zip(measure_candidates, builder_results, runner_results):
                error = b.error_msg or r.error_msg
                secs = [float(x) for x in (r.run_secs or [])]
                ok = not error and secs and all(s < 1e9 for s in secs)
                self.entries.append(
                    {
                        "gflops": self.flops / float(np.mean(secs)) / 1e9 if ok else None,
                        "t": now,
                        "error": None if ok else str(error or "no run time")[:500],
                        "built": not b.error_msg,
                        "trace": c.sch.trace,  # to rebuild a checkpoint's best
                    }
                )

    @derived_object
    class ProgramBuilder(PyBuilder):
        """Lowers each candidate to a KernelProgram, pickled as the artifact."""

        def __init__(self, tensors, target: dict[str, Any], work_dir: str) -> None:
            super().__init__()
            self.tensors = tuple(tensors)
            self.target = target
            self.work_dir = work_dir

        def build(self, build_inputs):
            from autosched.measure.build import opencl_program

            out = []
            for inp in build_inputs:
                try:
                    program = opencl_program(inp.mod, self.tensors, target=self.target)
                except Exception as exc:  # TVM's own errors: the candidate fails, not the run
                    out.append(BuilderResult(None, f"{type(exc).__name__}: {exc}"[:2000]))
                    continue
                # MetaSchedule deletes the artifact's folder once it is measured.
                path = os.path.join(tempfile.mkdtemp(dir=self.work_dir), "program.pkl")
                with open(path, "wb") as f:
                    pickle.dump(program, f)
                out.append(BuilderResult(path, None))
            return out

    @derived_object
    class Done(PyRunnerFuture):
        def __init__(self, result) -> None:
            super().__init__()
            self.res = result

        def done(self) -> bool:
            return True

        def result(self):
            return self.res

    @derived_object
    class WorkerRunner(PyRunner):
        """Times each program with autosched's killable measurement worker."""

        def __init__(self, worker: MeasureWorker, data: TestData, timing: TimingOptions, start):
            super().__init__()
            self.worker = worker
            self.data = data
            self.timing = timing
            self.start = start
            self.measured: list[tuple[float, KernelProgram | None]] = []

        def run(self, runner_inputs):
            futures = []
            for inp in runner_inputs:
                with open(inp.artifact_path, "rb") as f:
                    program = pickle.load(f)
                o = self.worker.measure(program, self.data, self.timing)
                if o.status == OK:
                    res = RunnerResult([float(x) for x in o.latencies], None)
                else:
                    res = RunnerResult(None, f"{o.status}: {o.error}"[:2000])
                self.measured.append(
                    (time.perf_counter() - self.start, program if o.status == OK else None)
                )
                futures.append(Done(res))
            return futures

    return TrialLog, ProgramBuilder, WorkerRunner


def opencl_target(device: Device) -> dict[str, Any]:
    """The OpenCL target with ``device``'s real limits (TVM's defaults are a small GPU's)."""
    from autosched.measure.cpu import host_cpu

    return {
        "kind": "opencl",
        "max_threads_per_block": device.max_work_group_size,
        "max_num_threads": device.max_work_group_size,
        "max_shared_memory_per_block": device.local_mem_bytes,
        # A GPU's warp or wavefront where its driver says (NVIDIA 32, AMD 32 or 64); no
        # SIMT warps on a CPU device: 1, also TVM's default for OpenCL.
        "thread_warp_size": device.subgroup_size or 1,
        "host": host_cpu().tvm_target(),
    }


def tune_llvm(wl, *, trials: int, batch: int, seed: int, top: int) -> dict[str, Any]:
    """MetaSchedule on TVM's llvm target (its own builder and runner)."""
    from bench.tune_llvm import metaschedule, trace_program

    TrialLog, _, _ = _classes()
    trial_log = TrialLog(wl.flops(), time.perf_counter())
    info = metaschedule(
        wl, trials=trials, batch=batch, seed=seed, top=top, measure_callbacks=[trial_log]
    )
    history = trial_log.entries
    traces = [entry.pop("trace") for entry in history]
    for entry in history:
        entry.pop("built")
    # Its database keeps no order: a top program's trial is the one that measured its
    # figure (the same run_secs, so the same float).
    trial_of = {}
    for i, entry in enumerate(history):
        trial_of.setdefault(entry["gflops"], i + 1)
    programs = [
        (f"top{i + 1}", program, g, trial_of.get(g))
        for i, (program, g) in enumerate(info["programs"])
    ]
    have = {trial for *_, trial in programs}
    for n, i in checkpoint_leaders([e["gflops"] for e in history]).items():
        if i + 1 not in have:
            have.add(i + 1)
            programs.append(
                (f"best@{n}", trace_program(wl, traces[i]), history[i]["gflops"], i + 1)
            )
    return {
        "history": history,
        "programs": programs,
        "best_trace": info["best_trace"],
        "wall_s": info["wall_s"],
        "trials": info["trials"],
        "wall_clock": "per batch (MetaSchedule reports a batch's results together)",
    }


def tune_opencl(
    wl,
    *,
    device: Device,
    trials: int,
    batch: int,
    seed: int,
    top: int,
    timing: TimingOptions | None = None,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """MetaSchedule on OpenCL, measured by autosched's worker on ``device``."""
    import tvm
    import tvm.s_tir.meta_schedule as ms

    from bench.tune_llvm import prim_module

    TrialLog, ProgramBuilder, WorkerRunner = _classes()
    rng = np.random.default_rng([seed, 0x5EED])
    inputs = wl.make_inputs(rng)
    data = TestData(wl.key, inputs, wl.reference(inputs), *wl.tolerance())
    target = opencl_target(device)
    mod = prim_module(wl)
    start = time.perf_counter()
    trial_log = TrialLog(wl.flops(), start)
    with (
        tempfile.TemporaryDirectory(prefix="bench-ms-cl-") as work_dir,
        MeasureWorker(device, timeout_s=timeout_s) as worker,
    ):
        builder = ProgramBuilder(wl.tensor_specs(), target, work_dir)
        runner = WorkerRunner(worker, data, timing or TimingOptions(), start)
        db = ms.tune_tir(
            mod,
            tvm.target.Target(target),
            work_dir,
            max_trials_global=trials,
            num_trials_per_iter=batch,
            builder=builder,
            runner=runner,
            seed=seed,
            measure_callbacks=[
                *ms.measure_callback.MeasureCallback.create("default"),
                trial_log,
            ],
        )
        wall = time.perf_counter() - start
        records = db.get_all_tuning_records()
    history = trial_log.entries
    for entry in history:
        entry.pop("trace")
    # The runner saw each built candidate finish: a finer clock than the callback's.
    built = [(i, entry) for i, entry in enumerate(history) if entry.pop("built")]
    ok: dict[int, tuple[float, KernelProgram]] = {}  # trial index -> (own GFLOP/s, program)
    if len(built) == len(runner.measured):
        for (i, entry), (t, program) in zip(built, runner.measured):
            entry["t"] = t
            if entry["gflops"] is not None and program is not None:
                ok[i] = (entry["gflops"], program)
    else:
        log.warning("MetaSchedule ran %d of %d built candidates", len(runner.measured), len(built))
    ranked = sorted(ok, key=lambda i: -ok[i][0])[:top]
    labels = {i: f"top{rank + 1}" for rank, i in enumerate(ranked)}
    for n, i in checkpoint_leaders([e["gflops"] for e in history]).items():
        if i in ok:
            labels.setdefault(i, f"best@{n}")
    return {
        "history": history,
        "programs": [(label, ok[i][1], ok[i][0], i + 1) for i, label in labels.items()],
        "wall_s": wall,
        "trials": len(records),
        "wall_clock": "per trial",
        "target": {k: v for k, v in target.items() if k != "host"},
    }
