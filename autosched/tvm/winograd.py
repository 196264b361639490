"""Winograd F(4x4, 3x3) convolutions: a 3x3 stride-1 convolution as three tunable tasks.

Lavin and Gray's minimal filtering (2016): each 4x4 block of outputs is computed from a
6x6 block of the input as ``A^T [(G g G^T) * (B^T d B)] A``: 36 multiplications per
block and channel pair where the direct convolution takes 144. The weight's transform
``G g G^T`` is a constant, made once at build time (here, in numpy); what runs is

- ``winograd_input``: ``V[xi, nu, n, th, tw, c] = sum_ab T[xi, nu, a, b] d[n, 4 th + a, 4 tw + b, c]``
  (``T = B^T (x) B^T``, the zero padding fused in as a producer),
- ``winograd_gemm``: ``M[xi, nu, .., k] = sum_c V[xi, nu, .., c] U[xi, nu, c, k]``, 36
  independent matrix products,
- ``winograd_output``: ``Y[n, h, w, k] = sum_xy S[h % 4, w % 4, xi, nu] M[xi, nu, n, h / 4, w / 4, k]``
  (``S = A^T (x) A^T``), with the convolution's epilogue (bias, residual, relu) fused
  after it by FuseOps.

The first two are contractions read off their loop nests like any other, so autosched's
contraction space tunes them; the third is a per-output reduction of 36 terms. The
points are 0, +-1, +-2 and infinity (F(4, 3)'s usual choice): float32 results stay within
about 1e-5 relative of the direct convolution's for unit-scale data (F(6, 3) loses
another digit, which is why it is not offered).

Whether a convolution runs this way is measured, not assumed: the transformed weight is
4x the original (36 against 9 values per channel pair), so on a deep layer whose weight
comes cold from memory the direct convolution can stay ahead. Task extraction offers
both forms; a build takes, per convolution, the one whose tuned records are faster
(:mod:`autosched.tvm.database`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TILE = 4  # outputs per tile side: F(4x4, 3x3)
KERNEL = 3
ALPHA = TILE + KERNEL - 1  # inputs per tile side

# Lavin and Gray's F(4, 3) matrices (points 0, 1, -1, 2, -2, infinity).
BT = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    dtype=np.float64,
)
G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ],
    dtype=np.float64,
)
AT = np.array(
    [
        [1, 1, 1, 1, 1, 0],
        [0, 1, -1, 2, -2, 0],
        [0, 1, 1, 4, 4, 0],
        [0, 1, -1, 8, -8, 1],
    ],
    dtype=np.float64,
)

CONV = "relax.nn.conv2d"
OUT_EWISE_FUSABLE = 4  # TVM's OpPatternKind kOutEWiseFusable


def input_matrix() -> np.ndarray:
    """``T[xi, nu, a, b] = B^T[xi, a] B^T[nu, b]``: the input tile's 2-D transform."""
    return np.einsum("xa,yb->xyab", BT, BT)


def output_matrix() -> np.ndarray:
    """``S[i, j, xi, nu] = A^T[i, xi] A^T[j, nu]``: the product tile's 2-D inverse."""
    return np.einsum("ix,jy->ijxy", AT, AT)


def weight_transform(weight_hwio: np.ndarray) -> np.ndarray:
    """``U[xi, nu, c, k] = (G w G^T)[xi, nu]`` for each channel pair of an HWIO weight."""
    u = np.einsum("xa,abck,yb->xyck", G, weight_hwio.astype(np.float64), G)
    return u.astype(weight_hwio.dtype)


def tiles(extent: int) -> int:
    """Tiles along an output axis of ``extent`` (the last one may be partly padding)."""
    return -(-extent // TILE)


def reference(x_nhwc: np.ndarray, w_hwio: np.ndarray, pad: tuple[int, int, int, int]) -> np.ndarray:
    """The convolution computed the Winograd way in numpy (float64): for tests."""
    top, left, bottom, right = pad
    n, h, w, _ = x_nhwc.shape
    oh, ow = h + top + bottom - 2, w + left + right - 2
    th, tw = tiles(oh), tiles(ow)
    xp = np.zeros((n, th * TILE + 2, tw * TILE + 2, x_nhwc.shape[3]))
    xp[:, top : top + h, left : left + w] = x_nhwc
    out = np.zeros((n, th * TILE, tw * TILE, w_hwio.shape[3]))
    u = weight_transform(w_hwio.astype(np.float64))
    t, s = input_matrix(), output_matrix()
    for i in range(th):
        for j in range(tw):
            d = xp[:, i * TILE : i * TILE + ALPHA, j * TILE : j * TILE + ALPHA]  # n a b c
            v = np.einsum("xyab,nabc->xync", t, d)
            m = np.einsum("xync,xyck->xynk", v, u)
            out[:, i * TILE : (i + 1) * TILE, j * TILE : (j + 1) * TILE] = np.einsum(
                "ijxy,xynk->nijk", s, m
            )
    return out[:, :oh, :ow]


def signature(n: int, oh: int, ow: int, c: int, k: int) -> str:
    """What a convolution's two forms are compared by: its batch, output size and channels
    (``n1_h56_w56_c64_k64``). Every convolution with one signature takes the same form."""
    return f"n{n}_h{oh}_w{ow}_c{c}_k{k}"


def call_signature(call: Any) -> str | None:
    """The signature of a conv2d call this rewrite takes, or None."""
    pad = convertible(call)
    if pad is None:
        return None
    n, h, w, c = (int(d) for d in call.args[0].ty.shape.values)
    k = int(call.args[1].value.shape[3])
    return signature(n, h + pad[0] + pad[2] - 2, w + pad[1] + pad[3] - 2, c, k)


def form_of(func: Any) -> tuple[str, str] | None:
    """``("winograd", signature)`` for a fused PrimFunc holding a Winograd stage,
    ``("direct", signature)`` for one holding a convolution the rewrite would take (a
    3x3 reduction over a ``[n, oh + 2, ow + 2, c]`` input into ``[n, oh, ow, k]``), else
    None."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        name = str(block.name_hint)
        for stage in ("winograd_input_", "winograd_gemm_", "winograd_output_"):
            if name.startswith(stage):
                return "winograd", name[len(stage) :]
        if not any(int(iv.iter_type) == 2 for iv in block.iter_vars) or len(block.writes) != 1:
            continue
        out = [int(d) for d in block.writes[0].source.shape]
        shapes = [[int(d) for d in r.source.shape] for r in block.reads]
        if len(out) != 4 or str(block.writes[0].source.dtype) != "float32":
            continue
        n, oh, ow, k = out
        for weight in shapes:
            if len(weight) == 4 and weight[:2] == [KERNEL, KERNEL] and weight[3] == k:
                c = weight[2]
                if [n, oh + 2, ow + 2, c] in shapes:
                    return "direct", signature(n, oh, ow, c, k)
    return None


def convertible(call: Any) -> tuple[int, int, int, int] | None:
    """The padding (top, left, bottom, right) of a conv2d call this rewrite takes, or
    None: channels-last float32 data, a constant 3x3 HWIO weight, stride 1, dilation 1,
    one group, static shapes."""
    import tvm
    from tvm import relax

    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    if call.op.name != CONV or not isinstance(call.args[1], tvm.ir.expr.Constant):
        return None
    a = call.attrs
    layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout))
    if layouts != ("NHWC", "HWIO", "NHWC") or int(a.groups) != 1:
        return None
    if [int(v) for v in a.strides] != [1, 1] or [int(v) for v in a.dilation] != [1, 1]:
        return None
    data = call.args[0].ty
    weight = call.args[1].value
    if str(data.dtype) != "float32" or str(weight.dtype) != "float32":
        return None
    if str(a.out_dtype) not in ("", "float32"):
        return None
    if data.shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in data.shape.values):
        return None
    if tuple(weight.shape[:2]) != (KERNEL, KERNEL):
        return None
    pad = [int(v) for v in a.padding]
    if len(pad) == 2:
        pad = pad * 2
    return tuple(pad)  # type: ignore[return-value]


def rewrite(mod: Any, *, select: Any = None) -> Any:
    """``mod`` with the 3x3 stride-1 convolutions that ``select`` accepts (a function of
    the conv2d call; default: all it takes) in Winograd form."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
            call = super().visit_call_(call)
            pad = convertible(call)
            if pad is None or (select is not None and not select(call)):
                return call
            return _winograd(self.builder_, call, pad)

    out = mod
    rewriter = _Rewrite(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = rewriter.visit_expr(func)
            out = rewriter.builder_.get()
            out[gv] = new
    return relax.transform.Normalize()(out)


def _winograd(bb: Any, call: Any, pad: tuple[int, int, int, int]) -> Any:
    from tvm import relax, te, topi

    top, left, bottom, right = pad
    x = call.args[0]
    n, h, w, c = (int(d) for d in x.ty.shape.values)
    weight = call.args[1].value.numpy()
    k = weight.shape[3]
    oh, ow = h + top + bottom - 2, w + left + right - 2
    th, tw = tiles(oh), tiles(ow)
    dtype = "float32"
    sig = signature(n, oh, ow, c, k)

    def input_transform(data, t):
        padded = topi.nn.pad(
            data,
            [0, top, left, 0],
            [0, th * TILE + 2 - h - top, tw * TILE + 2 - w - left, 0],
            name="winograd_pad",
        )
        a = te.reduce_axis((0, ALPHA), name="a")
        b = te.reduce_axis((0, ALPHA), name="b")
        return te.compute(
            (ALPHA, ALPHA, n, th, tw, c),
            lambda xi, nu, i, p, q, ch: te.sum(
                t[xi, nu, a, b] * padded[i, p * TILE + a, q * TILE + b, ch], axis=[a, b]
            ),
            name=f"winograd_input_{sig}",
        )

    def gemm(v, u):
        r = te.reduce_axis((0, c), name="c")
        return te.compute(
            (ALPHA, ALPHA, n, th, tw, k),
            lambda xi, nu, i, p, q, ko: te.sum(v[xi, nu, i, p, q, r] * u[xi, nu, r, ko], axis=r),
            name=f"winograd_gemm_{sig}",
        )

    def output_transform(m, s):
        xi = te.reduce_axis((0, ALPHA), name="xi")
        nu = te.reduce_axis((0, ALPHA), name="nu")
        return te.compute(
            (n, oh, ow, k),
            lambda i, y, x_, ko: te.sum(
                s[y % TILE, x_ % TILE, xi, nu] * m[xi, nu, i, y // TILE, x_ // TILE, ko],
                axis=[xi, nu],
            ),
            name=f"winograd_output_{sig}",
        )

    t = relax.const(input_matrix().astype(dtype))
    s = relax.const(output_matrix().astype(dtype))
    u = relax.const(weight_transform(weight))
    v = bb.emit(bb.call_te(input_transform, x, t, primfunc_name_hint="winograd_input"))
    m = bb.emit(bb.call_te(gemm, v, u, primfunc_name_hint="winograd_gemm"))
    out = bb.call_te(output_transform, m, s, primfunc_name_hint="winograd_output")
    # A per-output reduction with the convolution's epilogue to follow: FuseOps fuses
    # elementwise consumers only into functions marked output-elementwise-fusable
    # (AnnotateTIROpPattern keeps a pattern that is already there).
    gvar = out.args[0]
    bb.update_func(gvar, bb.get()[gvar].with_attr("op_pattern", OUT_EWISE_FUSABLE))
    return out
