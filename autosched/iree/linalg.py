"""autosched's operators as Linalg on tensors, and the iteration domain of their root op.

:func:`emit` writes a workload as an MLIR module with one function ``@main`` that
takes the workload's inputs in order and returns its outputs: contractions and
convolutions as Linalg named ops (``linalg.matmul``, ``linalg.batch_matmul``,
``linalg.conv_2d_nhwc_hwcf``, ...), a matmul's bias and ReLU epilogue and every
row-wise operator (softmax, layernorm, reductions) as ``linalg.generic``. IREE's
dispatch formation fuses the fill, the epilogue and the padding around the root op.

:func:`domain` gives the root op's loops in Linalg's own order (a matmul's ``m, n,
k``; ``conv_2d_nhwc_hwcf``'s ``n, oh, ow, f, kh, kw, c``): the tile sizes of a
``lowering_config`` are listed in that order, so the space reads its knobs off it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autosched.errors import InvalidInputError
from autosched.ops.base import Workload

PARALLEL = "parallel"
REDUCTION = "reduction"

# The row-wise operators whose root is a reduction over the last axis.
ROWWISE_OPS = ("softmax", "layernorm", "reduce")
OPS = ("matmul", "batch_matmul", "conv2d", "depthwise_conv2d", *ROWWISE_OPS)


@dataclass(frozen=True)
class Loop:
    name: str
    extent: int
    kind: str  # PARALLEL or REDUCTION


@dataclass(frozen=True)
class Domain:
    """The loops of a root Linalg op, in the op's order.

    Attributes:
        op: the Linalg op (``linalg.matmul``, ``linalg.generic``, ...).
        kind: ``contraction``, ``conv`` or ``reduction``: which pipelines apply.
        loops: every loop, parallel and reduction, as the op orders them.
    """

    op: str
    kind: str
    loops: tuple[Loop, ...]

    @property
    def spatial(self) -> tuple[Loop, ...]:
        return tuple(lp for lp in self.loops if lp.kind == PARALLEL)

    @property
    def reduction(self) -> tuple[Loop, ...]:
        return tuple(lp for lp in self.loops if lp.kind == REDUCTION)


def _loops(*spec: tuple[str, int, str]) -> tuple[Loop, ...]:
    return tuple(Loop(n, int(e), k) for n, e, k in spec)


def domain(workload: Workload) -> Domain:
    """The root op's iteration domain; raises InvalidInputError for other operators."""
    _check(workload)
    p = workload.params
    P, R = PARALLEL, REDUCTION
    if workload.op == "matmul":
        loops = _loops(("m", p["M"], P), ("n", p["N"], P), ("k", p["K"], R))
        return Domain("linalg.matmul", "contraction", loops)
    if workload.op == "batch_matmul":
        b, m, n, k = (p[x] for x in ("b", "m", "n", "k"))
        loops = _loops(("b", b, P), ("m", m, P), ("n", n, P), ("k", k, R))
        return Domain("linalg.batch_matmul", "contraction", loops)
    if workload.op in ("conv2d", "depthwise_conv2d"):
        n, oh, ow = p["n"], workload.out_h, workload.out_w
        out_c = p["k"] if workload.op == "conv2d" else p["c"]
        nhwc = p["layout"] == "NHWC"
        if nhwc:
            par = [("n", n, P), ("oh", oh, P), ("ow", ow, P), ("f", out_c, P)]
        else:
            par = [("n", n, P), ("f", out_c, P), ("oh", oh, P), ("ow", ow, P)]
        red = [("kh", p["r"], R), ("kw", p["s"], R)]
        if workload.op == "conv2d":
            red = red + [("c", p["c"], R)] if nhwc else [("c", p["c"], R)] + red
        return Domain(_conv_op(workload), "conv", _loops(*par, *red))
    loops = _loops(("row", p["rows"], P), ("col", p["cols"], R))
    return Domain("linalg.generic", "reduction", loops)


def config_dropped(workload: Workload) -> str | None:
    """Why IREE builds ``workload`` with its own config whatever lowering config it is
    given, or None where it applies the one given. IREE 3.13 folds a convolution's loops
    of extent 1 away before configuring it (a batch of 1, a 1x1 filter, a 1x1 output,
    a 1x3 filter: each checked) and then rebuilds the op without the config given
    (inline or by a tuning spec; on llvm-cpu and SPIR-V alike); without such a loop the
    config reaches ``iree-compile --compile-to=executable-configurations``. Matmuls, batch
    matmuls and row ops with unit dims keep theirs."""
    if workload.op not in ("conv2d", "depthwise_conv2d"):
        return None
    unit = [lp.name for lp in domain(workload).loops if lp.extent == 1]
    if not unit:
        return None
    return (
        f"IREE 3.13 drops the lowering config of a convolution with loops of extent 1 "
        f"({', '.join(unit)}: it folds them away), so only IREE's own config is built and "
        "measured; one without (a batch of 2 or more, a filter and an output over 1x1), "
        "or --target llvm or opencl, is tuned"
    )


def _check(workload: Workload) -> None:
    if workload.op not in OPS:
        raise InvalidInputError(
            f"operator {workload.op!r} has no Linalg form for IREE; accepted: {', '.join(OPS)}"
        )
    if workload.op == "conv2d" and workload.params.get("groups", 1) != 1:
        raise InvalidInputError(
            f"conv2d groups={workload.params['groups']} has no Linalg form for IREE; "
            "accepted: groups=1 (depthwise_conv2d for one group per channel)"
        )
    if workload.op == "depthwise_conv2d" and workload.params.get("dilation", 1) != 1:
        raise InvalidInputError("depthwise_conv2d dilation must be 1 for IREE")


def _conv_op(workload: Workload) -> str:
    nhwc = workload.params["layout"] == "NHWC"
    if workload.op == "conv2d":
        return "linalg.conv_2d_nhwc_hwcf" if nhwc else "linalg.conv_2d_nchw_fchw"
    return "linalg.depthwise_conv_2d_nhwc_hwc" if nhwc else "linalg.depthwise_conv_2d_nchw_chw"


# -- emission ---------------------------------------------------------------------------

_F32 = "f32"
_NEG_INF = "0xFF800000"


def tensor_type(shape: tuple[int, ...] | list[int], dtype: str = "float32") -> str:
    if dtype != "float32":
        raise InvalidInputError(f"dtype {dtype!r} has no Linalg form here; accepted: float32")
    return "tensor<" + "".join(f"{int(d)}x" for d in shape) + f"{_F32}>"


def _map(n: int, results: str) -> str:
    dims = ", ".join(f"d{i}" for i in range(n))
    return f"affine_map<({dims}) -> ({results})>"


def emit(workload: Workload) -> str:
    """The workload as an MLIR module: ``func.func @main(inputs) -> outputs``."""
    _check(workload)
    specs = workload.tensor_specs()
    ins = [s for s in specs if s.role == "input"]
    outs = [s for s in specs if s.role == "output"]
    args = ", ".join(f"%{s.name}: {tensor_type(s.shape)}" for s in ins)
    results = ", ".join(tensor_type(s.shape) for s in outs)
    body = _BODIES[workload.op](workload)
    ret = ", ".join(f"%{s.name}" for s in outs)
    lines = [
        f"func.func @main({args}) -> ({results}) {{",
        f"  %zero = arith.constant 0.0 : {_F32}",
        *("  " + ln for ln in body),
        f"  return {ret} : {results}",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _filled(name: str, shape: tuple[int, ...], value: str = "%zero") -> list[str]:
    t = tensor_type(shape)
    return [
        f"%{name}_empty = tensor.empty() : {t}",
        f"%{name}_init = linalg.fill ins({value} : {_F32}) outs(%{name}_empty : {t}) -> {t}",
    ]


def _matmul(wl: Workload) -> list[str]:
    M, N, K = wl.M, wl.N, wl.K
    a, b, c = tensor_type((M, K)), tensor_type((K, N)), tensor_type((M, N))
    lines = _filled("C", (M, N))
    lines.append(
        f"%C = linalg.matmul ins(%A, %B : {a}, {b}) outs(%C_init : {c}) -> {c}",
    )
    if wl.epilogue == "none":
        return lines
    relu = wl.epilogue == "bias_relu"
    maps = [_map(2, "d0, d1"), _map(2, "d1"), _map(2, "d0, d1")]
    lines += [
        f"%D = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
        f'iterator_types = ["parallel", "parallel"]}} '
        f"ins(%C, %bias : {c}, {tensor_type((N,))}) outs(%C_empty : {c}) {{",
        f"^bb0(%c: {_F32}, %b: {_F32}, %o: {_F32}):",
        f"  %s = arith.addf %c, %b : {_F32}",
    ]
    if relu:
        lines.append(f"  %r = arith.maximumf %s, %zero : {_F32}")
    lines += [f"  linalg.yield {'%r' if relu else '%s'} : {_F32}", f"}} -> {c}"]
    return lines


def _batch_matmul(wl: Workload) -> list[str]:
    b, m, n, k = (wl.params[x] for x in ("b", "m", "n", "k"))
    ta, tb, tc = tensor_type((b, m, k)), tensor_type((b, k, n)), tensor_type((b, m, n))
    return [
        *_filled("C", (b, m, n)),
        f"%C = linalg.batch_matmul ins(%A, %B : {ta}, {tb}) outs(%C_init : {tc}) -> {tc}",
    ]


def _conv(wl: Workload) -> list[str]:
    p = wl.params
    nhwc = p["layout"] == "NHWC"
    data_t = tensor_type(wl.data_shape)
    src, src_t, lines = "%data", data_t, []
    if p["pad"] > 0:
        pad = p["pad"]
        padded = list(wl.data_shape)
        hi, wi = (1, 2) if nhwc else (2, 3)
        padded[hi] += 2 * pad
        padded[wi] += 2 * pad
        low = [0, 0, 0, 0]
        low[hi] = low[wi] = pad
        src_t = tensor_type(padded)
        idx = ", ".join(f"%i{i}: index" for i in range(4))
        lines += [
            f"%padded = tensor.pad %data low{low} high{low} {{",
            f"^bb0({idx}):",
            f"  tensor.yield %zero : {_F32}",
            f"}} : {data_t} to {src_t}",
        ]
        src = "%padded"
    out = wl.out_shape
    out_t = tensor_type(out)
    dil = p.get("dilation", 1)
    attrs = f"{{dilations = dense<{dil}> : tensor<2xi64>, strides = dense<{p['stride']}> : tensor<2xi64>}}"
    name = out_name = "conv2d" if wl.op == "conv2d" else "depthwise_conv2d"
    lines += _filled(name, out)
    lines.append(
        f"%{out_name} = {_conv_op(wl)} {attrs} ins({src}, %weight : {src_t}, "
        f"{tensor_type(wl.weight_shape)}) outs(%{name}_init : {out_t}) -> {out_t}"
    )
    return lines


def _row_generic(
    result: str,
    ins: list[tuple[str, str, str]],
    out: str,
    out_t: str,
    reduce: bool,
    body: list[str],
) -> list[str]:
    """A 2-D generic over (row, col): ``ins`` are (value, type, "rc"|"r"|"c"), the
    output is per row when ``reduce``, else per element."""
    maps = [_map(2, {"rc": "d0, d1", "r": "d0", "c": "d1"}[k]) for _, _, k in ins]
    maps.append(_map(2, "d0" if reduce else "d0, d1"))
    iters = '["parallel", "reduction"]' if reduce else '["parallel", "parallel"]'
    in_vals = ", ".join(v for v, _, _ in ins)
    in_types = ", ".join(t for _, t, _ in ins)
    return [
        f"%{result} = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
        f"iterator_types = {iters}}} ins({in_vals} : {in_types}) outs({out} : {out_t}) {{",
        *body,
        f"}} -> {out_t}",
    ]


def _rowwise(wl: Workload) -> list[str]:
    R, C = wl.params["rows"], wl.params["cols"]
    full, row, col = tensor_type((R, C)), tensor_type((R,)), tensor_type((C,))
    types = {"rc": full, "r": row, "c": col}
    f = _F32
    lines: list[str] = []

    def generic(result, ins, init, reduce, args, ops, value):
        out_t = row if reduce else full
        block = [f"^bb0({', '.join(f'%{a}: {f}' for a in args)}):"]
        block += [f"  {op}" for op in ops] + [f"  linalg.yield {value} : {f}"]
        typed = [(v, types[k], k) for v, k in ins]
        lines.extend(_row_generic(result, typed, init, out_t, reduce, block))

    if wl.op == "reduce":
        init = "%zero" if wl.kind == "sum" else "%ninf"
        if wl.kind == "max":
            lines.append(f"%ninf = arith.constant {_NEG_INF} : {f}")
        lines += _filled("reduce", (R,), init)
        op = "arith.addf" if wl.kind == "sum" else "arith.maximumf"
        generic("reduce", [("%x", "rc")], "%reduce_init", True, ["a", "acc"],
                [f"%r = {op} %a, %acc : {f}"], "%r")  # fmt: skip
        return lines
    if wl.op == "softmax":
        lines.append(f"%ninf = arith.constant {_NEG_INF} : {f}")
        lines += _filled("row_max", (R,), "%ninf")
        generic("row_max", [("%x", "rc")], "%row_max_init", True, ["a", "acc"],
                [f"%r = arith.maximumf %a, %acc : {f}"], "%r")  # fmt: skip
        lines += _filled("row_sum", (R,))
        generic("row_sum", [("%x", "rc"), ("%row_max", "r")], "%row_sum_init", True,
                ["a", "m", "acc"],
                [f"%d = arith.subf %a, %m : {f}", f"%e = math.exp %d : {f}",
                 f"%r = arith.addf %e, %acc : {f}"], "%r")  # fmt: skip
        lines.append(f"%out_empty = tensor.empty() : {full}")
        generic("softmax", [("%x", "rc"), ("%row_max", "r"), ("%row_sum", "r")], "%out_empty",
                False, ["a", "m", "s", "o"],
                [f"%d = arith.subf %a, %m : {f}", f"%e = math.exp %d : {f}",
                 f"%r = arith.divf %e, %s : {f}"], "%r")  # fmt: skip
        return lines
    # layernorm: mean, then the variance of the centred values, then the affine map.
    lines.append(f"%n = arith.constant {float(C):.8e} : {f}")
    lines.append(f"%eps = arith.constant {float(wl.eps):.8e} : {f}")
    lines += _filled("row_sum", (R,))
    generic("row_sum", [("%x", "rc")], "%row_sum_init", True, ["a", "acc"],
            [f"%r = arith.addf %a, %acc : {f}"], "%r")  # fmt: skip
    lines += _filled("var_sum", (R,))
    generic("var_sum", [("%x", "rc"), ("%row_sum", "r")], "%var_sum_init", True,
            ["a", "s", "acc"],
            [f"%mean = arith.divf %s, %n : {f}", f"%d = arith.subf %a, %mean : {f}",
             f"%q = arith.mulf %d, %d : {f}", f"%r = arith.addf %q, %acc : {f}"], "%r")  # fmt: skip
    lines.append(f"%out_empty = tensor.empty() : {full}")
    generic("layernorm",
            [("%x", "rc"), ("%row_sum", "r"), ("%var_sum", "r"), ("%gamma", "c"), ("%beta", "c")],
            "%out_empty", False, ["a", "s", "v", "g", "b", "o"],
            [f"%mean = arith.divf %s, %n : {f}", f"%d = arith.subf %a, %mean : {f}",
             f"%var = arith.divf %v, %n : {f}", f"%ve = arith.addf %var, %eps : {f}",
             f"%inv = math.rsqrt %ve : {f}", f"%y = arith.mulf %d, %inv : {f}",
             f"%yg = arith.mulf %y, %g : {f}", f"%r = arith.addf %yg, %b : {f}"], "%r")  # fmt: skip
    return lines


_BODIES = {
    "matmul": _matmul,
    "batch_matmul": _batch_matmul,
    "conv2d": _conv,
    "depthwise_conv2d": _conv,
    "softmax": _rowwise,
    "layernorm": _rowwise,
    "reduce": _rowwise,
}
