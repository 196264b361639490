"""Killable measurement worker: a hung or crashing kernel never takes the tuner down.

The parent keeps one child process that owns the OpenCL context. Each candidate is
sent over a pipe with a deadline; if the child does not answer in time it is killed
(``timeout``), if it dies (``run_error``, with the signal), and a fresh child is
started for the next candidate.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time

from autosched.measure.device import Device
from autosched.measure.program import KernelProgram
from autosched.measure.runner import RunOutcome, TestData, TimingOptions
from autosched.records.record import RUN_ERROR, TIMEOUT

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0


def _child_main(conn, platform_index: int, device_index: int, env: dict[str, str]) -> None:
    os.environ.update(env)  # before pyopencl loads the ICD
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from autosched.measure.runner import OpenCLRunner

    runner = OpenCLRunner(platform_index, device_index)
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "data":
            runner.set_data(msg[1])
            conn.send(("ok",))
        elif kind == "run":
            try:
                conn.send(("result", runner.run(msg[1], msg[2])))
            except Exception as exc:  # a bug in the runner must not look like a hang
                conn.send(("result", RunOutcome(RUN_ERROR, f"runner: {type(exc).__name__}: {exc}")))


class MeasureWorker:
    """Measures programs on ``device`` in a child process, one at a time.

    Args:
        device: the OpenCL device.
        timeout_s: limit per candidate (OpenCL compile, check and all repeats).
    """

    def __init__(self, device: Device, *, timeout_s: float = 30.0) -> None:
        self.device = device
        self.timeout_s = timeout_s
        self._proc: mp.Process | None = None
        self._conn = None
        self._data_key: str | None = None
        # PoCL caches compiled kernels on disk; keep ours out of the user's cache.
        self._cache_dir = tempfile.mkdtemp(prefix="autosched-pocl-")
        self.restarts = 0

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        env = {"POCL_CACHE_DIR": self._cache_dir, "PYOPENCL_NO_CACHE": "1"}
        proc = ctx.Process(
            target=_child_main,
            args=(child, self.device.platform_index, self.device.device_index, env),
            daemon=True,
        )
        proc.start()
        child.close()
        if not parent.poll(_START_TIMEOUT_S):
            proc.kill()
            raise RuntimeError("measurement worker did not start")
        parent.recv()
        self._proc, self._conn, self._data_key = proc, parent, None

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._data_key = None, None, None
        self.restarts += 1

    def measure(self, program: KernelProgram, data: TestData, options: TimingOptions) -> RunOutcome:
        """Run ``program`` against ``data``; every failure comes back as an outcome."""
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self._kill()
            self._start()
        assert self._conn is not None
        start = time.perf_counter()
        try:
            if self._data_key != data.key:
                self._conn.send(("data", data))
                if not self._conn.poll(self.timeout_s):
                    raise TimeoutError
                self._conn.recv()
                self._data_key = data.key
            self._conn.send(("run", program, options))
            remaining = max(0.1, self.timeout_s - (time.perf_counter() - start))
            if not self._conn.poll(remaining):
                raise TimeoutError
            _, outcome = self._conn.recv()
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

    def close(self) -> None:
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
        shutil.rmtree(self._cache_dir, ignore_errors=True)

    def __enter__(self) -> MeasureWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
