"""Recognise an autosched workload in a PrimFunc made by another TVM front end.

Relax's legalisation and fusion name axes, buffers and blocks its own way, may keep a
zero-width padding as a plain copy, and split an epilogue into several blocks. A
PrimFunc computes an autosched workload here when their *fingerprints* are equal:

* the reduction's loop nest with names replaced by positions
  (:func:`autosched.space.loopnest.signature`): axis kinds and extents, each input's
  affine index forms;
* the shapes of the reduction's inputs (a padded input's size says how much padding);
* each block before the reduction (a convolution's padding), in order: which input of
  the reduction it computes, the arithmetic it does, the shapes it reads and writes and
  its affine reads, constant offsets included;
* the epilogue: its arithmetic (node types and intrinsic names) and how many extra
  inputs it reads.

Plain copies between blocks are inlined first, on both sides. The workloads tried
(:func:`candidates`) are derived from the function's loop nest alone (axis extents,
index coefficients, buffer shapes), never from its names; only a candidate whose own
PrimFunc has the same fingerprint is returned.

A function with no single reduction, or none of the contractions, may be row-wise
(softmax, a reduction over the last axis): its stages are compared in order
(:func:`row_fingerprint`) with those of the row-wise workloads of its rows and columns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from autosched.errors import AutoschedError, ScheduleError
from autosched.ops import Workload, workload
from autosched.ops.dense import EPILOGUES as DENSE_EPILOGUES
from autosched.ops.matmul import EPILOGUES as MATMUL_EPILOGUES
from autosched.ops.rowwise import KINDS as REDUCE_KINDS
from autosched.space.loopnest import LoopNest, analyze_prim_func, signature

log = logging.getLogger(__name__)

_FIELDS = ("a", "b", "value", "args", "condition", "true_value", "false_value")
_IGNORED = {"BufferLoad", "TensorLoad", "Cast", "FloatImm", "IntImm", "Var", "SizeVar"}
# ``a >= b`` and ``b <= a`` are one comparison; front ends write either.
_SAME = {"GE": "LE", "GT": "LT"}
_LAYOUTS = ("NCHW", "NHWC")


# -- normalising a PrimFunc ---------------------------------------------------------------------


def _is_copy(block) -> bool:
    """Whether ``block`` only copies one buffer element for element (same shape, same index)."""
    store = block.body
    load = getattr(store, "value", None)
    if not hasattr(store, "indices") or not hasattr(load, "indices"):
        return False
    if len(block.reads) != 1 or len(block.writes) != 1 or block.init is not None:
        return False
    src, dst = block.reads[0].source, block.writes[0].source
    if getattr(load, "source", None) is None or not load.source.same_as(src):
        return False
    if _shape(src) != _shape(dst):
        return False
    ivs = [iv.var for iv in block.iter_vars]
    return all(
        len(indices) == len(ivs) and all(i.same_as(v) for i, v in zip(indices, ivs))
        for indices in (load.indices, store.indices)
    )


def inline_copies(sch) -> None:
    """Inline every block of ``sch`` (a ``tvm.s_tir.Schedule``) that is a plain copy.

    topi pads a convolution's input even when the padding is zero; that copy changes
    nothing but would look like a producer. Outputs are never inlined.
    """
    root = sch.get_sblock("root")
    intermediates = {buf.name for buf in sch.get(root).alloc_buffers}
    for block_rv in sch.get_child_blocks(root):
        block = sch.get(block_rv)
        if block.writes[0].source.name not in intermediates or not _is_copy(block):
            continue
        try:
            sch.compute_inline(block_rv)
        except Exception as exc:  # TVM's own error types: leave the copy, it is correct
            log.debug("copy block %s not inlined: %s", block.name_hint, exc)


def normalized(func) -> tuple[Any, LoopNest]:
    """(a schedule of ``func`` in normal form, its reduction's loop nest).

    Normal form: plain copies inlined (:func:`inline_copies`), and an epilogue of several
    blocks inlined into its last block. Relax writes ``gelu(y + b)`` as six blocks, one
    of them read twice; the contraction schedule fuses an epilogue block by block into
    the accumulators' write-back, which needs each block to have one reader.

    Raises:
        ScheduleError: ``func`` has no single reduction with affine reads.
    """
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    inline_copies(sch)
    nest = analyze_prim_func(sch.mod["main"])
    if len(nest.epilogue) > 1:
        for name in nest.epilogue[:-1]:
            try:
                sch.compute_inline(sch.get_sblock(name))
            except Exception as exc:  # TVM's own error types; the block stays, still correct
                log.debug("epilogue block %s not inlined: %s", name, exc)
        nest = analyze_prim_func(sch.mod["main"])
    return sch, nest


# -- fingerprints ---------------------------------------------------------------------------------


def _ops(expr, out: set[str]) -> None:
    name = type(expr).__name__
    if name == "Call":
        out.add(f"Call:{getattr(expr.op, 'name', expr.op)}")
    elif name not in _IGNORED:
        out.add(_SAME.get(name, name))
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


def _shape(buffer) -> tuple[int, ...]:
    return tuple(int(d) for d in buffer.shape)


def _affine(block) -> tuple:
    """Each read of ``block``: (source shape, per dimension (coefficients per iter var in
    order, constant)); None for a read that is not affine."""
    import tvm

    variables = [iv.var for iv in block.iter_vars]
    reads = []
    for region in block.reads:
        dims = []
        for rng in region.region:
            coeffs = tvm.sym.detect_linear_equation(rng.min, variables)
            if len(coeffs) != len(variables) + 1:
                return None
            dims.append((tuple(int(c) for c in coeffs), int(rng.extent)))
        reads.append((_shape(region.source), tuple(dims)))
    return tuple(reads)


def fingerprint(sch, nest: LoopNest) -> tuple:
    """What must be equal for two functions to compute the same workload (module docstring).

    ``sch`` and ``nest`` come from :func:`normalized`.
    """
    blocks = {b.name_hint: b for b in map(sch.get, sch.get_child_blocks(sch.get_sblock("root")))}
    main = blocks[nest.main]
    shapes = {r.source.name: _shape(r.source) for r in main.reads}
    producers = []
    for name in nest.producers:  # in compute order
        block = blocks[name]
        written = block.writes[0].source
        ops: set[str] = set()
        _ops(block.body.value, ops)
        feeds = nest.produced.index(written.name) if written.name in nest.produced else -1
        producers.append((feeds, frozenset(ops), _shape(written), _affine(block)))
    ops = set()
    produced = {nest.output}
    extra: set[str] = set()
    for name in nest.epilogue:
        block = blocks[name]
        _ops(block.body.value, ops)
        extra.update(r.source.name for r in block.reads if r.source.name not in produced)
        produced.update(r.source.name for r in block.writes)
    return (
        signature(nest),
        tuple(shapes[acc.buffer] for acc in nest.inputs),
        tuple(producers),
        (frozenset(ops), len(extra)),
    )


@lru_cache(maxsize=256)
def _our_fingerprint(wl: Workload) -> tuple | None:
    from tvm import te

    st = wl.stages()
    try:
        sch, nest = normalized(te.create_prim_func([*st.inputs, *st.outputs]))
    except ScheduleError:
        return None
    return fingerprint(sch, nest)


# -- candidates -----------------------------------------------------------------------------------


def _make(op: str, **params: Any) -> Workload | None:
    try:
        return workload(op, **params)
    except AutoschedError:  # extents no workload of this op has
        return None


def _unpadded(sch, nest: LoopNest, buffer: str, padded: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of what a producer of ``buffer`` reads (``padded`` if none produces it)."""
    if buffer not in nest.produced:
        return padded
    for name in nest.producers:
        block = sch.get(sch.get_sblock(name))
        if block.writes[0].source.name == buffer and len(block.reads) == 1:
            return _shape(block.reads[0].source)
    return ()


def _window(nest: LoopNest, dim, out_axis: int, window_axis: int) -> tuple[int, int] | None:
    """(stride, dilation): the coefficients of the output and window axes in ``dim``."""
    names = [a.name for a in nest.axes]
    coeffs = {names.index(a): c for a, c in dim}
    if nest.axes[window_axis].extent == 1:  # a 1-wide window may be simplified away
        coeffs.setdefault(window_axis, 1)
    if set(coeffs) != {out_axis, window_axis}:
        return None
    return coeffs[out_axis], coeffs[window_axis]


def _conv_candidates(sch, nest: LoopNest, shapes: dict[str, tuple[int, ...]]) -> Iterator[Workload]:
    """conv2d (any groups) and depthwise_conv2d in either layout, read off the loop nest.

    The first input of the reduction is the (padded) data: its H and W indices are
    ``p*stride + r*dilation`` and ``q*stride + s*dilation``; its producer's input, if
    any, is the unpadded data.
    """
    n_s, n_r = len(nest.spatial), len(nest.reduction)
    data = nest.inputs[0]
    padded = shapes[data.buffer]
    if len(padded) != 4 or len(data.dims) != 4:
        return
    unpadded = _unpadded(sch, nest, data.buffer, padded)
    if len(unpadded) != 4:
        return
    for layout in _LAYOUTS:
        hd, wd, cd = (2, 3, 1) if layout == "NCHW" else (1, 2, 3)
        pad_h, pad_w = padded[hd] - unpadded[hd], padded[wd] - unpadded[wd]
        if pad_h != pad_w or pad_h % 2:
            continue
        sizes = {"n": unpadded[0], "h": unpadded[hd], "w": unpadded[wd], "pad": pad_h // 2}
        # Positions of the axes in the nest (spatial first, then reduction).
        if n_r == 3 and n_s in (4, 5):
            grouped = n_s == 5
            if layout == "NCHW":
                p, q = (3, 4) if grouped else (2, 3)
                r, s = n_s + 1, n_s + 2
            else:
                p, q, r, s = 1, 2, n_s, n_s + 1
            h_terms, w_terms = (
                _window(nest, data.dims[hd], p, r),
                _window(nest, data.dims[wd], q, s),
            )
            if h_terms is None or h_terms != w_terms:
                continue
            groups = nest.axes[1 if layout == "NCHW" else 3].extent if grouped else 1
            c = unpadded[cd]
            k = nest.axes[(2 if grouped else 1) if layout == "NCHW" else n_s - 1].extent * groups
            found = _make(
                "conv2d",
                **sizes,
                c=c,
                k=k,
                r=nest.axes[r].extent,
                s=nest.axes[s].extent,
                stride=h_terms[0],
                dilation=h_terms[1],
                groups=groups,
                layout=layout,
            )
        elif (n_s, n_r) == (4, 2):
            p, q = (2, 3) if layout == "NCHW" else (1, 2)
            h_terms, w_terms = (
                _window(nest, data.dims[hd], p, 4),
                _window(nest, data.dims[wd], q, 5),
            )
            if h_terms is None or h_terms != w_terms or h_terms[1] != 1:
                continue
            found = _make(
                "depthwise_conv2d",
                **sizes,
                c=unpadded[cd],
                r=nest.axes[4].extent,
                s=nest.axes[5].extent,
                stride=h_terms[0],
                layout=layout,
            )
        else:
            return
        if found is not None:
            yield found


def candidates(sch, nest: LoopNest) -> Iterator[Workload]:
    """Workloads ``nest`` may compute, from its extents, index coefficients and shapes."""
    spatial = [a.extent for a in nest.spatial]
    reduction = [a.extent for a in nest.reduction]
    kinds = (len(spatial), len(reduction))
    if kinds == (2, 1):
        (m, n), (k,) = spatial, reduction
        for epilogue in MATMUL_EPILOGUES:
            yield workload("matmul", M=m, N=n, K=k, epilogue=epilogue)
        for epilogue in DENSE_EPILOGUES:
            yield workload("dense", m=m, n=n, k=k, epilogue=epilogue)
    elif kinds == (3, 1):
        (b, m, n), (k,) = spatial, reduction
        yield workload("batch_matmul", b=b, m=m, n=n, k=k)
    elif nest.inputs:
        main = sch.get(sch.get_sblock(nest.main))
        shapes = {r.source.name: _shape(r.source) for r in main.reads}
        yield from _conv_candidates(sch, nest, shapes)


# -- row-wise functions ---------------------------------------------------------------------------


def row_nest(func):
    """The row-wise nest of ``func`` (see :func:`autosched.space.loopnest.analyze_row_prim_func`),
    or None when ``func`` is not row-wise."""
    from autosched.space.loopnest import analyze_row_prim_func

    try:
        return analyze_row_prim_func(func)
    except ScheduleError:
        return None


def row_fingerprint(func, nest) -> tuple:
    """What must be equal for two row-wise functions to compute the same workload: rows,
    columns and input shapes, then per stage in order its kind (map or reduce), what it
    reads (inputs and earlier stages by position), whether it is an output, and its
    arithmetic."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    position = {name: ("input", i) for i, (name, _) in enumerate(nest.inputs)}
    position.update({b.name: ("stage", i) for i, b in enumerate(nest.blocks)})
    stages = []
    for b in nest.blocks:
        ops: set[str] = set()
        _ops(sch.get(sch.get_sblock(b.name)).body.value, ops)
        stages.append((b.kind, tuple(position[r] for r in b.reads), b.output, frozenset(ops)))
    return nest.rows, nest.cols, tuple(shape for _, shape in nest.inputs), tuple(stages)


@lru_cache(maxsize=256)
def _our_row_fingerprint(wl: Workload) -> tuple | None:
    from tvm import te

    st = wl.stages()
    func = te.create_prim_func([*st.inputs, *st.outputs])
    nest = row_nest(func)
    return None if nest is None else row_fingerprint(func, nest)


def row_candidates(nest) -> Iterator[Workload]:
    """Row-wise workloads of ``nest``'s rows and columns (elementwise chains left out)."""
    rows, cols = nest.rows, nest.cols
    yield workload("softmax", rows=rows, cols=cols)
    yield workload("layernorm", rows=rows, cols=cols)
    for kind in REDUCE_KINDS:
        yield workload("reduce", rows=rows, cols=cols, kind=kind)


def _static(func) -> bool:
    """Whether every buffer of ``func`` has a fixed shape (a symbolic one has no workload)."""
    return all(hasattr(dim, "value") for p in func.params for dim in getattr(p, "shape", ()))


def recognize(func) -> Workload | None:
    """The autosched workload ``func`` computes, or None if it is not one we tune."""
    if not _static(func):
        return None
    try:
        sch, nest = normalized(func)
    except ScheduleError:
        pass
    else:
        theirs = fingerprint(sch, nest)
        for candidate in candidates(sch, nest):
            if _our_fingerprint(candidate) == theirs:
                return candidate
    rows = row_nest(func)
    if rows is None:
        return None
    theirs = row_fingerprint(func, rows)
    for candidate in row_candidates(rows):
        if _our_row_fingerprint(candidate) == theirs:
            return candidate
    return None
