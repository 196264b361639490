"""Versions: autosched's own, and that of the TVM that generates its kernels.

In a module of its own so that any module can read them without importing the package
root, whose imports reach most of autosched. Both go into every device fingerprint.
"""

from __future__ import annotations

import functools

__version__ = "0.1.0"


@functools.cache
def tvm_version() -> str:
    """The ``apache-tvm`` distribution's version, or ``"unknown"``: read once per process.

    The TVM a process runs is the one it loaded, whatever is installed later, and the
    fingerprint, and so the device key, must not change under a running tune or farm
    worker. Read afresh on each call, it did: a tune whose virtual environment was made
    again beside it (the same path) read the key of a half-installed TVM, its finalists'
    batch reached a "different" device, and the tune ended in a traceback.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-tvm")
    except PackageNotFoundError:
        return "unknown"
