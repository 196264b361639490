"""Run a built program on an OpenCL device: correctness first, then honest timing.

This module runs inside a measurement worker process (see :mod:`autosched.measure.worker`);
it imports pyopencl but never TVM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autosched.measure.program import KernelProgram
from autosched.records.record import BUILD_ERROR, OK, RUN_ERROR, WRONG_RESULT


@dataclass(frozen=True)
class TimingOptions:
    """How a candidate is timed.

    Args:
        warmup: untimed runs after the first (correctness-checked) run.
        min_repeats: timed runs at least.
        max_repeats: timed runs at most.
        min_time_s: keep repeating until this much kernel time has been measured.
    """

    warmup: int = 1
    min_repeats: int = 3
    max_repeats: int = 100
    min_time_s: float = 0.1


@dataclass(frozen=True)
class TestData:
    """Inputs and expected outputs of a workload, shared by all its candidates."""

    key: str
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    rtol: float
    atol: float


@dataclass(frozen=True)
class RunOutcome:
    status: str
    error: str = ""
    latencies: tuple[float, ...] = ()
    compile_s: float = 0.0


class OpenCLRunner:
    """Owns one OpenCL context and queue; runs programs against cached test data."""

    def __init__(self, platform_index: int, device_index: int) -> None:
        import pyopencl as cl

        self.cl = cl
        device = cl.get_platforms()[platform_index].get_devices()[device_index]
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(
            self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE
        )
        self.data: TestData | None = None
        self._input_bufs: dict[str, object] = {}

    def set_data(self, data: TestData) -> None:
        cl = self.cl
        self.data = data
        mf = cl.mem_flags
        self._input_bufs = {
            name: cl.Buffer(
                self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(arr)
            )
            for name, arr in data.inputs.items()
        }

    def run(self, program: KernelProgram, options: TimingOptions) -> RunOutcome:
        cl = self.cl
        assert self.data is not None, "set_data first"
        t0 = time.perf_counter()
        try:
            prg = cl.Program(self.ctx, program.source).build()
            kernels = [getattr(prg, k.name) for k in program.kernels]
        except Exception as exc:
            return RunOutcome(BUILD_ERROR, f"OpenCL compiler: {_first_lines(exc)}")
        # Outputs and scratch start as NaN so a kernel that skips elements is caught.
        bufs, outputs = [], {}
        for spec in program.tensors:
            if spec.role == "input":
                bufs.append(self._input_bufs[spec.name])
                continue
            host = np.full(spec.shape, np.nan, dtype=spec.dtype)
            buf = cl.Buffer(
                self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host
            )
            bufs.append(buf)
            if spec.role == "output":
                outputs[spec.name] = (host, buf)
        try:
            for kern, launch in zip(kernels, program.kernels):
                kern.set_args(*(bufs[i] for i in launch.args))

            def launch_all():
                events = [
                    cl.enqueue_nd_range_kernel(
                        self.queue, kern, launch.global_size, launch.local_size
                    )
                    for kern, launch in zip(kernels, program.kernels)
                ]
                # A blocking wait: busy-polling takes a core from PoCL's workers.
                events[-1].wait()
                return events

            launch_all()  # compiles for this local size, and gives the result to check
            compile_s = time.perf_counter() - t0
            for name, (host, buf) in outputs.items():
                cl.enqueue_copy(self.queue, host, buf).wait()
                problem = _compare(host, self.data.expected[name], self.data.rtol, self.data.atol)
                if problem:
                    return RunOutcome(WRONG_RESULT, f"{name}: {problem}", compile_s=compile_s)
            for _ in range(options.warmup):
                launch_all()
            latencies: list[float] = []
            while len(latencies) < options.max_repeats and (
                len(latencies) < options.min_repeats or sum(latencies) < options.min_time_s
            ):
                events = launch_all()
                latencies.append((events[-1].profile.end - events[0].profile.start) * 1e-9)
        except Exception as exc:
            return RunOutcome(RUN_ERROR, f"launch failed: {_first_lines(exc)}")
        return RunOutcome(OK, "", tuple(latencies), compile_s)


def _compare(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> str:
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != expected {expected.shape}"
    bad = ~np.isclose(actual, expected, rtol=rtol, atol=atol)
    if not bad.any():
        return ""
    idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return (
        f"{int(bad.sum())} of {bad.size} elements differ; first at {tuple(int(i) for i in idx)}: "
        f"got {actual[idx]!r}, expected {expected[idx]!r} (rtol={rtol:g}, atol={atol:g})"
    )


def _first_lines(exc: BaseException, n: int = 6) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:2000] or type(exc).__name__
