"""No kernel autosched builds reads or writes past its buffers (OpenCL and llvm).

A kernel that does may well run (on PoCL the host's memory is the device's; on the host
the next allocation is often mapped), but it is undefined behaviour: a farm's GPU may
fault or read garbage, and a model's build may read past an activation's end. Each
buffer here ends (or starts) at an inaccessible page (tests/guarded_buffers.py, a child
process), so an access past it is a segmentation fault. Random configs of every space
family, on shapes that leave guarded tiles, vector tails and padding. (The row-wise
reductions' rows past the last read the input's next rows until 2026-12-05, on both
targets: 8 of 52 OpenCL draws faulted.)
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from autosched.measure.build import build
from autosched.measure.cpu import host_cpu
from autosched.measure.program import CpuProgram, KernelLaunch, KernelProgram
from autosched.ops import workload
from autosched.ops.base import TensorSpec
from autosched.space.select import make_space
from tests.test_rowwise import _masked_softmax

CHILD = Path(__file__).with_name("guarded_buffers.py")

WORKLOADS = {
    "matmul_prime": lambda: workload("matmul", M=127, N=1000, K=333),
    "matmul_odd": lambda: workload("matmul", M=251, N=509, K=127),
    "conv2d_resnet": lambda: workload("conv2d", n=1, c=64, h=56, w=56, k=64, r=3, s=3, pad=1),
    "conv2d_7x7": lambda: workload("conv2d", n=1, c=512, h=7, w=7, k=512, r=3, s=3, pad=1),
    "dense": lambda: workload("dense", m=197, n=768, k=768),
    "batch_matmul": lambda: workload("batch_matmul", b=6, m=197, n=64, k=197),
    "depthwise": lambda: workload(
        "depthwise_conv2d", n=1, c=96, h=28, w=28, r=3, s=3, pad=1, stride=2
    ),
    "softmax": lambda: workload("softmax", rows=37, cols=197),
    "layernorm": lambda: workload("layernorm", rows=11, cols=100),
    "reduce": lambda: workload("reduce", rows=7, cols=30, kind="max"),
    "elementwise": lambda: workload("elementwise", rows=37, cols=197, ops="add+gelu"),
    "masked_softmax": lambda: _masked_softmax((1, 3, 5, 23)),
}
PER_WORKLOAD = 2


def _run(device, programs, mode: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / f"programs-{mode}.pkl"
    path.write_bytes(pickle.dumps(((device.platform_index, device.device_index), programs)))
    return subprocess.run(
        [sys.executable, str(CHILD), str(path), mode], capture_output=True, text=True, timeout=600
    )


def _last_run(stdout: str) -> int:
    runs = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("RUN ")]
    return runs[-1] if runs else -1


N = 1024
TENSORS = (TensorSpec("x", (N,), "float32", "input"), TensorSpec("y", (N,), "float32", "output"))


def _opencl_copy(shift: int, clamp: bool) -> KernelProgram:
    """``y[i] = x[i + shift]``, the index clamped into the buffer or not."""
    index = f"clamp(i + {shift}, 0, {N - 1})" if clamp else f"i + {shift}"
    source = (
        "__kernel void k(__global float* x, __global float* y) {\n"
        f"  int i = get_global_id(0);\n  y[i] = x[{index}];\n}}\n"
    )
    return KernelProgram(source, (KernelLaunch("k", (0, 1), (N,), (64,)),), TENSORS)


def _llvm_copy(shift: int, clamp: bool) -> CpuProgram:
    """The same through TVM's llvm (TIR checks no index)."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def copy(x: T.Buffer((N,), "float32"), y: T.Buffer((N,), "float32")):
        for i in range(N):
            y[i] = x[T.max(T.min(i + shift, N - 1), 0)] if clamp else x[i + shift]

    executable = tvm.compile(tvm.IRModule({"main": copy}), target=host_cpu().tvm_target())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "copy.so"
        executable.export_library(str(path))
        return CpuProgram(library=path.read_bytes(), entry="main", tensors=TENSORS)


@pytest.mark.parametrize("target", ["opencl", "llvm"])
@pytest.mark.parametrize(("mode", "shift"), [("end", 1), ("start", -1)])
def test_a_kernel_reading_past_its_buffer_faults(device, tmp_path, mode, shift, target):
    """The check itself: one element past the end (or before the start) is a fault,
    and the same kernel with its index clamped into the buffer runs."""
    make = _llvm_copy if target == "llvm" else _opencl_copy
    ok = _run(device, [make(shift, clamp=True)], mode, tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    fault = _run(device, [make(shift, clamp=False)], mode, tmp_path)
    assert fault.returncode == -signal.SIGSEGV, (fault.returncode, fault.stderr[-2000:])


@pytest.mark.parametrize("target", ["opencl", "llvm"])
@pytest.mark.parametrize("mode", ["end", "start"])
def test_no_kernel_reads_or_writes_past_its_buffers(device, host, tmp_path, mode, target):
    rng = np.random.default_rng(0)
    limits = host.limits if target == "llvm" else device.limits
    labels, programs = [], []
    for name, make in WORKLOADS.items():
        wl = make()
        space = make_space(wl, target=target, limits=limits)
        configs = [c for c in space.sample(rng, 64) if space.check(c) is None][:PER_WORKLOAD]
        assert len(configs) == PER_WORKLOAD, name
        for config in configs:
            labels.append(f"{name} {config.to_json()}")
            programs.append(build(space, config))
    done = _run(device, programs, mode, tmp_path)
    faulted = labels[_last_run(done.stdout)] if done.returncode else None
    assert done.returncode == 0, (done.returncode, faulted, done.stderr[-2000:])
    assert done.stdout.count("OK ") == len(programs)
