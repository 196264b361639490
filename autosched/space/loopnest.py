"""What the schedule space is derived from: the loop nest of a workload's main stage.

The space never looks at the operator's name. It reads, from the PrimFunc that TVM
makes of the TE compute, the main block's spatial and reduction axes with their
extents, and for each input the affine index expressions of its accesses. That is
enough to tile any contraction (matmul, batch matmul, convolution) and to estimate
tile footprints and bytes moved before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autosched.errors import ScheduleError
from autosched.ops.base import Workload


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    kind: str  # "S" (spatial) or "R" (reduction)


@dataclass(frozen=True)
class Access:
    """An input read by the main block: one affine form per buffer dimension.

    ``dims[d]`` is a tuple of (axis name, coefficient) pairs; ``extents[d]`` is the
    region extent TVM reports for that dimension (1 for a point access).
    """

    buffer: str
    dims: tuple[tuple[tuple[str, int], ...], ...]
    extents: tuple[int, ...]

    def footprint(self, tile: dict[str, int]) -> int:
        """Elements touched when each axis ranges over ``tile[axis]`` consecutive values."""
        total = 1
        for terms, ext in zip(self.dims, self.extents):
            span = sum(abs(c) * (tile.get(a, 1) - 1) for a, c in terms) + ext
            total *= span
        return total


@dataclass(frozen=True)
class LoopNest:
    main: str  # name of the main block
    axes: tuple[Axis, ...]  # in loop order: spatial first, then reduction
    inputs: tuple[Access, ...]
    output: str
    producers: tuple[str, ...]  # blocks before the main one
    epilogue: tuple[str, ...]  # blocks after it
    produced: tuple[str, ...] = ()  # inputs of the main block that a producer computes

    @property
    def spatial(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "S")

    @property
    def reduction(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "R")


def classify(workload: Workload) -> str:
    """``"contraction"`` or ``"rowwise"``: which space family fits ``workload``.

    A contraction has one reduction and an input that several outputs read (an
    axis of the output does not index it), so tiles can reuse what they load. Any
    other nest (several reductions, none, or a reduction that reads each input
    element for one output only) streams over rows.
    """
    return _classify_cached(workload.key, workload)


@lru_cache(maxsize=256)
def _classify_cached(key: str, workload: Workload) -> str:
    from tvm import te

    st = workload.stages()
    try:
        nest = analyze_prim_func(te.create_prim_func([*st.inputs, *st.outputs]))
    except ScheduleError:
        return "rowwise"
    spatial = {a.name for a in nest.spatial}
    for acc in nest.inputs:
        used = {name for terms in acc.dims for name, _ in terms}
        if spatial - used:
            return "contraction"
    return "rowwise"


def analyze(workload: Workload) -> LoopNest:
    """The loop nest of ``workload``'s main stage (cached per workload key)."""
    return _analyze_cached(workload.key, workload)


@lru_cache(maxsize=256)
def _analyze_cached(key: str, workload: Workload) -> LoopNest:
    from tvm import te

    st = workload.stages()
    nest = analyze_prim_func(te.create_prim_func([*st.inputs, *st.outputs]))
    if nest.main != st.main.op.name:
        raise ScheduleError(f"{workload}: expected main stage {st.main.op.name}, found {nest.main}")
    return nest


def analyze_prim_func(func) -> LoopNest:
    """The loop nest of any PrimFunc with one reduction block (TE's, or Relax's after fusion).

    Blocks before the reduction are producers, blocks after it form the epilogue.
    """
    import tvm
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [
        i for i, b in enumerate(blocks) if any(int(iv.iter_type) == 2 for iv in b.iter_vars)
    ]
    if len(reductions) != 1:
        raise ScheduleError(f"expected one reduction block, found {len(reductions)}")
    (at,) = reductions
    block = blocks[at]
    output = block.writes[0].source.name
    axes = []
    var_names = {}
    for iv in block.iter_vars:
        kind = {0: "S", 2: "R"}.get(int(iv.iter_type))
        if kind is None:
            raise ScheduleError(f"block {block.name_hint} has an axis of unsupported kind {iv}")
        name = str(iv.var.name).removeprefix("v_")
        var_names[name] = iv.var
        axes.append(Axis(name, int(iv.dom.extent), kind))
    variables = list(var_names.values())
    inputs = []
    for region in block.reads:
        buf = region.source.name
        if buf == output:  # the accumulator itself (the update reads it)
            continue
        dims, extents = [], []
        for rng in region.region:
            coeffs = tvm.sym.detect_linear_equation(rng.min, variables)
            if len(coeffs) != len(variables) + 1:
                raise ScheduleError(f"access {region} is not affine in the loop axes")
            terms = tuple((name, int(c)) for name, c in zip(var_names, coeffs[:-1]) if int(c) != 0)
            dims.append(terms)
            extents.append(int(rng.extent))
        inputs.append(Access(buf, tuple(dims), tuple(extents)))
    written = {w.source.name for b in blocks[:at] for w in b.writes}
    return LoopNest(
        main=block.name_hint,
        axes=tuple(sorted(axes, key=lambda a: a.kind == "R")),
        inputs=tuple(inputs),
        output=output,
        producers=tuple(b.name_hint for b in blocks[:at]),
        epilogue=tuple(b.name_hint for b in blocks[at + 1 :]),
        produced=tuple(acc.buffer for acc in inputs if acc.buffer in written),
    )


def signature(nest: LoopNest) -> tuple:
    """The nest with every name replaced by its position: equal for the same computation
    whatever TVM front end (TE, Relax legalisation) named its axes and buffers."""
    pos = {a.name: i for i, a in enumerate(nest.axes)}
    return (
        tuple((a.kind, a.extent) for a in nest.axes),
        tuple(
            (tuple(tuple((pos[n], c) for n, c in terms) for terms in acc.dims), acc.extents)
            for acc in nest.inputs
        ),
    )
