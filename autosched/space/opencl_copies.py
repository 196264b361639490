"""The kernels of their own that an OpenCL contraction schedule adds beside its main one:
elementwise loops (an input's padded copy, an unfused producer or epilogue) and an
input's panels (``stage=pack``). Since 2026-12-04 the main kernel writes a padded
output's real values itself (``contraction_schedule._write_real_outputs``)."""

from __future__ import annotations

import math

from autosched.space.space import row_width


def schedule_elementwise(sch, block, vec: int) -> None:
    """Its own kernel: each work-item ``v`` consecutive outputs along the last axis, up to
    64 work-items per group.

    ``v`` is the widest power of two up to ``vec`` that divides the last axis, so that a
    work-item's lanes never cross a row: an unfused epilogue over a 127x1000 matmul's
    outputs reads whole vectors of a row even where ``vec`` does not divide the count
    of outputs (until 2026-12-04 the same held for the outputs copied out of a padded
    buffer, where the rule was measured: 7 % faster on a Xeon's PoCL). Where no group of
    at least 8 divides the work-items (odd extents), a group is 64 of a row's, the last
    of each row guarded (single-item groups are slow; groups over all rows at once, each
    work-item dividing its index by the row's length, ran PoCL's 251x509 copy 8 %
    slower).
    """
    loops = list(sch.get_loops(block))
    v = row_width(int(sch.get(loops[-1]).extent), vec)
    if v > 1:
        items, lanes = sch.split(loops.pop(), [None, v])
        sch.vectorize(lanes)
        loops.append(items)
    total = math.prod(int(sch.get(lp).extent) for lp in loops)
    per_group = 64
    while total % per_group:
        per_group //= 2
    if per_group >= 8:
        g, t = sch.split(sch.fuse(*loops), [None, per_group])
    else:  # a row's work-items in groups of 64, its last group guarded: no division
        outer, t = sch.split(loops.pop(), [None, 64])
        g = sch.fuse(*loops, outer)
    sch.bind(g, "blockIdx.x")
    sch.bind(t, "threadIdx.x")


def pack_panels(sch, copy, dim: int, reg: int, vec: int) -> None:
    """OpenCL: the kernel of its own that copies an input into panels of ``reg`` columns
    of its dimension ``dim`` (the innermost output axis), each panel one contiguous run
    over the other dimensions: a matmul's ``B[k, n]`` becomes ``[n / reg, k, n % reg]``, a
    dense layer's ``W[n, k]`` the same. A work-item then reads its register tile's
    operand in one stream of whole vectors, as llvm's packing does per task. One
    work-item copies one row of a panel; 64 per group. ``copy`` is a ``cache_read``, a
    vector tail's zero-padded copy, or a produced input's producer (an im2col matrix).
    ``vec`` is the copy's vector width: past a vector tail, the widest that divides the
    real row (:func:`~autosched.space.space.row_width`), so that the zero padding is
    chosen per vector (a guard per lane is scalarised).

    On an AVX2 Zen 3's PoCL (Debian, pthread), a 4x16 register tile per work-item: 512^3
    81 GFLOP/s in place, 133 packed (numpy 131-140); 256x512x128, 90 and 121; with 8x8
    tiles, 127x1000x333 ran alike in one run (91 and 90), 117 and 129 in another.
    """
    from tvm.tirx import IndexMap

    def to_panels(*i):
        rest = i[:dim] + i[dim + 1 :]
        return (i[dim] // reg, *rest, i[dim] % reg)

    ndim = len(sch.get(copy).writes[0].region)
    sch.transform_layout(
        copy, ("write", 0), IndexMap.from_func(to_panels, ndim=ndim, index_dtype="int32")
    )
    loops = list(sch.get_loops(copy))
    panel, column = sch.split(loops.pop(dim), [None, reg])
    sch.reorder(panel, *loops, column)
    group, item = sch.split(sch.fuse(panel, *loops), [None, 64])
    sch.bind(group, "blockIdx.x")
    sch.bind(item, "threadIdx.x")
    if vec > 1:
        vectors, lanes = sch.split(column, [None, vec])
        sch.vectorize(lanes)
        sch.unroll(vectors)
