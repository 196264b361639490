"""Reading and writing MLIR through IREE's own MLIR Python bindings.

:func:`find_roots` lists the tunable root ops of a module (the ops IREE's dispatch
formation makes the root of a dispatch: contractions, convolutions, row reductions),
each with the autosched workload it computes where there is one, so that a record
tuned with ``--op matmul`` is found for the same matmul in any file.
:func:`annotate` writes ``compilation_info`` attributes onto roots and prints the
module back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from autosched.errors import InvalidInputError
from autosched.ops import Workload, workload

NAMED_ROOTS = (
    "linalg.matmul",
    "linalg.batch_matmul",
    "linalg.conv_2d_nhwc_hwcf",
    "linalg.conv_2d_nchw_fchw",
    "linalg.depthwise_conv_2d_nhwc_hwc",
    "linalg.depthwise_conv_2d_nchw_chw",
)


@dataclass(frozen=True)
class Root:
    """A tunable root op of a module, in walk order.

    Attributes:
        index: its position among the module's roots.
        op: the op's name (``linalg.matmul``).
        function: the enclosing function's name.
        workload: the autosched workload it computes, or None (shapes or a body that no
            autosched operator has).
    """

    index: int
    op: str
    function: str
    workload: Workload | None


def _context():
    from iree.compiler import ir

    return ir.Context()


def _parse(text: str, ctx) -> Any:
    from iree.compiler import ir

    try:
        return ir.Module.parse(text, ctx)
    except ir.MLIRError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "parse error"
        raise InvalidInputError(f"the MLIR input does not parse: {first}") from None


def _walk(op, function: str = "") -> Iterator[tuple[Any, str]]:
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                name = function
                if child.name in ("func.func", "util.func"):
                    name = str(child.attributes["sym_name"]).strip('"')
                yield child, name
                yield from _walk(child, name)


def _is_root(op) -> bool:
    if op.name in NAMED_ROOTS:
        return True
    if op.name != "linalg.generic":
        return False
    return "reduction" in str(op.attributes["iterator_types"])


def _roots(module) -> list[tuple[Any, str]]:
    return [(op, fn) for op, fn in _walk(module.operation) if _is_root(op)]


def find_roots(text: str) -> list[Root]:
    """The tunable root ops of the MLIR module ``text``, in order."""
    ctx = _context()
    module = _parse(text, ctx)
    return [Root(i, op.name, fn, _workload(op)) for i, (op, fn) in enumerate(_roots(module))]


def annotate(text: str, infos: Mapping[int, str]) -> str:
    """``text`` with ``compilation_info`` set on the roots ``infos`` names (root index
    -> attribute text); other ops are left as they are."""
    from iree.compiler import ir

    ctx = _context()
    module = _parse(text, ctx)
    roots = _roots(module)
    with ctx:
        for index, info in infos.items():
            op, _ = roots[index]
            op.attributes["compilation_info"] = ir.Attribute.parse(info)
    return str(module)


# -- what a root op computes ------------------------------------------------------------


def _shape(value) -> tuple[int, ...] | None:
    from iree.compiler import ir

    try:
        t = ir.RankedTensorType(value.type)
    except (ValueError, TypeError):
        return None
    if not t.has_static_shape or str(t.element_type) != "f32":
        return None
    return tuple(int(d) for d in t.shape)


def _ints(op, name: str, default: int = 1) -> list[int]:
    from iree.compiler import ir

    if name not in op.attributes:
        return [default, default]
    return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])]


def _padding(value, spatial: tuple[int, int]) -> tuple[Any, int]:
    """(the unpadded value, pad) when ``value`` is a symmetric zero ``tensor.pad`` of
    its spatial dims only; else (value, 0)."""
    from iree.compiler import ir

    owner = value.owner
    if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
        owner = owner.operation
    if not isinstance(owner, ir.Operation) or owner.name != "tensor.pad":
        return value, 0
    low = [int(v) for v in ir.DenseI64ArrayAttr(owner.attributes["static_low"])]
    high = [int(v) for v in ir.DenseI64ArrayAttr(owner.attributes["static_high"])]
    pads = {low[i] for i in spatial} | {high[i] for i in spatial}
    others = [low[i] + high[i] for i in range(len(low)) if i not in spatial]
    yielded = owner.regions[0].blocks[0].operations[0].operands[0].owner
    zero = "arith.constant" in str(yielded) and "0.000000e+00" in str(yielded)
    if len(pads) != 1 or any(others) or not zero:
        return value, 0
    return owner.operands[0], pads.pop()


def _workload(op) -> Workload | None:
    """The autosched workload ``op`` computes, or None."""
    try:
        return _named(op) if op.name != "linalg.generic" else _reduction(op)
    except (KeyError, ValueError, IndexError, InvalidInputError):
        return None


_PLAIN = (
    "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, "
    "affine_map<(d0, d1, d2) -> (d0, d1)>]",
    "[affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>, "
    "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]",
)


def _named(op) -> Workload | None:
    name = op.name
    if "indexing_maps" in op.attributes and str(op.attributes["indexing_maps"]) not in _PLAIN:
        return None  # a transposed or broadcast contraction: no autosched op
    a, b = _shape(op.operands[0]), _shape(op.operands[1])
    if a is None or b is None:
        return None
    if name == "linalg.matmul":
        return workload("matmul", M=a[0], N=b[1], K=a[1])
    if name == "linalg.batch_matmul":
        return workload("batch_matmul", b=a[0], m=a[1], n=b[2], k=a[2])
    nhwc = "nhwc" in name
    src, pad = _padding(op.operands[0], (1, 2) if nhwc else (2, 3))
    data = _shape(src)
    if data is None:
        return None
    strides, dilations = _ints(op, "strides"), _ints(op, "dilations")
    if len(set(strides)) != 1 or len(set(dilations)) != 1:
        return None
    n, c, h, w = (data[0], data[3], data[1], data[2]) if nhwc else data
    layout = "NHWC" if nhwc else "NCHW"
    common = dict(n=n, c=c, h=h, w=w, stride=strides[0], pad=pad, layout=layout)
    if "depthwise" in name:
        if dilations[0] != 1:
            return None
        r, s = (b[0], b[1]) if nhwc else (b[1], b[2])
        return workload("depthwise_conv2d", r=r, s=s, **common)
    r, s, k = (b[0], b[1], b[3]) if nhwc else (b[2], b[3], b[0])
    return workload("conv2d", k=k, r=r, s=s, dilation=dilations[0], **common)


def _reduction(op) -> Workload | None:
    """A sum or max of each row of a 2-D tensor (``reduce``); other generics: None."""
    iters = str(op.attributes["iterator_types"])
    if iters.count("parallel") != 1 or iters.count("reduction") != 1 or len(op.operands) != 2:
        return None
    x, out = _shape(op.operands[0]), _shape(op.operands[1])
    maps = str(op.attributes["indexing_maps"])
    if x is None or out is None or len(x) != 2 or out != (x[0],):
        return None
    if "(d0, d1) -> (d0, d1)" not in maps or "(d0, d1) -> (d0)" not in maps:
        return None
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    kinds = {"arith.addf": "sum", "arith.maximumf": "max"}
    if len(body) != 2 or body[0] not in kinds:
        return None
    return workload("reduce", rows=x[0], cols=x[1], kind=kinds[body[0]])
