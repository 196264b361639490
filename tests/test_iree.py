"""The IREE targets' parts on the real compiler, runtime and Vulkan driver (lavapipe):
Linalg emission, the spaces and their pruning, rendering, measurement."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest

import autosched
from autosched.iree.build import GPU_REPEAT, annotated_mlir, build_iree
from autosched.iree.linalg import domain, emit
from autosched.iree.mlir import find_roots
from autosched.iree.render import compilation_info
from autosched.iree.toolchain import compile_flags
from autosched.measure.device import select_device
from autosched.measure.iree_device import parse_vulkaninfo
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.records.record import BUILD_ERROR, OK
from autosched.space.config import Config
from autosched.space.device import device_limits as device_limits_of
from autosched.space.select import make_space
from tests.conftest import make_data

QUICK = TimingOptions(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.01)
# A 32x64 workgroup tile of 4x4 per invocation on the 256x256x64 matmul: 16x8 invocations.
VULKAN_MATMUL = {
    "pipeline": "BaseVectorize",
    "wg.m": 32,
    "wg.n": 64,
    "thr.m": 4,
    "thr.n": 4,
    "red.k": 4,
    "stages": 1,
}

WORKLOADS = [
    autosched.workload("matmul", M=32, N=16, K=8, epilogue="bias_relu"),
    autosched.workload("batch_matmul", b=2, m=8, n=16, k=4),
    autosched.workload("conv2d", n=1, c=4, h=6, w=6, k=8, r=3, s=3, pad=1, layout="NHWC"),
    autosched.workload("conv2d", n=1, c=4, h=7, w=7, k=8, r=3, s=3, stride=2, layout="NCHW"),
    autosched.workload("depthwise_conv2d", n=1, c=8, h=6, w=6, r=3, s=3, pad=1, layout="NHWC"),
    autosched.workload("softmax", rows=4, cols=16),
    autosched.workload("layernorm", rows=4, cols=16),
    autosched.workload("reduce", rows=4, cols=16, kind="max"),
]


@pytest.fixture(scope="module")
def cpu():
    return select_device(None, target="iree-llvm-cpu")


@pytest.fixture(scope="module")
def vulkan():
    return select_device(None, target="iree-vulkan")


def test_devices_carry_their_limits_and_fingerprints(cpu, vulkan):
    assert cpu.driver == "local-task" and cpu.limits.cores >= 1 and cpu.vector_bits >= 128
    fp = vulkan.fingerprint("iree-vulkan")
    assert fp["iree_version"].startswith("3.13") and fp["driver_info"] and fp["name"]
    # What the SPIR-V space prunes by comes from the device, not from defaults.
    assert vulkan.max_invocations >= 128 and vulkan.shared_bytes >= 16384
    assert vulkan.subgroup_size >= 1 and vulkan.limits.subgroup_size == vulkan.subgroup_size
    assert cpu.key("iree-llvm-cpu") != vulkan.key("iree-vulkan")
    # Reports rebuild spaces from records: the fingerprint implies the same limits.
    from autosched.report.aggregate import device_limits

    for dev in (cpu, vulkan):
        assert device_limits(dev.fingerprint(), dev.target) == dev.limits
    with pytest.raises(autosched.InvalidInputError, match="serves target 'iree-vulkan'"):
        select_device(vulkan, target="iree-llvm-cpu")


def test_vulkaninfo_parsing_reads_each_device():
    text = (
        "GPU0:\n\tdeviceName = First GPU\n\tdeviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\n"
        "\tmaxComputeWorkGroupInvocations = 256\n\tmaxComputeSharedMemorySize = 65536\n"
        "\tsubgroupSize = 64\nGPU1:\n\tdeviceName = llvmpipe (LLVM 15)\n"
        "\tdriverName = llvmpipe\n\tmaxComputeWorkGroupInvocations = 1024\n"
    )
    first, second = parse_vulkaninfo(text)
    assert first["maxComputeWorkGroupInvocations"] == 256 and first["subgroupSize"] == 64
    assert second["deviceName"].startswith("llvmpipe") and "subgroupSize" not in second


def test_a_gpu_s_limits_narrow_to_what_its_spirv_target_builds():
    """A GPU without a named SPIR-V target is built for IREE's portable baseline, which
    allows 16 KiB of shared memory where an H100's Vulkan driver reports 48 KiB: the
    space takes the narrower limit, so it never proposes a config the compiler
    refuses for the target (the lent H100 machine's driver, as vulkaninfo lists it)."""
    from dataclasses import replace

    from autosched.errors import ScheduleError
    from autosched.measure.cpu import host_cpu
    from autosched.measure.iree_device import device_from_info, iree_version

    text = (
        "GPU0:\n\tdeviceName = NVIDIA H100 80GB HBM3\n"
        "\tdeviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\n\tdriverName = NVIDIA\n"
        "\tmaxComputeWorkGroupInvocations = 1024\n\tmaxComputeSharedMemorySize = 49152\n"
        "\tsubgroupSize = 32\n"
    )
    (info,) = parse_vulkaninfo(text)
    gpu = device_from_info(info, 0, host_cpu(), iree_version())
    assert gpu.vulkan_target == "vp_android_baseline_2022" and gpu.subgroup_size == 32
    assert (gpu.max_invocations, gpu.shared_bytes) == (128, 16384)
    wl = autosched.workload("matmul", M=256, N=256, K=64)
    staged = Config(
        {
            "pipeline": "MatmulPromoteVectorize",
            "wg.m": 32,
            "wg.n": 64,
            "thr.m": 4,
            "thr.n": 4,
            "red.k": 32,
            "stages": 1,
        }  # fmt: skip
    )
    reported = replace(gpu.limits, local_mem_bytes=49152)
    wide = make_space(wl, target="iree-vulkan", limits=reported)
    assert wide.check(staged) is None and wide.shared_bytes(staged) == 24576
    # Built for the space's device's target (the baseline), not the default device's
    # (lavapipe here, which has 32 KiB and would build it).
    assert gpu.limits.spirv_target == "vp_android_baseline_2022"
    with pytest.raises(ScheduleError, match="24576 bytes of shared memory"):
        build_iree(wide, staged)
    narrow = make_space(wl, target="iree-vulkan", limits=gpu.limits)
    assert "shared memory exceed the device's 16384" in narrow.check(staged)
    fits = staged.replace(**{"red.k": 8})
    assert narrow.check(fits) is None
    program = build_iree(narrow, fits)
    # A GPU's call costs more than its kernels: a second module repeats each dispatch.
    assert program.module and program.repeated and program.repeat == GPU_REPEAT


@pytest.mark.parametrize("wl", WORKLOADS, ids=str)
def test_emitted_linalg_computes_the_reference_on_llvm_cpu(cpu, wl):
    roots = find_roots(emit(wl))
    assert roots and roots[0].op == domain(wl).op
    space = make_space(wl, target="iree-llvm-cpu", limits=cpu.limits)
    program = build_iree(space, space.default())
    with MeasureWorker(cpu, timeout_s=60) as worker:
        outcome = worker.measure(program, make_data(wl), QUICK)
    assert outcome.status == OK, outcome.error
    assert len(outcome.latencies) >= 3


def test_roots_map_back_to_the_workloads_they_came_from():
    for wl in WORKLOADS:
        root = find_roots(emit(wl))[0]
        if wl.op in ("softmax", "layernorm"):
            continue  # their first reduction is a row max or sum, not the operator
        expected = wl if wl.op != "matmul" else autosched.workload("matmul", M=32, N=16, K=8)
        assert root.workload == expected, (root.workload, wl)


def test_a_cpu_measured_elsewhere_is_built_for_its_own_llvm_name(cpu):
    """A CPU whose configs are built on another machine (bench/iree_prebuilt.py) names
    its LLVM CPU in its fingerprint; the space's limits carry it to iree-compile, and
    this machine's own device keeps its key (no such field)."""
    assert "llvm_cpu" not in cpu.fingerprint() and cpu.limits.llvm_cpu == ""
    other = dataclasses.replace(cpu, llvm_cpu="x86-64")  # runs on any x86-64, this one too
    assert other.fingerprint()["llvm_cpu"] == "x86-64" and other.key() != cpu.key()
    limits = device_limits_of(other.fingerprint(), "iree-llvm-cpu")
    assert limits == other.limits and limits.llvm_cpu == "x86-64"
    assert "--iree-llvmcpu-target-cpu=x86-64" in compile_flags("iree-llvm-cpu", llvm_cpu="x86-64")
    wl = autosched.workload("matmul", M=32, N=16, K=8)
    space = make_space(wl, target="iree-llvm-cpu", limits=limits)
    program = build_iree(space, space.default())
    with MeasureWorker(cpu, timeout_s=60) as worker:
        outcome = worker.measure(program, make_data(wl), QUICK)
    assert outcome.status == OK, outcome.error
    from autosched.errors import ScheduleError

    bad = make_space(wl, target="iree-llvm-cpu", limits=dataclasses.replace(limits, llvm_cpu="x"))
    with pytest.raises(ScheduleError):  # the name reaches iree-compile, which knows no CPU 'x'
        build_iree(bad, bad.default())


@pytest.mark.parametrize("bits", [None, 256, 512])
def test_cpu_space_prunes_by_the_host_and_renders_a_lowering_config(cpu, bits):
    """On this host's limits, and on an AVX2's and an AVX-512's whatever this host is:
    CI's CPU changes from day to day, and a rule that suits one must hold on the others."""
    wl = autosched.workload("matmul", M=96, N=64, K=32)
    limits = cpu.limits if bits is None else dataclasses.replace(cpu.limits, vector_bits=bits)
    space = make_space(wl, target="iree-llvm-cpu", limits=limits)
    assert space.default()["pipeline"] == "auto"
    assert compilation_info(space.nest, space.target, space.default()) is None
    configs = space.sample(np.random.default_rng(0), 30)
    assert len(configs) >= 20 and all(space.check(c) is None for c in configs)
    base = dict(
        pipeline="DoubleTilingExpert", peel=False, **{"red.k": 4, "cache.m": 0, "cache.n": 0}
    )
    ok = Config({**base, "dist.m": 32, "dist.n": 32, "vec.m": 4, "vec.n": 8})
    assert space.check(ok) is None
    assert "does not divide" in space.check(ok.replace(**{"vec.m": 8, "dist.m": 4}))
    too_many = ok.replace(**{"vec.m": 32, "vec.n": 32, "dist.m": 32, "dist.n": 32})
    assert "accumulators" in space.check(too_many)
    assert "cores idle" in space.check(ok.replace(**{"dist.m": 96, "dist.n": 64}))
    assert "changes nothing" in space.check(ok.replace(peel=True))
    # 96 is not a power of two: a 64-row tile leaves a remainder that peeling handles.
    assert space.check(ok.replace(**{"dist.m": 64}, peel=True)) is None
    assert "strictly between" in space.check(ok.replace(**{"cache.m": 32}))
    info = compilation_info(space.nest, space.target, ok)
    assert "distribution = [32, 32, 0]" in info and "vector_reduction = [0, 0, 4]" in info
    assert "cache_parallel" not in info
    cached = compilation_info(space.nest, space.target, ok.replace(**{"cache.m": 8}))
    assert "cache_parallel = [8, 0, 0]" in cached
    assert "DoubleTilingExpert" in info


def test_cpu_vector_tile_is_capped_by_the_cpus_own_register_file(cpu):
    """A 16x32 vector tile (512 accumulators) fills AVX-512's 32 registers of 16 lanes;
    a CPU with 16 such registers refuses it."""
    wl = autosched.workload("matmul", M=96, N=64, K=32)
    tile = Config(
        {"pipeline": "DoubleTilingExpert", "peel": False, "red.k": 4, "cache.m": 0,
         "cache.n": 0, "dist.m": 32, "dist.n": 32, "vec.m": 16, "vec.n": 32}
    )  # fmt: skip
    for registers, ok in ((32, True), (16, False)):
        limits = dataclasses.replace(cpu.limits, vector_bits=512, vector_registers=registers)
        reason = make_space(wl, target="iree-llvm-cpu", limits=limits).check(tile)
        assert (reason is None) == ok, reason
        assert ok or f"exceeds {registers} registers of 16 lanes" in reason
    # The vector tile is what one task keeps in registers.
    assert make_space(wl, target="iree-llvm-cpu", limits=cpu.limits).register_tile(tile) == (16, 32)


def test_vulkan_space_prunes_by_the_device_limits(vulkan):
    from dataclasses import replace

    wl = autosched.workload("matmul", M=256, N=256, K=64)
    space = make_space(wl, target="iree-vulkan", limits=vulkan.limits)
    c = Config(VULKAN_MATMUL)
    assert space.check(c) is None and space.workgroup_size(c) == (16, 8, 1)
    # One invocation's outputs are its register tile; IREE's own config has none.
    assert space.register_tile(c) == (4, 4)
    assert space.register_tile(c.replace(pipeline="auto")) is None
    small = make_space(
        wl, target="iree-vulkan", limits=replace(vulkan.limits, max_work_group_size=64)
    )
    assert "invocations exceed the device's 64" in small.check(c)
    odd = make_space(wl, target="iree-vulkan", limits=replace(vulkan.limits, subgroup_size=256))
    assert "subgroup size 256" in odd.check(c)
    promote = c.replace(pipeline="MatmulPromoteVectorize", **{"wg.m": 128, "thr.m": 8, "red.k": 64})
    tiny = make_space(wl, target="iree-vulkan", limits=replace(vulkan.limits, local_mem_bytes=8192))
    assert "shared memory" in tiny.check(promote)
    assert "only for MatmulPromoteVectorize" in space.check(c.replace(stages=2))
    staged = promote.replace(**{"red.k": 8}, stages=2)
    assert space.check(staged) is None and space.shared_bytes(staged) == (128 + 64) * 8 * 4 * 3
    text = compilation_info(space.nest, space.target, staged)
    assert "tile_sizes = [[128, 64, 8], [8, 4], [0, 0, 4]]" in text and "pipeline_depth = 1" in text
    info = compilation_info(space.nest, space.target, c)
    assert "tile_sizes = [[32, 64], [4, 4], [0, 0, 4]]" in info
    assert "workgroup_size = [16, 8, 1]" in info
    for cfg in space.sample(np.random.default_rng(1), 20):
        assert space.workgroup_size(cfg)[0] * space.workgroup_size(cfg)[1] <= vulkan.max_invocations


def test_cost_model_rows_tell_apart_which_axis_a_tile_cuts(cpu, vulkan):
    """Two configs whose tiles are the same products over other axes (a 32x64 workgroup
    tile and a 64x32 one) describe alike in every aggregate; the per-axis columns part
    them, in rows that line up with IREE's own config (whose knobs sit at their first
    choices) and with another workload of the kind."""
    from autosched.cost_model.features import feature_names, featurize

    wl = autosched.workload("matmul", M=256, N=256, K=64)
    space = make_space(wl, target="iree-vulkan", limits=vulkan.limits)
    a = Config(VULKAN_MATMUL)
    b = a.replace(**{"wg.m": 64, "wg.n": 32})
    assert space.check(a) is None and space.check(b) is None
    names = feature_names(space)
    rows = featurize(space, [a, b, space.default()])
    per_axis = [n for n in names if re.match(r"[sr][0-9]+_", n)]
    shared = [j for j, n in enumerate(names) if n not in per_axis]
    assert np.array_equal(rows[0, shared], rows[1, shared])
    col = {n: j for j, n in enumerate(names)}
    assert rows[0, col["s0_log_tile"]] == 5 and rows[1, col["s0_log_tile"]] == 6
    assert rows[0, col["s1_log_threads"]] == 4 and rows[0, col["r0_log_tile"]] == 2
    assert per_axis and not rows[2, [col[n] for n in per_axis]].any()
    other_wl = autosched.workload("matmul", M=512, N=128, K=256)
    other = make_space(other_wl, target="iree-vulkan", limits=vulkan.limits)
    assert feature_names(other) == names
    cpu_space = make_space(wl, target="iree-llvm-cpu", limits=cpu.limits)
    c = next(x for x in cpu_space.sample(np.random.default_rng(3), 20) if x["pipeline"] != "auto")
    described = cpu_space.describe(c)
    assert described["s1_log_reg"] == np.log2(c["vec.n"])
    assert described["s0_log_tile"] == np.log2(c["dist.m"])


def test_vulkan_measures_a_tuned_config_and_reads_results_back_aligned(vulkan):
    wl = autosched.workload("matmul", M=64, N=64, K=32, epilogue="bias")
    space = make_space(wl, target="iree-vulkan", limits=vulkan.limits)
    c = Config(
        {
            "pipeline": "BaseVectorize",
            "wg.m": 8,
            "wg.n": 32,
            "thr.m": 1,
            "thr.n": 4,
            "red.k": 4,
            "stages": 1,
        }  # fmt: skip
    )
    assert "compilation_info" in annotated_mlir(space, c)
    with MeasureWorker(vulkan, timeout_s=60) as worker:
        for config in (space.default(), c):
            outcome = worker.measure(build_iree(space, config), make_data(wl), QUICK)
            assert outcome.status == OK, outcome.error


@pytest.mark.parametrize(
    "wl",
    [
        autosched.workload("conv2d", n=2, c=16, h=28, w=28, k=32, r=3, s=3, pad=1, layout="NHWC"),
        autosched.workload("matmul", M=128, N=96, K=64),
    ],
    ids=str,
)
def test_iree_s_own_cpu_config_is_a_seed_that_builds_the_same_tiles(cpu, wl):
    """The llvm-cpu space writes IREE's own config out as knobs (whatever tiles IREE
    picks on the host: a 28-wide row by 7 on AVX-512, by 4 on AVX2): rendered back into
    the MLIR it gives the root op the tiles IREE picks by itself, so the tuner measures
    IREE's schedule as a point of the space."""
    from autosched.iree.heuristic import _tiles
    from autosched.iree.toolchain import compile_flags, compile_mlir

    space = make_space(wl, target="iree-llvm-cpu", limits=cpu.limits)
    (seed,) = space.seeds()
    assert seed["pipeline"] != "auto" and space.check(seed) is None

    def root(text: str) -> list:
        flags = compile_flags("iree-llvm-cpu")
        out = compile_mlir(text, flags, extra=["--compile-to=executable-configurations"])
        line = next(ln for ln in out.decode().splitlines() if "vector_reduction" in ln)
        names = ("distribution", "vector_common_parallel", "vector_reduction")
        return [_tiles(line, n) for n in names]

    own = root(emit(wl))
    assert own == root(annotated_mlir(space, seed))
    if wl.op == "conv2d":  # IREE's own row tile (7 of 28 on AVX-512, 4 on AVX2) is a knob
        ow = [lp.name for lp in space.nest.loops].index("ow")
        assert seed["vec.ow"] == own[1][ow] > 1


def test_iree_s_own_spirv_config_is_a_seed_that_builds_the_same_tiles(vulkan):
    """The same on Vulkan: IREE's SPIR-V config of a matmul (workgroup, invocation and
    reduction tiles, pipeline) written out as knobs renders back to the tiles and the
    workgroup size IREE picks by itself."""
    import re

    from autosched.iree.toolchain import compile_flags, compile_mlir

    wl = autosched.workload("matmul", M=256, N=128, K=64)
    space = make_space(wl, target="iree-vulkan", limits=vulkan.limits)
    (seed,) = space.seeds()
    assert seed["pipeline"] != "auto" and space.check(seed) is None

    def root(text: str) -> tuple:
        flags = compile_flags("iree-vulkan", vulkan_target=vulkan.vulkan_target)
        out = compile_mlir(text, flags, extra=["--compile-to=executable-configurations"])
        out = out.decode()
        tiles = re.search(r"tile_sizes = (\[\[[^>]*\]\])", out).group(1)
        size = re.search(r"workgroup_size = (\[[0-9, ]*\])", out).group(1)
        return tiles, size

    assert root(emit(wl)) == root(annotated_mlir(space, seed))


def test_a_driver_without_the_iree_compiler_proposes_no_seed_and_goes_on():
    """A farm job's driver may lack the iree extra its workers have: there the space
    has no seed (IREE's own config needs iree-compile), and nothing raises."""
    code = (
        "import sys; sys.modules['iree.compiler'] = None\n"  # as if not installed
        "import autosched\n"
        "from autosched.space.select import make_space\n"
        "from autosched.space.space import DeviceLimits\n"
        "wl = autosched.workload('matmul', M=64, N=64, K=64)\n"
        "lim = DeviceLimits(max_work_group_size=1, max_work_item_size=1, is_cpu=True,"
        " cores=2, vector_bits=256)\n"
        "print(make_space(wl, target='iree-llvm-cpu', limits=lim).seeds())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_config_the_compiler_rejects_is_a_build_error_value(cpu, tmp_path):
    from autosched.tuning.tune import tune

    wl = autosched.workload("matmul", M=64, N=64, K=64)
    space = make_space(wl, target="iree-llvm-cpu", limits=cpu.limits)
    # Vectors of 32x32x32 floats: the pruning bound is lifted to show the compiler's error.
    bad = Config({"pipeline": "DoubleTilingExpert", "dist.m": 32, "dist.n": 32, "vec.m": 32,
                  "vec.n": 32, "red.k": 32, "peel": False, "cache.m": 0, "cache.n": 0})  # fmt: skip
    from autosched.errors import ScheduleError

    with pytest.raises(ScheduleError, match="iree-compile"):
        build_iree(space, bad)
    result = tune(wl, trials=4, batch=4, db=str(tmp_path / "r.db"), target="iree-llvm-cpu")
    assert result.trials == 4 and result.best is not None
    assert all(r.status in (OK, BUILD_ERROR) for r in result.history)


@pytest.mark.parametrize("target", ["iree-llvm-cpu", "iree-vulkan"])
def test_a_convolution_with_a_unit_loop_is_built_with_iree_s_own_config(cpu, vulkan, target):
    """IREE 3.13 folds a convolution's loops of extent 1 away (a batch of 1, a 1x1
    filter) and rebuilds the op without the lowering config it was given (the tuner's
    inline one, or a spec's), so every config of such a space built IREE's own kernel:
    its space is now IREE's config alone and a tune says why. A batch-2 3x3 conv keeps
    the config given. If a later IREE keeps it, the first check fails: such
    convolutions can be tuned again."""
    from autosched.iree.linalg import config_dropped
    from autosched.iree.mlir import annotate
    from autosched.iree.toolchain import compile_mlir

    limits = (cpu if target == "iree-llvm-cpu" else vulkan).limits
    base = dict(c=8, h=8, w=8, k=16, layout="NHWC")
    kept = autosched.workload("conv2d", n=2, r=3, s=3, pad=1, **base)
    given = next(
        c
        for c in make_space(kept, target=target, limits=limits).sample(np.random.default_rng(0), 64)
        if c["pipeline"] != "auto" and c.get("dist.n", 1) == 1 and c.get("wg.n", 1) == 1
    )

    def reaches(wl) -> bool:
        info = compilation_info(domain(wl), target, given)
        text = annotate(emit(wl), {0: info})
        flags = compile_flags(target)
        out = compile_mlir(text, flags, extra=["--compile-to=executable-configurations"])
        key = "lowering_config<" if target == "iree-llvm-cpu" else "tile_sizes = "
        tiles = info[info.index(key) :].split(">")[0]
        return tiles in out.decode()

    assert reaches(kept) and config_dropped(kept) is None
    assert make_space(kept, target=target, limits=limits).size > 100
    for unit, loops in ((dict(n=1, r=3, s=3, pad=1), "n"), (dict(n=2, r=1, s=1), "kh, kw")):
        wl = autosched.workload("conv2d", **unit, **base)
        assert not reaches(wl), wl
        space = make_space(wl, target=target, limits=limits)
        assert space.size == 1 and space.default()["pipeline"] == "auto" and space.seeds() == []
        assert f"({loops}: it folds them away)" in config_dropped(wl)
