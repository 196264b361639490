"""Rows read through a window, fused into one axis: a convolution as a matrix product.

An NCHW convolution whose output rows take vectors of at most a quarter of the device's
(ResNet's last stage: rows of 7 on a 16-lane CPU) leaves most lanes idle on any schedule
of its own nest: TVM pads no vector tail on a windowed read, so 7 takes 1 lane, 28 four.
The rewrite here is im2col, done with schedule primitives so that the workload, its
records and its arguments stay what they are:

1. the main block's two innermost spatial axes (the output rows and columns) become
   one axis (``transform_block_layout``), named by joining theirs (``pq``);
2. each input read through a window over them (the image) is copied into a buffer
   indexed by the block's own axes (``reindex``: the im2col matrix), laid out with the
   fused axis innermost, so a vector along it is a contiguous load;
3. the output is written through a buffer indexed by the fused axis too, and a block of
   its own copies it into the real output (the epilogue).

The main block is then an einsum over plain axes (``c, r, s`` reduced), which the
contraction family tiles like a matmul, vector tails included: 49 outputs take vectors
of 8, padded to 56. The im2col matrix is a produced input (its producer reads the zero padding),
with the ``fuse.<buffer>`` and ``stage.<buffer>`` knobs any produced input has.

Measured on PoCL (Zen 5, 16 lanes) before it was built: a 512x49x4608 matmul, which is
the same product, tuned 48 trials to 177 GFLOP/s where the best schedule of the conv's
own nest reached 45; the conv through this rewrite reached 172-181 (numpy 171-183).
Which rows qualify: :func:`window_rows`.
The rule reads only the device's lanes, so it never applies on a GPU whose driver
reports scalar work-items, and OpenCL records of such a conv from before it (``tile.p``,
``tile.q``) no longer fit its space: the compile lookup passes them over.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

from autosched.ops.base import Workload
from autosched.space.config import Config
from autosched.space.loopnest import Access, Axis, LoopNest, analyze_prim_func
from autosched.space.space import VECTOR_WIDTHS

if TYPE_CHECKING:
    from autosched.space.contraction import ContractionSpace


def window_rows(nest: LoopNest, lanes: int) -> tuple[str, str] | None:
    """The two innermost spatial axes, where fusing them is worth it: the widest vector
    that divides the innermost fills at most a quarter of a native vector of ``lanes``,
    and every input that reads either axis reads both through a window (an axis plus a
    reduction axis, as a convolution's image: never a matmul's operand, which reads one).

    Where the line lies was measured on PoCL (Zen 5, 16 lanes; 48-trial tunes of 3x3
    convs against their own nests, one run each): rows of 7 (1 lane of 16) 45 -> 180
    GFLOP/s, rows of 14 (2 lanes) 49 -> 295, rows of 28 (4 lanes) 136 -> 212, but rows
    of 56 (8 lanes) 244 -> 147: there the image's im2col copy (9x the image, 7 MB at 64
    channels) and the lost reuse across the window cost more than the idle lanes."""
    spatial = nest.spatial
    if len(spatial) < 2:
        return None
    widest = max(v for v in VECTOR_WIDTHS if spatial[-1].extent % v == 0)
    if 4 * widest > lanes:
        return None
    rows = (spatial[-2].name, spatial[-1].name)
    reduced = {a.name for a in nest.reduction}
    windowed = False
    for acc in nest.inputs:
        reads = [terms for terms in acc.dims if {a for a, _ in terms} & set(rows)]
        if not reads:
            continue
        names = [{a for a, _ in terms} for terms in reads]
        if len(reads) != 2 or not all(len(n & set(rows)) == 1 and n & reduced for n in names):
            return None
        windowed = True
    return rows if windowed else None


def rewrite(sch, nest: LoopNest, rows: tuple[str, str]) -> None:
    """Apply the im2col rewrite (see the module docstring) to ``sch``, whose function
    has ``nest``'s blocks."""
    from tvm.tirx import IndexMap, Var

    block = sch.get_sblock(nest.main)
    names = [a.name for a in nest.axes]
    outer, inner = (names.index(r) for r in rows)
    width = nest.axes[inner].extent
    old = [Var(n, "int32") for n in names]
    new = [v for i, v in enumerate(old) if i != inner]
    new[outer] = old[outer] * width + old[inner]
    sch.transform_block_layout(block, IndexMap(old, new, None))
    for acc in nest.inputs:
        if not any({a for a, _ in terms} & set(rows) for terms in acc.dims):
            continue
        index = [r.source.name for r in sch.get(block).reads].index(acc.buffer)
        copy = sch.reindex(block, ("read", index))
        _fused_innermost(sch, block, copy, outer)
    sch.reindex(block, ("write", 0))


def _fused_innermost(sch, block, copy, fused: int) -> None:
    """Lay the buffer ``copy`` writes out with the fused axis (``block``'s axis number
    ``fused``) last."""
    stmt = sch.get(block)
    axis = stmt.iter_vars[fused].var
    buffer = sch.get(copy).writes[0].source.name
    (read,) = [r for r in stmt.reads if r.source.name == buffer]
    (dim,) = [i for i, rng in enumerate(read.region) if rng.min.same_as(axis)]
    ndim = len(read.region)
    order = [*(d for d in range(ndim) if d != dim), dim]
    sch.transform_layout(copy, ("write", 0), lambda *idx: [idx[d] for d in order])


def rewritten_nest(workload: Workload, nest: LoopNest, rows: tuple[str, str]) -> LoopNest:
    """The loop nest of ``workload``'s function after :func:`rewrite`, its axes named
    as before (the fused one by joining the two names)."""
    return _rewritten(workload.key, workload, nest, rows)


@lru_cache(maxsize=64)
def _rewritten(key: str, workload: Workload, nest: LoopNest, rows: tuple[str, str]) -> LoopNest:
    from tvm.s_tir import Schedule

    sch = Schedule(workload.prim_func())
    rewrite(sch, nest, rows)
    out = analyze_prim_func(sch.mod["main"])
    names = [a.name for a in nest.axes if a.name != rows[1]]
    names[names.index(rows[0])] = "".join(rows)
    rename = dict(zip((a.name for a in out.axes), names))
    return replace(
        out,
        axes=tuple(Axis(rename[a.name], a.extent, a.kind) for a in out.axes),
        inputs=tuple(
            Access(
                acc.buffer,
                tuple(tuple((rename[a], c) for a, c in terms) for terms in acc.dims),
                acc.extents,
            )
            for acc in out.inputs
        ),
    )


def tail_placement(space: ContractionSpace, config: Config) -> str | None:
    """Why ``config`` repeats another config of the rewritten space, or None.

    Past a vector tail the im2col matrix is built by its zero-padded copy, which is
    staged in local memory (``stage=local``) or is a kernel of its own (``global``), so
    its ``fuse`` knob has one meaning per placement: fused when staged."""
    if not space.vector_tail(config):
        return None
    inner, vec = space.nest.spatial[-1].extent, config["vec"]
    for name in space.nest.produced:
        staged = config[f"stage.{name}"] == "local"
        if config[f"fuse.{name}"] != staged:
            return (
                f"fuse.{name}={config[f'fuse.{name}']} with stage.{name}="
                f"{config[f'stage.{name}']!r} past a vector tail ({inner} % vec={vec}) is "
                f"fuse.{name}={staged}: the padded im2col copy is staged or its own kernel"
            )
    return None
