"""Tuning jobs: tasks as plain data (from a job file or a model) and the task scheduler."""

from __future__ import annotations

from autosched.tuning.job import Job, Task, job_from_dict, load_job
from autosched.tuning.scheduler import FairShare, Gradient, TaskProgress, make_policy

__all__ = [
    "FairShare",
    "Gradient",
    "Job",
    "Task",
    "TaskProgress",
    "job_from_dict",
    "load_job",
    "make_policy",
]
