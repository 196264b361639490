"""Run a built program on its device: correctness first, then honest timing.

This module runs inside a measurement worker process (see :mod:`autosched.measure.worker`).
:class:`OpenCLRunner` runs OpenCL programs through pyopencl and never imports TVM;
:class:`CpuRunner` runs llvm programs through TVM's runtime on the host CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autosched.measure.program import CpuProgram, KernelProgram
from autosched.records.record import BUILD_ERROR, INVALID, OK, RUN_ERROR, WRONG_RESULT


@dataclass(frozen=True)
class TimingOptions:
    """How a candidate is timed.

    Args:
        warmup: untimed runs after the first (correctness-checked) run.
        min_repeats: timed runs at least.
        max_repeats: timed runs at most.
        min_time_s: keep repeating until this much kernel time has been measured.
        passes: a search batch is timed in this many interleaved passes over its
            configs, each pass with its share of the repeats and time, and each
            config's samples pooled (:meth:`autosched.tuner.Tuner.measure`; configs far
            behind the batch's fastest after the first pass are not timed again): a
            neighbour's burst that halves the machine's speed for a fraction of a
            second spoils one pass of the config it hits, which the median outvotes.
    """

    warmup: int = 1
    min_repeats: int = 3
    max_repeats: int = 100
    min_time_s: float = 0.1
    passes: int = 3

    def per_pass(self) -> TimingOptions:
        """What each of the ``passes`` passes times: its share of the repeats and time."""
        n = max(1, self.passes)
        return dataclasses.replace(
            self,
            min_repeats=max(1, math.ceil(self.min_repeats / n)),
            max_repeats=max(1, math.ceil(self.max_repeats / n)),
            min_time_s=self.min_time_s / n,
            passes=1,
        )


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
    """What one run of a program gave: its status, and when it ran, one latency per
    sample, each the mean of ``calls_per_sample`` calls made back to back."""

    status: str
    error: str = ""
    latencies: tuple[float, ...] = ()
    compile_s: float = 0.0
    calls_per_sample: int = 1


class OpenCLRunner:
    """Owns one OpenCL context and queue; runs programs against cached test data."""

    # A sample of a short kernel is this long at least: launches queued back to back,
    # their profiled span over their count. One launch of a kernel of some 100 us on
    # PoCL's CPU device ran at one core's speed or at two by whether its second worker
    # thread was awake, so a config measured 2x apart from one batch to the next
    # (a softmax on Zen 4); queued launches keep the workers busy, and such slow
    # outliers went from about half the measurements to about one in fifteen.
    MIN_SAMPLE_S = 1e-3

    def __init__(self, platform_index: int, device_index: int) -> None:
        import pyopencl as cl

        self.cl = cl
        device = cl.get_platforms()[platform_index].get_devices()[device_index]
        self.device = device
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
        try:
            allowed = [
                k.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device)
                for k in kernels
            ]
        except Exception:  # a driver that cannot say: the launch will tell
            allowed = []
        problem = over_group_limit(allowed, [k.local_size for k in program.kernels])
        if problem:
            return RunOutcome(INVALID, problem, compile_s=time.perf_counter() - t0)
        # Outputs and scratch start unwritten so a kernel that skips elements is caught.
        bufs, outputs = [], {}
        for spec in program.tensors:
            if spec.role == "input":
                bufs.append(self._input_bufs[spec.name])
                continue
            host = unwritten(spec.shape, spec.dtype, self.data.expected.get(spec.name))
            buf = cl.Buffer(
                self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host
            )
            bufs.append(buf)
            if spec.role == "output":
                outputs[spec.name] = (host, buf)
        try:
            for kern, launch in zip(kernels, program.kernels):
                kern.set_args(*(bufs[i] for i in launch.args))

            def launch_all(wait: bool = True):
                events = [
                    cl.enqueue_nd_range_kernel(
                        self.queue, kern, launch.global_size, launch.local_size
                    )
                    for kern, launch in zip(kernels, program.kernels)
                ]
                # A blocking wait: busy-polling takes a core from PoCL's workers.
                if wait:
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
            estimate = time_one_call(launch_all, least_s=self.MIN_SAMPLE_S)
            number, _ = timing_plan(estimate, options, min_sample_s=self.MIN_SAMPLE_S)
            latencies: list[float] = []
            while len(latencies) < options.max_repeats and (
                len(latencies) < options.min_repeats or sum(latencies) * number < options.min_time_s
            ):
                start = time.perf_counter()
                runs = [launch_all(wait=False) for _ in range(number)]
                runs[-1][-1].wait()
                wall = (time.perf_counter() - start) / number
                profiled = (runs[-1][-1].profile.end - runs[0][0].profile.start) * 1e-9 / number
                latencies.append(_believable(profiled, wall))
        except Exception as exc:
            return RunOutcome(RUN_ERROR, f"launch failed: {_first_lines(exc)}")
        return RunOutcome(OK, "", tuple(latencies), compile_s, calls_per_sample=number)


# How a config refused by a compiled kernel's work-group limit is told (the error of
# its ``invalid`` record); the search reads it back (:func:`refused_group`).
_GROUP_REFUSAL = "the driver allows this compiled kernel at most"


def refused_group(status: str, error: str) -> bool:
    """Whether a record says its work-group was larger than the driver allowed the
    compiled kernel (:func:`over_group_limit`)."""
    return status == INVALID and _GROUP_REFUSAL in error


def over_group_limit(allowed: list[int], local_sizes: list) -> str:
    """Why a launch cannot run: a kernel's work-group is larger than the driver allows
    that compiled kernel (``CL_KERNEL_WORK_GROUP_SIZE``: on a GPU, what its registers and
    local memory leave), or "" when every one fits. Said before the launch, so the config
    is recorded ``invalid`` with the reason rather than a launch's OUT_OF_RESOURCES."""
    for i, (limit, local) in enumerate(zip(allowed, local_sizes)):
        items = math.prod(local) if local else 0
        if limit and items > limit:
            return (
                f"kernel {i} runs {items} work-items per group; {_GROUP_REFUSAL} "
                f"{limit} (its registers or local memory)"
            )
    return ""


def _believable(profiled_s: float, wall_s: float) -> float:
    """The event-profiled time of a launch, unless the device's profiling clock is broken.

    The profiled time is the honest one (no enqueue or wake-up overhead), but some
    drivers report nonsense: Mesa's rusticl on llvmpipe gives about 1 ns for a kernel
    that blocks the caller for milliseconds. A profiled time under 1% of the blocking
    wall time of a launch that took over 100 us is not believed; the wall time is used.
    """
    if wall_s > 1e-4 and profiled_s < 0.01 * wall_s:
        return wall_s
    return profiled_s


# TVM's runtime function that a timer runs before each sample to flush every argument
# but the first from the CPU caches (``CpuProgram.flush``).
FLUSH_ALL_BUT_FIRST = "cache_flush_cpu_non_first_arg"


class CpuRunner:
    """Runs llvm programs (shared libraries) through TVM's runtime on the host CPU.

    TVM's thread pool reads its size from ``TVM_NUM_THREADS`` when it starts, so the
    worker process sets that before the first kernel runs.

    Args:
        workdir: where libraries are written to be loaded (each is deleted once loaded).
    """

    # A timed sample of a very short kernel is several back-to-back calls, so that the
    # clock's resolution and the call overhead do not decide the figure.
    MIN_SAMPLE_S = 1e-4

    def __init__(self, workdir: str | Path) -> None:
        import tvm

        self.tvm = tvm
        self.dev = tvm.cpu(0)
        self.workdir = Path(workdir)
        self.data: TestData | None = None
        self._inputs: dict[str, object] = {}
        self._count = itertools.count()

    def set_data(self, data: TestData) -> None:
        self.data = data
        self._inputs = {
            name: self.tvm.runtime.tensor(np.ascontiguousarray(arr), self.dev)
            for name, arr in data.inputs.items()
        }

    def run(self, program: CpuProgram, options: TimingOptions) -> RunOutcome:
        tvm = self.tvm
        assert self.data is not None, "set_data first"
        t0 = time.perf_counter()
        path = self.workdir / f"kernel-{next(self._count)}.so"
        try:
            path.write_bytes(program.library)
            module = tvm.runtime.load_module(str(path))
            func = module[program.entry]
        except Exception as exc:
            return RunOutcome(BUILD_ERROR, f"cannot load the library: {_first_lines(exc)}")
        finally:
            path.unlink(missing_ok=True)  # loaded: the mapping outlives the file
        # Outputs and scratch start unwritten so a kernel that skips elements is caught.
        args, outputs = [], {}
        for spec in program.tensors:
            if spec.role == "input":
                args.append(self._inputs[spec.name])
                continue
            host = unwritten(spec.shape, spec.dtype, self.data.expected.get(spec.name))
            buf = tvm.runtime.tensor(host, self.dev)
            args.append(buf)
            if spec.role == "output":
                outputs[spec.name] = buf
        try:
            func(*args)
            compile_s = time.perf_counter() - t0
            for name, buf in outputs.items():
                problem = _compare(
                    buf.numpy(), self.data.expected[name], self.data.rtol, self.data.atol
                )
                if problem:
                    return RunOutcome(WRONG_RESULT, f"{name}: {problem}", compile_s=compile_s)
            for _ in range(options.warmup):
                func(*args)
            # Flushed operands: one call per sample (a second would find them cached).
            least = 0.0 if program.flush else self.MIN_SAMPLE_S
            estimate = time_one_call(lambda: func(*args), least_s=least)
            number, repeats = timing_plan(estimate, options, min_sample_s=least)
            flush = FLUSH_ALL_BUT_FIRST if program.flush else ""
            timer = module.time_evaluator(
                program.entry, self.dev, number=number, repeat=repeats, f_preproc=flush
            )
            latencies = tuple(float(t) for t in timer(*args).results)
        except Exception as exc:
            return RunOutcome(RUN_ERROR, f"call failed: {_first_lines(exc)}")
        return RunOutcome(OK, "", latencies, compile_s, calls_per_sample=number)


def time_one_call(call: Callable[[], object], *, least_s: float, most: int = 3) -> float:
    """Seconds of one ``call``: the fastest of up to ``most`` timed calls, fewer once they
    have taken ``10 * least_s`` together (a long kernel is timed once).

    A single timed call can catch a hiccup: on CI a 64x96x48 matmul that ran 0.2 ms a
    launch took over 1 ms in its one timed launch, so its samples were one launch each,
    the very regime ``least_s`` exists to avoid."""
    best, spent = math.inf, 0.0
    for _ in range(most):
        start = time.perf_counter()
        call()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent >= 10 * least_s:
            break
    return max(best, 1e-7)


def timing_plan(
    estimate_s: float, options: TimingOptions, *, min_sample_s: float
) -> tuple[int, int]:
    """``(calls per sample, samples)`` for a host-timed kernel whose one call took
    ``estimate_s``: each sample lasts at least ``min_sample_s`` (at most 1000 calls), and
    the samples fill ``options.min_time_s`` within the repeat bounds."""
    number = max(1, min(1000, math.ceil(min_sample_s / estimate_s)))
    repeats = math.ceil(options.min_time_s / (number * estimate_s))
    return number, max(options.min_repeats, min(options.max_repeats, repeats))


def unwritten(shape: tuple[int, ...], dtype: str, expected: np.ndarray | None) -> np.ndarray:
    """What an output or scratch buffer holds before a kernel runs, so that an element it
    skips is caught: NaN where the type has one; else each expected value with its
    lowest bit flipped (a bool negated), or the type's largest value in scratch. NaN
    cast to an integer is undefined, and numpy warned "invalid value encountered in
    cast" from every measuring worker that met a model's integer or mask output."""
    kind = np.dtype(dtype).kind
    if kind in "fc":
        return np.full(shape, np.nan, dtype=dtype)
    if expected is not None and expected.shape == tuple(shape):
        if kind == "b":
            return np.logical_not(expected)
        return np.bitwise_xor(expected.astype(dtype), np.ones((), dtype=dtype))
    if kind == "b":
        return np.ones(shape, dtype=dtype)
    return np.full(shape, np.iinfo(dtype).max, dtype=dtype)


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
