"""Exceptions raised by autosched.

Every error a user can cause derives from :class:`AutoschedError`; the CLI turns
those into one line and exit status 2 (1 for :class:`DeviceGivenUp`, a device that
failed mid-run, not the user's input). Failures of *candidates* (a kernel that does
not build, hangs or computes the wrong answer) are never exceptions: they are
records with an error kind (see :mod:`autosched.records.record`).
"""

from __future__ import annotations


class AutoschedError(Exception):
    """Root of every autosched exception."""


class InvalidInputError(AutoschedError, ValueError):
    """A user-supplied value is malformed; the message names it and what is accepted."""


class DeviceError(AutoschedError):
    """No OpenCL device matches, or the device cannot be opened."""


class DeviceGivenUp(DeviceError):
    """A device that stopped measuring mid-run and was given up; what it measured before
    is kept, and a rerun resumes."""


class RecordsError(AutoschedError):
    """The records database cannot be opened, read or written."""


class ScheduleError(AutoschedError):
    """A configuration cannot be applied to a workload (a bug or an invalid config)."""


class HarnessError(AutoschedError):
    """This process cannot measure: its build or measurement children cannot start (a
    script that starts autosched outside an ``if __name__ == "__main__":`` guard, whose
    children import it again). A tuning job stops on it and stores nothing of the
    batch: the configs are not to blame."""
