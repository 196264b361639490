"""Winograd F(4x4, 3x3) convolutions: a 3x3 stride-1 convolution as three tunable tasks.

Lavin and Gray's minimal filtering (2016): each 4x4 block of outputs is computed from a
6x6 block of the input as ``A^T [(G g G^T) * (B^T d B)] A``: 36 multiplications per
block and channel pair where the direct convolution takes 144. The weight's transform
``G g G^T`` is a constant, made once at build time (here, in numpy); what runs is

- ``winograd_input``: ``V[xi, nu, n, th, tw, c] = sum_ab T[xi, nu, a, b] d[n, 4 th + a, 4 tw + b, c]``
  (``T = B^T (x) B^T``, the zero padding fused in as a producer),
- ``winograd_gemm``: ``M[n, th, tw, xi, nu, k] = sum_c V[xi, nu, n, th, tw, c] U[xi, nu, c, k]``,
  36 independent matrix products, written tile by tile,
- ``winograd_output``: ``Y[n, h, w, k] = sum_xy S[h % 4, w % 4, xi, nu] M[n, h / 4, w / 4, xi, nu, k]``
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

from collections.abc import Callable
from typing import Any

import numpy as np

from autosched.ops.fused import parallel_leading

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
MARK = "autosched_winograd"  # block annotation: "<stage> <signature>"


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


def takes(call: Any) -> bool:
    """Whether the rewrite takes this conv2d call (the predicate for every one)."""
    return convertible(call) is not None


def form_of(func: Any) -> tuple[str, str] | None:
    """``("winograd", signature)`` for a fused PrimFunc holding a Winograd stage,
    ``("direct", signature)`` for one holding a convolution the rewrite would take (a
    3x3 reduction over a ``[n, oh + 2, ow + 2, c]`` input into ``[n, oh, ow, k]``), else
    None."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        marked = stage_of(block)
        if marked is not None:
            return "winograd", marked[1]
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


def stage_of(block: Any) -> tuple[str, str] | None:
    """``(stage, signature)`` of a Winograd stage's block (``input``, ``gemm`` or
    ``output``), or None for any other block."""
    mark = block.annotations.get(MARK) if block.annotations else None
    if mark is None:
        return None
    stage, sig = str(mark).split(" ", 1)
    return stage, sig


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
    sig = signature(n, oh, ow, c, k)

    def _mark(stage: str) -> dict[str, str]:
        # A block annotation (it survives fusion and the records' normalised script,
        # which renames a block after the buffer it writes): the stage and its conv.
        return {MARK: f"{stage} {sig}"}

    def input_transform(data):
        padded = topi.nn.pad(
            data,
            [0, top, left, 0],
            [0, th * TILE + 2 - h - top, tw * TILE + 2 - w - left, 0],
            name="winograd_pad",
        )

        # Separably, as B^T d then (B^T d) B: two sums of at most four terms per value
        # where the 2-D form has up to 16 (and an expression 10x the size to compile).
        def rows(xi, b, i, p, q, ch):
            return _by_index(
                xi,
                ALPHA,
                lambda r: _linear(BT[r], lambda a: padded[i, p * TILE + a, q * TILE + b, ch]),
            )

        partial = te.compute(
            (ALPHA, ALPHA, n, th, tw, c), rows, name="winograd_rows", attrs=_mark("rows")
        )

        def value(xi, nu, i, p, q, ch):
            return _by_index(
                nu, ALPHA, lambda s: _linear(BT[s], lambda b: partial[xi, b, i, p, q, ch])
            )

        return te.compute(
            (ALPHA, ALPHA, n, th, tw, c), value, name="winograd_input", attrs=_mark("input")
        )

    def gemm(v, u):
        r = te.reduce_axis((0, c), name="c")
        # Tile-major: the output transform reads a tile's 36 products as one block.
        return te.compute(
            (n, th, tw, ALPHA, ALPHA, k),
            lambda i, p, q, xi, nu, ko: te.sum(v[xi, nu, i, p, q, r] * u[xi, nu, r, ko], axis=r),
            name="winograd_gemm",
            attrs=_mark("gemm"),
        )

    def output_transform(m):
        def value(i, y, x_, ko):
            return _by_position(
                (y % TILE, x_ % TILE), TILE,
                lambda r, s: _separable(
                    AT, r, s, lambda xi, nu: m[i, y // TILE, x_ // TILE, xi, nu, ko]
                ),
            )  # fmt: skip

        return te.compute((n, oh, ow, k), value, name="winograd_output", attrs=_mark("output"))

    u = relax.const(weight_transform(weight))
    v = bb.emit(bb.call_te(input_transform, x, primfunc_name_hint="winograd_input"))
    m = bb.emit(bb.call_te(gemm, v, u, primfunc_name_hint="winograd_gemm"))
    out = bb.call_te(output_transform, m, primfunc_name_hint="winograd_output")
    # A map with the convolution's epilogue to follow: FuseOps fuses elementwise
    # consumers only into functions marked output-elementwise-fusable (AnnotateTIROpPattern
    # keeps a pattern that is already there).
    gvar = out.args[0]
    bb.update_func(gvar, bb.get()[gvar].with_attr("op_pattern", OUT_EWISE_FUSABLE))
    return out


def _linear(coefs: np.ndarray, term: Callable[[int], Any]) -> Any:
    """``sum_a coefs[a] * term(a)`` as an expression: zero coefficients left out, +-1 as
    an addition or subtraction."""
    from tvm import tirx

    acc = None
    for a in np.flatnonzero(coefs):
        coef = float(coefs[a])
        expr = term(int(a))
        if abs(coef) != 1:
            expr = expr * tirx.const(abs(coef), "float32")
        if acc is None:
            acc = expr if coef > 0 else tirx.const(0.0, "float32") - expr
        else:
            acc = acc + expr if coef > 0 else acc - expr
    return acc


def _separable(matrix: np.ndarray, row: int, col: int, load: Callable[[int, int], Any]) -> Any:
    """``sum_a M[row, a] sum_b M[col, b] load(a, b)`` as an expression, a sum of row sums
    (the unrolled tile shares them: the compiler's common subexpressions)."""
    return _linear(matrix[row], lambda a: _linear(matrix[col], lambda b: load(a, b)))


def _by_index(index: Any, size: int, value: Callable[[int], Any]) -> Any:
    """``value(r)`` for ``index == r``: a chain of selects that folds to one branch once
    the loop of ``index`` is unrolled."""
    from tvm import tirx

    expr = value(size - 1)
    for r in reversed(range(size - 1)):
        expr = tirx.Select(index == r, value(r), expr)
    return expr


def _by_position(index: tuple[Any, Any], size: int, value: Callable[[int, int], Any]) -> Any:
    """The expression ``value(r, s)`` for the position ``index == (r, s)`` of a
    ``size x size`` tile: a chain of selects that folds to one branch once the tile's
    loops are unrolled (the schedules here unroll them)."""
    from tvm import tirx

    cases = [(r, s) for r in range(size) for s in range(size)]
    expr = value(*cases[-1])
    for r, s in reversed(cases[:-1]):
        expr = tirx.Select(tirx.all(index[0] == r, index[1] == s), value(r, s), expr)
    return expr


def schedule(sch: Any, block: Any, *, lanes: int, cores: int) -> bool:
    """Schedule a ``winograd_input`` or ``winograd_output`` block (maps no space covers:
    each value is a different sum per position in its tile) tile by tile: the tile's
    positions unrolled, so that each select folds to its one sum, whose terms share the
    loads of the tile; the channels in vectors of ``lanes``, the tiles over ``cores``.
    The epilogue (bias, residual, relu) that FuseOps put after an output transform runs
    tile by tile too, while the tile is in cache. False for any other block or where
    TVM refuses (the caller's default schedule then applies)."""
    marked = stage_of(sch.get(block))
    name = str(sch.get(block).name_hint)
    try:
        if marked is not None and marked[0] == "output":
            n, h, w, k = sch.get_loops(block)
            ho, hi = sch.split(h, [None, TILE])
            wo, wi = sch.split(w, [None, TILE])
            tile, outer = (hi, wi), [n, ho, wo]
        elif marked is not None and marked[0] == "input":
            xi, nu, n, p, q, k = sch.get_loops(block)
            tile, outer = (xi, nu), [n, p, q]
            (rows,) = sch.get_producers(block)
        else:
            return False
        extent = int(sch.get(k).extent)
        v = lanes if lanes > 1 and extent % lanes == 0 else 1
        ko, kv = sch.split(k, [None, v])
        sch.reorder(*outer, ko, *tile, kv)
        for loop in tile:
            sch.unroll(loop)
        if v > 1:
            sch.vectorize(kv)
        parallel_leading(sch, outer, cores=cores)
        if marked[0] == "input":  # B^T d, for the tile, where B^T d B reads it
            sch.compute_at(rows, ko)
            *_, r_xi, r_b, r_k = sch.get_loops(rows)
            sch.unroll(r_xi)
            sch.unroll(r_b)
            if v > 1:
                sch.vectorize(r_k)
        for consumer in sch.get_consumers(block):
            sch.reverse_compute_at(consumer, ko)
            inner = sch.get_loops(consumer)[-1]
            if v > 1 and int(sch.get(inner).extent) == v:
                sch.vectorize(inner)
        return True
    except Exception as exc:  # TVM's own error types: the caller falls back
        import logging

        logging.getLogger(__name__).debug("%s: winograd schedule: %s", name, exc)
        return False
