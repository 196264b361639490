"""What a contraction config must respect to be valid on its device (see
:mod:`autosched.space.contraction` for the knobs): tiles that pad the work by at most
:data:`~autosched.space.space.MAX_PAD_WASTE`, the device's work-group, register and local
memory limits, register tiles and unrolled bodies a compiler keeps in registers, vector
widths and lanes that the loop nest can carry, panels cut into whole register tiles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autosched.space.config import Config
from autosched.space.im2col import tail_placement
from autosched.space.space import MAX_PAD_WASTE, padded

if TYPE_CHECKING:
    from autosched.space.contraction import ContractionSpace

MAX_REG_ELEMS = 256  # accumulators every device holds (llvm: more where its registers do)
# Vector statements in the fully unrolled body of one reduction step (register tile /
# vec, times the unrolled reduction iterations). Past this the kernel source runs to
# thousands of lines: a conv2d config with 1024 took 8 s in TVM and 27 s in PoCL's
# compiler for 2.6 GFLOP/s, and the fastest configs measured stay under 128.
MAX_UNROLLED_BODY = 512
# Registers a GPU work-item needs besides its accumulators (addresses, loop counters,
# the operands in flight). On an H200 every sampled 512^3 matmul config whose
# work-items x accumulators reached 65,536 (its registers per group) failed to launch
# and every one at 32,768 or under ran; with this overhead the check draws that line.
REG_OVERHEAD = 32


def check(space: ContractionSpace, config: Config) -> str | None:
    """Why ``config``, whose knobs each take one of their values, is not valid here, or
    None if it is."""
    waste = space.pad_waste(config)
    if waste > MAX_PAD_WASTE + 1e-9:
        return (
            f"tiles that do not divide their axes pad the work by {waste - 1:.0%}, "
            f"more than the {MAX_PAD_WASTE - 1:.0%} allowed"
        )
    if space.target == "llvm":
        return check_register_tile(space, config)
    threads = space.threads(config)
    if threads > min(space.limits.max_work_group_size, space.limits.max_work_item_size):
        return (
            f"work-group of {threads} work-items exceeds the device limit "
            f"{space.limits.max_work_group_size}"
        )
    reason = (
        check_register_tile(space, config)
        or space.rows
        and tail_placement(space, config)
        or check_panels(space, config)
    )
    if reason:
        return reason
    registers = space.limits.registers_per_group
    acc = space.reg_elems(config)
    if registers and threads * (acc + REG_OVERHEAD) > registers:
        return (
            f"{threads} work-items x ({acc} accumulators + {REG_OVERHEAD}) registers "
            f"exceed the device's {registers} per work-group"
        )
    local = space.local_mem_bytes(config)
    if local > space.limits.local_mem_bytes:
        return f"{local} bytes of local memory exceed the device's {space.limits.local_mem_bytes}"
    return None


def check_panels(space: ContractionSpace, config: Config) -> str | None:
    """OpenCL: an input packed into panels is cut into whole register tiles of the
    innermost axis (after its vector tail's padding); a produced one's producer
    writes them, in a kernel of its own."""
    inner = space.nest.spatial[-1]
    extent = padded(inner.extent, config["vec"])
    reg = config[f"tile.{inner.name}"][1]
    for acc in space.nest.inputs:
        name = acc.buffer
        if config[f"stage.{name}"] != "pack":
            continue
        if extent % reg:
            return (
                f"stage.{name}=pack takes register tiles that divide axis "
                f"{inner.name} of {extent}; {reg} does not"
            )
        if config.get(f"fuse.{name}"):
            return f"stage.{name}=pack writes the panels in a kernel of its own: fuse.{name}=False"
    return None


def check_register_tile(space: ContractionSpace, config: Config) -> str | None:
    """What both targets require of a work-item's (llvm: a task's) register tile."""
    cap = space.max_reg_elems(config["vec"])
    elems = space.reg_elems(config)
    if elems > cap:
        return f"register tile of {elems} accumulators exceeds {cap}"
    body = space.unrolled_body(config)
    if body > MAX_UNROLLED_BODY:
        return f"unrolled body of {body} vector statements exceeds {MAX_UNROLLED_BODY}"
    axis = space.vec_axis(config)
    if axis != space.nest.spatial[-1].name:  # whole vectors of that axis, no tail
        extent = next(a.extent for a in space.nest.spatial if a.name == axis)
        if config["vec"] == 1:
            return f"vec_axis={axis} takes vectors (vec > 1)"
        if extent % config["vec"]:
            return f"vec={config['vec']} does not divide axis {axis} of {extent}"
    elif config["vec"] not in space._inner_vecs:
        return f"vec={config['vec']} is not a vector width of axis {axis}"
    if config[f"tile.{axis}"][1] % config["vec"]:
        return f"vec={config['vec']} does not divide the register tile of axis {axis}"
    if axis != space.nest.spatial[-1].name:
        if space.pad_waste(config) > 1 or any(
            a.extent % config[f"tile.{a.name}"][1] for a in space.nest.spatial
        ):
            return f"vec_axis={axis} takes register tiles that divide their axes"
        for acc in space.nest.inputs:
            if axis in acc.axes and (
                config.get(f"stage.{acc.buffer}") != "pack" or ((axis, 1),) not in acc.dims
            ):
                return f"vec_axis={axis} needs stage.{acc.buffer}=pack (its lanes innermost)"
    return None
