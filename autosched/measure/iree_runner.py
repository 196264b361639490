"""Run IREE modules through ``iree.runtime``: correctness first, then timing.

Runs inside a measurement worker process (:mod:`autosched.measure.worker`), like the
OpenCL and TVM runners, and with the same rules: the first call's outputs are checked
against numpy's reference, then warm-up calls, then timed samples until enough time
is measured; a sample of a short kernel is several back-to-back calls.

A module's ``@main`` call returns when its work is done (IREE's synchronous calling
convention), so a call's wall time is the kernel's time plus the runtime's small
per-call overhead, the same for every config. On a GPU that overhead outweighs the
kernels (a millisecond a call on NVIDIA's Vulkan driver, against 20 us kernels), so its
programs carry a second module that runs each dispatch ``repeat`` times per call, and a
sample is the difference between the two modules' calls over ``repeat - 1``.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from autosched.measure.program import IreeProgram
from autosched.measure.runner import (
    RunOutcome,
    TestData,
    TimingOptions,
    _compare,
    _first_lines,
    time_one_call,
    timing_plan,
)
from autosched.records.record import BUILD_ERROR, OK, RUN_ERROR, WRONG_RESULT

log = logging.getLogger(__name__)

# Vulkan imports host memory only at this alignment of address and size
# (minImportedHostPointerAlignment).
HOST_ALIGNMENT = 4096


def aligned_block(nbytes: int) -> np.ndarray:
    """Bytes whose address and length are multiples of 4096 (at least ``nbytes``)."""
    padded = max(HOST_ALIGNMENT, -(-nbytes // HOST_ALIGNMENT) * HOST_ALIGNMENT)
    raw = np.empty(padded + HOST_ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % HOST_ALIGNMENT
    return raw[offset : offset + padded]


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 4096-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    return aligned_block(nbytes)[:nbytes].view(dtype).reshape(shape)


def thread_ticks() -> dict[int, int]:
    """This process's threads and the CPU clock ticks each has used (empty off Linux)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
    return out


LOWEST_PRIORITY = 19  # nice


def demote_spinning_threads(
    before: set[int], *, sample_s: float = 0.25, busy: float = 0.25
) -> list[int]:
    """Threads started since ``before`` that use at least ``busy`` of a core over
    ``sample_s`` while the process is idle get nice 19; returns them.

    A driver thread that busy-waits takes a core from the kernels being timed (on
    lavapipe it doubled a 512^3 matmul's time); at nice 19 it gets about 1.5 % of a core
    that anything else wants, and still notices a finished kernel. Decided by measuring
    the threads, not by their names: a driver that blocks in the kernel is left alone.
    """
    start = {t: n for t, n in thread_ticks().items() if t not in before}
    if not start:
        return []
    time.sleep(sample_s)
    end = thread_ticks()
    limit = busy * sample_s * os.sysconf("SC_CLK_TCK")
    spinning = [t for t, n in start.items() if end.get(t, n) - n >= limit]
    for tid in spinning:
        try:  # on Linux a thread id names that thread alone
            os.setpriority(os.PRIO_PROCESS, tid, LOWEST_PRIORITY)
        except OSError as exc:  # the thread ended
            log.debug("thread %d keeps its priority: %s", tid, exc)
    if spinning:
        log.info("%d spinning device thread(s) set to nice %d", len(spinning), LOWEST_PRIORITY)
    return spinning


class IreeRunner:
    """Owns one IREE runtime device; runs modules against cached test data.

    Args:
        driver: ``local-task`` or ``vulkan``.
        threads: ``local-task``: worker threads of IREE's task system.
    """

    MIN_SAMPLE_S = 1e-4

    def __init__(self, driver: str, threads: int = 0) -> None:
        import iree.runtime as rt

        if driver == "local-task" and threads:
            rt.flags.parse_flags(f"--task_topology_max_group_count={threads}")
        self.rt = rt
        self.driver = driver
        before = set(thread_ticks())
        self.config = rt.Config(driver)
        self.device = self.config.device
        # A GPU device's threads that spin while nothing runs (IREE's Vulkan driver on
        # lavapipe: two, each at 100 % of a core) get the lowest priority, so they stop
        # taking cores from the kernels being timed. Not on local-task: there the
        # device's threads are the ones that run the kernels.
        self.demoted = demote_spinning_threads(before) if driver != "local-task" else []
        self.data: TestData | None = None
        self._inputs: dict[str, object] = {}

    def set_data(self, data: TestData) -> None:
        self.data = data
        self._inputs = {
            name: self.rt.asdevicearray(self.device, np.ascontiguousarray(arr))
            for name, arr in data.inputs.items()
        }

    def to_numpy(self, array) -> np.ndarray:
        """A device array's contents on the host.

        ``DeviceArray.to_host`` maps what the host can see; a Vulkan buffer it cannot
        is copied into an imported host allocation, which Vulkan takes only 4096-byte
        aligned: here an aligned numpy array is imported and copied into. A driver that
        cannot import host memory gets a host-visible buffer of its own, mapped.
        """
        rt = self.rt
        if not hasattr(array, "_buffer_view") or array._is_mappable():
            return np.array(array.to_host())
        view = array._buffer_view
        source = view.get_buffer()
        shape, dtype = tuple(view.shape), np.dtype(array.dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        mem = int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE)
        usage = int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_PERSISTENT)
        allocator = self.device.allocator
        if self._importable(mem, usage, nbytes):
            block = aligned_block(nbytes)
            target = allocator.import_host_allocation(block, memory_type=mem, allowed_usage=usage)
            self._copy(source, target)
            return np.array(block[:nbytes].view(dtype).reshape(shape))
        # No VK_EXT_external_memory_host (NVIDIA's driver in a container): copy into a
        # host-visible buffer of the device's own and read it through a mapping.
        staging = int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED)
        target = allocator.allocate_buffer(
            memory_type=mem, allowed_usage=staging, allocation_size=nbytes
        )
        self._copy(source, target)
        return np.array(target.map().asarray(shape, dtype))

    def _importable(self, memory_type: int, usage: int, nbytes: int) -> bool:
        """Whether the device takes host memory as a buffer (VK_EXT_external_memory_host)."""
        compat = self.device.allocator.query_buffer_compatibility(
            memory_type=memory_type,
            allowed_usage=usage,
            intended_usage=usage,
            allocation_size=nbytes,
        )
        return bool(compat & int(self.rt.BufferCompatibility.IMPORTABLE))

    def _copy(self, source, target) -> None:
        """Device buffer to device buffer, waited for."""
        rt = self.rt
        sem = self.device.create_semaphore(0)
        self.device.queue_copy(
            source,
            target,
            wait_semaphores=rt.HalFence.create_at(sem, 0),
            signal_semaphores=rt.HalFence.create_at(sem, 1),
        )
        rt.HalFence.create_at(sem, 1).wait()

    def run(self, program: IreeProgram, options: TimingOptions) -> RunOutcome:
        assert self.data is not None, "set_data first"
        if program.driver != self.driver:
            return RunOutcome(
                RUN_ERROR, f"a {program.driver} module reached a {self.driver} device"
            )
        t0 = time.perf_counter()
        modules = [program.module] + ([program.repeated] if program.repeated else [])
        try:
            loaded = [self._load(m) for m in modules]  # (context, @main): the context lives on
            funcs = [func for _, func in loaded]
        except Exception as exc:
            return RunOutcome(BUILD_ERROR, f"cannot load the module: {_first_lines(exc)}")
        args = [self._inputs[t.name] for t in program.tensors if t.role == "input"]
        names = [t.name for t in program.tensors if t.role == "output"]
        try:
            for i, func in enumerate(funcs):
                problem = self._check(func(*args), names)
                if problem and i == 0:
                    return RunOutcome(WRONG_RESULT, problem, compile_s=time.perf_counter() - t0)
                if problem:  # its repeats do not leave the output as one dispatch does
                    log.info("repeated dispatches give a wrong result, timing calls: %s", problem)
                    funcs = funcs[:1]
            compile_s = time.perf_counter() - t0
            for _ in range(options.warmup):
                for func in funcs:
                    func(*args)
            last = funcs[-1]
            estimate = time_one_call(lambda: last(*args), least_s=self.MIN_SAMPLE_S)
            number, repeats = timing_plan(estimate, options, min_sample_s=self.MIN_SAMPLE_S)
            latencies = []
            for _ in range(repeats):
                spans = []
                for func in reversed(funcs):
                    start = time.perf_counter()
                    for _ in range(number):
                        func(*args)
                    spans.append((time.perf_counter() - start) / number)
                if len(spans) == 1:
                    latencies.append(spans[0])
                else:  # the calls' own cost cancels: per dispatch of the kernels
                    latencies.append((spans[0] - spans[1]) / (program.repeat - 1))
        except Exception as exc:
            return RunOutcome(RUN_ERROR, f"call failed: {_first_lines(exc)}")
        if float(np.median(latencies)) <= 0:
            return RunOutcome(
                RUN_ERROR,
                f"{program.repeat} dispatches per call took no longer than one: the "
                "kernels' time is below the noise of the call's own",
                compile_s=compile_s,
            )
        return RunOutcome(OK, "", tuple(latencies), compile_s, calls_per_sample=number)

    def _load(self, module: bytes) -> tuple:
        """A module loaded on this device: its context, and its ``@main``."""
        vm = self.rt.VmModule.copy_buffer(self.config.vm_instance, module)
        ctx = self.rt.SystemContext(vm_modules=[vm], config=self.config)
        return ctx, ctx.modules.module["main"]

    def _check(self, result, names: list[str]) -> str:
        """The first output that differs from numpy's reference, as a message ('' if none)."""
        assert self.data is not None
        results = result if isinstance(result, (tuple, list)) else (result,)
        for name, value in zip(names, results):
            problem = _compare(
                self.to_numpy(value), self.data.expected[name], self.data.rtol, self.data.atol
            )
            if problem:
                return f"{name}: {problem}"
        return ""
