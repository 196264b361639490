"""Constant negative indices made non-negative (a Relax pass).

TVM 0.27's torch frontend imports ``x[:, -1]`` (``aten.select`` with a negative index,
the last token of a sequence model) as ``take(x, -1, axis=1, mode="fast")``, and the
``fast`` mode does not wrap a negative index: the built model reads memory before the
tensor and returns garbage, with no error. Every ``take`` whose indices are constants
along an axis of static extent gets them written as ``index + extent``, which is the
element the model's own framework reads. Indices out of range either way, symbolic
extents and computed indices are left as they are.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tvm.ir import IRModule


def wrap_negative_indices(mod: IRModule) -> IRModule:
    """Return ``mod`` with every constant negative index of a ``take`` non-negative."""
    import tvm
    from tvm import relax

    take = tvm.ir.Op.get("relax.take")

    @relax.expr_functor.mutator
    class Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
            call = super().visit_call_(call)
            if call.op != take or not isinstance(call.args[1], tvm.ir.expr.Constant):
                return call
            indices = call.args[1].value.numpy()
            extent = _extent(call.args[0], call.attrs.axis)
            if indices.dtype.kind not in "iu" or extent is None or not (indices < 0).any():
                return call
            if indices.min() < -extent or indices.max() >= extent:
                return call
            wrapped = np.where(indices < 0, indices + extent, indices).astype(indices.dtype)
            return relax.op.take(
                call.args[0], relax.const(wrapped), axis=call.attrs.axis, mode=call.attrs.mode
            )

    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = Rewrite(mod).visit_expr(func)
    return out


def _extent(data, axis) -> int | None:
    """The static extent ``take`` indexes along ``axis`` (all of ``data`` flattened
    when None), or None where a dimension is symbolic or the shape unknown."""
    shape = getattr(getattr(data, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(hasattr(d, "value") for d in values):
        return None
    dims = [int(d.value) for d in values]
    if axis is None:
        return math.prod(dims)
    axis = int(axis)
    return dims[axis] if -len(dims) <= axis < len(dims) else None
