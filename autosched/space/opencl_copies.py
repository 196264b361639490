"""The kernels of their own that an OpenCL contraction schedule adds beside its main one:
elementwise loops (a padded copy, an unfused producer or epilogue, the outputs copied
out of a padded buffer) and an input's panels (``stage=pack``)."""

from __future__ import annotations

import math


def schedule_elementwise(sch, block, vec: int) -> None:
    """Its own kernel: one work-item per ``vec`` consecutive outputs, 64 per group.

    Where no group of at least 8 divides the outputs (odd extents: copying the real
    outputs out of a padded one), a group is 64 consecutive outputs along the last axis,
    the last of each row guarded (single-item groups are slow).
    """
    loops = sch.get_loops(block)
    total = math.prod(int(sch.get(lp).extent) for lp in loops)
    v = vec if total % vec == 0 else 1
    per_group = 64
    while total % (per_group * v):
        per_group //= 2
    if per_group >= 8:
        g, t, inner = sch.split(sch.fuse(*loops), [None, per_group, v])
        sch.bind(g, "blockIdx.x")
        sch.bind(t, "threadIdx.x")
        if v > 1:
            sch.vectorize(inner)
        return
    outer, t = sch.split(loops[-1], [None, 64])
    sch.bind(sch.fuse(*loops[:-1], outer), "blockIdx.x")
    sch.bind(t, "threadIdx.x")


def pack_panels(sch, copy, dim: int, reg: int, vec: int) -> None:
    """OpenCL: the kernel of its own that copies an input into panels of ``reg`` columns
    of its dimension ``dim`` (the innermost output axis), each panel one contiguous run
    over the other dimensions: a matmul's ``B[k, n]`` becomes ``[n / reg, k, n % reg]``, a
    dense layer's ``W[n, k]`` the same. A work-item then reads its register tile's
    operand in one stream of whole vectors, as llvm's packing does per task. One
    work-item copies one row of a panel; 64 per group. ``copy`` is a ``cache_read``, a
    vector tail's zero-padded copy, or a produced input's producer (an im2col matrix).

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
