"""Run OpenCL programs with every buffer against an inaccessible page (a child process).

``python tests/guarded_buffers.py PROGRAMS.pkl end|start``: each buffer's bytes end
(``end``) or start (``start``) at a page mapped ``PROT_NONE`` and are handed to the
driver in place (``CL_MEM_USE_HOST_PTR``). PoCL's CPU device runs kernels on the host
memory itself, so a kernel that reads or writes one element past its buffer (or before
it) takes a segmentation fault, which the parent sees as the child's exit status. The
child prints ``RUN i`` before and ``OK i`` after program ``i``, so the parent knows which
one faulted. A driver that copies such buffers would check nothing: the tests run a
kernel that reads past its buffer first and expect the fault.
"""

from __future__ import annotations

import ctypes
import mmap
import pickle
import sys

import numpy as np

PAGE = mmap.PAGESIZE


def _guarded(nbytes: int, mode: str, keep: list) -> np.ndarray:
    pages = -(-nbytes // PAGE) + 2  # the data's pages and one inaccessible page each side
    region = mmap.mmap(-1, pages * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    for page in (0, pages - 1):
        if libc.mprotect(ctypes.c_void_p(base + page * PAGE), PAGE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    start = (pages - 1) * PAGE - nbytes if mode == "end" else PAGE
    keep.append(region)
    return np.frombuffer(region, np.uint8, nbytes, start)


def main(path: str, mode: str) -> None:
    import pyopencl as cl

    device_index, programs = pickle.load(open(path, "rb"))
    platform, index = device_index
    ctx = cl.Context([cl.get_platforms()[platform].get_devices()[index]])
    queue = cl.CommandQueue(ctx)
    keep: list = []
    for i, program in enumerate(programs):
        print("RUN", i, flush=True)
        built = cl.Program(ctx, program.source).build()
        buffers = []
        for tensor in program.tensors:
            host = _guarded(tensor.nbytes, mode, keep)
            host[:] = 0
            flags = cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR
            buffers.append(cl.Buffer(ctx, flags, hostbuf=host))
        for k in program.kernels:
            kernel = getattr(built, k.name)
            kernel(queue, k.global_size, k.local_size, *[buffers[a] for a in k.args])
        queue.finish()
        print("OK", i, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
