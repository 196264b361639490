"""Fold inference batch-norm into the convolution that feeds it (a Relax pass).

``batch_norm(conv2d(x, W) [+ b], gamma, beta, mean, var)[0]`` with every parameter a
constant is ``conv2d(x, W * s) + ((b - mean) * s + beta)`` with
``s = gamma / sqrt(var + eps)`` per output channel: exact up to float rounding. The
pass folds only where that holds for every element: inference mode, NCHW data, OIHW
weights, the channel axis normalised, per-channel constants, and a convolution (and
bias) result that nothing else reads. Everything else is left as it was.

It works on ``relax.nn.batch_norm`` calls, as both importers emit them, so it runs
before ``DecomposeOpsForInference`` turns them into arithmetic.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tvm.ir import IRModule

log = logging.getLogger(__name__)


def fold_batch_norm(mod: IRModule) -> IRModule:
    """Return ``mod`` with every foldable conv2d -> inference batch-norm folded.

    The folded module still holds the unused convolution and batch-norm bindings;
    ``relax.transform.DeadCodeElimination`` removes them (``prepare`` runs it).
    """
    from tvm import relax

    out = mod
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        folder = _make_folder(mod, func)
        new_func = folder.visit_expr(func)
        if folder.folded:
            log.debug("folded %d batch-norms into convolutions in %s", folder.folded, gvar)
            out = _with_function(out, gvar, new_func)
    return out


def _with_function(mod: IRModule, gvar: Any, func: Any) -> IRModule:
    import tvm

    funcs = dict(mod.functions.items())
    funcs[gvar] = func
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def _make_folder(mod: IRModule, func: Any) -> Any:
    from tvm import relax

    var2val = relax.analysis.get_var2val(func)
    uses = _count_uses(func)

    @relax.expr_functor.mutator
    class _Folder(relax.PyExprMutator):
        def __init__(self) -> None:
            super().__init__(mod)
            self.folded = 0
            self.done: dict[Any, Any] = {}  # batch-norm tuple var -> the folded result var

        def visit_var_binding_(self, binding: Any) -> None:
            value = binding.value
            plan = None
            if isinstance(value, relax.TupleGetItem) and value.index == 0:
                bn_var = value.tuple_value
                if bn_var in self.done:
                    self.builder_.emit_normalized(relax.VarBinding(binding.var, self.done[bn_var]))
                    return
                plan = _plan(bn_var, var2val, uses)
            if plan is None:
                super().visit_var_binding_(binding)
                return
            conv, weight, bias = plan
            data = self.visit_expr(conv.args[0])
            new_conv = self.builder_.emit(
                relax.Call(conv.op, [data, relax.const(weight)], conv.attrs, conv.ty_args)
            )
            folded = self.builder_.normalize(relax.op.add(new_conv, relax.const(bias)))
            self.builder_.emit_normalized(relax.VarBinding(binding.var, folded))
            self.done[value.tuple_value] = binding.var
            self.folded += 1

    return _Folder()


def _count_uses(func: Any) -> dict[Any, int]:
    from tvm import relax

    @relax.expr_functor.visitor
    class _Uses(relax.PyExprVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.count: dict[Any, int] = {}

        def visit_var_(self, var: Any) -> None:
            self.count[var] = self.count.get(var, 0) + 1

        def visit_dataflow_var_(self, var: Any) -> None:
            self.count[var] = self.count.get(var, 0) + 1

    visitor = _Uses()
    visitor.visit_expr(func)
    return visitor.count


def _call_of(expr: Any, op_name: str, var2val: Any) -> Any:
    """The call of ``op_name`` that ``expr`` (a var) is bound to, or None."""
    import tvm
    from tvm import relax

    if not isinstance(expr, relax.Var) or expr not in var2val:
        return None
    value = var2val[expr]
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        if value.op.name == op_name:
            return value
    return None


def _const(expr: Any) -> np.ndarray | None:
    import tvm

    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None


def _reshaped_const(expr: Any, var2val: Any) -> np.ndarray | None:
    """A constant, or a reshape of one (how the ONNX frontend gives a conv's bias)."""
    value = _const(expr)
    if value is not None:
        return value
    for op in ("relax.reshape", "relax.expand_dims"):
        call = _call_of(expr, op, var2val)
        if call is not None and (value := _const(call.args[0])) is not None:
            shape = expr.ty.shape
            if shape is None or not all(hasattr(d, "value") for d in shape.values):
                return None
            return value.reshape([int(d.value) for d in shape.values])
    return None


def _plan(bn_var: Any, var2val: Any, uses: dict[Any, int]) -> Any:
    """(conv2d call, folded weight, folded bias of shape 1xCx1x1), or None if not exact."""
    bn = _call_of(bn_var, "relax.nn.batch_norm", var2val)
    if bn is None or bool(bn.attrs.training):
        return None
    data = bn.args[0]
    ndim = len(data.ty.shape) if data.ty.shape is not None else -1
    if ndim != 4 or int(bn.attrs.axis) not in (1, -3):
        return None
    params = [_const(arg) for arg in bn.args[1:]]
    if any(p is None for p in params) or uses.get(data, 0) != 1:
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    bias = None
    conv = _call_of(data, "relax.nn.conv2d", var2val)
    if conv is None:  # conv2d + a per-channel bias, then batch-norm
        add = _call_of(data, "relax.add", var2val)
        if add is None:
            return None
        conv_var, bias = add.args[0], _reshaped_const(add.args[1], var2val)
        conv = _call_of(conv_var, "relax.nn.conv2d", var2val)
        if conv is None or bias is None or uses.get(conv_var, 0) != 1:
            return None
    attrs = conv.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    weight = _const(conv.args[1])
    dtype = str(data.ty.dtype)
    if layouts != ("NCHW", "OIHW", "NCHW") or weight is None or dtype != str(weight.dtype):
        return None
    channels = weight.shape[0]
    if bias is not None:
        if bias.shape not in ((1, channels, 1, 1), (channels, 1, 1)):
            return None
        bias = bias.reshape(channels).astype(np.float64)
    if any(p.shape != (channels,) for p in (gamma, beta, mean, var)):
        return None
    if not bool(bn.attrs.scale):
        gamma = np.ones(channels)
    if not bool(bn.attrs.center):
        beta = np.zeros(channels)
    scale = gamma / np.sqrt(var + float(bn.attrs.epsilon))
    new_weight = (weight.astype(np.float64) * scale[:, None, None, None]).astype(weight.dtype)
    shift = ((0.0 if bias is None else bias) - mean) * scale + beta
    return conv, new_weight, shift.reshape(1, channels, 1, 1).astype(weight.dtype)
