"""IREE's own lowering config for a workload, written out as a config of its space.

The space's ``auto`` pipeline leaves the config to IREE's heuristics; the search can
neither learn from that measurement as a point of the space nor step from it to a
neighbour. Here ``iree-compile --compile-to=executable-configurations`` shows the
config IREE picks for the root op, and its tile lists are read back into the space's
knobs (llvm-cpu: distribution, cache, vector and reduction tiles; SPIR-V: workgroup,
invocation and reduction tiles and the pipeline), so the tuner can measure the same
schedule as an explicit config first and search around it.
"""

from __future__ import annotations

import logging
import re

from autosched.errors import DeviceError, ScheduleError
from autosched.iree.linalg import PARALLEL, emit
from autosched.iree.toolchain import compile_flags, compile_mlir
from autosched.measure.iree_device import spirv_target
from autosched.space.config import Config
from autosched.space.device import vector_bits

log = logging.getLogger(__name__)

_LIST = r"{name} = \[([0-9, ]*)\]"


def _tiles(text: str, name: str) -> list[int] | None:
    m = re.search(_LIST.format(name=name), text)
    return [int(v) for v in m.group(1).split(",")] if m else None


def iree_default_config(space, *, vulkan_target: str | None = None) -> Config | None:
    """IREE's config for ``space``'s workload (llvm-cpu, or SPIR-V for
    ``vulkan_target``: by default the one its builds use) as a config of ``space``, or
    None where it is not one (a tile outside the knobs' choices, a pipeline the space
    does not have, or a compiler that shows none). A job's driver that has no IREE
    compiler (its workers build) gets None too: the seed is a help, not a need."""
    try:
        if not space.cpu and vulkan_target is None:
            vulkan_target = spirv_target(space.limits)
        flags = compile_flags(
            space.target,
            vulkan_target=vulkan_target or "llvmpipe",
            llvm_cpu=_llvm_cpu(space.limits),
        )
        out = compile_mlir(
            emit(space.workload),
            flags,
            extra=["--compile-to=executable-configurations"],
            timeout_s=120,
        ).decode(errors="replace")
    except (ScheduleError, DeviceError, ImportError, OSError) as exc:
        log.info("no IREE config to seed %s with: %s", space.workload, exc)
        return None
    config = _cpu_config(space, out) if space.cpu else _spirv_config(space, out)
    return config if config is not None and space.check(config) is None else None


def _llvm_cpu(limits) -> str:
    """The CPU to ask IREE's config for: the one the device's fingerprint names; else
    this host where it has the device's vector width (a live tune); else the generic
    x86-64 level of that width, so that a sample replayed on another CPU keeps its own
    seed (an AVX2 Zen 3's sample replayed on an AVX-512 Xeon got the Xeon's config,
    16-lane vectors outside its space, and no seed; x86-64-v3 gives the Zen 3's own)."""
    if limits.llvm_cpu or not limits.is_cpu:
        return limits.llvm_cpu or "host"
    from autosched.measure.cpu import host_cpu

    if vector_bits(host_cpu().isa) == limits.vector_bits:
        return "host"
    return {512: "x86-64-v4", 256: "x86-64-v3"}.get(limits.vector_bits, "x86-64-v2")


def _spirv_config(space, out: str) -> Config | None:
    """SPIR-V: the root op's ``tile_sizes`` (workgroup, invocation, reduction tiles)
    and its function's pipeline; MatmulPromoteVectorize keeps the reduction tile at
    the workgroup level and its ``pipeline_depth`` is ``stages`` - 1 (as
    :mod:`autosched.iree.render` writes them)."""
    dom = space.nest
    n_par = len(dom.spatial)
    for m in re.finditer(r"tile_sizes = \[\[([0-9, ]*)\], \[([0-9, ]*)\], \[([0-9, ]*)\]\]", out):
        wg, thr, red = ([int(v) for v in g.split(",")] if g.strip() else [] for g in m.groups())
        if len(thr) == n_par and len(red) == len(dom.loops):
            break
    else:
        return None
    pipe = re.search(
        r"spirv_pipeline<(\w+)>(?: workgroup_size = \[[0-9, ]*\])?(?:, \{pipeline_depth = (\d+))?",
        out,
    )
    if pipe is None:
        return None
    pipeline = pipe.group(1)
    values: dict = {"pipeline": pipeline}
    for i, lp in enumerate(dom.spatial):
        values[f"wg.{lp.name}"] = wg[i]
        values[f"thr.{lp.name}"] = thr[i]
    for j, lp in enumerate(dom.reduction):
        tile = wg[n_par + j] if pipeline == "MatmulPromoteVectorize" else red[n_par + j]
        values[f"red.{lp.name}"] = tile or 1
    if "stages" in {k.name for k in space.knobs}:
        values["stages"] = (
            int(pipe.group(2) or 0) + 1 if pipeline == "MatmulPromoteVectorize" else 1
        )
    return Config(values)


def _cpu_config(space, out: str) -> Config | None:
    """llvm-cpu: the root op's distribution, cache, vector and reduction tiles."""
    dom = space.nest
    pipeline = space.cpu_pipeline
    if f"#iree_cpu.pipeline<{pipeline}>" not in out:
        return None
    # The root op's config is the one that tiles the reduction too.
    root = next(
        (ln for ln in out.splitlines() if "lowering_config" in ln and "vector_reduction" in ln),
        None,
    )
    if root is None:
        return None
    dist, vec, red = (
        _tiles(root, n) for n in ("distribution", "vector_common_parallel", "vector_reduction")
    )
    cache = _tiles(root, "cache_parallel")
    if not dist or not vec or not red or len(dist) != len(dom.loops):
        return None
    knobs = {k.name for k in space.knobs}
    values: dict = {"pipeline": pipeline}
    for i, lp in enumerate(dom.loops):
        if lp.kind == PARALLEL:
            values[f"dist.{lp.name}"] = dist[i] or lp.extent  # 0: the loop is not tiled
            values[f"vec.{lp.name}"] = vec[i] or 1
            if f"cache.{lp.name}" in knobs:
                # A cache tile as large as the distribution tile tiles nothing: no level
                # (IREE writes one so on AVX2, where it picks dist 48 of a 96 axis).
                c = cache[i] if cache else 0
                values[f"cache.{lp.name}"] = 0 if c >= values[f"dist.{lp.name}"] else c
        else:
            values[f"red.{lp.name}"] = red[i] or 1
    if "peel" in knobs:
        values["peel"] = False
    return Config(values)
