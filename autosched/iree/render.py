"""Configs rendered as IREE attributes, at the edge: ``compilation_info`` on a root op.

A config is plain data (:class:`autosched.space.config.Config` of an
:class:`autosched.space.iree.IreeSpace`); only here does it become MLIR text:

* llvm-cpu: ``#iree_cpu.lowering_config<distribution = [...], vector_common_parallel =
  [...], vector_reduction = [...]>`` with a ``translation_info`` naming the CPU pipeline
  (and ``enable_loop_peeling`` when the config peels);
* Vulkan: ``#iree_codegen.lowering_config<tile_sizes = [[workgroup], [thread],
  [reduction]]>`` with a SPIR-V pipeline and its ``workgroup_size``.

Each list has one entry per loop of the root op, in the op's loop order.
"""

from __future__ import annotations

from autosched.iree.linalg import PARALLEL, Domain
from autosched.space.config import Config
from autosched.space.iree import AUTO


def _list(values: list[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def compilation_info(dom: Domain, target: str, config: Config) -> str | None:
    """The ``#iree_codegen.compilation_info<...>`` text of ``config`` for a root op with
    loops ``dom``; None for pipeline ``auto`` (IREE chooses)."""
    if config["pipeline"] == AUTO:
        return None
    if target == "iree-llvm-cpu":
        return _cpu(dom, config)
    return _spirv(dom, config)


def _cpu(dom: Domain, config: Config) -> str:
    dist, cache, vec, red = [], [], [], []
    for lp in dom.loops:
        par = lp.kind == PARALLEL
        dist.append(config[f"dist.{lp.name}"] if par else 0)
        cache.append(config.get(f"cache.{lp.name}", 0) if par else 0)
        vec.append(config[f"vec.{lp.name}"] if par else 0)
        red.append(0 if par else config[f"red.{lp.name}"])
    cached = f"cache_parallel = {_list(cache)}, " if any(cache) else ""
    lowering = (
        f"#iree_cpu.lowering_config<{cached}distribution = {_list(dist)}, "
        f"vector_common_parallel = {_list(vec)}, vector_reduction = {_list(red)}>"
    )
    extra = ", {enable_loop_peeling}" if config.get("peel") else ""
    translation = (
        f"#iree_codegen.translation_info<pipeline = "
        f"#iree_cpu.pipeline<{config['pipeline']}>{extra}>"
    )
    return (
        f"#iree_codegen.compilation_info<lowering_config = {lowering}, "
        f"translation_info = {translation}>"
    )


def _spirv(dom: Domain, config: Config) -> str:
    spatial, reduction = dom.spatial, dom.reduction
    wg = [config[f"wg.{lp.name}"] for lp in spatial]
    thr = [config[f"thr.{lp.name}"] for lp in spatial]
    red = [0] * len(spatial) + [config[f"red.{lp.name}"] for lp in reduction]
    if config["pipeline"] == "MatmulPromoteVectorize":
        # The operands' tiles in shared memory span the reduction tile: it belongs to the
        # workgroup level; invocations step through it four at a time (vec4 loads).
        wg = wg + [config[f"red.{lp.name}"] for lp in reduction]
        red = [0] * len(spatial) + [min(4, config[f"red.{lp.name}"]) for lp in reduction]
    mapped = spatial[-3:]
    sizes = [config[f"wg.{lp.name}"] // config[f"thr.{lp.name}"] for lp in mapped]
    size = list(reversed(sizes)) + [1] * (3 - len(sizes))
    lowering = (
        f"#iree_codegen.lowering_config<tile_sizes = [{_list(wg)}, {_list(thr)}, {_list(red)}]>"
    )
    options = ""
    if config["pipeline"] == "MatmulPromoteVectorize":
        # Software pipelining: `stages` shared-memory buffers, stores in the last stage.
        depth = config.get("stages", 1) - 1
        options = f", {{pipeline_depth = {depth}, store_stage = {1 if depth else 0}}}"
    translation = (
        f"#iree_codegen.translation_info<pipeline = #iree_gpu.spirv_pipeline<"
        f"{config['pipeline']}> workgroup_size = {_list(size)}{options}>"
    )
    return (
        f"#iree_codegen.compilation_info<lowering_config = {lowering}, "
        f"translation_info = {translation}>"
    )
