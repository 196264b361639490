"""The peers benchmark's shared harness: every run's finalists timed again by one stopwatch.

autosched's measurement worker times every finalist (blocking waits, the same warm-up
and repeats), round-robin with the vendor library, which runs in a process of its own
so that it shares no state with the tuners.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from autosched.measure.runner import TimingOptions
from bench.peers_runs import Finalist

log = logging.getLogger(__name__)

# How the shared re-timing times every finalist (and the vendor library, per round).
RETIME = TimingOptions(warmup=2, min_repeats=10, max_repeats=400, min_time_s=0.2)


def _vendor_child(conn, workload_json: dict, seed: int) -> None:
    from threadpoolctl import threadpool_limits

    from autosched.report.vendor import vendor_callable

    fn, inputs = vendor_callable(workload_json, seed=seed)

    def sample(min_time_s: float, min_repeats: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            fn(**inputs)
        times: list[float] = []
        while len(times) < min_repeats or sum(times) < min_time_s:
            t = time.perf_counter()
            fn(**inputs)
            times.append(time.perf_counter() - t)
        return times

    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        # As autosched.report.vendor times it: the BLAS's own threads and one thread, the
        # faster counts (a BLAS spinning its threads on busy cores can be far slower).
        default = sample(*msg[1:])
        with threadpool_limits(limits=1, user_api="blas"):
            single = sample(*msg[1:])
        if np.median(single) < np.median(default):
            conn.send((single, "1 thread"))
        else:
            conn.send((default, "the BLAS's default threads"))


def vendor_name(wl) -> str | None:
    """What the vendor baseline is (autosched.report.vendor's numpy call), or None."""
    from autosched.report.vendor import VENDOR_OPS

    if wl.op not in VENDOR_OPS:
        return None
    blas = versions().get("numpy_blas") or "numpy's BLAS"
    return f"numpy baseline of {wl.op} (autosched.report.vendor; {blas})"


class Vendor:
    """numpy/OpenBLAS in a spawned process: no state shared with the tuners."""

    def __init__(self, wl, *, seed: int = 0) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_vendor_child, args=(child, wl.to_json(), seed), daemon=True
        )
        self._proc.start()
        child.close()
        self.threads = ""

    def latencies(self, *, min_time_s: float, min_repeats: int, warmup: int) -> list[float]:
        """Timed calls (seconds) with the faster of the BLAS's threads and one thread;
        ``threads`` says which."""
        self._conn.send(("time", min_time_s, min_repeats, warmup))
        times, self.threads = self._conn.recv()
        return times

    def close(self) -> None:
        try:
            self._conn.send(("stop",))
        except OSError:
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


def versions() -> dict[str, str | None]:
    """Versions of the packages the benchmark compares, and numpy's BLAS."""
    out: dict[str, str | None] = {}
    for pkg in ("apache-tvm", "apache-tvm-ffi", "kernel_tuner", "pyopencl", "numpy", "optuna"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        out["numpy_blas"] = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError):
        out["numpy_blas"] = None
    return out


# -- the shared re-timing -----------------------------------------------------------------


def retime(
    finalists: Sequence[Finalist],
    wl,
    *,
    device,
    rounds: int,
    vendor: Vendor | None,
    timeout_s: float,
) -> list[list[float]]:
    """Time every finalist again, round-robin with the vendor library; its latencies per round.

    Each round visits the finalists in a rotated order, so no program always follows
    the same neighbour, and the vendor goes last and first in turn; every one gets the
    same warm-up and repeats. A finalist's latencies go to its ``visits``, a failure to
    its ``error``.
    """
    from autosched.measure.cpu import host_cpu
    from autosched.measure.runner import TestData
    from autosched.measure.worker import MeasureWorker

    inputs = wl.make_inputs(np.random.default_rng([0, 0x5EED]))
    data = TestData(wl.key, inputs, wl.reference(inputs), *wl.tolerance())
    workers: dict[str, MeasureWorker] = {}
    vendor_lat: list[list[float]] = []

    def time_vendor() -> None:
        if vendor is not None:
            vendor_lat.append(
                vendor.latencies(
                    min_time_s=RETIME.min_time_s,
                    min_repeats=RETIME.min_repeats,
                    warmup=RETIME.warmup,
                )
            )

    try:
        for rnd in range(rounds):
            if rnd % 2:
                time_vendor()
            shift = (rnd * len(finalists)) // max(rounds, 1)
            for f in list(finalists[shift:]) + list(finalists[:shift]):
                if f.error:
                    continue
                kind = f.program.kind
                if kind not in workers:
                    dev = device if kind == "opencl" else host_cpu()
                    workers[kind] = MeasureWorker(dev, timeout_s=timeout_s)
                out = workers[kind].measure(f.program, data, RETIME)
                if out.status == "ok":
                    f.visits.append(list(out.latencies))
                else:
                    f.error = f"{out.status}: {out.error}"[:500]
            if rnd % 2 == 0:
                time_vendor()
            log.info("re-timing: round %d of %d done", rnd + 1, rounds)
    finally:
        for w in workers.values():
            w.close()
    return vendor_lat
