"""The contraction spaces' features: what the cost model reads of a config.

Named alike for every workload of an operator, so that a model of one shape ranks
another's. On llvm the shared names mean the same (a task is a work-group of one
work-item) and the CPU's knobs add their own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from autosched.space.config import Config
from autosched.space.contraction_knobs import mid_order

if TYPE_CHECKING:
    from autosched.space.contraction import ContractionSpace


def describe_gpu(space: ContractionSpace, config: Config) -> dict[str, float]:
    """Features of an OpenCL config (work-groups of work-items, local memory)."""
    itemsize = np.dtype(space.workload.dtype).itemsize
    threads = space.threads(config)
    reg = space.reg_elems(config)
    groups = space.groups(config)
    red = space.nest.reduction
    chunk = math.prod(config[f"tile.{a.name}"][0] for a in red) if red else 1
    unroll = math.prod(config[f"tile.{a.name}"][1] for a in red) if red else 1
    red_total = math.prod(a.extent for a in red) if red else 1
    # Per work-item, per reduction step: loads of each input for its register tile.
    item_tile = {a.name: config[f"tile.{a.name}"][1] for a in space.nest.spatial}
    item_loads = sum(acc.footprint(item_tile) for acc in space.nest.inputs)
    staged = sum(config[f"stage.{acc.buffer}"] == "local" for acc in space.nest.inputs)
    packed = [acc for acc in space.nest.inputs if config[f"stage.{acc.buffer}"] == "pack"]
    inner = space.nest.spatial[-1]
    feats: dict[str, float] = {
        "log_threads": math.log2(threads),
        "log_groups": math.log2(groups),
        "log_reg": math.log2(reg),
        "log_acc": math.log2(reg) if red else 0.0,
        "log_vec": math.log2(config["vec"]),
        "log_vec_auto": 0.0,  # OpenCL: what the driver makes of it is its own to say
        "vec_regs": reg / config["vec"],
        "log_chunk": math.log2(chunk),
        "log_unroll": math.log2(unroll),
        "log_red": math.log2(red_total),
        "log_work_items": math.log2(threads * groups),
        "item_loads_per_step": float(item_loads),
        "intensity": reg / max(item_loads, 1),
        "local_bytes": float(space.local_mem_bytes(config)),
        "staged": float(staged),
        "packed": float(len(packed)),
        "log_panel_reads": _log_panel_reads(space, config, packed),
        "fuse": float(bool(config["fuse"])) if "fuse" in config else 1.0,
        "producer_kernels": float(len(space.unfused_producers(config))),
        "inner_reg": float(config[f"tile.{inner.name}"][1]),
        "inner_threads": float(config[f"tile.{inner.name}"][0]),
        "group_footprint_kb": sum(
            acc.footprint(space.group_tile(config)) for acc in space.nest.inputs
        )
        * itemsize
        / 1024,
        "unrolled_body": float(reg / config["vec"] * unroll),
        "log_pad_waste": math.log2(space.pad_waste(config)),
    }
    for i, ax in enumerate(space.nest.spatial):
        t, r = config[f"tile.{ax.name}"]
        feats[f"s{i}_log_threads"] = math.log2(t)
        feats[f"s{i}_log_reg"] = math.log2(r)
        feats[f"s{i}_log_extent"] = math.log2(ax.extent)
    inlined = space.inlined_producers(config)
    for acc in space.nest.inputs:
        feats[f"stage_{acc.buffer}"] = float(config[f"stage.{acc.buffer}"] == "local")
        feats[f"pack_{acc.buffer}"] = float(acc in packed)
        if acc.buffer in space.nest.produced:
            feats[f"inline_{acc.buffer}"] = float(acc.buffer in inlined)
    return feats


def _log_panel_reads(space: ContractionSpace, config: Config, packed) -> float:
    """log2 of how many register tiles read each element of a packed input (those along
    the axes it does not index), the most of ``packed``; 0 where none is packed: what
    the input's copy pays for."""
    most = 1
    for acc in packed:
        used = acc.axes
        reads = math.prod(
            -(-a.extent // config[f"tile.{a.name}"][1])
            for a in space.nest.spatial
            if a.name not in used
        )
        most = max(most, reads)
    return math.log2(most)


# The most scalar multiply-adds one trip of a loop may hold, all of its inner loops
# unrolled, for LLVM to vectorise the loop itself (see :func:`compiled_form`).
UNROLLED_BODY = 32


def compiled_form(space: ContractionSpace, config: Config) -> Config:
    """The explicit-vector config whose code LLVM makes of a scalar (``vec`` 1) llvm
    config, or ``config`` itself.

    LLVM vectorises scalar code along the axis its vectors would run on (contiguous in
    the output) two ways. Its SLP vectoriser packs a register tile's unrolled
    statements along that axis into vectors, up to the native width: the form is the
    same tile at that width (in the assembly of the Zen 4's 7x7 conv sample, scalar
    configs with 32 or 64 outputs along it ran mostly 16-lane FMAs). Its loop
    vectoriser takes the innermost loop that is left once it has unrolled the small
    ones inside: in block order (the reduction chunk inside the tile loops) the tile
    loop along that axis, with no register tile along it, is that loop where the loops
    inside it hold at most :data:`UNROLLED_BODY` multiply-adds in all; the form walks
    that axis a native vector per tile (a remainder counted as padding). In the
    assembly of the Zen 4's 7x7 conv and 512^3 matmul samples every such config ran
    16-lane FMAs, at 0.27-1.00 of its sample's best (the 7x7's best two among them; the
    3x3 conv's best is one too), while those with 48 or more inside ran at 0.23 or less.
    Re-timed side by side there, the 7x7's four best scalar configs ran at 0.85-0.96 of
    their forms (which that sample had not drawn).
    """
    if config["vec"] != 1:
        return config
    lanes = max(1, space.limits.vector_lanes)
    axis = space.vec_axis(config)
    mid, reg = config[f"tile.{axis}"]
    nest = space.nest
    order = mid_order(nest, config)  # the tile loops as the lowering builds them
    inside = (
        math.prod(config[f"tile.{a}"][0] for a in order[order.index(axis) + 1 :])
        * math.prod(config[f"tile.{a.name}"][0] for a in nest.reduction)
        * space.reg_elems(config)
    )
    block_order = not nest.reduction or config["reduce_at"] == "block"
    if reg == 1 and mid >= lanes and block_order and inside <= UNROLLED_BODY:
        return config.replace(vec=lanes, **{f"tile.{axis}": (-(-mid // lanes), lanes)})
    width = min(lanes, reg & -reg)  # the largest power of two dividing the tile
    return config.replace(vec=width) if width > 1 else config


def describe_cpu(space: ContractionSpace, config: Config) -> dict[str, float]:
    """Features of an llvm config (parallel tasks, register tiles, packing): those of
    the code LLVM makes of it (:func:`compiled_form`), and ``log_vec_auto``, log2 of the
    vector width LLVM gave it beyond its own."""
    form = compiled_form(space, config)
    feats = _describe_cpu(space, form)
    feats["log_vec_auto"] = math.log2(form["vec"] / config["vec"])
    return feats


def _describe_cpu(space: ContractionSpace, config: Config) -> dict[str, float]:
    itemsize = np.dtype(space.workload.dtype).itemsize
    nest = space.nest
    reg = space.reg_elems(config)
    tasks = space.groups(config)
    vec = config["vec"]
    red = nest.reduction
    chunk = math.prod(config[f"tile.{a.name}"][0] for a in red) if red else 1
    unroll = math.prod(config[f"tile.{a.name}"][1] for a in red) if red else 1
    red_total = math.prod(a.extent for a in red) if red else 1
    block_order = bool(red) and config["reduce_at"] == "block"
    item_tile = {a.name: config[f"tile.{a.name}"][1] for a in nest.spatial}
    lanes = space.vec_axis(config)  # the innermost axis unless the lanes run along another
    # Load instructions per reduction step of one register tile: an operand that runs
    # contiguously along the vectorised axis is read a vector at a time; any other
    # is read an element at a time (a broadcast). Against the reg / vec vector FMAs
    # of the step this is the micro-kernel's real operand reuse.
    item_loads = 0.0
    for acc in nest.inputs:
        elems = acc.footprint(item_tile)
        contiguous = bool(acc.dims) and (
            acc.dims[-1] == ((lanes, 1),)  # or packed with the lanes moved innermost:
            or config.get(f"stage.{acc.buffer}") == "pack"
            and ((lanes, 1),) in acc.dims
        )
        item_loads += elems / vec if contiguous else elems
    # What one register tile streams per pass: its operands over a reduction chunk
    # (block order) or over the whole reduction (tile order).
    pass_tile = dict(item_tile)
    pass_tile.update(
        {a.name: config[f"tile.{a.name}"][0] if block_order else a.extent for a in red}
    )
    cores = max(1, space.limits.cores)
    packed = [acc.buffer for acc in nest.inputs if red and config[f"stage.{acc.buffer}"] == "pack"]
    feats: dict[str, float] = {
        "log_threads": 0.0,
        "log_groups": math.log2(tasks),
        "log_reg": math.log2(reg),
        "log_acc": math.log2(reg) if red else 0.0,
        "log_vec": math.log2(vec),
        "vec_regs": reg / vec,
        "log_chunk": math.log2(chunk),
        "log_unroll": math.log2(unroll),
        "log_red": math.log2(red_total),
        "log_work_items": math.log2(tasks),
        "item_loads_per_step": item_loads,
        "intensity": reg / vec / max(item_loads, 1.0),
        "local_bytes": 0.0,
        "staged": 0.0,
        "fuse": float(bool(config["fuse"])) if "fuse" in config else 1.0,
        "producer_kernels": float(len(space.unfused_producers(config))),
        "inner_reg": float(config[f"tile.{lanes}"][1]),
        "inner_threads": 1.0,
        "group_footprint_kb": sum(acc.footprint(space.group_tile(config)) for acc in nest.inputs)
        * itemsize
        / 1024,
        "unrolled_body": float(reg / vec * unroll),
        "reduce_block": float(block_order),
        "pass_footprint_kb": sum(acc.footprint(pass_tile) for acc in nest.inputs) * itemsize / 1024,
        "packed": float(len(packed)),
        "log_panel_reads": _log_panel_reads(
            space, config, [a for a in nest.inputs if a.buffer in packed]
        ),
        "pack_kb": space.pack_bytes(config) / 1024,
        "log_tasks_per_core": math.log2(tasks / cores),
        "imbalance": math.ceil(tasks / cores) * cores / tasks,
        "log_tiles_per_task": math.log2(
            math.prod(config[f"tile.{a.name}"][0] for a in nest.spatial)
        ),
        "tile_inner_last": float(config["tile_inner"] == lanes),
        "log_pad_waste": math.log2(space.pad_waste(config)),
    }
    for i, ax in enumerate(nest.spatial):
        m, r = config[f"tile.{ax.name}"]
        feats[f"s{i}_log_threads"] = 0.0
        feats[f"s{i}_log_reg"] = math.log2(r)
        feats[f"s{i}_log_extent"] = math.log2(ax.extent)
        feats[f"s{i}_log_mid"] = math.log2(m)
    inlined = space.inlined_producers(config)
    for acc in nest.inputs:
        feats[f"stage_{acc.buffer}"] = 0.0
        feats[f"pack_{acc.buffer}"] = float(acc.buffer in packed)
        if acc.buffer in nest.produced:
            feats[f"inline_{acc.buffer}"] = float(acc.buffer in inlined)
    return feats
