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


def prim_func_tensors(space: Space, config: Config) -> list:
    """The TE tensors that become PrimFunc parameters, in order.

    An intermediate the schedule keeps in global memory between two kernels (an
    unfused epilogue's input, say) becomes an extra parameter: the runner allocates it
    as scratch. The order matches ``Workload.tensor_specs``.
    """
    st = space.workload.stages()
    scratch = set(space.scratch(config))
    return [*st.inputs, *st.outputs, *(t for t in st.intermediates if t.op.name in scratch)]


def schedule(space: Space, config: Config) -> tvm.IRModule:
    """The scheduled module for ``config``; raises ScheduleError if TVM rejects it."""
    from tvm import te
    from tvm.s_tir import Schedule

    reason = space.check(config)
    if reason:
        raise ScheduleError(f"invalid config: {reason}")
    func = te.create_prim_func(prim_func_tensors(space, config))
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
