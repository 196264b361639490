"""Which space family fits a workload, and the space of that family.

The families (:mod:`autosched.space.contraction`, :mod:`autosched.space.rowwise`) build
on the shared machinery of :mod:`autosched.space.space`; this module sits above them
all, so the base never has to know its implementations.
"""

from __future__ import annotations

from autosched.iree import IREE_TARGETS
from autosched.ops.base import Workload
from autosched.space.contraction import ContractionSpace
from autosched.space.loopnest import classify
from autosched.space.rowwise import RowSpace
from autosched.space.space import DeviceLimits, Space

FAMILIES: dict[str, type[Space]] = {"contraction": ContractionSpace, "rowwise": RowSpace}


def family(workload: Workload) -> type[Space]:
    """The space class whose knobs fit ``workload``'s loop nest (see
    :func:`autosched.space.loopnest.classify`); never decided by the operator's name."""
    return FAMILIES[classify(workload)]


def make_space(workload: Workload, *, target: str = "opencl", limits: DeviceLimits) -> Space:
    """All schedules of ``workload`` for ``target`` on a device with ``limits``.

    Args:
        workload: the operator instance.
        target: code generation target; one of :data:`autosched.space.space.ALL_TARGETS`.
        limits: the device's limits.

    Raises:
        InvalidInputError: ``target`` is not supported.
    """
    if target in IREE_TARGETS:  # IREE's lowering configs, read off the root Linalg op
        from autosched.space.iree import IreeSpace

        return IreeSpace(workload, target=target, limits=limits)
    return family(workload)(workload, target=target, limits=limits)
