"""The row-wise spaces' features: what the cost model reads of a config (see
:meth:`autosched.space.rowwise.RowSpace.describe`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from autosched.space.config import Config

if TYPE_CHECKING:
    from autosched.space.rowwise import Kernel, RowSpace


def describe_rows(space: RowSpace, config: Config) -> dict[str, float]:
    """Derived quantities of a config: the cost model's hand-made features.

    The core names mean what they mean for a contraction, as near as a row-wise
    nest allows: ``log_reg`` counts the values a work-item (llvm: a task's loop
    body) holds per step (``vec * unroll`` partial results or outputs),
    ``intensity`` is flops per element moved through global memory, ``staged``
    counts the reductions that go through local memory (group mode).
    """
    nest = space.nest
    itemsize = np.dtype(space.workload.dtype).itemsize
    kernels = space.kernels(config)
    vec = config["vec"]
    unroll = config.get("unroll", 1)
    threads = space.threads(config)
    groups = space.groups(config)
    group_mode = config.get("reduce") == "group"
    per_item = config.get("per_item", 1)
    if space.target == "llvm":
        cols_per_item = nest.cols
    elif space.elementwise:
        cols_per_item = per_item
    else:
        cols_per_item = nest.cols // threads if group_mode else nest.cols
    moved = _elements_moved(space, kernels)
    passes = max(len(k.computed) for k in kernels)  # over a row, per kernel
    cross = len(nest.reductions) if group_mode else 0
    fused = sum(bool(config[f"fuse.{n}"]) for n in nest.stages)
    # Inlined maps are evaluated once per stage that computes them, kept ones once.
    kept = sum(len(k.kept) for k in kernels)
    evaluated = kept + sum(
        len(space.inlined_into(config, [s])) for k in kernels for s in k.computed
    )
    fused_maps = sum(nest.block(n).kind == "map" and config[f"fuse.{n}"] for n in nest.stages)
    cores = max(1, space.limits.cores)
    feats: dict[str, float] = {
        "log_threads": math.log2(threads),
        "log_groups": math.log2(groups),
        "log_reg": math.log2(vec * unroll),
        "log_acc": 0.0,  # no register tile held through a reduction
        "log_vec_auto": 0.0,
        "log_vec": math.log2(vec),
        "intensity": space.workload.flops() / max(moved, 1),
        "staged": float(cross),
        "log_work_items": math.log2(threads * groups),
        "log_unroll": math.log2(unroll),
        # Rows are never padded to whole tiles; a vector tail computes its last
        # vector's lanes one by one.
        "log_pad_waste": math.log2(-(-nest.cols // vec) * vec / nest.cols),
        "reduce_group": float(group_mode),
        "fused_stages": float(fused),
        "unfused_stages": float(len(nest.stages) - fused),
        "kernels": float(len(kernels)),
        "row_passes": float(passes),
        "recomputed": float(evaluated - fused_maps),
        "bytes_per_row": moved * itemsize / nest.rows,
        "log_cols_per_item": math.log2(cols_per_item),
        "vectors_per_item": cols_per_item / vec,
        "barriers": float(cross * (2 + math.log2(threads))),
        "log_tasks_per_core": math.log2(max(groups / cores, 1e-3)),
        "log_rows_per_task": math.log2(config.get("rows_per_task", 1)),
    }
    return feats


def _elements_moved(space: RowSpace, kernels: tuple[Kernel, ...]) -> int:
    """Elements each kernel reads from and writes to global memory, summed.

    A kernel reads every global buffer that any of its stages reads (through inlined
    maps) once; a row's values it reads again in another pass come from cache.
    Where the intermediates between kernels stay in cache
    (:func:`intermediates_cached`), they do not count, nor does an input that an
    earlier kernel already read.
    """
    nest = space.nest
    shapes = dict(nest.inputs)
    computed = {b.name for b in nest.blocks}
    cached = intermediates_cached(space)
    total = 0
    seen: set[str] = set()  # inputs an earlier kernel read (in cache, where it holds them)
    for k in kernels:
        stages = [*k.computed, *k.inlined]
        local = {*k.reductions, *k.kept, *k.inlined}
        reads = {buf for s in stages for buf in nest.block(s).reads if buf not in local}
        for buf in reads:
            if buf not in computed:
                if not (cached and buf in seen):
                    total += math.prod(shapes[buf])
                seen.add(buf)
            elif not cached:
                total += nest.rows * (nest.cols if nest.block(buf).kind == "map" else 1)
        if nest.block(k.root).output or not cached:
            total += nest.rows * (nest.cols if nest.block(k.root).kind == "map" else 1)
    return total


def intermediates_cached(space: RowSpace) -> bool:
    """Whether a stage's output that another kernel (llvm: parallel loop) reads stays
    in the cores' own caches in between: on a CPU whose fingerprint gives its caches,
    where each core's share of a ``rows x cols`` intermediate fits its second level.

    Each core computes and reads back the same rows (the rows are split over the cores
    alike in every loop), so fusing such a stage saves no memory traffic, while a
    map fused into two consumers is evaluated twice. On the four CPUs' llvm softmax
    samples (1536x128: 384 KiB per core, against L2s of 512 KiB to 2 MiB) a config
    with ``exp`` as a stage of its own ran at a median 1.40x (Xeon) to 1.71x (Zen 3)
    of the same config with it fused into both consumers, and the row maximum at
    1.01-1.17x; counting the intermediates' traffic, the prior put the fused configs
    first. Replayed on a Xeon (20 seeds, 2026-12-04): the model search's median
    trials to 95 % 29 / 20 / 7 / 7 -> 30 / 10.5 / 5 / 8 cold (Zen 4, Zen 3, Zen 5,
    Xeon), the Zen 4's best after 64 trials 0.979 -> 0.993 of the sample's best, the
    four scores summed 3.19 -> 3.26 cold and 3.32 -> 3.41 with transfer (the Zen 3's
    25 -> 20.5 trials). On a GPU, and where the caches are not known (PoCL's
    fingerprints), intermediates count as before.
    """
    lim = space.limits
    if not lim.is_cpu or len(lim.cache_bytes) < 2:
        return False
    itemsize = np.dtype(space.workload.dtype).itemsize
    share = space.nest.rows * space.nest.cols * itemsize / max(1, lim.cores)
    return share <= lim.cache_bytes[1]
