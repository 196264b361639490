"""What the build step hands to the runner: plain, picklable data, no TVM objects."""

from __future__ import annotations

from dataclasses import dataclass

from autosched.ops.base import TensorSpec


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of a program, in launch order.

    ``args`` index into ``KernelProgram.tensors``; sizes are OpenCL NDRange sizes
    (global = groups * local, per dimension, dimension 0 first).
    """

    name: str
    args: tuple[int, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


@dataclass(frozen=True)
class KernelProgram:
    """OpenCL C source plus everything needed to launch it on any OpenCL runtime."""

    source: str
    kernels: tuple[KernelLaunch, ...]
    tensors: tuple[TensorSpec, ...]
