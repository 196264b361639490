"""Apply a config to a workload: knob values -> ``tvm.s_tir.Schedule`` primitives.

Each space family owns its schedule code (``Space.apply``); this module makes the
PrimFunc with the right parameters and turns TVM's errors into ScheduleError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autosched.errors import ScheduleError
from autosched.space.config import Config
from autosched.space.space import Space
from autosched.space.vector_math import vector_math

if TYPE_CHECKING:
    import tvm


def param_names(mod: tvm.IRModule) -> list[str]:
    """The buffer parameters of ``mod``'s ``main``, in order: what ``Workload.tensor_specs``
    lists for the same scratch."""
    return [str(p.name) for p in mod["main"].params]


def schedule(space: Space, config: Config) -> tvm.IRModule:
    """The scheduled module for ``config``; raises ScheduleError if TVM rejects it."""
    from tvm.s_tir import Schedule

    reason = space.check(config)
    if reason:
        raise ScheduleError(f"invalid config: {reason}")
    func = space.workload.prim_func(scratch=space.scratch(config))
    sch = Schedule(func)
    apply(sch, space, config)
    return sch.mod


def apply(sch, space: Space, config: Config) -> None:
    """Apply ``config`` to ``sch``, whose function has ``space.nest``'s blocks.

    The function may come from another front end (Relax): only the block and buffer
    names of ``space.nest`` are used to find things.
    """
    vector_math()
    try:
        space.apply(sch, config)
    except Exception as exc:  # TVM raises its own error types; keep the message
        raise ScheduleError(f"{type(exc).__name__}: {exc}") from exc
