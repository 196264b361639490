"""The contraction spaces' knobs and their choices (see :mod:`autosched.space.contraction`
for what each knob means): OpenCL's work-groups, work-items and local memory, llvm's
parallel blocks, register tiles and packing, from the loop nest and the device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autosched.space.space import (
    UNROLLS,
    VECTOR_WIDTHS,
    Knob,
    fits,
    tile_sizes,
    widened_vector_widths,
)

if TYPE_CHECKING:
    from autosched.space.config import Config
    from autosched.space.contraction import ContractionSpace
    from autosched.space.loopnest import LoopNest

MAX_REG_PER_AXIS = 64
MAX_THREADS_PER_AXIS = 256
MAX_CHUNK = 64
MAX_CHUNK_CPU = 1024  # a CPU cache block of the reduction may be long
STAGES_CPU = ("global", "pack")
REDUCE_AT = ("tile", "block")


def make_knobs(space: ContractionSpace) -> list[Knob]:
    if space.target == "llvm":
        return _cpu_knobs(space)
    knobs = []
    for ax in space.nest.spatial:
        pairs = [
            (t, r)
            for t in tile_sizes(ax.extent, MAX_THREADS_PER_AXIS)
            for r in tile_sizes(ax.extent, MAX_REG_PER_AXIS)
            if fits(ax.extent, t * r)
        ]
        knobs.append(Knob(f"tile.{ax.name}", tuple(pairs)))
    knobs += _reduction_and_vec_knobs(space, MAX_CHUNK)
    for acc in space.nest.inputs:
        pack = ("pack",) if panel_input(space, acc) else ()
        knobs.append(Knob(f"stage.{acc.buffer}", ("global", "local", *pack)))
    return knobs + _fusion_knobs(space)


def panel_input(space: ContractionSpace, acc) -> bool:
    """OpenCL on a CPU driver: whether ``acc`` may be packed into panels (``stage=pack``).

    An input read along the reduction with a dimension that is the innermost output axis
    (a matmul's B, a dense layer's weights, an NHWC conv's, the im2col matrix of an NCHW
    conv's rows, whose producer then writes the panels). On a GPU the panels would cost
    the work-items of a warp their coalesced reads, so it is not offered there.
    """
    inner = space.nest.spatial[-1].name
    reduction = {a.name for a in space.nest.reduction}
    return space.limits.is_cpu and ((inner, 1),) in acc.dims and bool(acc.axes & reduction)


def _reduction_and_vec_knobs(space: ContractionSpace, max_chunk: int) -> list[Knob]:
    knobs = []
    for ax in space.nest.reduction:
        pairs = [(c, u) for c in tile_sizes(ax.extent, max_chunk) for u in UNROLLS if c % u == 0]
        knobs.append(Knob(f"tile.{ax.name}", tuple(pairs)))
    widths = set(space._inner_vecs)
    axes = space.vector_axes()
    for a in space.nest.spatial[:-1]:  # the widths of every axis that may carry the lanes
        if a.name in axes:
            widths.update(v for v in VECTOR_WIDTHS if a.extent % v == 0)
    knobs.append(Knob("vec", tuple(sorted(widths))))
    if len(axes) > 1:
        knobs.append(Knob("vec_axis", axes, optional=True))
    return knobs


def inner_widths(space: ContractionSpace) -> list[int]:
    """Vector widths of the innermost spatial axis."""
    inner = space.nest.spatial[-1].extent
    # A vector tail is padded (see the module docstring), an im2col matrix's too.
    tail = space.nest.einsum or space.rows is not None
    vecs = [v for v in VECTOR_WIDTHS if inner % v == 0 or (tail and fits(inner, v))]
    if space.target == "llvm":
        vecs += widened_vector_widths(inner)
    return sorted(vecs)


def mid_order(nest: LoopNest, config: Config) -> list[str]:
    """llvm: the spatial axes in the order of their tile loops inside a task, outermost
    first: ``tile_inner``'s last (the register tiles it walks share the other operands'
    panels, which stay in L1 while its own operand streams), the rest in nest order.
    The lowering builds its loops in this order and the features read it from here."""
    last = config["tile_inner"]
    return [a.name for a in nest.spatial if a.name != last] + [last]


def _fusion_knobs(space: ContractionSpace) -> list[Knob]:
    knobs = [Knob("fuse", (True, False))] if space.nest.epilogue else []
    return knobs + [Knob(f"fuse.{name}", (True, False)) for name in space.nest.produced]


def whole_tiles(space: ContractionSpace, extent: int, reg: int) -> bool:
    """llvm: whether an axis of ``extent`` is walked in whole register tiles of ``reg``,
    so that a block of tiles that does not divide it is cut short by a guard on whole
    tiles: where ``reg`` divides the axis, or where the nest is padded to whole tiles
    (TVM's ``pad_einsum``, see :func:`autosched.space.contraction_schedule._pad_blocks`).
    """
    return space.target == "llvm" and (space.nest.einsum or extent % reg == 0)


def _cpu_knobs(space: ContractionSpace) -> list[Knob]:
    knobs = []
    for ax in space.nest.spatial:
        pairs = set()
        for r in tile_sizes(ax.extent, MAX_REG_PER_AXIS):
            pairs.update((m, r) for m in tile_sizes(ax.extent, ax.extent) if fits(ax.extent, m * r))
            if whole_tiles(space, ax.extent, r):  # blocks of any tile size of the tiles
                tiles = -(-ax.extent // r)
                pairs.update((m, r) for m in tile_sizes(tiles, tiles))
        knobs.append(Knob(f"tile.{ax.name}", tuple(sorted(pairs))))
    knobs += _reduction_and_vec_knobs(space, MAX_CHUNK_CPU)
    if space.nest.reduction:
        knobs.append(Knob("reduce_at", REDUCE_AT))
    knobs.append(Knob("tile_inner", tuple(a.name for a in space.nest.spatial)))
    if space.nest.reduction:
        for acc in space.nest.inputs:
            knobs.append(Knob(f"stage.{acc.buffer}", STAGES_CPU))
    return knobs + _fusion_knobs(space)
