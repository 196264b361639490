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


def annotated_mlir(space: IreeSpace, config: Config) -> str:
    """The workload as Linalg, with ``config`` on its root op (none for ``auto``)."""
    text = emit(space.workload)
    info = compilation_info(space.nest, space.target, config)
    return annotate(text, {0: info}) if info else text


def build_iree(
    space: IreeSpace, config: Config, *, vulkan_target: str | None = None
) -> IreeProgram:
    """Compile ``config`` for the space's target (Vulkan: ``vulkan_target``, else the
    SPIR-V target of the device the space's limits came from, else the default Vulkan
    device's).

    Raises:
        ScheduleError: iree-compile rejected the config.
    """
    if space.target == "iree-vulkan" and vulkan_target is None:
        vulkan_target = spirv_target(space.limits)
    text = annotated_mlir(space, config)
    flags = compile_flags(space.target, vulkan_target=vulkan_target or "llvmpipe")
    module = compile_mlir(text, flags)
    tensors = tuple(t for t in space.workload.tensor_specs() if t.role != "scratch")
    return IreeProgram(module=module, driver=DRIVERS[space.target], tensors=tensors, mlir=text)
