"""Run programs with every buffer against an inaccessible page (a child process).

``python tests/guarded_buffers.py PROGRAMS.pkl end|start``: each buffer's bytes end
(``end``) or start (``start``) at a page mapped ``PROT_NONE``. An OpenCL program gets
them in place (``CL_MEM_USE_HOST_PTR``: PoCL's CPU device runs kernels on the host
memory itself), an llvm one as DLPack views (TVM's tensors on them, no copy). A kernel
that reads or writes one element past its buffer (or before it) then takes a
segmentation fault, which the parent sees as the child's exit status. The child prints
``RUN i`` before and ``OK i`` after program ``i``, so the parent knows which one
faulted. A driver that copies such buffers would check nothing: the tests run a kernel
that reads past its buffer first and expect the fault.
"""

from __future__ import annotations

import ctypes
import mmap
import pickle
import sys

import numpy as np

PAGE = mmap.PAGESIZE
TVM_ALIGN = 64  # bytes: TVM's kAllocAlignment
_LIBC = ctypes.CDLL(None, use_errno=True)


def _guarded(nbytes: int, mode: str, keep: list, align: int = 1) -> np.ndarray:
    """``nbytes`` of zeros (an anonymous mapping) against an inaccessible page: ending at
    most ``align - 1`` bytes before it (``end``: the start aligned to ``align``) or
    starting right after it (``start``)."""
    pages = -(-nbytes // PAGE) + 2  # the data's pages and one inaccessible page each side
    region = mmap.mmap(-1, pages * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    for page in (0, pages - 1):
        if _LIBC.mprotect(ctypes.c_void_p(base + page * PAGE), PAGE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    start = ((pages - 1) * PAGE - nbytes) // align * align if mode == "end" else PAGE
    keep.append(region)
    return np.frombuffer(region, np.uint8, nbytes, start)


def _queue(device_index: tuple[int, int]):
    import pyopencl as cl

    platform, index = device_index
    return cl.CommandQueue(cl.Context([cl.get_platforms()[platform].get_devices()[index]]))


def _run_opencl(program, queue, mode: str, keep: list) -> None:
    import pyopencl as cl

    ctx = queue.context
    built = cl.Program(ctx, program.source).build()
    buffers = []
    for tensor in program.tensors:
        host = _guarded(tensor.nbytes, mode, keep)
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR
        buffers.append(cl.Buffer(ctx, flags, hostbuf=host))
    for k in program.kernels:
        kernel = getattr(built, k.name)
        kernel(queue, k.global_size, k.local_size, *[buffers[a] for a in k.args])
    queue.finish()


def _run_llvm(program, mode: str, keep: list) -> None:
    import tempfile
    from pathlib import Path

    import tvm
    import tvm_ffi

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.so"
        path.write_bytes(program.library)
        module = tvm.runtime.load_module(str(path))
    args = []
    for tensor in program.tensors:
        # TVM's kernels take their buffers 64-byte aligned (LLVM may use aligned vector
        # loads), as its allocator gives them: a read past the end shorter than the gap
        # this leaves goes unseen.
        host = _guarded(tensor.nbytes, mode, keep, align=TVM_ALIGN)
        args.append(tvm_ffi.from_dlpack(host.view(np.dtype(tensor.dtype)).reshape(tensor.shape)))
    module[program.entry](*args)


def main(path: str, mode: str) -> None:
    device_index, programs = pickle.load(open(path, "rb"))
    keep: list = []
    queue = None  # one OpenCL context for all the programs
    for i, program in enumerate(programs):
        print("RUN", i, flush=True)
        if program.kind == "llvm":
            _run_llvm(program, mode, keep)
        else:
            queue = queue or _queue(device_index)
            _run_opencl(program, queue, mode, keep)
        print("OK", i, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
