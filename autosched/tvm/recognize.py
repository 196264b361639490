"""Recognise an autosched workload in a PrimFunc made by another TVM front end.

Relax's legalisation and fusion name axes, buffers and blocks its own way and may
split an epilogue into several blocks. Two functions compute the same thing here when
their reduction loop nests have the same signature (names replaced by positions) and
their epilogues use the same arithmetic on the same number of extra inputs.
"""

from __future__ import annotations

from functools import lru_cache

from autosched.errors import ScheduleError
from autosched.ops import Workload, workload
from autosched.ops.matmul import EPILOGUES
from autosched.space.loopnest import LoopNest, analyze_prim_func, signature

_FIELDS = ("a", "b", "value", "args", "condition", "true_value", "false_value")
_IGNORED = {"BufferLoad", "Cast", "FloatImm", "IntImm", "Var", "SizeVar"}


def _ops(expr, out: set[str]) -> None:
    name = type(expr).__name__
    if name not in _IGNORED:
        out.add(name)
    for field in _FIELDS:
        child = getattr(expr, field, None)
        if child is None:
            continue
        for c in (
            child
            if isinstance(child, (list, tuple)) or type(child).__name__ == "Array"
            else [child]
        ):
            if hasattr(c, "same_as"):  # a TVM node, not a plain value
                _ops(c, out)


def epilogue_summary(func, nest: LoopNest) -> tuple[frozenset[str], int]:
    """(arithmetic node types, number of extra inputs) of the blocks after the reduction."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    ops: set[str] = set()
    produced = {nest.output}
    extra: set[str] = set()
    for name in nest.epilogue:
        block = sch.get(sch.get_sblock(name))
        _ops(block.body.value, ops)
        for region in block.reads:
            if region.source.name not in produced:
                extra.add(region.source.name)
        produced.update(r.source.name for r in block.writes)
    return frozenset(ops), len(extra)


@lru_cache(maxsize=64)
def _our_summary(wl: Workload) -> tuple:
    from tvm import te

    st = wl.stages()
    func = te.create_prim_func([*st.inputs, *st.outputs])
    nest = analyze_prim_func(func)
    return signature(nest), epilogue_summary(func, nest)


def recognize(func) -> Workload | None:
    """The autosched workload ``func`` computes, or None if it is not one we tune."""
    try:
        nest = analyze_prim_func(func)
    except ScheduleError:
        return None
    sig = signature(nest)
    axes = [a.extent for a in nest.axes]
    if len(axes) != 3:
        return None
    summary = epilogue_summary(func, nest)
    M, N, K = axes
    for epilogue in EPILOGUES:
        candidate = workload("matmul", M=M, N=N, K=K, epilogue=epilogue)
        if _our_summary(candidate) == (sig, summary):
            return candidate
    return None
