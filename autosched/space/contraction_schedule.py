"""The contraction family's schedules: knob values -> ``tvm.s_tir.Schedule`` primitives.

One function per target: :func:`_apply` builds the OpenCL kernel structure (work-groups,
work-items, register tiles), :func:`_apply_cpu` the LLVM one (a parallel loop over
blocks, register tiles walked inside each block, vector instructions, packing).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from autosched.space.config import Config
from autosched.space.contraction_knobs import mid_order
from autosched.space.im2col import rewrite
from autosched.space.loopnest import analyze
from autosched.space.opencl_copies import pack_panels, schedule_elementwise
from autosched.space.space import row_width

if TYPE_CHECKING:
    from autosched.space.contraction import ContractionSpace as Space


def apply_contraction(sch, space: Space, config: Config) -> None:
    if space.rows is not None:
        rewrite(sch, analyze(space.workload), space.rows)  # the nest the space rewrote
    if space.target == "llvm":
        _apply_cpu(sch, space, config)
    else:
        _apply(sch, space, config)


def _producer_blocks(sch, nest) -> dict[str, object]:
    """The producer block of each input of the main block that one computes.

    Other producers (ones that feed a producer) are inlined here: no knob places them.
    """
    out = {}
    for name in nest.producers:
        block = sch.get_sblock(name)
        written = sch.get(block).writes[0].source.name
        if written in nest.produced:
            out[written] = block
        else:
            sch.compute_inline(block)
    return out


def _place_producers(
    sch, produced: dict[str, object], space: Space, config: Config
) -> tuple[dict[str, object], list]:
    """Place each produced input's producer per its ``fuse.<input>`` knob.

    Returns (the producers fused into staging, input buffer -> block: the caller
    computes them at the staging point, a packed buffer on llvm or local memory on
    OpenCL; the unfused ones: kernels or loops of their own, whose output is a scratch
    argument). The space's ``inlined_producers`` are inlined into the main block's reads.
    """
    unfused = set(space.unfused_producers(config))
    inlined = set(space.inlined_producers(config))
    into_staging, separate = {}, []
    for buffer, block in produced.items():
        if buffer in unfused:
            separate.append(block)
        elif buffer in inlined:
            sch.compute_inline(block)
        else:
            into_staging[buffer] = block
    return into_staging, separate


def _separate_blocks(sch, nest, config: Config, producers: list) -> list:
    """Blocks that ``config`` runs as kernels (llvm: parallel loops) of their own: unfused
    producers and an unfused epilogue."""
    if nest.epilogue and not config.get("fuse", True):
        return producers + [sch.get_sblock(name) for name in nest.epilogue]
    return producers


def _finish_main(sch, block, nest, vec: int, vec_loop, red_outer, red_inner, regs) -> None:
    """Vectorize and unroll the main block's loops, then split off its initialisation
    (TVM wants ``vectorize``/``parallel`` before ``decompose_reduction``)."""
    if vec > 1:
        sch.vectorize(vec_loop)
    for lp in (*red_inner, *regs):
        sch.unroll(lp)
    if nest.reduction:
        sch.decompose_reduction(block, red_outer[0])


def _apply(sch, space: Space, config: Config) -> None:
    nest = space.nest
    produced = _producer_blocks(sch, nest)
    block = sch.get_sblock(nest.main)
    pads, unpad = _pad_vector_tail(sch, space, config, block)
    if pads:  # an im2col matrix (the one padded nest with a producer): its copy computes it
        for producer in produced.values():
            sch.compute_inline(producer)
        produced = {}
    into_staging, unfused = _place_producers(sch, produced, space, config)
    panels = {}  # input -> the block that writes its panels
    for buffer, producer in produced.items():
        if config[f"stage.{buffer}"] == "pack":  # unfused (the space's check)
            unfused.remove(producer)
            panels[buffer] = producer
    separate = _separate_blocks(sch, nest, config, unfused)
    for buffer, pad in pads.items():
        if config[f"stage.{buffer}"] == "local":
            into_staging[buffer] = pad
        elif config[f"stage.{buffer}"] == "pack":  # the padded copy is the packed one
            panels[buffer] = pad
        else:  # a padded copy in global memory (a scratch argument), its own kernel
            separate.insert(0, pad)
    for acc in nest.inputs:  # before the main block's loops change under cache_read
        if config[f"stage.{acc.buffer}"] == "pack" and acc.buffer not in panels:
            read_index = [r.source.name for r in sch.get(block).reads].index(acc.buffer)
            panels[acc.buffer] = sch.cache_read(block, read_index, "global")
    loops = sch.get_loops(block)
    by_axis = dict(zip((a.name for a in nest.axes), loops))

    groups, threads, regs = [], [], []
    vec_loop = None
    inner = nest.spatial[-1].name
    vec = int(config["vec"])
    for ax in nest.spatial:
        t, r = config[f"tile.{ax.name}"]
        if ax.name == inner:
            g, th, ro, rv = _split_inner(sch, by_axis[ax.name], [t, r // vec], vec)
            regs.append(ro)
            vec_loop = rv
        else:
            g, th, ro = sch.split(by_axis[ax.name], [None, t, r])
            regs.append(ro)
        groups.append(g)
        threads.append(th)
    red_outer, red_mid, red_inner = _split_reductions(sch, nest, config, by_axis)
    sch.reorder(*groups, *threads, *red_outer, *red_mid, *red_inner, *regs, vec_loop)
    bx = sch.fuse(*groups)
    tx = sch.fuse(*threads)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    n_threads = space.threads(config)

    # Stage inputs per reduction chunk, fetched cooperatively by the work-group.
    if nest.reduction:
        for acc in nest.inputs:
            if config[f"stage.{acc.buffer}"] != "local":
                continue
            if acc.buffer in into_staging:  # the producer computes the staged tile itself
                cache = into_staging[acc.buffer]
                sch.set_scope(cache, 0, "shared")
            else:
                read_index = [r.source.name for r in sch.get(block).reads].index(acc.buffer)
                cache = sch.cache_read(block, read_index, "shared")
            sch.compute_at(cache, red_outer[-1])
            # Loops above the copy: group, thread, then each reduction's outer loop.
            copy_loops = sch.get_loops(cache)[2 + len(red_outer) :]
            if not copy_loops:  # a single element per chunk: every work-item loads it
                continue
            fused = sch.fuse(*copy_loops)
            _, ct = sch.split(fused, [None, n_threads])
            sch.bind(ct, "threadIdx.x")

    # Register accumulators, written back (with the epilogue when fused) per work-item.
    # Past a vector tail, each vector of them is stored into a private vector and the
    # real outputs written from it, in the widest vectors that divide a row
    # (:func:`_write_real_outputs`).
    acc_block = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc_block, tx)
    if nest.epilogue and config.get("fuse", True):
        for name in nest.epilogue:
            sch.reverse_compute_inline(sch.get_sblock(name))
    # TVM drops unit loops, so the write-back nest may have fewer loops than axes; with
    # vec > 1 the innermost axis has a tile of at least vec and is the last loop.
    wb_loops = _unrolled_vectors(sch, sch.get_loops(acc_block)[2:], vec)
    tail = row_width(space.nest.spatial[-1].extent, vec)  # the real row's vectors
    if unpad is not None:
        _write_real_outputs(sch, acc_block, unpad, wb_loops[-1], vec, tail)

    for own in separate:
        schedule_elementwise(sch, own, vec)
    for buffer, copy in panels.items():
        (acc,) = (a for a in nest.inputs if a.buffer == buffer)
        dim = acc.dims.index(((inner, 1),))
        pack_panels(sch, copy, dim, config[f"tile.{inner}"][1], tail)

    _finish_main(sch, block, nest, vec, vec_loop, red_outer, red_inner, regs)


def _write_real_outputs(sch, acc_block, unpad, vector_loop, vec: int, width: int) -> None:
    """Where the output is padded: the main kernel (llvm: each task, in tile order) writes
    the real outputs itself, from its register tile.

    The padded output becomes private to the work-item or task, one vector of it at a
    time: the write-back stores each vector of accumulators into it whole, and
    ``unpad`` writes the real outputs out of it in the widest vectors that divide a row
    (:func:`~autosched.space.space.row_width`), a guard per vector (per output
    where the row is odd). The accumulators are only ever read whole, so the compiler
    keeps them in vector registers; read in narrower vectors or per lane, PoCL kept them
    in memory (4.5-5x slower). For the same reason the private vector gets a row stride
    that is no multiple of ``vec``: of the accumulators' size (a tile of one vector),
    TVM's storage rewrite would merge the two. Before 2026-12-04 the padded output was
    written whole and a kernel (llvm: a parallel loop) of its own copied the real
    outputs out. On a Xeon's PoCL, interleaved by profiling events, the 127x1000x333
    matmul's best config ran 380-411 us this way against 436-466 us, the 251x509x127
    one's 129 us against 164-172; on llvm, interleaved, the awkward benchmark's best
    configs of 127x1000x333, 251x509x127 and 257x512x129 ran 339-346 / 315 / 325
    GFLOP/s against 327-328 / 305 / 305.
    """
    sch.set_scope(acc_block, 0, "local")
    ndim = len(sch.get(acc_block).writes[0].region)
    if ndim > 1:
        sch.storage_align(acc_block, 0, ndim - 2, vec, width)
    above = [sch.get(lp) for lp in sch.get_loops(acc_block)]
    depth = 1 + next(i for i, lp in enumerate(above) if lp.same_as(sch.get(vector_loop)))
    sch.reverse_compute_at(unpad, vector_loop)
    _unrolled_vectors(sch, sch.get_loops(unpad)[depth:], width)


def _unrolled_vectors(sch, loops, width: int) -> list:
    """Split the last of ``loops`` into vectors of ``width`` (where above 1) and unroll
    the rest; returns the unrolled loops, the vectors' own loop last."""
    loops = list(loops)
    if width > 1:
        outer, lanes = sch.split(loops.pop(), [None, width])
        sch.vectorize(lanes)
        loops.append(outer)
    for lp in loops:
        sch.unroll(lp)
    return loops


def _pad_vector_tail(sch, space: Space, config: Config, block) -> tuple[dict[str, object], object]:
    """Pad the innermost axis to whole vectors where ``vec`` does not divide it. See
    :func:`_pad`. On OpenCL the other axes keep their guarded tails: padded to whole
    work-groups, PoCL (Zen 3) ran the best configs of the 127x1000x333 and 251x509x127
    matmuls 4-7 % slower (the copies, for no gain in the kernel)."""
    if not space.vector_tail(config):
        return {}, None
    inner = space.nest.spatial[-1].name
    return _pad(sch, space, block, {inner: int(config["vec"])})


def _pad_blocks(sch, space: Space, config: Config, block) -> tuple[dict[str, object], object]:
    """llvm: pad each spatial axis of an einsum nest to whole register tiles where they
    do not divide it (the innermost's are whole vectors); other nests as OpenCL.

    A guarded tail inside a register tile puts the guard inside its reduction loop, where
    it kept LLVM from holding the accumulators in registers: on an AVX2 Zen 3, a 4x16
    tile with B packed ran the 257x512x129 matmul at 48 GFLOP/s guarded and 114 padded,
    the 251x509x127 one at 54 and 138 (256x512x129, nothing to pad: 188). A last block
    of fewer register tiles is guarded, on whole tiles (:func:`_split_tiles`): padded to
    whole blocks instead, 257 rows in blocks of 256 would compute 512. Padding a
    reduction's chunks instead of guarding them gained nothing (127x1000x333, chunks of
    32 and 64), so those keep their guards.
    """
    if not space.nest.einsum:
        return _pad_vector_tail(sch, space, config, block)
    factors = {}
    for ax in space.nest.spatial:
        r = config[f"tile.{ax.name}"][1]  # a multiple of vec on the lanes' axis
        factors[ax.name] = r if ax.extent % r else 1
    return _pad(sch, space, block, factors)


def _pad(sch, space: Space, block, factors: dict[str, int]) -> tuple[dict[str, object], object]:
    """Pad the main block's axes to multiples of ``factors`` (axis name -> factor).

    TVM's ``pad_einsum`` pads the block's iteration domain: each input a padded axis
    indexes gets a producer of a zero-padded copy, the block writes a padded output,
    and a consumer copies the real outputs out of it. Returns (input buffer -> its
    padding producer, the consumer), or ({}, None) where nothing is padded.
    """
    if all(f == 1 for f in factors.values()):
        return {}, None
    # The block's axes are the nest's, in its order (spatial first).
    sch.pad_einsum(block, [factors.get(a.name, 1) for a in space.nest.axes])
    pads = {sch.get(p).reads[0].source.name: p for p in sch.get_producers(block)}
    (unpad,) = sch.get_consumers(block)
    return pads, unpad


def _accumulators(sch, block, unpad, scope: str):
    """The block that writes the accumulators of ``block`` back (in ``scope``).

    Unpadded: a ``cache_write``. Padded: the padded output itself holds the
    accumulators, and the consumer that copies the real outputs out is the write-back.
    """
    if unpad is None:
        return sch.cache_write(block, 0, scope)
    sch.set_scope(block, 0, scope)
    return unpad


def _split_inner(sch, loop, factors: list[int], vec: int) -> list:
    """Split the innermost spatial axis into ``[outer, *factors, vec]``.

    The lanes come off first, so when the tiles do not divide the axis the guard TVM
    adds is on the whole vectors above the lanes: a condition the lanes share, which
    keeps them one vector instruction (a guard on the lanes themselves would make TVM
    scalarise the loop). ``vec`` divides the axis.
    """
    if vec == 1:
        return list(sch.split(loop, [None, *factors, 1]))
    vectors, lanes = sch.split(loop, [None, vec])
    return [*sch.split(vectors, [None, *factors]), lanes]


def _apply_cpu(sch, space: Space, config: Config) -> None:
    nest = space.nest
    into_staging, unfused = _place_producers(sch, _producer_blocks(sch, nest), space, config)
    separate = _separate_blocks(sch, nest, config, unfused)
    block = sch.get_sblock(nest.main)
    inner = space.vec_axis(config)
    lanes_last = inner != nest.spatial[-1].name  # lanes off another axis: its data moved last
    pads, unpad = ({}, None) if lanes_last else _pad_blocks(sch, space, config, block)
    for buffer, pad in pads.items():
        if config[f"stage.{buffer}"] == "pack":
            into_staging[buffer] = pad
        else:  # a padded copy, made once by its own parallel loop
            separate.insert(0, pad)
    by_axis = dict(zip((a.name for a in nest.axes), sch.get_loops(block)))
    vec = int(config["vec"])

    outer, mids, regs = [], {}, []
    vec_loop = None
    for ax in nest.spatial:
        m, r = config[f"tile.{ax.name}"]
        if ax.name == inner:  # the lanes first: a guard is on whole vectors (_split_inner)
            vectors, vec_loop = sch.split(by_axis[ax.name], [None, vec])
            o, mid, ro = _split_tiles(sch, vectors, m, r // vec)
        else:
            o, mid, ro = _split_tiles(sch, by_axis[ax.name], m, r)
        outer.append(o)
        mids[ax.name] = mid
        regs.append(ro)
    # The chosen axis' mid loop goes innermost (see mid_order).
    mid_loops = [mids[name] for name in mid_order(nest, config)]
    red_outer, red_mid, red_inner = _split_reductions(sch, nest, config, by_axis)
    block_order = bool(nest.reduction) and config["reduce_at"] == "block"
    if block_order:
        sch.reorder(*outer, *red_outer, *mid_loops, *red_mid, *red_inner, *regs, vec_loop)
    else:
        sch.reorder(*outer, *mid_loops, *red_outer, *red_mid, *red_inner, *regs, vec_loop)
    par = sch.fuse(*outer)

    # Packing: each task copies what it reads of an input (per reduction chunk in block
    # order) into a contiguous buffer right above the loops that read it.
    if nest.reduction:
        anchor = red_outer[-1] if block_order else par
        for acc in nest.inputs:
            if config[f"stage.{acc.buffer}"] != "pack":
                continue
            if acc.buffer in into_staging:  # the producer writes the packed buffer itself
                cache = into_staging[acc.buffer]
            else:
                read_index = [r.source.name for r in sch.get(block).reads].index(acc.buffer)
                cache = sch.cache_read(block, read_index, "global")
            sch.compute_at(cache, anchor)
            if ((inner, 1),) in acc.dims[:-1]:  # the lanes' axis innermost in the copy
                _move_last(sch, cache, acc.dims.index(((inner, 1),)), len(acc.dims))
            _vectorize_innermost(sch, cache, vec)

    # Accumulators: per register tile (in registers after LLVM's promotion) in tile
    # order; per block in block order, since a block's reduction spans the mid loops.
    if block_order:
        acc_block = _accumulators(sch, block, unpad, "global")
        sch.reverse_compute_at(acc_block, par)
    else:  # padded: the real outputs written out of each vector (_write_real_outputs)
        acc_block = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(acc_block, mid_loops[-1])
    if lanes_last:  # the lanes of each accumulator vector adjacent, as in registers
        _accumulators_lanes_last(sch, block, nest, inner)
    if nest.epilogue and config.get("fuse", True):
        for name in nest.epilogue:
            sch.reverse_compute_inline(sch.get_sblock(name))
    wb_loops = _vectorize_innermost(sch, acc_block, vec)
    if not block_order:  # a register tile's write-back is small: unroll it
        for lp in wb_loops:
            sch.unroll(lp)
        if unpad is not None:
            tail = row_width(nest.spatial[-1].extent, vec)
            _write_real_outputs(sch, acc_block, unpad, wb_loops[-1], vec, tail)

    for own in separate:
        _schedule_elementwise_cpu(sch, own, vec)

    sch.parallel(par)
    _finish_main(sch, block, nest, vec, vec_loop, red_outer, red_inner, regs)


def _split_tiles(sch, loop, mid: int, reg: int) -> tuple:
    """Split an llvm axis into ``(outer, mid, reg)`` loops, the register tile first.

    Where blocks of ``mid`` tiles do not divide the axis but ``reg`` does (after
    padding: :func:`_pad_blocks`), TVM's guard is then on whole register tiles: a
    condition on the block and mid loops alone, which its HoistIfThenElse lifts above
    the reduction, so the accumulators stay in registers. Split ``[outer, mid, reg]`` at
    once, the guard names the register tile's loop too; lowering simplifies it to the
    same condition, but it stays inside the reduction and the register tile's loops (TVM
    0.27's lowering, checked on a 260-row reduction; see :func:`_pad_blocks`).
    """
    tiles, inner = sch.split(loop, [None, reg])
    outer, mids = sch.split(tiles, [None, mid])
    return outer, mids, inner


def _move_last(sch, block, dim: int, ndim: int) -> None:
    """Lay out the buffer ``block`` writes with its dimension ``dim`` innermost."""
    from tvm.tirx import IndexMap

    order = [d for d in range(ndim) if d != dim] + [dim]
    index_map = IndexMap.from_func(lambda *idx: [idx[d] for d in order], ndim=ndim)
    sch.transform_layout(block, ("write", 0), index_map)


def _accumulators_lanes_last(sch, block, nest, axis: str) -> None:
    """Lay out the accumulators ``block`` writes with the dimension ``axis`` indexes
    innermost (the loop nest's axes are the block's iterators, in order)."""
    stmt = sch.get(block)
    var = stmt.iter_vars[[a.name for a in nest.axes].index(axis)].var
    region = stmt.writes[0].region
    dim = next(d for d, r in enumerate(region) if r.min.same_as(var))
    _move_last(sch, block, dim, len(region))


def _vectorize_innermost(sch, block, vec: int) -> list:
    """Vectorize the innermost loop of ``block``'s own nest by ``vec`` where it divides.

    Returns the block's other own loops (below its compute-at anchor). TVM drops unit
    loops, so a nest may have fewer loops than the block has axes.
    """
    anchor_depth = _anchor_depth(sch, block)
    own = list(sch.get_loops(block))[anchor_depth:]
    if not own:
        return []
    last = own.pop()
    extent = int(sch.get(last).extent)
    if vec > 1 and extent % vec == 0:
        lo, lv = sch.split(last, [None, vec])
        sch.vectorize(lv)
        own.append(lo)
    else:
        own.append(last)
    return own


def _anchor_depth(sch, block) -> int:
    """How many of ``block``'s loops enclose other blocks too (its compute-at anchor)."""
    depth = 0
    for lp in sch.get_loops(block):
        if len(sch.get_child_blocks(lp)) > 1:
            depth += 1
        else:
            break
    return depth


def _schedule_elementwise_cpu(sch, block, vec: int) -> None:
    """Its own parallel loop, ``vec`` consecutive outputs per vector instruction."""
    loops = sch.get_loops(block)
    total = math.prod(int(sch.get(lp).extent) for lp in loops)
    if total % vec and len(loops) > 1:  # rows in parallel, each copied by LLVM's loops
        sch.parallel(sch.fuse(*loops[:-1]))
        return
    fused = sch.fuse(*loops)
    v = vec if total % vec == 0 else 1
    outer, lanes = sch.split(fused, [None, v])
    sch.parallel(outer)
    if v > 1:
        sch.vectorize(lanes)


def _split_reductions(sch, nest, config: Config, by_axis: dict) -> tuple[list, list, list]:
    """Each reduction axis split by its ``(chunk, unroll)`` knob into outer, mid, inner."""
    outer, mid, inner = [], [], []
    for ax in nest.reduction:
        c, u = config[f"tile.{ax.name}"]
        o, m, i = sch.split(by_axis[ax.name], [None, c // u, u])
        outer.append(o)
        mid.append(m)
        inner.append(i)
    return outer, mid, inner
