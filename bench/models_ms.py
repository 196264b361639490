"""MetaSchedule as a tuned build of bench/models.py (its ``TUNED["metaschedule"]`` hook).

The model's Relax module goes through ``relax.get_pipeline("zero")`` (legalise, fold
constants, fuse), MetaSchedule's ``tune_relax`` tunes every extracted task with its
gradient task scheduler and ``trials_per_task`` x (number of tasks) more trials in all
(at least the total autosched gets), into the JSON database of the work folder (an
earlier budget's records seed its evolutionary search, as they do when a user
resumes), and ``MetaScheduleApplyDatabase`` + ``tvm.compile`` build it (``compile_relax``
did not apply the database in TVM 0.27). The runner inherits
TVM_NUM_THREADS from bench/models.py, so candidates run on the same threads.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from autosched.models import Model

log = logging.getLogger("bench.models")


def metaschedule_build(
    model: Model, *, trials_per_task: int, work_dir: Path, seed: int = 0
) -> tuple[Any, float]:
    """Tune ``model`` with MetaSchedule; return (the built executable, tuning wall seconds)."""
    import tvm
    from tvm import relax
    from tvm.s_tir.meta_schedule import relax_integration

    from autosched.measure.cpu import host_cpu
    from bench.tune_llvm import lean_builder

    target = tvm.target.Target(host_cpu().tvm_target())
    fused = relax.get_pipeline("zero")(model.mod)
    tasks = relax_integration.extract_tasks(fused, target)
    total = trials_per_task * len(tasks)
    log.info("%s: MetaSchedule, %d tasks x %d trials", model.name, len(tasks), trials_per_task)
    start = time.perf_counter()
    database = relax_integration.tune_relax(
        fused,
        {},
        target,
        str(work_dir),
        max_trials_global=total,
        max_trials_per_task=trials_per_task,
        # Each batch starts a pool of builder processes that import TVM: big batches amortise
        # it, and a longer timeout keeps a busy machine's slow start from failing builds
        # (30 s, the default, failed most of a tiny BERT layer's 2-trial batches here).
        num_trials_per_iter=min(64, trials_per_task),
        builder=lean_builder(),
        seed=seed,
    )
    tune_s = time.perf_counter() - start
    with target, database, tvm.transform.PassContext(opt_level=3):
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(fused)
    return tvm.compile(tuned, target=target), tune_s
