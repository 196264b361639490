"""IREE's own lowering config for a workload, written out as a config of its space.

The space's ``auto`` pipeline leaves the config to IREE's heuristics; the search can
neither learn from that measurement as a point of the space nor step from it to a
neighbour. Here ``iree-compile --compile-to=executable-configurations`` shows the
config IREE picks for the root op, and its tile lists are read back into the space's
knobs (llvm-cpu: distribution, cache, vector and reduction tiles), so the tuner can
measure the same schedule as an explicit config first and search around it.
"""

from __future__ import annotations

import re

from autosched.errors import ScheduleError
from autosched.iree.linalg import PARALLEL, emit
from autosched.iree.toolchain import compile_flags, compile_mlir
from autosched.space.config import Config

_LIST = r"{name} = \[([0-9, ]*)\]"


def _tiles(text: str, name: str) -> list[int] | None:
    m = re.search(_LIST.format(name=name), text)
    return [int(v) for v in m.group(1).split(",")] if m else None


def iree_default_config(space) -> Config | None:
    """IREE's llvm-cpu config for ``space``'s workload as a config of ``space``, or
    None where it is not one (a tile outside the knobs' choices, another pipeline, a
    Vulkan space, or a compiler that shows none)."""
    if not space.cpu:
        return None
    dom = space.nest
    try:
        flags = compile_flags(space.target)
        out = compile_mlir(
            emit(space.workload),
            flags,
            extra=["--compile-to=executable-configurations"],
            timeout_s=120,
        ).decode(errors="replace")
    except ScheduleError:
        return None
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
                values[f"cache.{lp.name}"] = cache[i] if cache else 0
        else:
            values[f"red.{lp.name}"] = red[i] or 1
    if "peel" in knobs:
        values["peel"] = False
    config = Config(values)
    return config if space.check(config) is None else None
