"""Records: every measurement kept, best per workload and device queried."""

from autosched.records.base import Database
from autosched.records.opener import open_database
from autosched.records.record import STATUSES, Record

__all__ = ["Database", "Record", "STATUSES", "open_database"]
