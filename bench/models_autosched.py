"""autosched as a tuned build of bench/models.py (its ``TUNED["autosched"]`` hook).

The path a compiler team runs: ``extract_tasks`` reads the model's fused PrimFuncs,
``tune_tasks`` spends ``trials_per_task`` x (tunable tasks) more trials in all on this
CPU through the gradient task scheduler (the one a farm job uses), into the records
database in the work folder (resuming from what an earlier budget measured there: its
trials are a total, so the trials held are added),
and ``autosched.tvm.build`` applies those records (no shipped ones: only what this run
measured counts) and builds the Relax executable. The measurement
child inherits TVM_NUM_THREADS from bench/models.py, so candidates run on the threads
the model will.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from autosched.models import Model

log = logging.getLogger("bench.models")


def autosched_build(
    model: Model, *, trials_per_task: int, work_dir: Path, seed: int = 0
) -> tuple[Any, float]:
    """Tune ``model`` with autosched; return (the built executable, tuning wall seconds)."""
    from autosched.measure.device import select_device
    from autosched.measure.runner import TimingOptions
    from autosched.records.opener import open_database
    from autosched.tuning.model import tune_tasks
    from autosched.tuning.runner import LocalRunner
    from autosched.tvm import build
    from autosched.tvm.tasks import extract_tasks

    device = select_device(None, target="llvm")
    tasks = extract_tasks(model.mod, target="llvm", limits=device.limits)
    tunable = [t for t in tasks if t.family is not None]
    total = trials_per_task * len(tunable)
    log.info(
        "%s: autosched, %d tunable tasks of %d x %d trials",
        model.name, len(tunable), len(tasks), trials_per_task,
    )  # fmt: skip
    db = open_database(work_dir / "records.db")
    runner = LocalRunner(device, "llvm", timing=TimingOptions(), keep=max(1, len(tasks)))
    # tune_tasks's trials are the total, the trials the records hold counted: add these.
    (slot,) = runner.slots()
    held = sum(_measured(db, t.workload.key, slot.device_key) for t in tunable)
    start = time.perf_counter()
    try:
        tune_tasks(
            tasks, runner, db, name=model.name, target="llvm", trials=held + total, seed=seed
        )
    finally:
        runner.close()
    tune_s = time.perf_counter() - start
    built = build(model.mod, "llvm", db=db, shipped=False)
    db.close()
    return built.executable, tune_s


def _measured(db: Any, workload_key: str, device_key: str) -> int:
    """Configs of a workload the records hold for this device (what tune_tasks counts)."""
    records = db.query(workload_key=workload_key, device_key=device_key, target="llvm")
    return len({r.config_key for r in records})
