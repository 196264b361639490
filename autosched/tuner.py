"""The tuning loop: propose -> build (worker processes) -> measure (killable worker) -> records.

Everything measured goes to the records database one batch per transaction, so a
crash or kill loses at most the batch in flight, and rerunning the same call resumes:
configs already measured on this device are not measured again, and the strategy
starts from every record the database holds for this operator and device.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.measure.build import BuildResult
from autosched.measure.cpu import HostCPU
from autosched.measure.device import Device, select_device
from autosched.measure.lifeline import exit_with_parent
from autosched.measure.memory import check_fits
from autosched.measure.runner import RunOutcome, TestData, TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import Workload, workload_from_json
from autosched.records.base import Database
from autosched.records.record import BUILD_ERROR, INVALID, OK, Record
from autosched.search import make_strategy
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits, Space

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialEvent:
    """Reported to the progress callback after each measured trial."""

    trial: int  # 1-based, counting trials measured before this run
    total: int
    record: Record
    best_gflops: float | None


@dataclass
class TuneResult:
    """What a tuning run found. ``best`` and ``default`` come from the final,
    interleaved re-measurement, so their ratio was measured side by side."""

    workload: Workload
    device: Device | HostCPU
    target: str
    trials: int  # measured trials of this workload on this device, this run's included
    new_trials: int  # measured by this run
    best: Record | None
    default: Record | None
    history: list[Record] = field(default_factory=list)
    run_id: str = ""
    wall_s: float = 0.0

    @property
    def speedup(self) -> float | None:
        if self.best and self.default and self.best.latency_s and self.default.latency_s:
            return self.default.latency_s / self.best.latency_s
        return None

    def to_json(self) -> dict[str, Any]:
        best = None
        if self.best is not None:
            best = {
                "gflops": self.best.gflops,
                "latency_s": self.best.latency_s,
                "spread": self.best.spread,
                "config": self.best.config,
                "record_id": self.best.id,
            }
        return {
            "workload": self.workload.to_json(),
            "workload_key": self.workload.key,
            "device": self.device.fingerprint(self.target),
            "device_key": self.device.key(self.target),
            "target": self.target,
            "trials": self.trials,
            "new_trials": self.new_trials,
            "best": best,
            "default_gflops": self.default.gflops if self.default else None,
            "speedup": self.speedup,
            "wall_s": self.wall_s,
            "run_id": self.run_id,
            "history": [
                {
                    "trial": i + 1,
                    "gflops": r.gflops if r.ok else None,
                    "status": r.status,
                    "error": r.error or None,
                    "config": r.config,
                }
                for i, r in enumerate(self.history)
            ],
        }


# -- build workers ---------------------------------------------------------------------


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


def _build_worker_init(show_output: bool) -> None:
    """Ctrl-C is the tuning process's to handle: it shuts the build pool down itself; a
    build worker whose tuning process was killed exits instead of waiting forever; and
    what compilers print goes to the terminal only in verbose mode (TVM reports its
    errors as exceptions, which become the records' messages)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    if not show_output:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)


class _Builders:
    """A process pool that survives a crashing build."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: cf.ProcessPoolExecutor | None = None

    def submit(self, *args) -> cf.Future:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(
                self.workers,
                mp_context=mp.get_context("spawn"),
                initializer=_build_worker_init,
                initargs=(log.isEnabledFor(logging.INFO),),
            )
        return self._pool.submit(_build_task, *args)

    def result(self, fut: cf.Future, timeout_s: float) -> BuildResult:
        try:
            return fut.result(timeout=timeout_s)
        except cf.TimeoutError:
            self.reset()
            return BuildResult(None, BUILD_ERROR, f"build took longer than {timeout_s:g} s")
        except cf.process.BrokenProcessPool:
            self.reset()
            return BuildResult(None, BUILD_ERROR, "build worker crashed")

    def reset(self) -> None:
        if self._pool is not None:
            for proc in list(getattr(self._pool, "_processes", {}).values()):
                proc.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None


# -- the loop --------------------------------------------------------------------------


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
    ) -> None:
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
        inputs = workload.make_inputs(rng)
        rtol, atol = workload.tolerance()
        self.data = TestData(workload.key, inputs, workload.reference(inputs), rtol, atol)
        self.timeout_s = timeout_s
        self.worker = MeasureWorker(device, timeout_s=timeout_s)
        self.builders = _Builders(build_workers or max(1, min(2, os.cpu_count() or 1)))

    def close(self) -> None:
        self.worker.close()
        self.builders.close()

    # one candidate -> one record
    def _record(
        self,
        config: Config,
        build: BuildResult,
        outcome: RunOutcome | None,
        started_at: float | None = None,
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
        )

    def _submit(self, config: Config) -> cf.Future:
        return self.builders.submit(
            self.workload.to_json(), config.to_json(), self.device.limits, self.target
        )

    def measure(
        self, configs: Sequence[Config], *, on_record: Callable[[Record], None] | None = None
    ) -> list[Record]:
        """Build all ``configs`` in the worker pool and measure each as its build lands.

        On llvm the builds run on the cores that the kernels are timed on, so the whole
        batch is built before the first measurement.
        """
        futures = [self._submit(c) for c in configs]
        limit = max(60.0, self.timeout_s)
        builds: list[BuildResult | None] = [None] * len(configs)
        if self.target == "llvm":
            builds = [self.builders.result(fut, limit) for fut in futures]
        out = []
        for config, fut, built in zip(configs, futures, builds):
            built = built or self.builders.result(fut, limit)
            outcome, started_at = None, time.time()
            if built.program is not None:
                outcome = self.worker.measure(built.program, self.data, self.timing)
            rec = self._record(config, built, outcome, started_at)
            if rec.status != OK:
                log.info("config %s: %s: %s", config.key, rec.status, rec.error[:300])
            out.append(rec)
            if on_record:
                on_record(rec)
        return out

    def remeasure(self, configs: Sequence[Config], *, rounds: int = 3) -> list[Record]:
        """Measure ``configs`` again, interleaved round-robin, and pool each one's repeats.

        Neighbours on a shared machine slow everything for seconds at a time; measuring
        the finalists side by side keeps that from deciding the winner.
        """
        built = [self.builders.result(self._submit(c), max(60.0, self.timeout_s)) for c in configs]
        lats: list[list[float]] = [[] for _ in configs]
        started_at = time.time()  # the rounds interleave: each record spans all of them
        failed: dict[int, RunOutcome] = {}
        for _ in range(rounds):
            for i, b in enumerate(built):
                if b.program is None or i in failed:
                    continue
                o = self.worker.measure(b.program, self.data, self.timing)
                if o.status == OK:
                    lats[i].extend(o.latencies)
                else:
                    failed[i] = o
        out = []
        for i, (config, b) in enumerate(zip(configs, built)):
            outcome = failed.get(i) or RunOutcome(OK, "", tuple(lats[i]))
            measured = outcome if b.program is not None else None
            out.append(self._record(config, b, measured, started_at))
        return out


def _open_db(db: Database | str | os.PathLike | None) -> tuple[Database, bool]:
    from autosched.records import open_database
    from autosched.records.sqlite import default_db_path

    if db is None:
        return open_database(default_db_path()), True
    if isinstance(db, (str, os.PathLike)):
        return open_database(db), True
    return db, False


def tune(
    workload: Workload,
    *,
    trials: int = 64,
    batch: int = 16,
    strategy: str = "model",
    db: Database | str | os.PathLike | None = None,
    device: Device | HostCPU | str | int | None = None,
    target: str = "opencl",
    seed: int = 0,
    timeout_s: float = 30.0,
    timing: TimingOptions | None = None,
    finalists: int = 3,
    progress: Callable[[TrialEvent], None] | None = None,
) -> TuneResult:
    """Tune ``workload`` until the database holds ``trials`` measurements of it on this device.

    Args:
        workload: from ``autosched.workload(...)``.
        trials: measured configs wanted in total (earlier runs' count; resuming tops up).
        batch: configs proposed, built and measured between two model updates.
        strategy: ``"model"`` (cost-model-guided evolution), ``"random"`` or ``"tpe"``.
        db: a Database, or a path or URL for ``open_database`` (default: ``default_db_path()``).
        device: a device or selector (see ``select_device``); default: first GPU, else first
            device (OpenCL); the host CPU (llvm).
        target: ``"opencl"`` (OpenCL C on an OpenCL device) or ``"llvm"`` (TVM's LLVM
            code generation for the host CPU).
        seed: seeds every random choice; a seeded run is reproducible up to timing noise.
        timeout_s: limit per candidate; a kernel that hangs longer is killed.
        finalists: best candidates re-measured side by side with the default at the end.
        progress: called after every trial.

    Returns:
        TuneResult with the best record (re-measured) and the default schedule's record.
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise InvalidInputError(f"trials={trials!r} is not valid; accepted: an integer >= 1")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidInputError(f"batch={batch!r} is not valid; accepted: an integer >= 1")
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise InvalidInputError(f"timeout_s={timeout_s!r} is not valid; accepted: a number > 0")
    start = time.perf_counter()
    dev = select_device(device, target=target)
    check_fits(workload, dev)  # before any test data is built
    database, owned = _open_db(db)
    tuner = Tuner(
        workload,
        db=database,
        device=dev,
        target=target,
        seed=seed,
        timeout_s=timeout_s,
        timing=timing,
    )
    space = tuner.space
    rng = np.random.default_rng(seed)

    def space_for(wl_json: dict) -> Space:
        if wl_json == workload.to_json():
            return space
        return make_space(workload_from_json(wl_json), target=target, limits=dev.limits)

    try:
        search = make_strategy(strategy, space, rng=rng, space_for=space_for)
        mine = database.query(workload_key=workload.key, device_key=tuner.device_key, target=target)
        related = database.query(op=workload.op, device_family=tuner.device_family, target=target)
        search.observe(related)
        measured = {r.config_key for r in mine}
        history = list(mine)
        if mine:
            log.info(
                "resuming: %d trials of %s already measured on this device", len(measured), workload
            )
        best = max((r.gflops or 0.0 for r in mine if r.ok), default=None)

        def report(rec: Record) -> None:
            nonlocal best
            history.append(rec)
            if rec.ok and (best is None or (rec.gflops or 0) > best):
                best = rec.gflops
            if progress:
                progress(TrialEvent(len(history), trials, rec, best))

        new: list[Record] = []
        default = space.default()
        if default.key not in measured and len(measured) < trials:
            recs = tuner.measure([default], on_record=lambda r: (new.append(r), report(r)))
            database.add(recs)
            search.observe(recs)
            measured.add(default.key)
        while len(measured) < trials:
            want = min(batch, trials - len(measured))
            configs = search.propose(want)
            if not configs:
                log.info(
                    "the strategy has no new configs to propose; stopping at %d trials",
                    len(measured),
                )
                break
            configs = [c for c in configs if c.key not in measured][:want]
            batch_records: list[Record] = []

            def on_record(r: Record, batch_records: list[Record] = batch_records) -> None:
                batch_records.append(r)
                new.append(r)
                report(r)

            tuner.measure(configs, on_record=on_record)
            database.add(batch_records)  # one transaction per batch
            search.observe(batch_records)
            measured.update(r.config_key for r in batch_records)

        # Finalists, re-measured side by side with the default schedule.
        ranked = database.best(
            workload.key, device_key=tuner.device_key, target=target, k=finalists
        )
        final_configs = [Config(r.config) for r in ranked]
        if default.key not in {c.key for c in final_configs}:
            final_configs.append(default)
        final = tuner.remeasure(final_configs) if ranked else []
        database.add([r for r in final if r.ok])
        ok_final = [r for r in final if r.ok]
        default_rec = next((r for r in ok_final if r.config_key == default.key), None)
        best_rec = min(ok_final, key=lambda r: r.latency_s or float("inf"), default=None)
        if best_rec is not None:
            stored = database.best(workload.key, device_key=tuner.device_key, target=target, k=50)
            best_rec = next(
                (
                    r
                    for r in stored
                    if r.config_key == best_rec.config_key
                    and r.run_id == tuner.run_id
                    and r.timestamp == best_rec.timestamp
                ),
                best_rec,
            )
        return TuneResult(
            workload=workload,
            device=dev,
            target=target,
            trials=len(measured),
            new_trials=len(new),
            best=best_rec,
            default=default_rec,
            history=history,
            run_id=tuner.run_id,
            wall_s=time.perf_counter() - start,
        )
    finally:
        tuner.close()
        if owned:
            database.close()
