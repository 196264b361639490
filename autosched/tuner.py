"""Measuring candidates of one workload on one local device: a pool of build
workers (a crashing build takes only its worker down) and a killable measurement child
(a hung or crashing kernel takes only the child). :class:`Tuner` turns configs into
records; the loop that proposes them and stores them is :mod:`autosched.tuning.loop`,
and :func:`autosched.tuning.tune.tune` runs it for one workload on this machine.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from autosched.errors import HarnessError
from autosched.iree import IREE_TARGETS
from autosched.measure.build import BuildResult
from autosched.measure.cpu import HostCPU
from autosched.measure.device import Device
from autosched.measure.lifeline import GUARD, child_context, exit_with_parent
from autosched.measure.runner import RunOutcome, TestData, TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import Workload, workload_from_json
from autosched.records.base import Database
from autosched.records.record import BUILD_ERROR, INVALID, OK, Record
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits

log = logging.getLogger(__name__)


# -- build workers ---------------------------------------------------------------------


# A config whose first pass came out more than this many times slower than the batch's
# fastest is not timed again in the later passes: the bursts measured on a shared 2-core
# VM slowed a config 2.3x at most (bench/batch_noise), so one that far behind is behind
# on its merits, and a batch of random configs does not pay three passes for its slow ones.
AGAIN_WITHIN = 2.5


def _build_task(
    workload_json: dict, config_json: dict, limits: DeviceLimits, target: str
) -> BuildResult:
    """Runs in a build worker process."""
    from autosched.errors import ScheduleError
    from autosched.measure.build import build

    start = time.perf_counter()
    space = make_space(workload_from_json(workload_json), target=target, limits=limits)
    config = Config.from_json(config_json)
    reason = space.check(config)
    if reason:
        return BuildResult(None, INVALID, reason)
    try:
        program = build(space, config)
    except ScheduleError as exc:
        return BuildResult(None, BUILD_ERROR, str(exc)[:2000], time.perf_counter() - start)
    except Exception as exc:  # TVM's own errors: keep kind and message as data
        return BuildResult(
            None, BUILD_ERROR, f"{type(exc).__name__}: {exc}"[:2000], time.perf_counter() - start
        )
    return BuildResult(program, OK, "", time.perf_counter() - start)


def _no_op() -> None:
    """What a build worker runs to show it can run anything at all."""


def _build_worker_init(show_output: bool, parent: int) -> None:
    """Ctrl-C is the tuning process's to handle: it shuts the build pool down itself; a
    build worker whose tuning process was killed exits instead of waiting forever; and
    what compilers print goes to the terminal only in verbose mode (TVM reports its
    errors as exceptions, which become the records' messages)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(parent=parent)
    if not show_output:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)


def default_build_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


class BuildPool:
    """A process pool that survives a crashing build. Started on the first build; a
    device's session shares one among the workloads it tunes."""

    def __init__(self, workers: int, *, target: str) -> None:
        """``target``: what the pool builds for (every target but IREE's builds with TVM,
        which its workers then find imported: :func:`child_context`)."""
        self.workers = workers
        self.tvm = target not in IREE_TARGETS
        self._pool: cf.ProcessPoolExecutor | None = None
        self._built = False  # whether any of its workers ever returned a build
        self._closed = False
        self._lifecycle = threading.Lock()  # the close and a pool's start, one at a time

    def submit(self, *args) -> cf.Future:
        return self.submit_call(_build_task, *args)

    def submit_call(self, fn: Callable[..., Any], *args) -> cf.Future:
        """``fn(*args)`` in a build worker; the pool starts on first use.

        Raises:
            HarnessError: the pool is closed (its session's close, on Ctrl-C, ends a batch
                that a thread is building rather than start a pool for it again).
        """
        with self._lifecycle:
            if self._closed:
                raise HarnessError("the build pool is closed")
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(
                    self.workers,
                    mp_context=child_context(tvm=self.tvm),
                    initializer=_build_worker_init,
                    initargs=(log.isEnabledFor(logging.INFO), os.getpid()),
                )
            return self._pool.submit(fn, *args)

    def result(self, fut: cf.Future, timeout_s: float) -> BuildResult:
        """The build's result; a build that crashed its worker or overran is a
        BUILD_ERROR of its config.

        Raises:
            HarnessError: the pool broke before any build came back and a fresh pool's
                worker cannot even answer a no-op: no config is to blame.
        """
        try:
            out = fut.result(timeout=timeout_s)
        except cf.TimeoutError:
            self.reset()
            return BuildResult(None, BUILD_ERROR, f"build took longer than {timeout_s:g} s")
        except cf.process.BrokenProcessPool:
            if self._closed:
                raise HarnessError("the build pool is closed") from None
            self.reset()
            if not self._built and not self._answers():
                raise HarnessError(f"the build workers die as they start: {GUARD}") from None
            return BuildResult(None, BUILD_ERROR, "build worker crashed")
        self._built = True
        return out

    def _answers(self, timeout_s: float = 120.0) -> bool:
        """Whether a fresh pool's worker runs a no-op (kept as this pool's if so)."""
        try:
            self.submit_call(_no_op).result(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - however the no-op fails, no worker answers
            self.reset()
            return False
        return True

    def reset(self) -> None:
        if self._pool is not None:
            for proc in list(getattr(self._pool, "_processes", {}).values()):
                proc.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def close(self) -> None:
        with self._lifecycle:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


# -- one workload on one device ----------------------------------------------------------


class Tuner:
    """One tuning session of a workload on a device. ``tune()`` is the plain entry."""

    def __init__(
        self,
        workload: Workload,
        *,
        db: Database,
        device: Device | HostCPU,
        target: str = "opencl",
        seed: int = 0,
        timeout_s: float = 30.0,
        timing: TimingOptions | None = None,
        build_workers: int | None = None,
        worker: MeasureWorker | None = None,
        builders: BuildPool | None = None,
    ) -> None:
        """``worker`` and ``builders``: a measurement child and a build pool shared with
        other tuners of the same device (its session closes them); by default the tuner
        starts and closes its own."""
        self.workload = workload
        self.db = db
        self.device = device
        self.target = target
        self.seed = seed
        self.timing = timing or TimingOptions()
        self.space = make_space(workload, target=target, limits=device.limits)
        self.device_key = device.key(target)
        self.device_family = device.family(target)
        self.fingerprint = device.fingerprint(target)
        self.run_id = uuid.uuid4().hex[:12]
        self.worker_name = f"{socket.gethostname()}:{os.getpid()}"  # who measured, per record
        rng = np.random.default_rng([seed, 0x5EED])
        inputs, expected = workload.test_data(rng)
        rtol, atol = workload.tolerance()
        self.data = TestData(workload.key, inputs, expected, rtol, atol)
        self.timeout_s = timeout_s
        self._owns = (worker is None, builders is None)
        self.worker = worker or MeasureWorker(device, timeout_s=timeout_s)
        self.builders = builders or BuildPool(
            build_workers or default_build_workers(), target=target
        )

    def close(self) -> None:
        if self._owns[0]:
            self.worker.close()
        if self._owns[1]:
            self.builders.close()

    # one candidate -> one record
    def _record(
        self,
        config: Config,
        build: BuildResult,
        outcome: RunOutcome | None,
        started_at: float | None = None,
        rounds: int = 0,
    ) -> Record:
        status, error, lat = build.status, build.error, ()
        if outcome is not None:
            status, error, lat = outcome.status, outcome.error, outcome.latencies
        median = spread = gflops = None
        if status == OK and lat:
            arr = np.asarray(lat)
            median = float(np.median(arr))
            q1, q3 = np.percentile(arr, [25, 75])
            spread = float((q3 - q1) / median)
            gflops = self.workload.flops() / median / 1e9
        return Record(
            workload_key=self.workload.key,
            workload=self.workload.to_json(),
            target=self.target,
            device_key=self.device_key,
            device_family=self.device_family,
            device=self.fingerprint,
            config_key=config.key,
            config=config.to_json(),
            status=status,
            error=error,
            latencies=tuple(float(x) for x in lat),
            latency_s=median,
            spread=spread,
            gflops=gflops,
            timestamp=time.time(),
            run_id=self.run_id,
            started_at=started_at,
            ended_at=time.time() if started_at is not None else None,
            worker=self.worker_name,
            rounds=rounds,
        )

    def _submit(self, config: Config) -> cf.Future:
        return self.builders.submit(
            self.workload.to_json(), config.to_json(), self.device.limits, self.target
        )

    def measure(
        self,
        configs: Sequence[Config],
        *,
        on_record: Callable[[Record], None] | None = None,
        control: str = "",
    ) -> list[Record]:
        """Build all ``configs`` in the worker pool and time them in ``timing.passes``
        interleaved passes (the first as each build lands), pooling each one's samples.

        Where the device is the host's CPU (llvm, the IREE targets, an OpenCL CPU driver
        such as PoCL), the builds run on the cores that the kernels are timed on, so the
        whole batch is built before the first measurement (on the AVX2 Zen 3's PoCL a
        batch's first configs had been timed while up to 15 others built; one read 71
        GFLOP/s there, 120 alone, and a first pass 2.5x behind the batch's fastest is not
        timed again: ``AGAIN_WITHIN``). A config that fails in any pass (a wrong result, a
        hang) is recorded as that failure.

        ``control`` (a config key) is the batch's control (:mod:`autosched.tuning.control`),
        timed in every pass however its first came out: its figure says how fast the whole
        batch ran, and one slow first pass of it is a burst, not its merit (a lavapipe
        sample's control read 3.7 GFLOP/s in a first pass, 14.0 in the batch before
        and 12.8 in the closing round; left at that one pass, its batch read 2.8x slow).
        """
        futures = [self._submit(c) for c in configs]
        self.worker.timeout_s = self.timeout_s  # a shared worker serves other timeouts too
        limit = max(60.0, self.timeout_s)
        builds: list[BuildResult | None] = [None] * len(configs)
        if self.target != "opencl" or self.device.limits.is_cpu:
            builds = [self.builders.result(fut, limit) for fut in futures]
        part = self.timing.per_pass()
        outcomes: list[RunOutcome | None] = [None] * len(configs)
        started_at = [0.0] * len(configs)
        out: list[Record] = []

        def emit(i: int, started: float) -> None:
            built = builds[i]
            assert built is not None
            rec = self._record(configs[i], built, outcomes[i], started)
            if rec.status != OK:
                log.info("config %s: %s: %s", configs[i].key, rec.status, rec.error[:300])
            out.append(rec)
            if on_record:
                on_record(rec)

        for i, fut in enumerate(futures):
            built = builds[i] = builds[i] or self.builders.result(fut, limit)
            started_at[i] = time.time()
            if built.program is not None:
                outcomes[i] = self.worker.measure(built.program, self.data, part)
            if self.timing.passes <= 1:
                emit(i, started_at[i])
        if self.timing.passes <= 1:
            return out
        done = [b for b in builds if b is not None]
        always = {i for i, c in enumerate(configs) if control and c.key == control}
        self._time_again(
            done, outcomes, part, self.timing.passes - 1, within=AGAIN_WITHIN, always=always
        )
        for i in range(len(configs)):  # the passes interleave: each record spans the batch
            emit(i, started_at[0])
        return out

    def _time_again(
        self,
        builds: Sequence[BuildResult],
        outcomes: list[RunOutcome | None],
        timing: TimingOptions,
        passes: int,
        *,
        within: float = math.inf,
        always: Collection[int] = (),
    ) -> None:
        """Time the built configs ``passes`` times more, interleaved round-robin, pooling
        each one's samples into ``outcomes[i]`` (None: not timed yet). A config that failed
        is not timed again, and one that fails keeps that failure; one whose figure so far
        is more than ``within`` times the fastest's is left as it is, unless its index is
        in ``always``."""
        so_far = [
            float(np.median(o.latencies)) if o is not None and o.status == OK and o.latencies else 0
            for o in outcomes
        ]
        fastest = min((f for f in so_far if f > 0), default=0.0)
        for _ in range(passes):
            for i, built in enumerate(builds):
                before = outcomes[i]
                if built.program is None or (before is not None and before.status != OK):
                    continue
                if so_far[i] > within * fastest and i not in always:  # behind on its merits
                    continue
                more = self.worker.measure(built.program, self.data, timing)
                outcomes[i] = (
                    dataclasses.replace(before, latencies=before.latencies + more.latencies)
                    if before is not None and more.status == OK
                    else more
                )

    def remeasure(self, configs: Sequence[Config], *, rounds: int = 3) -> list[Record]:
        """Measure ``configs`` again, interleaved round-robin, and pool each one's repeats.

        Neighbours on a shared machine slow everything for seconds at a time; measuring
        the finalists side by side keeps that from deciding the winner.
        """
        built = [self.builders.result(self._submit(c), max(60.0, self.timeout_s)) for c in configs]
        self.worker.timeout_s = self.timeout_s
        started_at = time.time()  # the rounds interleave: each record spans all of them
        outcomes: list[RunOutcome | None] = [None] * len(configs)
        self._time_again(built, outcomes, self.timing, rounds)
        return [
            self._record(c, b, o, started_at, rounds) for c, b, o in zip(configs, built, outcomes)
        ]
