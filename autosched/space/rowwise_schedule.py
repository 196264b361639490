"""The row-wise family's schedules: knob values -> ``tvm.s_tir.Schedule`` primitives.

The same steps serve both targets:

1. every fused map stage is inlined into its readers;
2. each reduction, just before it moves under its kernel's row loop, is split on its
   own loop nest (``rfactor`` must see the block alone under its outermost loop): into
   ``vec`` partial results for vector instructions, and in group mode first into one
   partial result per work-item; where ``vec`` leaves a vector tail, the last vector's
   lanes are guarded and computed one by one;
3. each kernel's root stage gets its row loop (work-groups and work-items on OpenCL, a
   parallel loop of tasks on llvm) and its column loop (vectors, unrolling, work-items
   in group mode); the fused reductions of the kernel, and the partial results of each
   reduction, are computed per row under that row loop in private memory, and so is a
   kept map's row (``keep.<stage>``; in group mode in the work-group's local memory),
   its column loop lowered as the root's.

In group mode the last step of each reduction has its loop over work-items bound to
``threadIdx.x``, which TVM lowers to a tree all-reduce through local memory.

Vectors pay only if the math in them stays vectorised: see
:mod:`autosched.space.vector_math`, which every family's schedules get. On OpenCL a
stage that reads a per-row flag (a mask) has its lanes unrolled instead (see
:func:`_vector_lanes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autosched.space.config import Config

if TYPE_CHECKING:
    from autosched.space.rowwise import RowSpace


@dataclass
class _Reduction:
    """A reduction block and the blocks of its partial results, innermost first."""

    block: object
    partials: list = field(default_factory=list)  # [lanes (vec), threads (group mode)]


def apply_rowwise(sch, space: RowSpace, config: Config) -> None:
    nest = space.nest
    kernels = space.kernels(config)
    for name in nest.row_maps:  # one value per row, read where it is needed
        sch.compute_inline(sch.get_sblock(name))
    for block in nest.blocks:
        if space.inlined(config, block.name):
            sch.compute_inline(sch.get_sblock(block.name))
    for block in nest.blocks:  # several leading axes are the rows: one row loop per block
        lead = nest.row_axes + block.kept  # a kept reduced dimension joins the rows
        if lead > 1 and not space.inlined(config, block.name):
            sch.fuse(*sch.get_loops(sch.get_sblock(block.name))[:lead])
    llvm = space.target == "llvm"
    mode = "item" if llvm or space.elementwise else config["reduce"]
    vec = int(config["vec"])
    unroll = int(config.get("unroll", 1))
    threads = 1 if llvm else int(config["threads"])
    # A kernel whose root is a reduction accumulates in private memory and writes each
    # row's result once: the write-back block becomes the kernel's root.
    roots = {}
    for kernel in kernels:
        block = sch.get_sblock(kernel.root)
        if nest.block(kernel.root).kind == "reduce":
            roots[kernel.root] = sch.cache_write(block, 0, "local")
        else:
            roots[kernel.root] = block
    for name, rv in roots.items():  # a reduction root's write-back block has every row axis
        block = nest.block(name)
        lead = nest.row_axes + block.kept
        if block.kind == "reduce" and lead > 1:
            sch.fuse(*sch.get_loops(rv)[:lead])
    # Columns past the row's last whole vector: a vector tail (item mode and llvm; the
    # space gives group mode widths that divide the columns).
    tail = 0 if mode == "group" else nest.cols % vec
    tails: list[_Tail] = []  # reductions' walks over a row's vectors that end in a tail
    for kernel in kernels:
        root = roots[kernel.root]
        if llvm:
            anchor = _rows_cpu(sch, root, int(config["rows_per_task"]))
        elif space.elementwise:
            as_vectors = _vector_lanes(space, config, kernel.root)
            _map_flat(sch, root, threads, int(config["per_item"]), vec, as_vectors)
            continue
        else:
            anchor = _rows_opencl(sch, root, mode, threads)
        # Consumers first: a block moves under the row loop once all its readers are there.
        # Each reduction is split where it is still alone in its own nest at the top (see
        # _split_reduction), just before it moves: splitting all of them first broke
        # TVM 0.27's analysis of the later ones once an earlier one's vector tail had
        # been decomposed. A kept map's row goes to private memory (item mode, llvm) or
        # to the work-group's local memory (group mode: its work-items split the row).
        for name in reversed([b.name for b in nest.blocks if b.name in kernel.computed]):
            if name in kernel.kept:
                block = sch.get_sblock(name)
                sch.compute_at(block, anchor)
                sch.set_scope(block, 0, "shared" if mode == "group" else "local")
                as_vectors = _vector_lanes(space, config, name)
                _map_columns(sch, block, anchor, mode, threads, vec, unroll, tail, as_vectors)
                continue
            if name not in nest.reductions:
                continue
            part = _split_reduction(sch, name, mode, threads, vec)
            sch.compute_at(part.block, anchor)
            sch.set_scope(part.block, 0, "local")
            as_vectors = _vector_lanes(space, config, name)
            _finish_reduction(sch, part, anchor, mode, vec, unroll, nest.cols, as_vectors, tails)
        if nest.block(kernel.root).kind == "map":
            as_vectors = _vector_lanes(space, config, kernel.root)
            _map_columns(sch, root, anchor, mode, threads, vec, unroll, tail, as_vectors)
    for walk in tails:  # last: a partitioned nest is no longer one block to move
        _split_tail(sch, walk)


def _vector_lanes(space: RowSpace, config: Config, name: str) -> bool:
    """Whether stage ``name``'s lanes become vector instructions; on OpenCL, where the
    stage reads a per-row flag (a mask), they are unrolled instead.

    A flag read under vectors becomes a vector select, and TVM 0.27's OpenCL C passes it
    a condition of 0 / 1 lanes where OpenCL's ``select`` reads each lane's sign bit:
    every lane took the false branch (a masked softmax returned its softmax where the
    mask said zero). Unrolled lanes are scalar selects (C's ``?:``), which are right, and
    the stage's other vector loads still come in whole vectors; LLVM's vector selects
    are right.
    """
    return space.target == "llvm" or not space.flagged(config, name)


def _lower_lanes(sch, loop, as_vectors: bool) -> None:
    if as_vectors:
        sch.vectorize(loop)
    else:
        sch.unroll(loop)


# -- reductions -------------------------------------------------------------------------


def _split_reduction(sch, name: str, mode: str, threads: int, vec: int) -> _Reduction:
    """Split the reduction ``name`` into partial results while it is alone in its nest."""
    block = sch.get_sblock(name)
    _, k = sch.get_loops(block)
    red = _Reduction(block)
    if mode == "group":
        _, tx, kv = sch.split(k, [None, threads, vec])
        per_thread = sch.rfactor(tx, 0)
        red.partials.insert(0, per_thread)
        if vec > 1:
            red.partials.insert(0, sch.rfactor(sch.get_loops(per_thread)[-1], 0))
    elif vec > 1:
        _, kv = sch.split(k, [None, vec])
        red.partials.insert(0, sch.rfactor(kv, 0))
    return red


def _finish_reduction(
    sch,
    red: _Reduction,
    anchor,
    mode: str,
    vec: int,
    unroll: int,
    row_cols: int,
    as_vectors: bool,
    tails: list[_Tail],
) -> None:
    """Compute ``red``'s partial results per row under ``anchor`` and lower each step.

    The reduction block itself is already under ``anchor`` (fused) or has ``anchor`` as
    its own row loop (a kernel's root). Where ``vec`` does not divide ``row_cols``
    (a vector tail: item mode, llvm), the lanes' step keeps its guard and its walk over
    the vectors goes to ``tails`` (see :func:`_split_tail`).
    """
    tail = row_cols % vec if mode != "group" else 0
    at = anchor
    if mode == "group":
        (at,) = _below(sch, red.block, anchor)
        sch.bind(at, "threadIdx.x")
    for partial in reversed(red.partials):  # consumers first
        sch.compute_at(partial, at)
        if tail and partial is red.partials[0]:
            _guard_lanes(sch, partial, vec, row_cols)
        sch.set_scope(partial, 0, "local")
    steps = [*red.partials, red.block]
    # The innermost step walks the work-item's columns, ``vec`` lanes at a time; TVM
    # drops loops of extent 1, so the walk over the columns may be gone.
    walker = steps[0]
    loops = _below(sch, walker, at)
    lanes = loops.pop(0) if vec > 1 else None
    cols = loops[0] if loops else None
    if cols is not None and lanes is not None:
        sch.reorder(cols, lanes)
    if lanes is not None:
        _lower_lanes(sch, lanes, as_vectors)
    if cols is not None and tail:  # unrolled once the tail is split off
        tails.append(_Tail(cols, unroll))
    elif cols is not None and unroll > 1:
        cols, inner = sch.split(cols, [None, unroll])
        sch.unroll(inner)
    if walker is not red.block or mode != "group":
        if cols is not None or lanes is not None:
            sch.decompose_reduction(walker, cols if cols is not None else lanes)
    # The later steps reduce the lanes (in the work-item) and then the work-items (in
    # the work-group: TVM's cross-thread reduction keeps its own initialisation).
    for step in steps[1:]:
        if mode == "group" and step is red.block:
            continue
        own = _below(sch, step, at)
        if own:
            sch.unroll(own[0])
            sch.decompose_reduction(step, own[0])


def _guard_lanes(sch, partial, vec: int, cols: int) -> None:
    """Give back the guard ``compute_at`` dropped from a vector tail's lanes step.

    The lanes' block reads column ``vector * vec + lane`` of a row, guarded where the
    row ends mid-vector; TVM 0.27's ``compute_at`` regenerates its loops over whole
    vectors and drops that guard (the last vector then read past the row). The guard is
    rebuilt from the block's new bindings: its lane (the rfactor axis, first) and its
    reduction axis over the vectors. The guard ``compute_at`` gave (a row past the last,
    where the work-items or tasks do not divide the rows) stays: without it the rows
    past the end read the input past its end.
    """
    import tvm
    from tvm.s_tir import SBlockRealize

    loop = sch.get_loops(partial)[-1]
    node = sch.get(loop)
    realize = node.body
    if not isinstance(realize, SBlockRealize):
        raise TypeError(f"the lanes step is not alone in its innermost loop: {realize}")
    iter_vars = list(realize.block.iter_vars)
    (vector,) = [i for i, iv in enumerate(iter_vars) if iv.iter_type == _REDUCE]
    values = realize.iter_values
    guard = values[vector] * vec + values[0] < cols
    given = realize.predicate
    if not (isinstance(given, tvm.tirx.IntImm) and given.value):
        guard = tvm.tirx.And(given, guard)
    body = SBlockRealize(values, guard, realize.block)
    new = tvm.tirx.For(
        node.loop_var,
        node.min,
        node.extent,
        node.kind,
        body,
        node.thread_binding,
        node.annotations,
    )
    sch.state.replace(sch.get_sref(loop), new, {realize.block: realize.block})


_REDUCE = 2  # IterVar.iter_type of a reduction axis (kCommReduce)


def _below(sch, block, anchor) -> list:
    """``block``'s loops under ``anchor`` (TVM drops loops of extent 1)."""
    loops = list(sch.get_loops(block))
    target = sch.get(anchor)
    for i, lp in enumerate(loops):
        if sch.get(lp).same_as(target):
            return loops[i + 1 :]
    raise ValueError("the anchor loop does not enclose the block")


# -- vector tails -----------------------------------------------------------------------


@dataclass
class _Tail:
    """A reduction's walk over a row's vectors whose last vector is cut short (a guarded
    tail), and the unrolling its whole vectors get: left to :func:`_split_tail` once
    every block has moved."""

    walk: object
    unroll: int


def _split_tail(sch, tail: _Tail) -> None:
    """Split a row's last, partial vector off its walk (``loop_partition``): the whole
    vectors before it keep their vector lanes, unguarded, unrolled by ``tail.unroll``;
    the last one's lanes are unrolled, each lane's guard then a constant (the live lanes
    stay, the others go).

    Left to TVM's loop partitioning (a ``pragma_loop_partition_hint`` on the walk), the
    last vector's lanes stay one vectorised loop under a lane-dependent guard, which
    TVM's vectoriser turns into a loop over all ``vec`` lanes with the guard inside; in
    OpenCL C a reduction's partial results are then indexed by a computed lane, and
    PoCL keeps them in memory. A map's tail is left to TVM: there the loop is the
    cheaper code (a 2364 x 197 add + GELU chain, vectors of 16, ran 12-18 % slower with
    its tail's lanes unrolled on a Zen 5's PoCL; the softmax and layernorm maps the same).
    """
    extent = int(sch.get(tail.walk).extent)  # >= 2: the space puts a whole vector first
    head, last = sch.loop_partition(tail.walk, [extent - 1, None])
    for block in sch.get_child_blocks(last):
        sch.unroll(sch.get_loops(block)[-1])
    if tail.unroll > 1:
        walk, inner = sch.split(head, [None, tail.unroll])
        sch.unroll(inner)
        if (extent - 1) % tail.unroll:  # the last step's whole vectors are guarded
            sch.annotate(walk, "pragma_loop_partition_hint", 1)


# -- rows and columns -------------------------------------------------------------------


def _rows_opencl(sch, root, mode: str, threads: int):
    """Bind the root's row loop; returns the loop over one row."""
    rows = sch.get_loops(root)[0]
    if mode == "group":
        sch.bind(rows, "blockIdx.x")
        return rows
    g, t = sch.split(rows, [None, threads])
    sch.bind(g, "blockIdx.x")
    sch.bind(t, "threadIdx.x")
    return t


def _rows_cpu(sch, root, rows_per_task: int):
    rows = sch.get_loops(root)[0]
    task, row = sch.split(rows, [None, rows_per_task])
    sch.parallel(task)
    return row


def _map_columns(
    sch,
    root,
    anchor,
    mode: str,
    threads: int,
    vec: int,
    unroll: int,
    tail: int,
    as_vectors: bool = True,
) -> None:
    """The column loop of a map root: work-items (group mode), unrolled vectors."""
    (cols,) = _below(sch, root, anchor)
    # The lanes come off first: a guard of a tile that does not divide stays above them.
    vectors, v = sch.split(cols, [None, vec])
    if mode == "group":
        _, tx, u = sch.split(vectors, [None, threads, unroll])
        sch.bind(tx, "threadIdx.x")
    else:
        walk, u = sch.split(vectors, [None, unroll])
        if tail:  # the row's last vector is guarded: only the last step keeps the guard
            sch.annotate(walk, "pragma_loop_partition_hint", 1)
    if vec > 1:
        _lower_lanes(sch, v, as_vectors)
    if unroll > 1:
        sch.unroll(u)


def _map_flat(sch, root, threads: int, per_item: int, vec: int, as_vectors: bool = True) -> None:
    """An elementwise kernel: ``per_item`` consecutive columns per work-item. Where ``vec``
    does not divide them, they are the whole row (:meth:`RowSpace.check`) and its last
    vector a tail: the walk over the row's vectors is partitioned so that only its last
    step keeps the guard, the others stay whole vectors (a guard per lane is scalarised)."""
    rows, cols = sch.get_loops(root)
    vectors, v = sch.split(cols, [None, vec])  # guards of the tiles stay above the lanes
    if per_item % vec:  # one work-item per row, walking all its vectors
        items = rows
        sch.annotate(vectors, "pragma_loop_partition_hint", 1)
    else:
        chunk, _ = sch.split(vectors, [None, per_item // vec])
        items = sch.fuse(rows, chunk)
    g, t = sch.split(items, [None, threads])
    sch.bind(g, "blockIdx.x")
    sch.bind(t, "threadIdx.x")
    if vec > 1:
        _lower_lanes(sch, v, as_vectors)
