"""Tuning a whole model: its fused functions as one job, trials shared by the gradient.

A model's tasks (:func:`autosched.tvm.tasks.extract_tasks`) become a :class:`Job` whose
tasks are weighted by how often ``main`` calls them; :func:`run_job` runs it (the same
loop as ``autosched job run`` and ``autosched tune``) with the :class:`Gradient` policy
and a total budget: every task first gets its minimum, then the trials go where the
weighted latency falls most. Functions no space family covers are not tuned: a build
gives them the default schedule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.records.base import Database
from autosched.tuning.job import Job, Task
from autosched.tuning.loop import JobEvent, JobResult, run_job
from autosched.tuning.scheduler import Gradient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskTiming:
    """One task's figures after tuning (milliseconds; None where not measured)."""

    name: str
    workload_key: str
    weight: int
    family: str | None
    trials: int
    best_ms: float | None
    default_ms: float | None


def model_job(
    tasks: Sequence[Any],
    *,
    name: str,
    target: str,
    trials: int,
    batch: int = 16,
    seed: int = 0,
    strategy: str = "model",
    timeout_s: float = 30.0,
) -> Job:
    """The job of a model's tunable tasks (those with a space family), weighted by calls.

    Each task may take up to ``trials`` (the whole budget); the policy's budget, not the
    tasks' counts, ends the job.

    Raises:
        InvalidInputError: no task has a space family (nothing to tune).
    """
    tunable = [t for t in tasks if t.family is not None]
    if not tunable:
        raise InvalidInputError(
            "the model has no function a space family covers (contraction or row-wise); "
            "nothing to tune"
        )
    return Job(
        name=name,
        tasks=tuple(
            Task(name=t.name, workload=t.workload, target=target, trials=trials, weight=t.weight)
            for t in tunable
        ),
        strategy=strategy,
        seed=seed,
        batch=batch,
        timeout_s=timeout_s,
        policy="gradient",
    )


def model_policy(job: Job, *, trials: int) -> Gradient:
    """The gradient policy with ``trials`` in all; every task's minimum is one batch, or
    an equal share of the budget when the budget cannot give each task a batch."""
    share = max(1, trials // max(1, len(job.tasks)))
    return Gradient(
        min_trials=min(job.batch, share),
        rng=np.random.default_rng([job.seed, 0x7A5C]),
        budget=trials,
    )


def tune_tasks(
    tasks: Sequence[Any],
    runner: Any,
    db: Database,
    *,
    name: str,
    target: str,
    trials: int,
    batch: int = 16,
    seed: int = 0,
    strategy: str = "model",
    timeout_s: float = 30.0,
    deadline: float | None = None,
    progress: Callable[[JobEvent], None] | None = None,
    finalists: int = 3,
) -> JobResult:
    """Tune a model's tasks with ``trials`` in all on ``runner`` (local or a farm);
    ``finalists`` best configs of each task are re-measured beside its default at the end."""
    job = model_job(
        tasks, name=name, target=target, trials=trials, batch=batch, seed=seed,
        strategy=strategy, timeout_s=timeout_s,
    )  # fmt: skip
    start = time.time()
    result = run_job(
        job, runner, db, deadline=deadline, policy=model_policy(job, trials=trials),
        progress=progress, finalists=finalists,
    )  # fmt: skip
    log.info("%s: %d trials in %.1f s", name, result.new_trials, time.time() - start)
    return result


def task_timings(tasks: Sequence[Any], result: JobResult | None) -> list[TaskTiming]:
    """Each task with its trials and best/default latency from ``result`` (None: untuned)."""
    by_key = {}
    if result is not None:
        for pair in result.pairs:
            by_key[pair.task.workload.key] = pair
    out = []
    for t in tasks:
        pair = by_key.get(t.workload.key)
        best = default = None
        trials = 0
        if pair is not None:
            trials = len(pair.measured)
            rec = pair.best or min(
                (r for r in pair.history if r.ok and r.latency_s),
                key=lambda r: r.latency_s,
                default=None,
            )
            best = rec.latency_s * 1e3 if rec and rec.latency_s else None
            drec = pair.default_record or next(
                (r for r in pair.history if r.ok and r.config_key == pair.default.key), None
            )
            default = drec.latency_s * 1e3 if drec and drec.latency_s else None
        out.append(TaskTiming(t.name, t.workload.key, t.weight, t.family, trials, best, default))
    return out
