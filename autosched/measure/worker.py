"""Killable measurement worker: a hung or crashing kernel never takes the tuner down.

The parent keeps one child process that owns the device: the OpenCL context, or, for
the host CPU (``llvm``), TVM's runtime and its thread pool. Each candidate is sent over
a pipe with a deadline; if the child does not answer in time it is killed
(``timeout``), if it dies (``run_error``, with the signal), and a fresh child is
started for the next candidate. The child picks the runner by the program's kind. A
child is retired, and a fresh one started, after :data:`PROGRAMS_PER_CHILD` programs:
TVM's runtime and PoCL keep every kernel they load mapped.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from autosched.errors import HarnessError
from autosched.measure.cpu import HostCPU
from autosched.measure.device import Device
from autosched.measure.iree_device import IreeDevice
from autosched.measure.lifeline import child_context, exit_with_parent
from autosched.measure.program import Program
from autosched.measure.runner import RunOutcome, TestData, TimingOptions
from autosched.records.record import RUN_ERROR, TIMEOUT

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0
# A child keeps every kernel it has loaded mapped: TVM's runtime never unloads an llvm
# candidate's library (tvm-ffi 0.1.14: five mappings and 16-60 KiB apiece), nor PoCL the
# shared object it compiles each OpenCL program to (four mappings). At Linux's default
# limit of 65,530 mappings per process (vm.max_map_count) an llvm child's 13,026th load
# fails ("failed to map segment from shared object"), and every later candidate of an
# overnight job would be recorded as a build error. So a child is retired after this
# many programs and a fresh one takes the next, as a process pool's maxtasksperchild
# retires its workers: at most 5,000 mappings, one child start per 1,000 candidates.
# Its kernels' files go with it: PoCL's cache of them (70 KiB or more a program) and the
# llvm libraries that, deleted, stay on disk while mapped (in memory, where /tmp is a
# tmpfs): a night's 20,000 candidates would leave gigabytes.
PROGRAMS_PER_CHILD = 1000


def _child_main(conn, device_spec: tuple, env: dict[str, str], workdir: str, parent: int) -> None:
    """``device_spec``: ``("opencl", platform_index, device_index)``, ``("llvm",)`` or
    ``("iree", driver, threads)``."""
    os.environ.update(env)  # before pyopencl loads the ICD, before TVM starts its threads
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    exit_with_parent(parent=parent)  # a hung kernel must not outlive a killed tuner
    runners: dict[str, object] = {}

    def runner_for(kind: str):
        if kind not in runners:
            if kind != device_spec[0]:
                raise ValueError(f"a {kind} program cannot run on a {device_spec[0]} device")
            if kind == "opencl":
                from autosched.measure.runner import OpenCLRunner

                runners[kind] = OpenCLRunner(device_spec[1], device_spec[2])
            elif kind == "iree":
                from autosched.measure.iree_runner import IreeRunner

                runners[kind] = IreeRunner(device_spec[1], device_spec[2])
            else:
                from autosched.measure.runner import CpuRunner

                runners[kind] = CpuRunner(workdir)
            if data is not None:
                runners[kind].set_data(data)
        return runners[kind]

    data: TestData | None = None
    output = _Output(workdir)
    runner_for(device_spec[0])  # open the device now: a broken driver fails the start
    conn.send(("ready", output.take()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "data":
            data = msg[1]
            for runner in runners.values():
                runner.set_data(data)
            conn.send(("ok",))
        elif kind == "run":
            try:
                outcome = runner_for(msg[1].kind).run(msg[1], msg[2])
            except Exception as exc:  # a bug in the runner must not look like a hang
                outcome = RunOutcome(RUN_ERROR, f"runner: {type(exc).__name__}: {exc}")
            conn.send(("result", outcome, output.take()))


class _Output:
    """The child's stdout and stderr, at the file-descriptor level, go to a file.

    OpenCL drivers and their compilers (PoCL's clang: "2 warnings generated.") write
    straight to fds 1 and 2. Caught here, each candidate's share is sent to the parent
    with its result and logged there (shown with ``-v``), never printed over the
    progress line.
    """

    def __init__(self, workdir: str) -> None:
        self.path = Path(workdir) / f"output-{os.getpid()}.txt"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:  # the parent removed its folder: it is shutting down
            fd = os.open(os.devnull, os.O_WRONLY)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self.offset = 0

    def take(self) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(64 * 1024)
                self.offset = f.seek(0, os.SEEK_END)
        except OSError:  # gone with the parent's folder, or never made
            return ""
        return data.decode(errors="replace")


def _log_output(text: str, what: str) -> None:
    if text.strip():
        log.info("%s printed:\n%s", what, text.rstrip())


_DIR_PREFIX = "autosched-measure-"


def _sweep_stale_dirs() -> None:
    """Remove work folders of tuners that were killed before they could clean up.

    Folders are named after the owning process; one whose owner is gone is stale.
    """
    root = Path(tempfile.gettempdir())
    for path in root.glob(f"{_DIR_PREFIX}*-*"):
        pid = path.name[len(_DIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def pocl_pinning(device: Device) -> dict[str, str]:
    """``POCL_AFFINITY`` for a measurement child on ``device``.

    PoCL's CPU driver pins its thread i to CPU i when asked. Unpinned, its threads
    migrate: on an AVX2 Zen 3, a 0.2 ms matmul's (251x509x127) slowest tenth of samples
    ran from 75 and 93 GFLOP/s unpinned against 125 and 105 pinned, in two runs of
    interleaved rounds; medians moved within 3 % either way (three runs, 512^3 too). It
    is asked only of PoCL on a CPU, and only where this process may run on every one of
    CPUs 0..compute_units-1: under a narrower cpuset or taskset the pinning would fail.
    A POCL_AFFINITY of the user's own is passed on as it is (the child's environment is
    the fork server's, from before the user set it).
    """
    own = os.environ.get("POCL_AFFINITY")
    if own is not None:
        return {"POCL_AFFINITY": own}
    if device.type != "cpu" or "Portable Computing Language" not in device.platform:
        return {}
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # no affinity masks here (not Linux)
        return {}
    return {"POCL_AFFINITY": "1"} if set(range(device.compute_units)) <= allowed else {}


class MeasureWorker:
    """Measures programs on ``device`` in a child process, one at a time.

    Args:
        device: an OpenCL device, or the host CPU for llvm programs.
        timeout_s: limit per candidate (loading or compiling, check and all repeats).
    """

    def __init__(self, device: Device | HostCPU | IreeDevice, *, timeout_s: float = 30.0) -> None:
        self.device = device
        self.timeout_s = timeout_s
        self._proc: mp.Process | None = None
        self._conn = None
        self._data: TestData | None = None
        # PoCL caches compiled kernels on disk; keep ours out of the user's cache. The
        # llvm runner writes each library here to load it.
        _sweep_stale_dirs()
        self._cache_dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
        self.restarts = 0
        self.retired = 0  # children ended after PROGRAMS_PER_CHILD programs
        self._programs = 0  # programs the present child has run
        # Why the last child could not start ("" once one has): the device's or the
        # host's failure, not the programs' (autosched.tuning.runner.DeviceSession).
        self.start_error = ""
        # close() may come from another thread than the measuring one (a session's close
        # on Ctrl-C): the check for it and a child's start are one step, so no child
        # starts after the close has stopped the last one.
        self._closed = False
        self._lifecycle = threading.Lock()

    def _spec(self) -> tuple[tuple, dict[str, str]]:
        if isinstance(self.device, IreeDevice):
            # lavapipe sizes its thread pool from the machine unless told.
            env = {"LP_NUM_THREADS": str(self.device.cores)} if self.device.type == "cpu" else {}
            return ("iree", self.device.driver, self.device.cores), env
        if isinstance(self.device, HostCPU):
            # TVM's pool otherwise sizes itself from the machine, not from what we may use.
            return ("llvm",), self.device.thread_env()
        spec = ("opencl", self.device.platform_index, self.device.device_index)
        env = {"POCL_CACHE_DIR": self._cache_dir, "PYOPENCL_NO_CACHE": "1"}
        return spec, env | pocl_pinning(self.device)

    def _start(self) -> None:
        # TVM for an llvm child; and for an OpenCL one, so that the build workers forked
        # after it (from the same server) find it imported.
        ctx = child_context(tvm=not isinstance(self.device, IreeDevice))
        parent, child = ctx.Pipe()
        spec, env = self._spec()
        proc = ctx.Process(
            target=_child_main,
            args=(child, spec, env, self._cache_dir, os.getpid()),
            daemon=True,
        )
        proc.start()
        child.close()
        if not parent.poll(_START_TIMEOUT_S):
            proc.kill()
            raise RuntimeError("measurement worker did not start")
        _log_output(parent.recv()[1], "the device's driver, opening it,")
        self._proc, self._conn, self._data = proc, parent, None
        self._programs = 0
        self.start_error = ""

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            leftover = Path(self._cache_dir) / f"output-{self._proc.pid}.txt"
            try:  # what a crashing driver said last
                _log_output(
                    leftover.read_bytes()[-4000:].decode(errors="replace"), "the killed child"
                )
                leftover.unlink()
            except OSError:
                pass
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._data = None, None, None
        self.restarts += 1

    def measure(self, program: Program, data: TestData, options: TimingOptions) -> RunOutcome:
        """Run ``program`` against ``data``; every failure comes back as an outcome.

        Raises:
            HarnessError: the worker is closed. A batch that a thread was timing when its
                session closed (Ctrl-C) ends there rather than start a child per config left.
        """
        with self._lifecycle:
            if self._closed:
                raise HarnessError("the measurement worker is closed")
            if self._proc is None or not self._proc.is_alive():
                if self._proc is not None:
                    self._kill()
                try:
                    self._start()
                except (OSError, RuntimeError) as exc:  # the device's, not the program's
                    self.start_error = f"{type(exc).__name__}: {exc}"
                    return RunOutcome(RUN_ERROR, f"cannot start the measurement child: {exc}")
        if self._conn is None:  # closed from another thread since
            raise HarnessError("the measurement worker is closed")
        start = time.perf_counter()
        try:
            # Tuners sharing this worker each have their own data, and two of one
            # workload (other seeds) share a key: the object itself says what is loaded.
            if self._data is not data:
                self._conn.send(("data", data))
                if not self._conn.poll(self.timeout_s):
                    raise TimeoutError
                self._conn.recv()
                self._data = data
            self._conn.send(("run", program, options))
            remaining = max(0.1, self.timeout_s - (time.perf_counter() - start))
            if not self._conn.poll(remaining):
                raise TimeoutError
            _, outcome, output = self._conn.recv()
            _log_output(output, f"the driver and compiler, for {program.kind} program,")
            self._programs += 1
            if self._programs >= PROGRAMS_PER_CHILD:
                self._retire()
            return outcome
        except TimeoutError:
            self._kill()
            return RunOutcome(TIMEOUT, f"no result within {self.timeout_s:g} s; worker killed")
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = self._proc.exitcode if self._proc is not None else None
            if self._proc is not None:
                self._proc.join(1)
                code = self._proc.exitcode
            self._kill()
            how = (
                f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
            )
            return RunOutcome(RUN_ERROR, f"measurement worker crashed ({how})")

    def _retire(self) -> None:
        try:
            self.reset()
        except OSError as exc:  # the next child starts in the old folder
            log.warning("cannot make a fresh folder for the measurement child: %s", exc)
        self.retired += 1

    def reset(self) -> None:
        """End the child; the next starts in a new folder, and the old one goes with the
        kernels the child compiled and loaded there.

        Raises:
            OSError: no folder can be made (the temporary directory is gone or full).
        """
        self.stop()
        with self._lifecycle:
            if self._closed:  # its close removes the folder; no new one after it
                return
            old = self._cache_dir
            self._cache_dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
        shutil.rmtree(old, ignore_errors=True)
        if os.path.lexists(old) and not os.path.isdir(old):  # something else took its place
            with contextlib.suppress(OSError):
                os.remove(old)

    def close(self) -> None:
        """End the child and remove its folder: the worker is done."""
        with self._lifecycle:
            self._closed = True
        self.stop()
        shutil.rmtree(self._cache_dir, ignore_errors=True)

    def stop(self) -> None:
        """End the child only; the next measurement starts a new one."""
        if self._proc is not None and self._proc.is_alive() and self._conn is not None:
            try:
                self._conn.send(("stop",))
                self._proc.join(2)
            except OSError:
                pass
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)
        self._proc = self._conn = None
        self._data = None

    def __enter__(self) -> MeasureWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
