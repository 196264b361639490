"""``autosched.tune``: one workload on this machine's device, as a one-task job.

The same loop as a farm job (:mod:`autosched.tuning.loop`), on a
:class:`~autosched.tuning.runner.LocalRunner`: everything measured goes to the records
database one batch per transaction, so a crash or kill loses at most the batch in
flight, and rerunning the same call resumes: configs already measured on this device
are not measured again, and the strategy starts from every record the database holds
for this operator and device family.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autosched.errors import DeviceGivenUp, InvalidInputError
from autosched.measure.cpu import HostCPU
from autosched.measure.device import Device, select_device
from autosched.measure.memory import check_fits
from autosched.measure.runner import TimingOptions
from autosched.ops import Workload
from autosched.records.base import Database
from autosched.records.record import Record
from autosched.tuning.job import Job, Task
from autosched.tuning.loop import JobEvent, run_job
from autosched.tuning.runner import LocalRunner


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
        target: ``"opencl"`` (OpenCL C on an OpenCL device), ``"llvm"`` (TVM's LLVM
            code generation for the host CPU), ``"iree-llvm-cpu"`` or ``"iree-vulkan"``
            (IREE's backends, with configs as ``compilation_info``; the iree extra).
        seed: seeds every random choice; a seeded run is reproducible up to timing noise.
        timeout_s: limit per candidate; a kernel that hangs longer is killed.
        finalists: best candidates re-measured side by side with the default at the end.
        progress: called after every trial.

    Returns:
        TuneResult with the best record (re-measured) and the default schedule's record.

    Raises:
        DeviceGivenUp: the device measured nothing in several batches in a row (no
            measurement child could start, or configs it measured before failed too);
            what it measured before is kept, and a rerun resumes.
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
    name = str(workload)
    job = Job(
        name=name,
        tasks=(Task(name, workload, target, trials),),
        strategy=strategy,
        seed=seed,
        batch=batch,
        timeout_s=float(timeout_s),
    )
    keys = set(
        database.measured_config_keys(workload.key, device_key=dev.key(target), target=target)
    )
    best = max(
        (
            r.gflops or 0.0
            for r in database.best(workload.key, device_key=dev.key(target), target=target, k=1)
        ),
        default=None,
    )
    count = [len(keys), best]

    def on_record(rec: Record) -> None:
        if rec.config_key in keys:  # a batch's control (autosched.tuning.control)
            return
        keys.add(rec.config_key)
        count[0] += 1
        if rec.ok and (count[1] is None or (rec.gflops or 0.0) > count[1]):
            count[1] = rec.gflops
        if progress:
            progress(TrialEvent(count[0], trials, rec, count[1]))

    def on_batch(event: JobEvent) -> None:
        # What the records hold once a batch is stored: a batch the device measured
        # nothing of (autosched.tuning.loop) is not, and its configs come again.
        keys.clear()
        keys.update(event.pair.measured)
        count[0] = len(keys)

    runner = LocalRunner(dev, target, timing=timing, on_record=on_record)
    try:
        result = run_job(job, runner, database, finalists=finalists, progress=on_batch)
    finally:
        runner.close()
        if owned:
            database.close()
    (pair,) = result.pairs
    if result.broken:
        raise DeviceGivenUp(
            f"{result.broken[0]}; the {len(pair.measured)} measurements before are kept, "
            "and a rerun resumes"
        )
    return TuneResult(
        workload=workload,
        device=dev,
        target=target,
        trials=len(pair.measured),
        new_trials=pair.new,
        best=pair.best,
        default=pair.default_record,
        history=pair.history,
        run_id=pair.best.run_id if pair.best else "",
        wall_s=time.perf_counter() - start,
    )
