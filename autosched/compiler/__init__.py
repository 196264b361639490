"""Compile a workload with the best schedule the records know for this device.

    >>> import autosched
    >>> from autosched.compiler import compile
    >>> wl = autosched.workload("matmul", M=512, N=512, K=512)   # doctest: +SKIP
    >>> kernel = compile(wl)                                     # doctest: +SKIP
    >>> kernel.provenance, kernel.record.gflops                  # doctest: +SKIP
    >>> c = kernel(a, b)                                         # doctest: +SKIP
    >>> kernel(a, b, out=c)                                      # doctest: +SKIP

The config is looked up in the user's records database, then in the records shipped
with autosched (see :mod:`autosched.compiler.lookup` for the order and fallbacks), and
lowered by the same build code the tuner measured it with, so a record's kernel is the
kernel that was timed.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from autosched.compiler.kernel import CompiledKernel
from autosched.compiler.lookup import (
    PROVENANCES,
    SHIPPED,
    Lookup,
    Source,
    adapt_config,
    fallbacks,
    lookup_config,
    shipped_database,
    shipped_records_dir,
)
from autosched.errors import InvalidInputError, ScheduleError
from autosched.measure.device import Device, select_device
from autosched.ops.base import Workload
from autosched.records.base import Database
from autosched.space.select import make_space
from autosched.space.space import TARGETS

if TYPE_CHECKING:
    from autosched.measure.cpu import HostCPU

log = logging.getLogger(__name__)


def compile(
    workload: Workload,
    *,
    target: str = "opencl",
    device: Device | HostCPU | str | int | None = None,
    db: Database | str | os.PathLike[str] | None = None,
    shipped: bool = True,
) -> CompiledKernel:
    """Build ``workload`` for ``device`` with the best recorded schedule.

    Args:
        workload: from ``autosched.workload(...)``.
        target: code generation target; one of :data:`autosched.space.space.TARGETS`.
        device: a device or selector (see ``select_device``); default for OpenCL: the
            first GPU, else the first device; for llvm: the host CPU.
        db: the user's records database: a Database, the path of an existing SQLite
            file, or a ``postgresql://`` URL. Default: ``default_db_path()`` when that file exists (it is never
            created here).
        shipped: also consult the records shipped in ``records/*.jsonl`` (after ``db``).

    Returns:
        A :class:`CompiledKernel`; its ``provenance`` says how the config was found.

    Raises:
        InvalidInputError: ``workload`` or ``target`` is not valid.
        RecordsError: ``db`` cannot be opened (a path that does not exist included).
        InvalidInputError: no such device, or one that does not serve ``target``.
        DeviceError: no OpenCL platform.
        ScheduleError: TVM refuses the looked-up config, the space's untuned config and
            its default alike (a refused record alone falls back to them, with a warning).
    """
    _check_args(workload, target)
    dev = select_device(device, target=target)
    found = find_config(workload, target=target, device=dev, db=db, shipped=shipped)

    from autosched.measure.build import build

    space = make_space(workload, target=target, limits=dev.limits)
    tries = fallbacks(space, found)
    for i, attempt in enumerate(tries):
        try:
            program = build(space, attempt.config)
        except ScheduleError as exc:
            if i + 1 == len(tries):
                raise
            log.warning(
                "%s: the %s config %s could not be built (%s); building the next: %s",
                workload,
                attempt.provenance,
                attempt.config.key,
                exc,
                tries[i + 1].provenance,
            )
            continue
        found = attempt
        break
    log.info("built %s with config %s (%s)", workload, found.config.key, found.provenance)
    return CompiledKernel(
        workload=workload,
        target=target,
        device=dev,
        config=found.config,
        program=program,
        provenance=found.provenance,
        record=found.record,
        database=found.database,
    )


def find_config(
    workload: Workload,
    *,
    target: str = "opencl",
    device: Device | HostCPU | str | int | None = None,
    db: Database | str | os.PathLike[str] | None = None,
    shipped: bool = True,
) -> Lookup:
    """What :func:`compile` builds: the config for ``workload`` and where it came from.

    Same arguments and errors as :func:`compile`; nothing is built. This is the whole
    lookup, opening the databases included (``bench/lookup.py`` times it).
    """
    _check_args(workload, target)
    dev = select_device(device, target=target)
    sources, owned = _open_sources(db, shipped=shipped)
    try:
        space = make_space(workload, target=target, limits=dev.limits)
        return lookup_config(space, device=dev, sources=sources)
    finally:
        for opened in owned:
            opened.close()


def _check_args(workload: Workload, target: str) -> None:
    if not isinstance(workload, Workload):
        raise InvalidInputError(
            f"workload {workload!r} is not valid; accepted: autosched.workload(...)"
        )
    if target.startswith("iree-"):
        raise InvalidInputError(
            f"target {target!r} builds with iree-compile, not here; accepted: opencl or llvm "
            "(for IREE: `autosched iree annotate` or `autosched iree spec`, then iree-compile)"
        )
    if target not in TARGETS:
        raise InvalidInputError(
            f"target {target!r} is not supported; accepted: {', '.join(TARGETS)}"
        )


def _open_sources(
    db: Database | str | os.PathLike[str] | None, *, shipped: bool
) -> tuple[list[Source], list[Database]]:
    """The databases to consult in order, and those opened here (to close after)."""
    from autosched.records import open_database
    from autosched.records.sqlite import default_db_path

    sources: list[Source] = []
    owned: list[Database] = []
    if db is None:
        path = default_db_path()
        if path.is_file():
            db = path
        else:
            log.info("no records database at %s; consulting shipped records only", path)
    if isinstance(db, (str, os.PathLike)):
        opened = open_database(db, create=False)
        owned.append(opened)
        sources.append(Source(str(getattr(opened, "location", db)), opened))
    elif db is not None:
        if not isinstance(db, Database):
            raise InvalidInputError(
                f"db={db!r} is not valid; accepted: a records Database, a path, or None"
            )
        sources.append(Source(str(getattr(db, "path", type(db).__name__)), db))
    if shipped:
        sources.append(Source(SHIPPED, shipped_database()))
    return sources, owned


__all__ = [
    "PROVENANCES",
    "CompiledKernel",
    "Lookup",
    "Source",
    "adapt_config",
    "compile",
    "find_config",
    "lookup_config",
    "shipped_database",
    "shipped_records_dir",
]
