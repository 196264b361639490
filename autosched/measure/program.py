"""What the build step hands to the runner: plain, picklable data, no TVM objects.

A program says which runner it needs through its ``kind``: ``"opencl"`` programs are
OpenCL C launched through pyopencl, ``"llvm"`` programs are shared libraries from
TVM's LLVM code generation, called through TVM's runtime on the host CPU; ``"iree"``
programs are IREE modules run through ``iree.runtime``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

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

    kind: ClassVar[str] = "opencl"

    source: str
    kernels: tuple[KernelLaunch, ...]
    tensors: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class CpuProgram:
    """A shared library built by TVM for the host CPU, as bytes.

    Bytes rather than a path: the program crosses from a build process to the
    measurement process, and a file owned by neither would have no one to delete it.

    Attributes:
        library: the shared object (``Executable.export_library``), to be written to a
            file and loaded with ``tvm.runtime.load_module``.
        entry: the function to call; it takes ``tensors`` in order.
        tensors: the arguments, as in :class:`KernelProgram`.
        target: the TVM target it was compiled for (kind, mcpu, num-cores).
        flush: flush every argument but the first from the CPU caches before each
            timed call (``Workload.cold_operands``: a model's weights come from memory).
    """

    kind: ClassVar[str] = "llvm"

    library: bytes = field(repr=False)
    entry: str
    tensors: tuple[TensorSpec, ...]
    target: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    flush: bool = False


@dataclass(frozen=True)
class IreeProgram:
    """An IREE module (``.vmfb``) for one runtime driver, as bytes.

    Attributes:
        module: the compiled module; ``@main`` takes the inputs of ``tensors`` in order
            and returns the outputs.
        driver: the IREE runtime driver it runs on (``local-task``, ``vulkan``).
        tensors: the workload's inputs and outputs, as in :class:`KernelProgram`.
        mlir: the annotated MLIR it was compiled from (for the record and for debugging).
        repeated: the same module with every dispatch run ``repeat`` times per call
            (``--iree-hal-benchmark-dispatch-repeat-count``), or None: where one call
            costs more than its kernels (a GPU), the kernels' time is the difference
            between the two modules' calls (:mod:`autosched.measure.iree_runner`).
        repeat: the dispatches per call of ``repeated``.
    """

    kind: ClassVar[str] = "iree"

    module: bytes = field(repr=False)
    driver: str
    tensors: tuple[TensorSpec, ...]
    mlir: str = field(default="", repr=False, hash=False, compare=False)
    repeated: bytes | None = field(default=None, repr=False)
    repeat: int = 1


Program = KernelProgram | CpuProgram | IreeProgram
