"""What the schedule space is derived from: the loop nest of a workload's main stage.

The space never looks at the operator's name. It reads, from the PrimFunc that TVM
makes of the TE compute, the main block's spatial and reduction axes with their
extents, and for each input the affine index expressions of its accesses. That is
enough to tile any contraction (matmul, batch matmul, convolution) and to estimate
tile footprints and bytes moved before anything is built.
"""

from __future__ import annotations

import math
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

    @property
    def axes(self) -> frozenset[str]:
        """The loop axes this access is indexed by, in any of its dimensions."""
        return frozenset(name for terms in self.dims for name, _ in terms)

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

    @property
    def einsum(self) -> bool:
        """Whether every input is read at plain axes (``B[k, j]``: no sums of axes, strides
        or windows) straight from a parameter: what TVM's ``pad_einsum`` can pad."""
        return not self.produced and all(
            ext == 1 and len(terms) <= 1 and all(c == 1 for _, c in terms)
            for acc in self.inputs
            for terms, ext in zip(acc.dims, acc.extents)
        )


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
    try:
        nest = analyze_prim_func(workload.prim_func())
    except ScheduleError:
        return "rowwise"
    # An axis of extent 1 (a reduction's kept dimension, keepdims) reuses nothing.
    spatial = {a.name for a in nest.spatial if a.extent > 1}
    for acc in nest.inputs:
        if spatial - acc.axes:
            return "contraction"
    return "rowwise"


def analyze(workload: Workload) -> LoopNest:
    """The loop nest of ``workload``'s main stage (cached per workload key)."""
    return _analyze_cached(workload.key, workload)


@lru_cache(maxsize=256)
def _analyze_cached(key: str, workload: Workload) -> LoopNest:
    nest = analyze_prim_func(workload.prim_func())
    main = workload.main_stage()
    if main is not None and nest.main != main:
        raise ScheduleError(f"{workload}: expected main stage {main}, found {nest.main}")
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


# -- row-wise nests ----------------------------------------------------------------------


@dataclass(frozen=True)
class RowBlock:
    """One stage of a row-wise nest.

    ``kind`` is ``"reduce"`` (a reduction over the columns: one value per row) or
    ``"map"`` (one value per row and column). ``reads`` names the buffers it reads,
    inputs and earlier stages alike, in the order TVM lists them.
    """

    name: str
    kind: str
    reads: tuple[str, ...]
    output: bool
    # A reduction that keeps its reduced dimension (keepdim: a loop of extent 1 between
    # the rows and the columns, its result [*rows, 1]); the schedule fuses it into the rows.
    kept: bool = False


@dataclass(frozen=True)
class RowNest:
    """Stages that stream over the rows of a ``[rows, cols]`` matrix, in compute order.

    Every stage is indexed by the same row axis and either maps over or reduces the
    same column axis; every access is ``[row, col]``, ``[row]`` or ``[col]``, so rows
    are independent and a row's stages can share one kernel.
    """

    rows: int
    cols: int
    blocks: tuple[RowBlock, ...]
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # (name, shape) of each parameter read
    row_axes: int = 1  # leading spatial axes the rows span (fused into one by the schedule)
    # Maps over a unit column (one value per row, e.g. a mask cast to bool and negated):
    # every schedule inlines them first, in this order, into the blocks that read them.
    row_maps: tuple[str, ...] = ()
    # The parameters those maps read: a block that reads one reads a row map.
    row_map_inputs: tuple[str, ...] = ()

    @property
    def spatial(self) -> tuple[Axis, ...]:
        if self.reductions:
            return (Axis("rows", self.rows, "S"),)
        return (Axis("rows", self.rows, "S"), Axis("cols", self.cols, "S"))

    @property
    def reduction(self) -> tuple[Axis, ...]:
        return (Axis("cols", self.cols, "R"),) if self.reductions else ()

    @property
    def reductions(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.blocks if b.kind == "reduce")

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.blocks if b.output)

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages that are not outputs: the ones a schedule may fuse or not."""
        return tuple(b.name for b in self.blocks if not b.output)

    def block(self, name: str) -> RowBlock:
        return next(b for b in self.blocks if b.name == name)

    def readers(self, name: str) -> tuple[str, ...]:
        return tuple(b.name for b in self.blocks if name in b.reads)


def analyze_rows(workload: Workload) -> RowNest:
    """The row-wise nest of ``workload`` (cached per workload key)."""
    return _analyze_rows_cached(workload.key, workload)


@lru_cache(maxsize=256)
def _analyze_rows_cached(key: str, workload: Workload) -> RowNest:
    return analyze_row_prim_func(workload.prim_func())


def analyze_row_prim_func(func) -> RowNest:
    """The row-wise nest of a PrimFunc whose blocks all stream over one ``[rows, cols]``.

    The rows may be several leading axes (a softmax over the last axis of a 4-D tensor):
    every block then has the same leading spatial axes, which the schedule fuses into one
    row loop, and accesses index them all, in order.

    A reduction may keep its reduced dimension (``mean(-1, keepdim=True)``, as a group norm
    over a reshape takes it): a loop of extent 1 between its rows and its columns, which
    the schedule fuses into the rows (:attr:`RowBlock.kept`).

    A map over the rows and a unit column (extents ``[*rows, 1]``: a per-row mask cast
    and negated, as ``torch.where`` over an attention mask exports) is not a stage: it
    is inlined into its readers (:attr:`RowNest.row_maps`), which then read its inputs,
    and an access ``[*rows, 0]`` of a buffer whose last extent is 1 is a ``[row]``
    access. A ViT's masked softmax fell to the default schedule for want of this and
    took 22 % of the model's time.

    Raises:
        ScheduleError: a block is not a per-row reduction over the columns nor a map
            over rows and columns, the blocks disagree on the extents, or an access is
            not ``[row, col]``, ``[row]`` or ``[col]``.
    """
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    root = sch.get_sblock("root")
    blocks = [sch.get(b) for b in sch.get_child_blocks(root)]
    allocated = {buf.name for buf in sch.get(root).alloc_buffers}  # everything else is a parameter
    writer = {b.writes[0].source.name: b.name_hint for b in blocks if len(b.writes) == 1}
    extents: set[tuple[int, ...]] = set()
    out = []
    row_maps = _row_maps(blocks, allocated, writer)
    for block in blocks:
        if block.name_hint in row_maps:
            continue
        kinds = "".join({0: "S", 2: "R"}.get(int(iv.iter_type), "?") for iv in block.iter_vars)
        if (
            len(kinds) < 2
            or set(kinds[:-1]) != {"S"}
            or kinds[-1] not in "SR"
            or len(block.writes) != 1
        ):
            raise ScheduleError(
                f"block {block.name_hint} is not a map over rows and columns nor a per-row "
                f"reduction (axes {kinds})"
            )
        wrote = block.writes[0].source
        iter_vars = list(block.iter_vars)
        kept = _keeps_dimension(block)
        if kept:  # [*rows, 1]: the reduced dimension kept, one value per row
            del iter_vars[-2]
        extents.add(tuple(int(iv.dom.extent) for iv in iter_vars))
        *rows, col = (iv.var for iv in iter_vars)
        want = len(rows) + (kinds[-1] == "S" or kept)
        if len(wrote.shape) != want:
            raise ScheduleError(
                f"block {block.name_hint} writes {wrote.name} of rank {len(wrote.shape)}"
            )
        reads = []
        for region in block.reads:
            buf = region.source
            if buf.name == wrote.name:  # a reduction's accumulator
                continue
            index = [rng.min for rng in region.region]
            forms = [[*rows, col], rows, [col]]
            point = all(int(rng.extent) == 1 for rng in region.region)
            if point and _unit_column(index, buf.shape):
                index = index[:-1]  # [*rows, 0] of [*rows, 1]: one value per row
            if not point or not any(_indexes(index, f) for f in forms):
                raise ScheduleError(
                    f"block {block.name_hint} reads {buf.name}{list(index)}: only "
                    "[row, col], [row] and [col] are row-wise accesses"
                )
            source = writer.get(buf.name, buf.name)
            reads.extend(row_maps.get(source, (source,)))
        out.append(
            RowBlock(
                name=block.name_hint,
                kind="reduce" if kinds[-1] == "R" else "map",
                reads=tuple(reads),
                output=wrote.name not in allocated,
                kept=kept,
            )
        )
    if len(extents) != 1:
        raise ScheduleError(f"the blocks disagree on rows and columns: {sorted(extents)}")
    ((*row_extents, cols),) = extents
    inputs: dict[str, tuple[int, ...]] = {}
    for block in blocks:
        for region in block.reads:
            buf = region.source
            if buf.name not in writer and buf.name not in allocated:
                inputs.setdefault(buf.name, tuple(int(d) for d in buf.shape))
    return RowNest(
        rows=math.prod(row_extents),
        cols=cols,
        blocks=tuple(out),
        inputs=tuple(inputs.items()),
        row_axes=len(row_extents),
        row_maps=tuple(row_maps),
        row_map_inputs=tuple(
            dict.fromkeys(n for srcs in row_maps.values() for n in srcs if n not in writer.values())
        ),
    )


def _keeps_dimension(block) -> bool:
    """Whether ``block`` reduces its last axis and keeps it (``keepdim``): a loop of extent
    1 between its rows and the reduced axis, its result ``[*rows, 1]``."""
    ivs = block.iter_vars
    if len(ivs) <= 2 or len(block.writes) != 1:
        return False
    shape = block.writes[0].source.shape
    return (
        int(ivs[-1].iter_type) == 2
        and all(int(iv.iter_type) == 0 for iv in ivs[:-1])
        and int(ivs[-2].dom.extent) == 1
        and len(shape) == len(ivs) - 1
        and int(shape[-1]) == 1
    )


def _row_maps(blocks, allocated: set[str], writer: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """The maps over the rows and a unit column whose results stay in the function,
    each with what it reads (through the others), in compute order: parameters, and
    stages with one value per row (a reduction that kept its dimension: a group norm's
    variance, then its ``rsqrt``); ``writer``: the block that writes each buffer."""
    out: dict[str, tuple[str, ...]] = {}
    per_row = {b.name_hint for b in blocks if _keeps_dimension(b)}  # one value per row
    for block in blocks:
        extents = [int(iv.dom.extent) for iv in block.iter_vars]
        wrote = block.writes[0].source if len(block.writes) == 1 else None
        if (
            wrote is None
            or wrote.name not in allocated
            or len(extents) < 2
            or extents[-1] != 1
            or any(int(iv.iter_type) != 0 for iv in block.iter_vars)
            or len(wrote.shape) != len(extents)
        ):
            continue
        sources: list[str] = []
        for region in block.reads:
            name = writer.get(region.source.name)
            if name is None:  # a parameter
                sources.append(region.source.name)
            elif name in out:
                sources.extend(out[name])
            elif name in per_row:  # a variance's sum of squares, before its rsqrt
                sources.append(name)
            else:
                break  # reads a stage row by column: not a map of per-row values
        else:
            out[block.name_hint] = tuple(dict.fromkeys(sources))
    return out


def _unit_column(index, shape) -> bool:
    """Whether ``index`` reads column 0 of a buffer whose last extent is 1."""
    return (
        len(index) >= 2
        and int(shape[-1]) == 1
        and hasattr(index[-1], "value")
        and int(index[-1].value) == 0
    )


def _indexes(index, variables) -> bool:
    """Whether ``index`` is exactly ``variables``, one per dimension."""
    return len(index) == len(variables) and all(e.same_as(v) for e, v in zip(index, variables))
