"""Channels-last convolutions: the layout every 2-D convolution of a model is tuned and
built in, whatever the model's own layout.

The contraction spaces put the vector lanes on the output's innermost axis and read the
weight along it. In NCHW that axis is the image width (7 at ResNet's last stage, 14
before it) and the weight is strided along the output channels; in NHWC it is the
output channels (64 to 512 in ResNet) and an HWIO weight is contiguous along them, as a
matmul's B is. A 7x7x512 3x3 convolution tuned with 32 trials on the llvm target reached
22.7 GFLOP/s in NCHW and 202.5 in NHWC (AMD EPYC Zen 4, AVX-512).

Relax's ConvertLayout moves every op that has a layout rule (elementwise arithmetic,
relu, pooling, means, concatenation) along; the constant weights' transposes fold into
new constants at build time (the FoldConstant that follows in
:func:`autosched.tvm.tasks.fuse`), and the data's become two small transposes at the
model's edges (one per value, however often it is used). An op without a rule keeps
its layout between a transpose on each side: ``clip`` (relu6, hardtanh, clamp) is one,
so it is first rewritten as ``maximum`` and ``minimum``, which have rules and fuse into
the same kernel. ConvertLayout also fails (``std::bad_alloc`` in TVM 0.27) on a
``squeeze`` with a negative axis, as PyTorch's multi-head attention exports, so those
axes are first written as non-negative.
"""

from __future__ import annotations

import math
from typing import Any

# A transposed convolution stays as it is: following its input to NHWC, TVM 0.27 has no
# lowering for it and the build fails in VM codegen (a transpose on each side instead).
DESIRED = {"relax.nn.conv2d": ["NHWC", "HWIO"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


def _rewrite_for_layout(mod: Any) -> Any:
    """``clip`` as ``maximum``/``minimum``; ``squeeze`` axes non-negative."""
    import tvm
    from tvm import relax

    clip = tvm.ir.Op.get("relax.clip")
    squeeze = tvm.ir.Op.get("relax.squeeze")

    @relax.expr_functor.mutator
    class Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
            call = super().visit_call_(call)
            if call.op == squeeze:
                return _squeeze_axes_non_negative(call)
            if call.op != clip or len(call.args) != 3:
                return call
            x, lo, hi = call.args
            bounds = [getattr(b, "value", None) for b in (lo, hi)]
            if not all(isinstance(b, (int, float)) for b in bounds):  # tensor bounds
                return call
            dtype = x.ty.dtype
            out = x
            low, high = (float(b) for b in bounds)
            if math.isfinite(low):
                out = relax.op.maximum(out, relax.const(low, dtype))
            if math.isfinite(high):
                out = relax.op.minimum(out, relax.const(high, dtype))
            return out

    rewritten = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewritten[gv] = Rewrite(mod).visit_expr(func)
    return relax.transform.Normalize()(rewritten)


def _squeeze_axes_non_negative(call: Any) -> Any:
    from tvm import relax

    axes = call.attrs.axis
    ndim = getattr(call.args[0].ty, "ndim", -1)
    if axes is None or ndim < 0 or all(int(a) >= 0 for a in axes):
        return call
    return relax.op.squeeze(call.args[0], [int(a) % ndim for a in axes])


def channels_last(mod: Any) -> Any:
    """``mod`` with every ``relax.nn.conv2d`` in NHWC with an HWIO weight (and ``clip``
    as ``maximum``/``minimum``, so that it follows); the values it returns are
    unchanged."""
    from tvm import relax

    mod = relax.transform.ConvertLayout(DESIRED)(_rewrite_for_layout(mod))
    # ConvertLayout transposes a value once per use (a residual's input is used twice).
    return relax.transform.EliminateCommonSubexpr()(mod)
