"""Build with real TVM codegen and measure on the real OpenCL device."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import pytest

from autosched.measure.build import build
from autosched.measure.program import KernelProgram
from autosched.measure.runner import OpenCLRunner, TimingOptions, time_one_call
from autosched.measure.worker import MeasureWorker, pocl_pinning
from autosched.ops import workload
from autosched.space.config import Config
from autosched.space.select import make_space
from tests.conftest import make_data

FAST = TimingOptions(warmup=0, min_repeats=2, max_repeats=5, min_time_s=0.0)


@pytest.fixture(scope="module")
def worker(device):
    with MeasureWorker(device, timeout_s=20) as w:
        yield w


CONFIGS = {
    "default": None,
    "register_tile_vec16": {"tile.i": (1, 8), "tile.j": (1, 32), "tile.k": (2, 2), "vec": 16},
    "threads_and_local_staging": {
        "tile.i": (4, 2),
        "tile.j": (4, 4),
        "tile.k": (8, 2),
        "vec": 4,
        "stage.A": "local",
        "stage.B": "local",
    },
    "unfused_epilogue": {
        "tile.i": (2, 4),
        "tile.j": (2, 8),
        "tile.k": (4, 4),
        "vec": 8,
        "fuse": False,
    },
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("epilogue", ["none", "bias_relu"])
def test_built_kernels_compute_the_reference(device, worker, name, epilogue):
    wl = workload("matmul", M=64, N=96, K=48, epilogue=epilogue)
    space = make_space(wl, limits=device.limits)
    changes = dict(CONFIGS[name] or {})
    if epilogue == "none":
        changes.pop("fuse", None)
    config = space.default().replace(**changes)
    assert space.check(config) is None
    program = build(space, config)
    assert "__kernel" in program.source
    outcome = worker.measure(program, make_data(wl), FAST)
    assert outcome.status == "ok", outcome.error
    assert len(outcome.latencies) >= 2 and all(t > 0 for t in outcome.latencies)


def test_a_short_kernel_is_timed_over_launches_queued_back_to_back(device, worker):
    # One launch of a kernel of microseconds on PoCL's CPU device runs on one core or
    # on two by whether its second worker thread happens to be awake: a sample is
    # launches queued back to back for at least a millisecond, their mean per launch.
    wl = workload("matmul", M=64, N=96, K=48)
    space = make_space(wl, limits=device.limits)
    program = build(space, space.default())
    outcome = worker.measure(program, make_data(wl), FAST)
    assert outcome.status == "ok", outcome.error
    assert outcome.calls_per_sample > 1
    per_sample = outcome.calls_per_sample * min(outcome.latencies)
    assert per_sample >= 0.2 * OpenCLRunner.MIN_SAMPLE_S  # launches queue faster than one blocks
    # A kernel longer than a sample is one launch per sample.
    big = workload("matmul", M=512, N=512, K=512)
    space = make_space(big, limits=device.limits)
    outcome = worker.measure(build(space, space.default()), make_data(big), FAST)
    assert outcome.status == "ok", outcome.error
    assert outcome.calls_per_sample == 1 or min(outcome.latencies) < OpenCLRunner.MIN_SAMPLE_S


def test_one_slow_call_does_not_set_how_many_calls_make_a_sample():
    # CI: a kernel of 0.2 ms a launch took over 1 ms in its one timed launch, and was
    # timed one launch per sample. The plan takes the fastest of a few calls.
    took = []

    def call(first_s=0.005, then_s=0.0001):
        took.append(time.perf_counter())
        time.sleep(first_s if len(took) == 1 else then_s)

    estimate = time_one_call(call, least_s=1e-3)
    assert len(took) == 3 and estimate < 1e-3
    took.clear()  # a call longer than ten samples together is timed once
    assert time_one_call(lambda: call(0.02, 0.02), least_s=1e-3) >= 0.02 and len(took) == 1


def test_launch_geometry_comes_from_tvm(device):
    wl = workload("matmul", M=64, N=64, K=64, epilogue="bias")
    space = make_space(wl, limits=device.limits)
    fused = build(space, space.default().replace(**{"tile.i": (2, 4), "tile.j": (4, 8), "vec": 4}))
    (k,) = fused.kernels
    assert k.local_size == (8,) and k.global_size == (8 * (64 // 8) * (64 // 32),)
    assert sorted(fused.tensors[i].name for i in k.args) == ["A", "B", "D", "bias"]
    unfused = build(space, space.default().replace(fuse=False))
    assert len(unfused.kernels) == 2  # matmul, then the epilogue reading the scratch C
    assert [t.role for t in unfused.tensors] == ["input", "input", "input", "output", "scratch"]
    assert unfused.tensors[unfused.kernels[1].args[0]].name == "C"


def _with_kernel(program: KernelProgram, source: str) -> KernelProgram:
    launch = dataclasses.replace(program.kernels[0], global_size=(1,), local_size=(1,))
    return KernelProgram(source=source, kernels=(launch,), tensors=program.tensors)


def test_hanging_wrong_and_crashing_kernels_are_classified_and_tuning_goes_on(device):
    wl = workload("matmul", M=32, N=32, K=32)
    space = make_space(wl, limits=device.limits)
    good = build(space, space.default())
    data = make_data(wl)
    names = [good.tensors[i].name for i in good.kernels[0].args]
    params = ", ".join(f"__global float* restrict {n}" for n in names)
    hang = _with_kernel(
        good, f"__kernel void main_kernel({params}) {{ while (A[0] < 1e30f) {{ C[1] = A[0]; }} }}"
    )
    wrong = _with_kernel(
        good,
        f"__kernel void main_kernel({params}) {{ for (int i = 0; i < 1024; ++i) C[i] = 1.0f; }}",
    )
    crash = _with_kernel(
        good, f"__kernel void main_kernel({params}) {{ ((__global float*)16)[0] = 1.0f; }}"
    )
    broken = _with_kernel(good, "__kernel void main_kernel(__global float* A) { syntax error }")
    with MeasureWorker(device, timeout_s=5) as w:
        assert w.measure(hang, data, FAST).status == "timeout"
        assert w.measure(good, data, FAST).status == "ok"  # a fresh worker took over
        out = w.measure(wrong, data, FAST)
        assert out.status == "wrong_result" and "differ" in out.error
        crashed = w.measure(crash, data, FAST)
        assert crashed.status == "run_error", crashed
        assert w.measure(broken, data, FAST).status == "build_error"
        assert w.measure(good, data, FAST).status == "ok"


def test_a_kernel_that_skips_outputs_is_caught(device):
    wl = workload("matmul", M=32, N=32, K=32)
    space = make_space(wl, limits=device.limits)
    good = build(space, space.default())
    short = dataclasses.replace(good.kernels[0], global_size=(good.kernels[0].global_size[0] // 2,))
    half = KernelProgram(good.source, (short,), good.tensors)
    with MeasureWorker(device, timeout_s=20) as w:
        assert w.measure(half, make_data(wl), FAST).status == "wrong_result"


def test_invalid_config_is_rejected_before_build(device):
    from autosched.tuner import _build_task

    wl = workload("matmul", M=64, N=64, K=64)
    space = make_space(wl, limits=device.limits)
    bad = space.default().replace(vec=16)
    res = _build_task(wl.to_json(), bad.to_json(), device.limits, "opencl")
    assert res.status == "invalid" and "vec=16" in res.error and res.program is None
    assert Config.from_json(bad.to_json()) == bad


def test_work_folders_of_killed_tuners_are_swept(device, tmp_path):
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    # A folder owned by a process that no longer exists, as a SIGKILLed tuner leaves it.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = Path(tempfile.gettempdir()) / f"autosched-measure-{dead.stdout.strip()}-x"
    stale.mkdir()
    mine = Path(tempfile.gettempdir()) / f"autosched-measure-{os.getpid()}-keep"
    mine.mkdir(exist_ok=True)
    try:
        with MeasureWorker(device):
            assert not stale.exists()
            assert mine.exists()
    finally:
        mine.rmdir()


def test_driver_and_compiler_output_goes_to_the_log_not_the_terminal(device, caplog, capfd):
    """PoCL's clang prints "N warnings generated." straight to fd 2 of the process that
    builds. The measurement child catches it and hands it to the parent's log (shown
    with ``-v``); nothing reaches the terminal."""
    wl = workload("matmul", M=32, N=32, K=32)
    space = make_space(wl, limits=device.limits)
    good = build(space, space.default())
    noisy = dataclasses.replace(good, source="#warning autosched-test-warning\n" + good.source)
    with caplog.at_level(logging.INFO, logger="autosched.measure.worker"):
        with MeasureWorker(device, timeout_s=30) as w:
            assert w.measure(noisy, make_data(wl), FAST).status == "ok"
    out, err = capfd.readouterr()
    assert "warning" not in out + err, out + err
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "warning generated" in logged or "warnings generated" in logged, logged


def test_registers_per_group_enter_the_fingerprint_only_where_the_driver_says(device):
    """PoCL says nothing of registers: its fingerprint, and so its key and every record
    already made, are as before. A driver that says (NVIDIA) has it in the fingerprint,
    and the space's limits read it back from a record's device."""
    import dataclasses

    assert device.registers_per_group == 0
    assert "registers_per_group" not in device.fingerprint()
    nv = dataclasses.replace(device, registers_per_group=65536)
    assert nv.fingerprint()["registers_per_group"] == 65536
    assert nv.key() != device.key()
    assert nv.limits.registers_per_group == 65536 and device.limits.registers_per_group == 0
    assert device.subgroup_size == 0 and "subgroup_size" not in device.fingerprint()
    warp = dataclasses.replace(nv, subgroup_size=32)
    assert warp.fingerprint()["subgroup_size"] == 32 and warp.limits.subgroup_size == 32


def test_a_device_s_key_stays_while_the_installed_packages_change(device, monkeypatch):
    """The TVM a process runs is the one it loaded: its version, and so every device
    key, is read once, not afresh from the installed packages' metadata (a tune whose
    virtual environment was installed again beside it, at the same path, changed its
    OpenCL device's key between two batches: its finalists went to a device no session
    had, and the tune ended in a traceback)."""
    import importlib.metadata

    from autosched.measure.cpu import host_cpu

    before = (device.key("opencl"), host_cpu().key("llvm"))

    def uninstalled(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", uninstalled)
    assert (device.key("opencl"), host_cpu().key("llvm")) == before


def test_a_gpu_driver_that_no_icd_file_registers_is_named_with_the_fix(tmp_path):
    """A container with NVIDIA's OpenCL library mounted but no /etc/OpenCL/vendors entry:
    OpenCL lists only the CPU platform, and autosched says what to write where."""
    from autosched.measure.device import unregistered_drivers

    lib = tmp_path / "libnvidia-opencl.so.1"
    lib.write_bytes(b"")
    (hint,) = unregistered_drivers(["Portable Computing Language"], dirs=(str(tmp_path),))
    assert str(lib) in hint and "/etc/OpenCL/vendors/nvidia.icd" in hint
    assert (
        unregistered_drivers(["NVIDIA CUDA", "Portable Computing Language"], (str(tmp_path),)) == []
    )
    assert unregistered_drivers(["Portable Computing Language"], dirs=(str(tmp_path / "no"),)) == []


def _threads_cpus(pid: int) -> list[str]:
    """Cpus_allowed_list of each thread of process ``pid``."""
    out = []
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        line = [x for x in status.read_text().splitlines() if x.startswith("Cpus_allowed_list")]
        out.append(line[0].split(":")[1].strip())
    return out


def test_pocl_cpu_threads_are_pinned_unless_the_user_or_the_cpuset_says_otherwise(
    device, monkeypatch
):
    wl = workload("matmul", M=64, N=64, K=64)
    space = make_space(wl, limits=device.limits)
    program, data = build(space, space.default()), make_data(wl)
    own = os.sched_getaffinity(0)
    assert len(own) > 1 and device.compute_units > 1  # PoCL on a multi-core CPU
    mask = _threads_cpus(os.getpid())[0]  # this process's own list, as the kernel writes it
    with MeasureWorker(device, timeout_s=20) as w:
        assert w.measure(program, data, FAST).status == "ok"
        threads = _threads_cpus(w._proc.pid)
    # PoCL's thread i runs on CPU i alone; the child's other threads keep the whole mask.
    assert {str(i) for i in range(device.compute_units)} <= set(threads) | {mask}, threads
    monkeypatch.setenv("POCL_AFFINITY", "0")
    with MeasureWorker(device, timeout_s=20) as w:
        assert w.measure(program, data, FAST).status == "ok"
        assert set(_threads_cpus(w._proc.pid)) == {mask}
    monkeypatch.delenv("POCL_AFFINITY")
    # A narrower cpuset than PoCL's threads would need: no pinning asked.
    os.sched_setaffinity(0, {max(own)})
    try:
        narrow = pocl_pinning(device)
    finally:
        os.sched_setaffinity(0, own)
    assert narrow == {}
    assert pocl_pinning(device) == {"POCL_AFFINITY": "1"}
