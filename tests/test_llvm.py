"""The llvm target: TVM's LLVM code generation for the host CPU, measured through TVM's
runtime in the same killable worker; no OpenCL anywhere on this path."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import autosched
from autosched.errors import InvalidInputError
from autosched.measure.build import build
from autosched.measure.cpu import HostCPU, cpu_model_id, host_cpu
from autosched.measure.device import select_device
from autosched.measure.program import CpuProgram
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import workload
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits
from tests.conftest import make_data

FAST = TimingOptions(warmup=0, min_repeats=2, max_repeats=5, min_time_s=0.0)
QUICK = TimingOptions(warmup=1, min_repeats=3, max_repeats=30, min_time_s=0.02)
OPENCL_LIMITS = DeviceLimits(max_work_group_size=256, max_work_item_size=256, local_mem_bytes=32768)


@pytest.fixture(scope="module")
def cpu() -> HostCPU:
    return select_device(target="llvm")


@pytest.fixture(scope="module")
def worker(cpu):
    with MeasureWorker(cpu, timeout_s=30) as w:
        yield w


def test_the_host_cpu_is_the_llvm_device_and_its_fingerprint_names_the_compilers(cpu):
    import tvm

    assert isinstance(cpu, HostCPU) and select_device("host", target="llvm") is cpu
    fp = cpu.fingerprint("llvm")
    assert fp["target"] == "llvm" and fp["name"] and fp["type"] == "cpu"
    assert fp["mcpu"] == tvm.target.codegen.llvm_get_system_cpu()
    assert fp["compute_units"] == len(os.sched_getaffinity(0)) == cpu.limits.cores
    assert fp["llvm_version"] == str(tvm.target.codegen.llvm_version_major())
    assert fp["tvm_version"] and fp["autosched_version"] == autosched.__version__
    assert cpu.tvm_target() == {
        "kind": "llvm",
        "mcpu": fp["mcpu"],
        "num-cores": cpu.cores,
        "fast-math-reassoc": True,
    }
    assert len(cpu.key()) == 16 and cpu.key() == host_cpu().key("llvm")
    assert cpu.family() != cpu.key()
    with pytest.raises(InvalidInputError, match="accepted: host"):
        select_device("no-such-device", target="llvm")
    with pytest.raises(InvalidInputError, match="accepted: llvm"):
        cpu.fingerprint("opencl")
    with pytest.raises(InvalidInputError, match="does not serve target 'opencl'"):
        select_device(cpu, target="opencl")


def test_a_scalar_row_reduction_runs_in_vector_lanes_and_keeps_infinities(cpu):
    """A reduction the schedule leaves scalar (197 columns, which no vector width
    divides) is vectorised by LLVM under the host target's reassociation, and the sums
    and an attention mask's -inf come out as numpy's: the flag reorders adds, it
    assumes nothing about the values."""
    import re

    import tvm
    from tvm import te

    rows, cols = 64, 197
    x = te.placeholder((rows, cols), name="x")
    k = te.reduce_axis((0, cols), name="k")
    total = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="total")
    top = te.compute((rows,), lambda i: te.max(x[i, k], axis=k), name="top")
    mod = tvm.IRModule({"main": te.create_prim_func([x, total, top])})

    def build(target: dict):
        """The executable for ``target`` and the vector adds in its LLVM IR."""
        executable = tvm.compile(mod, target=tvm.target.Target(target))
        ir = executable.mod.inspect_source("ll")
        return executable, len(re.findall(r"fadd[^\n]*<\d+ x float>", ir))

    plain = {name: v for name, v in cpu.tvm_target().items() if name != "fast-math-reassoc"}
    assert build(plain)[1] == 0  # without it LLVM keeps the adds in order
    executable, adds = build(cpu.tvm_target())
    assert adds > 0
    xs = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    xs[::3, 100:] = -np.inf
    xs[1, :] = -np.inf
    dev = tvm.cpu(0)
    out = [tvm.runtime.tensor(np.zeros(rows, np.float32), dev) for _ in range(2)]
    executable["main"](tvm.runtime.tensor(xs, dev), *out)
    got_total, got_top = (o.numpy() for o in out)
    want = xs.astype(np.float64).sum(axis=1)
    finite = np.isfinite(want)
    assert np.all(np.isneginf(got_total[~finite])) and (~finite).sum() == 23
    np.testing.assert_allclose(got_total[finite], want[finite], rtol=0, atol=1e-4)
    # (A row of -inf alone has TVM's identity of max as its max, the lowest finite float.)
    some = np.isfinite(xs).any(axis=1)
    np.testing.assert_array_equal(got_top[some], xs.max(axis=1)[some])


def test_two_cpus_of_one_model_name_are_different_devices(cpu, monkeypatch):
    # A cloud VM calls a Zen 4 and a Zen 5 "AMD EPYC" alike: the CPU's family and
    # model numbers tell them apart, for the llvm device and for an OpenCL CPU device.
    assert cpu.model_id == cpu_model_id() == cpu.fingerprint()["model_id"] != ""
    other = dataclasses.replace(cpu, model_id=cpu.model_id + "0")
    assert other.key() != cpu.key() and other.family() != cpu.family()
    pocl = select_device(None)
    assert pocl.type == "cpu" and pocl.fingerprint()["host_cpu"] == cpu.model_id
    key, family = pocl.key(), pocl.family()
    monkeypatch.setattr("autosched.measure.device.cpu_model_id", lambda: cpu.model_id + "0")
    assert pocl.key() != key and pocl.family() != family
    # What /proc/cpuinfo says on x86 and on Arm.
    x86 = {"vendor_id": "AuthenticAMD", "cpu family": "26", "model": "2", "model name": "AMD EPYC"}
    arm = {"CPU implementer": "0x41", "CPU part": "0xd4f", "CPU variant": "0x0"}
    monkeypatch.setattr("autosched.measure.cpu._cpuinfo", lambda: x86)
    assert cpu_model_id.__wrapped__() == "AuthenticAMD family 26 model 2"
    monkeypatch.setattr("autosched.measure.cpu._cpuinfo", lambda: arm)
    assert cpu_model_id.__wrapped__() == "implementer 0x41 part 0xd4f variant 0x0"


def test_llvm_space_has_cpu_knobs_and_describes_every_config(cpu):
    wl = workload("matmul", M=512, N=512, K=512, epilogue="bias_relu")
    space = make_space(wl, target="llvm", limits=cpu.limits)
    names = {k.name for k in space.knobs}
    assert names == {
        "tile.i",
        "tile.j",
        "tile.k",
        "vec",
        "reduce_at",
        "tile_inner",
        "stage.A",
        "stage.B",
        "fuse",
    }
    assert (1, 16) in space.knob("tile.i").choices and 16 in space.knob("vec").choices
    assert set(space.knob("stage.B").choices) == {"global", "pack"}
    default = space.default()
    assert space.check(default) is None and space.threads(default) == 1
    # The names that mean the same on OpenCL are all there, so one cost model serves both.
    opencl = make_space(wl, limits=OPENCL_LIMITS)
    rng = np.random.default_rng(0)
    configs = [default, *space.sample(rng, 50)]
    for c in configs:
        assert space.check(c) is None
        feats = space.describe(c)
        assert set(opencl.describe(opencl.default())) <= set(feats)
        assert all(math.isfinite(v) for v in feats.values())
    assert space.check(default.replace(vec=16)) is not None  # vec must divide the tile


def test_a_fused_producer_read_in_place_is_described_as_inline(cpu):
    """A fused pad that is not packed (llvm) or staged (OpenCL) is computed in the main
    loop's reads, a bounds check per element: ResNet's NCHW conv ran such configs at
    8-33 GFLOP/s on a Zen 5 where a packed fused pad ran 250. Without its own feature
    the model blamed the fusion: over eight seeds of 64 trials (interleaved) the median
    best went from 222 to 249 GFLOP/s with it."""
    wl = workload("conv2d", n=1, c=64, h=56, w=56, k=64, r=3, s=3, stride=1, pad=1)
    for target, limits, staged in (
        ("llvm", cpu.limits, "pack"),
        ("opencl", OPENCL_LIMITS, "local"),
    ):
        space = make_space(wl, target=target, limits=limits)
        seen = set()
        for c in space.sample(np.random.default_rng(1), 400):
            fused, kept = c["fuse.pad"], c["stage.pad"] == staged
            assert space.describe(c)["inline_pad"] == float(fused and not kept), (target, c)
            seen.add((fused, kept))
        assert len(seen) == 4, (target, seen)


def test_llvm_register_tile_cap_is_the_cpu_register_file(cpu, worker):
    """AVX-512 holds 32 x 16 fp32 accumulators: a 7x64 tile of a 7x7x512 conv (28
    registers) is a config there, and computes the reference; an AVX2 register file
    (16 x 8) and an OpenCL work-item keep the 256 every device holds."""
    wl = workload("conv2d", n=1, c=32, h=7, w=7, k=128, r=3, s=3, pad=1, layout="NHWC")
    avx512 = dataclasses.replace(cpu.limits, vector_lanes=16, vector_registers=32)
    avx2 = dataclasses.replace(cpu.limits, vector_lanes=8, vector_registers=16)
    wide = make_space(wl, target="llvm", limits=avx512)
    config = wide.default().replace(
        **{"tile.p": (1, 7), "tile.q": (7, 1), "tile.k": (2, 64), "vec": 16}
    )
    assert wide.reg_elems(config) == 448 and wide.check(config) is None
    assert "exceeds 256" in make_space(wl, target="llvm", limits=avx2).check(config)
    # In 8-wide vectors the same 32 registers hold 256: 448 of them would spill.
    assert "exceeds 256" in wide.check(config.replace(vec=8))
    opencl = make_space(wl, limits=OPENCL_LIMITS)
    tiles = {k: config[k] for k in ("tile.p", "tile.q", "tile.k", "vec")}
    assert "exceeds 256" in opencl.check(opencl.default().replace(**tiles))
    program = build(wide, config)
    outcome = worker.measure(program, make_data(wl), FAST)
    assert outcome.status == "ok", outcome.error


def test_an_axis_of_56_gets_14_lane_vectors_on_llvm_and_they_compute_the_reference(cpu, worker):
    """Powers of two stop at 8 lanes on ResNet's 56-wide rows: half an AVX-512 register.
    LLVM widens a 14-lane vector to one 16-lane register (two lanes idle), which is how
    MetaSchedule's fastest schedules of that conv ran (322-371 GFLOP/s on a Zen 5 where
    autosched's 8-lane best was 250; with 14 lanes autosched's own searches found 336-397).
    OpenCL C has no such vector types."""
    wl = workload("conv2d", n=1, c=8, h=14, w=56, k=16, r=3, s=3, stride=1, pad=1)
    space = make_space(wl, target="llvm", limits=cpu.limits)
    assert {7, 14} <= set(space.knob("vec").choices)
    opencl = make_space(wl, limits=OPENCL_LIMITS)
    assert not {7, 14} & set(opencl.knob("vec").choices)
    square = make_space(workload("matmul", M=64, N=64, K=64), target="llvm", limits=cpu.limits)
    assert set(square.knob("vec").choices) == {1, 2, 4, 8, 16}
    # A 14-lane vector takes one AVX-512 register, and two of an 8-lane file (a file of
    # 64 such registers here, so that the cap is above the 256 every device holds).
    avx512 = make_space(
        wl,
        target="llvm",
        limits=dataclasses.replace(cpu.limits, vector_lanes=16, vector_registers=32),
    )
    assert avx512.max_reg_elems(14) == 32 * 14 and avx512.max_reg_elems(8) == 32 * 8
    many = dataclasses.replace(cpu.limits, vector_lanes=8, vector_registers=64)
    assert make_space(wl, target="llvm", limits=many).max_reg_elems(14) == 32 * 14
    tiled = {"tile.k": (2, 4), "tile.p": (7, 2), "tile.q": (2, 28), "tile.c": (8, 2)}
    for changes in (
        {"vec": 14, "fuse.pad": True, "stage.pad": "pack"},
        {"vec": 14, "fuse.pad": False, "reduce_at": "block", "stage.weight": "pack"},
        {"vec": 7, "fuse.pad": True, "stage.pad": "global", "tile_inner": "k"},
    ):
        config = space.default().replace(**tiled, **changes)
        assert space.check(config) is None, changes
        outcome = worker.measure(build(space, config), make_data(wl), FAST)
        assert outcome.status == "ok", (changes, outcome.error)


def test_rows_of_7_take_their_lanes_from_the_output_channels_and_compute_the_reference(cpu, worker):
    """ResNet's last stage in NCHW: rows of 7 fill 7 of an AVX-512 register's 16 lanes, so
    on such a CPU the lanes may run along the output channels instead, with the weights
    packed channel-innermost and the accumulators laid out likewise (on a Zen 5, 512
    channels: 229 GFLOP/s against 131 for the best 7-lane config and 184 for numpy, one
    interleaved run). The vectors are LLVM's on any host."""
    wl = workload("conv2d", n=1, c=16, h=7, w=7, k=32, r=3, s=3, stride=1, pad=1)
    avx512 = dataclasses.replace(cpu.limits, vector_lanes=16, vector_registers=32)
    space = make_space(wl, target="llvm", limits=avx512)
    assert space.knob("vec_axis").choices == ("q", "k")
    lanes_k = {"vec": 16, "vec_axis": "k", "stage.weight": "pack", "tile.k": (2, 16)}
    rows = {"tile.p": (7, 1), "tile.q": (1, 7), "tile.c": (8, 1), "tile.r": (3, 1)}
    packed = space.make({**space.default(), **rows, **lanes_k})
    features = space.describe(packed)
    across = space.describe(space.make({**packed, "vec": 7, "vec_axis": "q"}))
    assert features["item_loads_per_step"] < across["item_loads_per_step"]
    for changes in (
        {"fuse.pad": True, "stage.pad": "pack", "tile_inner": "p"},
        {"fuse.pad": True, "stage.pad": "global", "reduce_at": "block"},
        {"fuse.pad": False, "reduce_at": "tile", "tile.k": (1, 32), "tile_inner": "k"},
        {"tile.p": (4, 1)},  # blocks of 4 rows, the last cut short by a guard on whole tiles
    ):
        config = space.make({**packed, **changes})
        assert space.check(config) is None, changes
        outcome = worker.measure(build(space, config), make_data(wl), FAST)
        assert outcome.status == "ok", (changes, outcome.error)
    assert "stage.weight=pack" in space.check(packed.replace(**{"stage.weight": "global"}))
    assert "divide" in space.check(packed.replace(**{"tile.p": (1, 4)}))
    assert "vec > 1" in space.check(packed.replace(vec=1))
    # Any contraction: a matmul of 7 columns takes its lanes along the rows, A packed
    # row-innermost, with its epilogue fused into the write-back or not.
    mm = workload("matmul", M=64, N=7, K=32, epilogue="bias_relu")
    space = make_space(mm, target="llvm", limits=avx512)
    lanes_i = [c for c in space.sample(np.random.default_rng(0), 400) if "vec_axis" in c]
    assert {c["fuse"] for c in lanes_i[:6]} == {True, False}
    for config in lanes_i[:6]:
        outcome = worker.measure(build(space, config), make_data(mm), FAST)
        assert outcome.status == "ok", (config, outcome.error)


CONFIGS = {
    "default": {},
    "register_tile_packed_B": {
        "tile.i": (2, 8),
        "tile.j": (1, 32),
        "tile.k": (8, 2),
        "vec": 16,
        "stage.B": "pack",
    },
    "block_order_both_packed": {
        "tile.i": (2, 4),
        "tile.j": (3, 32),
        "tile.k": (16, 4),
        "vec": 8,
        "reduce_at": "block",
        "tile_inner": "i",
        "stage.A": "pack",
        "stage.B": "pack",
    },
    "unfused_epilogue": {
        "tile.i": (4, 16),
        "tile.j": (2, 16),
        "tile.k": (48, 4),
        "vec": 16,
        "fuse": False,
    },
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("epilogue", ["none", "bias_relu"])
def test_llvm_kernels_compute_the_reference(cpu, worker, name, epilogue):
    wl = workload("matmul", M=64, N=96, K=48, epilogue=epilogue)
    space = make_space(wl, target="llvm", limits=cpu.limits)
    changes = dict(CONFIGS[name])
    if epilogue == "none":
        changes.pop("fuse", None)
    config = space.default().replace(**changes)
    assert space.check(config) is None
    program = build(space, config)
    assert isinstance(program, CpuProgram) and program.kind == "llvm"
    assert program.target["mcpu"] == cpu.mcpu and program.library.startswith(b"\x7fELF")
    unfused = epilogue != "none" and not config["fuse"]
    assert [t.role for t in program.tensors][-1] == ("scratch" if unfused else "output")
    outcome = worker.measure(program, make_data(wl), FAST)
    assert outcome.status == "ok", outcome.error
    assert len(outcome.latencies) >= 2 and all(t > 0 for t in outcome.latencies)


def _script_program(func, tensors) -> CpuProgram:
    import tvm

    executable = tvm.compile(tvm.IRModule({"main": func}), target=host_cpu().tvm_target())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.so"
        executable.export_library(str(path))
        return CpuProgram(library=path.read_bytes(), entry="main", tensors=tensors)


def test_hanging_crashing_wrong_and_broken_llvm_kernels_are_classified(cpu):
    from tvm.script import tirx as T

    wl = workload("matmul", M=32, N=32, K=32)
    space = make_space(wl, target="llvm", limits=cpu.limits)
    good = build(space, space.default())
    data = make_data(wl)

    @T.prim_func
    def hang(
        A: T.Buffer((32, 32), "float32"),
        B: T.Buffer((32, 32), "float32"),
        C: T.Buffer((32, 32), "float32"),
    ):
        while A[0, 0] < T.float32(1e30):
            C[0, 1] = A[0, 0]

    @T.prim_func
    def crash(
        A: T.Buffer((32, 32), "float32"),
        B: T.Buffer((32, 32), "float32"),
        C: T.Buffer((32, 32), "float32"),
    ):
        C[0, 1] = A[100000000, 0]

    @T.prim_func
    def wrong(
        A: T.Buffer((32, 32), "float32"),
        B: T.Buffer((32, 32), "float32"),
        C: T.Buffer((32, 32), "float32"),
    ):
        for i, j in T.grid(32, 32):
            C[i, j] = T.float32(1)

    broken = CpuProgram(library=b"not a shared object", entry="main", tensors=good.tensors)
    with MeasureWorker(cpu, timeout_s=5) as w:
        assert w.measure(_script_program(hang, good.tensors), data, FAST).status == "timeout"
        assert w.measure(good, data, FAST).status == "ok"  # a fresh worker took over
        crashed = w.measure(_script_program(crash, good.tensors), data, FAST)
        assert crashed.status == "run_error" and "crashed" in crashed.error, crashed
        out = w.measure(_script_program(wrong, good.tensors), data, FAST)
        assert out.status == "wrong_result" and "differ" in out.error
        assert w.measure(broken, data, FAST).status == "build_error"
        assert w.measure(good, data, FAST).status == "ok"


def test_an_integer_output_that_a_kernel_skips_is_caught_without_a_warning(cpu, caplog):
    """Outputs start unwritten: NaN for floats; an integer output (a model's mask or
    index) starts as each expected value with its lowest bit flipped, so a kernel that
    skips elements is caught there too, and numpy no longer warns from the worker about
    NaN cast to an integer."""
    from tvm.script import tirx as T

    from autosched.measure.runner import TestData, unwritten
    from autosched.ops.base import TensorSpec

    @T.prim_func
    def double(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
        for i in range(64):
            C[i] = A[i] * 2

    @T.prim_func
    def half(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
        for i in range(32):
            C[i] = A[i] * 2

    caplog.set_level("INFO", logger="autosched.measure.worker")  # what the worker printed
    a = np.arange(-32, 32, dtype="int32")
    data = TestData("int-double", {"A": a}, {"C": 2 * a}, rtol=0.0, atol=0.0)
    tensors = (TensorSpec("A", (64,), "int32", "input"), TensorSpec("C", (64,), "int32", "output"))
    with MeasureWorker(cpu, timeout_s=30) as w:
        assert w.measure(_script_program(double, tensors), data, FAST).status == "ok"
        out = w.measure(_script_program(half, tensors), data, FAST)
        assert out.status == "wrong_result" and "32 of 64 elements differ" in out.error, out
    assert not [r for r in caplog.records if "invalid value" in r.getMessage()]
    mask = np.array([True, False, True])
    assert (unwritten((3,), "bool", mask) != mask).all()
    assert (unwritten((2,), "uint8", np.array([0, 255], "uint8")) == [1, 254]).all()
    assert (unwritten((2,), "int64", None) == np.iinfo("int64").max).all()
    assert np.isnan(unwritten((2,), "float32", np.zeros(2, "float32"))).all()


@pytest.mark.timed
def test_short_llvm_tune_beats_the_default_and_its_best_kernel_is_correct(tmp_path, cpu):
    wl = autosched.workload("matmul", M=128, N=128, K=128, epilogue="bias_relu")
    db = tmp_path / "records.db"
    result = autosched.tune(
        wl, trials=12, batch=6, target="llvm", db=db, seed=1, timing=QUICK, strategy="model"
    )
    assert result.target == "llvm" and result.device == cpu and result.trials == 12
    assert result.best is not None and result.default is not None
    assert result.speedup > 2.0, (result.best.gflops, result.default.gflops)
    with SQLiteDatabase(db) as store:
        best = store.best(wl.key, device_key=cpu.key(), target="llvm")[0]
        assert best.device["mcpu"] == cpu.mcpu
        assert not store.query(workload_key=wl.key, target="opencl")
    program = build(make_space(wl, target="llvm", limits=cpu.limits), Config.from_json(best.config))
    with MeasureWorker(cpu) as w:
        assert w.measure(program, make_data(wl, seed=7), QUICK).status == "ok"


def test_cli_tunes_and_looks_up_on_llvm_without_opencl(tmp_path):
    # A pyopencl that cannot be imported: the llvm path must never need it.
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "pyopencl.py").write_text("raise ImportError('OpenCL is blocked in this test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), *sys.path]))
    common = ["--op", "matmul", "--shape", "64,64,64", "--target", "llvm"]
    common += ["--db", str(tmp_path / "l.db")]
    out = tmp_path / "t.json"
    run = [sys.executable, "-m", "autosched"]
    res = subprocess.run(
        [*run, "tune", *common, "--trials", "4", "--batch", "2", "--strategy", "random"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["target"] == "llvm" and data["trials"] == 4
    assert data["best"]["gflops"] > 0 and data["device"]["mcpu"]
    assert "GFLOP/s" in res.stdout
    best = subprocess.run(
        [*run, "best", *common, "--json", str(tmp_path / "b.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert best.returncode == 0, best.stderr
    picked = json.loads((tmp_path / "b.json").read_text())["best"]
    assert picked["config"] == data["best"]["config"] and picked["rounds"] == 3
    assert "final round: 3 rounds side by side" in best.stdout
    bad = subprocess.run(
        [*run, "tune", *common[:-4], "--target", "cuda"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and "invalid choice: 'cuda'" in bad.stderr
