"""Constant ``take`` indices made non-negative and checked (a Relax pass).

TVM 0.27's torch frontend imports ``x[:, -1]`` (``aten.select`` with a negative index,
the last token of a sequence model) as ``take(x, -1, axis=1, mode="fast")``, and the
``fast`` mode does not wrap a negative index: the built model reads memory before the
tensor and returns garbage, with no error. Every ``take`` whose indices are constants
along an axis of static extent gets them written as ``index + extent``, which is the
element the model's own framework reads.

Such a ``take`` (a class token ``x[:, 0]``, the query, key and value of
``nn.MultiheadAttention``'s packed projection) is then known to stay in range, and its
mode becomes ``clip``, which reads the same elements: in ``fast`` mode TOPI prints a
warning that out-of-range indices segfault each time it lowers one, and a ViT's task
extraction and build lower them dozens of times. The ONNX frontend computes a Gather's
index at run time (``where(i < 0, i + shape_of(x)[axis], i)``) even where ``i`` is a
constant and the shape static: such integer arithmetic on constants and static shapes
is evaluated here, not by ``FoldConstant``, which would also fold (and change the
tasks of) every transpose of a weight. Indices out of range either way, symbolic
extents and indices computed from inputs (token ids) are left as they are.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tvm.ir import IRModule

# What an index computed from constants and static shapes is made of, evaluated in numpy.
_ARITHMETIC = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.less": np.less,
    "relax.greater": np.greater,
    "relax.less_equal": np.less_equal,
    "relax.greater_equal": np.greater_equal,
    "relax.equal": np.equal,
    "relax.where": np.where,
}
_DEPTH = 16  # how far back through bindings an index is followed


def settle_take_indices(mod: IRModule) -> IRModule:
    """Return ``mod`` with every constant index of a ``take`` non-negative, and such a
    ``take`` whose indices are all in range in ``clip`` mode (the same elements)."""
    import tvm
    from tvm import relax

    take = tvm.ir.Op.get("relax.take")

    @relax.expr_functor.mutator
    class Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
            call = super().visit_call_(call)
            if call.op != take:
                return call
            indices = self.constant(call.args[1], _DEPTH)
            extent = _extent(call.args[0], call.attrs.axis)
            if indices is None or indices.dtype.kind not in "iu" or extent is None:
                return call
            if indices.size == 0 or indices.min() < -extent or indices.max() >= extent:
                return call
            constant = isinstance(call.args[1], tvm.ir.expr.Constant)
            if constant and not (indices < 0).any() and call.attrs.mode != "fast":
                return call
            wrapped = np.where(indices < 0, indices + extent, indices).astype(indices.dtype)
            mode = "clip" if call.attrs.mode == "fast" else call.attrs.mode
            axis = call.attrs.axis
            index = relax.const(wrapped, str(wrapped.dtype))
            return relax.op.take(call.args[0], index, axis=axis, mode=mode)

        def constant(self, expr: Any, depth: int) -> np.ndarray | None:
            """``expr``'s value where it is integer arithmetic on constants and static
            shapes, else None."""
            if depth == 0:
                return None
            if isinstance(expr, tvm.ir.expr.Constant):
                return expr.value.numpy()
            if isinstance(expr, relax.Var):
                bound = self.lookup_binding(expr)
                return None if bound is None else self.constant(bound, depth - 1)
            if isinstance(expr, relax.ShapeExpr):
                dims = _static_dims(expr)
                return None if dims is None else np.array(dims, "int64")
            if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
                return None
            name = expr.op.name
            if name == "relax.shape_of":
                dims = _static_dims(getattr(getattr(expr.args[0], "ty", None), "shape", None))
                return None if dims is None else np.array(dims, "int64")
            args = [self.constant(a, depth - 1) for a in expr.args]
            if any(a is None or a.dtype.kind not in "iub" for a in args):
                return None
            if name == "relax.shape_to_tensor":
                return args[0]
            if name == "relax.take" and expr.attrs.axis is not None:
                axis, mode = int(expr.attrs.axis), str(expr.attrs.mode)
                extent = args[0].shape[axis]
                if mode == "fast" and not ((args[1] >= 0) & (args[1] < extent)).all():
                    return None  # what TVM reads there is undefined
                return np.take(
                    args[0], args[1], axis=axis, mode="clip" if mode == "clip" else "wrap"
                )
            if name in _ARITHMETIC:
                return np.asarray(_ARITHMETIC[name](*args))
            return None

    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = Rewrite(mod).visit_expr(func)
    return out


def _static_dims(shape) -> list[int] | None:
    """The dimensions of a Relax shape, or None where one is symbolic or it is unknown."""
    values = getattr(shape, "values", None)
    if values is None or not all(hasattr(d, "value") for d in values):
        return None
    return [int(d.value) for d in values]


def _extent(data, axis) -> int | None:
    """The static extent ``take`` indexes along ``axis`` (all of ``data`` flattened
    when None), or None where a dimension is symbolic or the shape unknown."""
    dims = _static_dims(getattr(getattr(data, "ty", None), "shape", None))
    if dims is None:
        return None
    if axis is None:
        return math.prod(dims)
    axis = int(axis)
    return dims[axis] if -len(dims) <= axis < len(dims) else None
