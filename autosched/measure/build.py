"""Build: config -> scheduled TVM module -> a program the runner can load.

OpenCL: OpenCL C source and launch geometry. The geometry is read from TVM's lowered
device functions (their ``thread_extent`` attributes and parameters), never parsed out
of the generated C; the source keeps a reduction's partial results in a vector register
(:mod:`autosched.measure.opencl_source`). llvm: a shared library compiled for the host
CPU, as bytes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autosched.errors import ScheduleError
from autosched.iree import IREE_TARGETS
from autosched.measure.opencl_source import vector_accumulators
from autosched.measure.program import CpuProgram, KernelLaunch, KernelProgram, Program
from autosched.ops.base import TensorSpec
from autosched.space.config import Config
from autosched.space.schedule import param_names, schedule
from autosched.space.space import Space

if TYPE_CHECKING:
    import tvm


@dataclass(frozen=True)
class BuildResult:
    """A built program, or an error kind (``invalid`` or ``build_error``) and message."""

    program: Program | None
    status: str = "ok"
    error: str = ""
    seconds: float = 0.0


def build(space: Space, config: Config) -> Program:
    """Build ``config`` for the space's target.

    Returns a :class:`KernelProgram` (OpenCL), a :class:`CpuProgram` (llvm) or an
    :class:`IreeProgram` (the IREE targets). Raises
    ScheduleError (invalid) or other errors (build).
    """
    if space.target == "llvm":
        return _build_cpu(space, config)
    if space.target in IREE_TARGETS:
        from autosched.iree.build import build_iree

        return build_iree(space, config)  # type: ignore[arg-type]
    mod = schedule(space, config)
    tensors = space.workload.tensor_specs(scratch=space.scratch(config))
    names = param_names(mod)
    assert names == [t.name for t in tensors], (names, tensors)
    return opencl_program(mod, tensors)


def opencl_program(
    mod: tvm.IRModule, tensors: Sequence[TensorSpec], *, target: dict[str, Any] | None = None
) -> KernelProgram:
    """Lower a scheduled TIR module to OpenCL C plus its launch geometry.

    ``mod`` holds one PrimFunc whose buffer parameters are named like ``tensors``
    (TE placeholders and computes keep their names through ``create_prim_func``), in
    any order; each kernel's arguments are mapped to ``tensors`` by name. The module
    can come from autosched's own schedule or from elsewhere (MetaSchedule, say).
    A global buffer the schedule allocates between two kernels (the zero-padded copy of
    an input that ``pad_einsum`` makes) becomes a scratch argument after ``tensors``.

    Args:
        mod: a scheduled ``IRModule`` (threads bound, as OpenCL needs).
        tensors: the program's arguments, in the order the runner allocates them.
        target: the OpenCL target as a dict (default ``{"kind": "opencl"}``); the host
            is always llvm.

    Raises:
        ScheduleError: the module lowers to no single device module, or a kernel takes
            an argument that is not one of ``tensors``.
    """
    import tvm
    from tvm.target import Target
    from tvm.tirx.build import codegen_build, split_host_device_mods

    target_obj = Target(dict(target or {"kind": "opencl"}))
    allocated = _global_allocations(mod)
    mod = tvm.tirx.transform.BindTarget(target_obj.with_host(Target({"kind": "llvm"})))(mod)
    pipeline, _finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(target_obj)
    mod = pipeline(mod)
    _host, device_mods = split_host_device_mods(mod)
    if len(device_mods) != 1:
        raise ScheduleError(f"expected one device module, got {len(device_mods)}")
    ((dev_target, dev_mod),) = device_mods.items()
    dev_mod = finalize_device()(dev_mod)

    tensors = list(tensors)
    names = [t.name for t in tensors]
    launches = []
    funcs = sorted(dev_mod.functions.items(), key=lambda kv: _launch_order(kv[0].name_hint))
    for gv, func in funcs:
        args = []
        for p in func.params:
            pname = str(p.name).removesuffix("_ptr")
            if pname not in names and pname in allocated:
                tensors.append(allocated[pname])
                names.append(pname)
            if pname not in names:
                raise ScheduleError(f"kernel {gv.name_hint} takes {p.name}, which is not a buffer")
            args.append(names.index(pname))
        extents: dict[str, int] = {}
        _thread_extents(func.body, extents)
        launches.append(_launch(gv.name_hint, tuple(args), extents))
    source = vector_accumulators(codegen_build(dev_mod, dev_target).inspect_source())
    return KernelProgram(source=source, kernels=tuple(launches), tensors=tuple(tensors))


def _build_cpu(space: Space, config: Config) -> CpuProgram:
    import tvm

    from autosched.measure.cpu import host_cpu

    mod = schedule(space, config)
    target = host_cpu().tvm_target()
    executable = tvm.compile(mod, target=tvm.target.Target(target))
    tensors = space.workload.tensor_specs(scratch=space.scratch(config))
    names = param_names(mod)
    assert names == [t.name for t in tensors], (names, tensors)
    with tempfile.TemporaryDirectory(prefix="autosched-build-") as tmp:
        path = Path(tmp) / "kernel.so"
        executable.export_library(str(path))  # links with the system C compiler
        library = path.read_bytes()
    return CpuProgram(
        library=library,
        entry="main",
        tensors=tuple(tensors),
        target=target,
        flush=space.workload.flush_operands(space.limits),
    )


def _global_allocations(mod: tvm.IRModule) -> dict[str, TensorSpec]:
    """Buffers the root block of ``mod``'s main allocates in global memory, as scratch."""
    root = getattr(mod["main"].body, "block", None)  # an SBlockRealize before lowering
    found = {}
    for buf in getattr(root, "alloc_buffers", ()):
        if buf.scope() == "global":
            shape = tuple(int(x) for x in buf.shape)
            found[str(buf.name)] = TensorSpec(str(buf.name), shape, str(buf.dtype), "scratch")
    return found


def _launch_order(name: str) -> int:
    # TVM names kernels main_kernel, main_kernel_1, ... in launch order.
    tail = name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _thread_extents(stmt, out: dict[str, int]) -> None:
    from tvm.tirx import stmt as S

    if isinstance(stmt, S.AttrStmt) and stmt.attr_key == "thread_extent":
        out[str(stmt.node.thread_tag)] = int(stmt.value)
    if isinstance(stmt, S.SeqStmt):
        for child in stmt.seq:
            _thread_extents(child, out)
    for field in ("body", "then_case", "else_case"):
        child = getattr(stmt, field, None)
        if isinstance(child, S.Stmt):
            _thread_extents(child, out)


def _launch(name: str, args: tuple[int, ...], extents: dict[str, int]) -> KernelLaunch:
    dims = max([int(k[-1] == "y") + 2 * int(k[-1] == "z") for k in extents] + [0]) + 1
    groups = [extents.get(f"blockIdx.{'xyz'[d]}", 1) for d in range(dims)]
    local = [extents.get(f"threadIdx.{'xyz'[d]}", 1) for d in range(dims)]
    return KernelLaunch(
        name=name,
        args=args,
        global_size=tuple(g * t for g, t in zip(groups, local)),
        local_size=tuple(local),
    )
