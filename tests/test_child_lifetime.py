"""A measurement child is retired after PROGRAMS_PER_CHILD programs, on both targets.

TVM's runtime keeps every llvm library it loads mapped and PoCL every OpenCL program's
shared object; a child that ran an overnight job's candidates would reach the kernel's
limit on mappings (vm.max_map_count) and record every later candidate as a build error
(an llvm child: its 13,026th). Here the limit is lowered to three programs and the
child's own memory map is read while it runs: it never holds more than three kernels,
every candidate is measured, and a fresh child takes over where one retires.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

import autosched.measure.worker as worker_module
from autosched.measure.build import build
from autosched.measure.cpu import host_cpu
from autosched.measure.device import select_device
from autosched.measure.program import KernelProgram
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import workload
from autosched.space.select import make_space
from tests.conftest import make_data

FAST = TimingOptions(warmup=0, min_repeats=1, max_repeats=2, min_time_s=0.0)
RUNS = 7
LIMIT = 3


def _kernels_mapped(pid: int, folder: str) -> int:
    """Kernel files from ``folder`` (the worker's) that process ``pid`` has mapped."""
    files = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(folder):
            files.add(fields[5])
    return len(files)


def _programs(target: str):
    """``RUNS`` distinct programs of one small matmul for ``target`` and their data."""
    wl = workload("matmul", M=32, N=32, K=32)
    device = host_cpu() if target == "llvm" else select_device()
    space = make_space(wl, target=target, limits=device.limits)
    program = build(space, space.default())
    if target == "llvm":  # a library file per run: the same bytes load as another one
        programs = [program] * RUNS
    else:  # each with a kernel of its own: PoCL compiles and loads a shared object apiece
        programs = [
            dataclasses.replace(
                program,
                source=f"{program.source}\n__kernel void run_{i}(__global float* x) {{ x[0] = {i}; }}\n",
            )
            for i in range(RUNS)
        ]
        assert isinstance(program, KernelProgram)
    return device, programs, make_data(wl)


@pytest.mark.parametrize("target", ["llvm", "opencl"])
def test_a_child_is_retired_after_its_programs_and_never_holds_more(target, monkeypatch):
    monkeypatch.setattr(worker_module, "PROGRAMS_PER_CHILD", LIMIT)
    device, programs, data = _programs(target)
    pids, held, files, folders = [], [], [], []
    with MeasureWorker(device, timeout_s=60) as w:
        for program in programs:
            outcome = w.measure(program, data, FAST)
            assert outcome.status == "ok", outcome.error
            folder = w._cache_dir
            folders.append(folder)
            if w._proc is not None:  # still running: what it holds now
                pids.append(w._proc.pid)
                held.append(_kernels_mapped(w._proc.pid, folder))
            files.append(
                sum(1 for f in Path(folder).rglob("*") if f.is_file() and "output" not in f.name)
            )
        retired, killed = w.retired, w.restarts
    # Runs 3 and 6 retire their child; 1-2, 4-5 and 7 leave one running, three in all,
    # each holding only the kernels it ran itself.
    assert held == [1, 2, 1, 2, 1], held
    assert len(set(pids)) == 3, pids
    assert (retired, killed) == (2, 0)  # retired, never killed
    # The retired child's kernels leave the disk with it (PoCL's cache of each program:
    # its bitcode, shared object and a time stamp; an llvm library is deleted once loaded):
    # the next child has a new folder, and the old one is gone.
    assert files[2] == files[5] == 0, files
    assert len(set(folders)) == 3 and not any(os.path.exists(f) for f in set(folders[:5])), folders
    if target == "opencl":
        assert 0 < files[0] < files[1] and files[3:5] == files[:2] == [files[6], files[1]], files
    else:
        assert not any(files), files
