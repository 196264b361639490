"""Versions: autosched's own, and that of the TVM that generates its kernels.

In a module of its own so that any module can read them without importing the package
root, whose imports reach most of autosched. Both go into every device fingerprint.
"""

from __future__ import annotations

__version__ = "0.1.0"


def tvm_version() -> str:
    """The installed ``apache-tvm`` distribution's version, or ``"unknown"``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-tvm")
    except PackageNotFoundError:
        return "unknown"
