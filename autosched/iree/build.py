"""Build one config of an IREE space: Linalg, ``compilation_info``, ``iree-compile``."""

from __future__ import annotations

from autosched.iree.linalg import emit
from autosched.iree.mlir import annotate
from autosched.iree.render import compilation_info
from autosched.iree.toolchain import compile_flags, compile_mlir
from autosched.measure.iree_device import DRIVERS, spirv_target
from autosched.measure.program import IreeProgram
from autosched.space.config import Config
from autosched.space.iree import IreeSpace

# Dispatches per call of a GPU's second module. On NVIDIA's Vulkan driver (a lent H100,
# 2026-11-27) one call of a module took 1.3-3.7 ms whatever the config, its kernels
# 0.02-0.4 ms of that: timed by the call, every config looked alike. The difference
# between 129 dispatches and one per call puts 2.5 ms of a 20 us kernel against the
# call's jitter; with 33 the small conv2d's figures came out twice as high and ranked
# its configs differently (Spearman 0.74 between the two runs; the matmul's 0.98).
GPU_REPEAT = 129


def annotated_mlir(space: IreeSpace, config: Config) -> str:
    """The workload as Linalg, with ``config`` on its root op (none for ``auto``)."""
    text = emit(space.workload)
    info = compilation_info(space.nest, space.target, config)
    return annotate(text, {0: info}) if info else text


def build_iree(
    space: IreeSpace,
    config: Config,
    *,
    vulkan_target: str | None = None,
    repeat: int | None = None,
) -> IreeProgram:
    """Compile ``config`` for the space's target (Vulkan: ``vulkan_target``, else the
    SPIR-V target of the device the space's limits came from, else the default Vulkan
    device's). ``repeat``: also build the module with each dispatch repeated that many
    times per call (default: :data:`GPU_REPEAT` for a Vulkan GPU, none elsewhere), so
    the runner can tell the kernels' time from the call's.

    Raises:
        ScheduleError: iree-compile rejected the config.
    """
    if space.target == "iree-vulkan" and vulkan_target is None:
        vulkan_target = spirv_target(space.limits)
    text = annotated_mlir(space, config)
    flags = compile_flags(
        space.target,
        vulkan_target=vulkan_target or "llvmpipe",
        llvm_cpu=space.limits.llvm_cpu or "host",
    )
    module = compile_mlir(text, flags)
    if repeat is None:
        repeat = GPU_REPEAT if space.target == "iree-vulkan" and not space.limits.is_cpu else 1
    repeated = None
    if repeat > 1:
        more = [f"--iree-hal-benchmark-dispatch-repeat-count={repeat}"]
        repeated = compile_mlir(text, flags, extra=more)
    tensors = tuple(t for t in space.workload.tensor_specs() if t.role != "scratch")
    return IreeProgram(
        module=module,
        driver=DRIVERS[space.target],
        tensors=tensors,
        mlir=text,
        repeated=repeated,
        repeat=repeat,
    )
