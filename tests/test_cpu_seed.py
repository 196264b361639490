"""The contraction spaces' CPU seeds (issue 13): llvm's from BLIS's analytical model of
the CPU, from its fingerprint (vector lanes and registers, L1, cores), and OpenCL's on a
CPU driver (its register tile for one work-item per group), measured right after the
default. The AVX2 Zen 3's searches had not found either in 48 trials."""

from __future__ import annotations

import dataclasses

import pytest

import autosched
from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.device import device_limits
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits, padded

AVX2 = DeviceLimits(
    max_work_group_size=1,
    max_work_item_size=1,
    local_mem_bytes=0,
    is_cpu=True,
    cores=2,
    compute_units=2,
    vector_lanes=8,
    vector_registers=16,
    cache_bytes=(32 * 1024, 512 * 1024),
)
AVX512 = dataclasses.replace(AVX2, vector_lanes=16, vector_registers=32, cache_bytes=(48 * 1024,))


def _matmul_space(limits, m, n, k, target="llvm"):
    return make_space(autosched.workload("matmul", M=m, N=n, K=k), target=target, limits=limits)


@pytest.mark.parametrize("limits", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("shape", [(512, 512, 512), (127, 1000, 333), (257, 512, 129)])
def test_the_seed_fills_the_register_file_and_packs_a_panel_that_fits_l1(limits, shape):
    m, n, k = shape
    space = _matmul_space(limits, m, n, k)
    (seed,) = space.seeds()
    assert space.check(seed) is None
    lanes, registers, l1 = limits.vector_lanes, limits.vector_registers, limits.cache_bytes[0]
    (mid_j, nr), (_, mr) = seed["tile.j"], seed["tile.i"]
    assert (nr, mid_j) == (2 * lanes, 1)  # two native vectors per row, one panel per task
    per_row = nr // lanes
    # Accumulators, one row of operands and a broadcast fit; twice the rows would not.
    assert mr * per_row + per_row + 1 <= registers < 2 * mr * per_row + per_row + 1
    assert (seed["stage.B"], seed["stage.A"]) == ("pack", "global")
    chunk = seed["tile.k"][0]
    if k * nr * 4 <= l1:
        assert (seed["reduce_at"], chunk) == ("tile", k)
    else:
        assert seed["reduce_at"] == "block" and k % chunk == 0 and chunk * nr * 4 <= l1
    assert space.groups(seed) >= 4 * limits.cores


def test_the_seed_reads_its_caches_and_cores_from_the_fingerprint():
    fingerprint = {
        "target": "llvm",
        "type": "cpu",
        "isa": ["avx", "avx2", "fma"],
        "compute_units": 64,
        "cache_bytes": {"L1": 16 * 1024, "L2": 1 << 20, "L3": 1 << 25},
    }
    limits = device_limits(fingerprint, "llvm")
    assert limits.cache_bytes == (16 * 1024, 1 << 20, 1 << 25)
    (seed,) = _matmul_space(limits, 512, 512, 512).seeds()
    # A 16-lane panel over K=512 is 32 KiB: chunks of 256 fit this L1; the 32 row blocks of
    # AVX2's machine (2 cores) become 128 to give 64 cores four tasks each.
    assert (seed["reduce_at"], seed["tile.k"][0]) == ("block", 256)
    assert _matmul_space(limits, 512, 512, 512).groups(seed) >= 256
    assert _matmul_space(AVX2, 512, 512, 512).seeds()[0]["reduce_at"] == "tile"


def test_a_dense_layer_packs_its_weights_lanes_innermost():
    from autosched.space.schedule import schedule

    space = make_space(autosched.workload("dense", m=64, n=1000, k=512), target="llvm", limits=AVX2)
    (seed,) = space.seeds()  # W is laid out [n, k]: along the reduction, not the lanes
    assert (seed["stage.W"], seed["stage.x"], seed["tile.j"]) == ("pack", "global", (1, 16))
    script = schedule(space, seed).script()
    assert "W_pad = T.sblock_alloc_buffer((512, 1008))" in script  # packed [k, n]: n innermost


@pytest.mark.parametrize("hw", [56, 28, 14, 7])
def test_an_nchw_conv_seed_keeps_vectors_in_whole_registers_and_tiles_the_image_rows(hw):
    """Lanes run along the image's columns (q); a 14-lane vector would take two AVX2
    registers, one of them 6 lanes (64 GFLOP/s on the Zen 3 where 8 or 7 lanes by two
    image rows ran 123-181), so the seed keeps one register's vectors and takes two rows
    of the image (p) as the tile's second column of vectors."""
    c = 64 * 56 // hw
    wl = autosched.workload("conv2d", n=1, c=c, h=hw, w=hw, k=c, r=3, s=3, stride=1, pad=1)
    for limits, lanes in ((AVX2, 8), (AVX512, 16)):
        (seed,) = make_space(wl, target="llvm", limits=limits).seeds()
        vec, (_, nr), (_, b) = seed["vec"], seed["tile.q"], seed["tile.p"]
        assert vec <= lanes and hw % vec == 0 and nr == vec, seed  # one register, no tail
        assert b == 2 and (seed["stage.pad"], seed["stage.weight"]) == ("pack", "global")
        assert seed["fuse.pad"] is True  # the padding is computed into the packed copy
        mr = seed["tile.k"][1]
        assert 2 * mr + 2 + 1 <= limits.vector_registers < 2 * (2 * mr) + 2 + 1, seed


@pytest.mark.parametrize("hw", [56, 14, 7])
def test_an_nhwc_conv_seed_packs_each_weight_panel_once_for_many_image_rows(hw):
    """NHWC: lanes along the output channels, register rows along the image's columns q.
    Once a task holds a whole row of q it takes rows of p too, while every core keeps
    four tasks, so that each packed weight panel serves them all; the padding, read in
    place, runs as a loop of its own. On the Zen 3 that ran ResNet's 7x7x512 conv at 87
    GFLOP/s and its 56x56x64 at 182, where one row of p per task with the padding
    fused had run 36 and 113 (numpy 79 and 136, the same run)."""
    c = 64 * 56 // hw
    wl = autosched.workload(
        "conv2d", n=1, c=c, h=hw, w=hw, k=c, r=3, s=3, stride=1, pad=1, layout="NHWC"
    )
    for limits in (AVX2, AVX512):
        space = make_space(wl, target="llvm", limits=limits)
        (seed,) = space.seeds()
        (mq, rq), (mp, rp) = seed["tile.q"], seed["tile.p"]
        assert seed["stage.weight"] == "pack" and rp == 1 and mq * rq >= hw, seed
        assert (seed["stage.pad"], seed["fuse.pad"]) == ("global", False), seed
        assert mp > 1 and space.groups(seed) >= 4 * limits.cores, seed
        double = {k.name: space.value(seed, k.name) for k in space.knobs}
        double["tile.p"] = (2 * mp, 1)
        assert 2 * mp > hw or space.groups(space.make(double)) < 4 * limits.cores, seed


def test_rows_that_would_pad_their_axis_give_way_to_a_tile_of_as_many_accumulators():
    """14 image columns in 4-row tiles pad to 16 (57 GFLOP/s on the Zen 3); 14 rows of one
    8-lane register hold more accumulators and pad nothing (136). Where no such tile holds
    as many (7 columns: 7 rows of 8 lanes against 4 rows of 16, padded to 8), the padded
    one stays (105 against 93 there)."""

    def seed(hw, c):
        wl = autosched.workload(
            "conv2d", n=1, c=c, h=hw, w=hw, k=c, r=3, s=3, stride=1, pad=1, layout="NHWC"
        )
        (config,) = make_space(wl, target="llvm", limits=AVX2).seeds()
        return config

    fourteen = seed(14, 256)
    assert (fourteen["vec"], fourteen["tile.k"], fourteen["tile.q"]) == (8, (1, 8), (1, 14))
    seven = seed(7, 512)
    assert (seven["vec"], seven["tile.k"], seven["tile.q"]) == (16, (1, 16), (2, 4))


def test_a_batch_axis_is_not_a_column_of_the_register_tile():
    """Both operands of a batched matmul index the batch: tiling it shares no
    broadcast, so the seed's columns stay along the lanes (two vectors of j)."""
    wl = autosched.workload("batch_matmul", b=12, m=128, n=64, k=128)
    for limits in (AVX2, AVX512):
        (seed,) = make_space(wl, target="llvm", limits=limits).seeds()
        lanes = limits.vector_lanes
        assert (seed["tile.b"], seed["tile.j"]) == ((1, 1), (1, 2 * lanes)), seed


# OpenCL on a CPU driver (PoCL's device: work-groups of up to 4096, emulated local memory).
POCL_AVX2 = dataclasses.replace(
    AVX2, max_work_group_size=4096, max_work_item_size=4096, local_mem_bytes=1 << 19
)
POCL_AVX512 = dataclasses.replace(POCL_AVX2, vector_lanes=16, vector_registers=32)
GPU = DeviceLimits(
    max_work_group_size=1024,
    max_work_item_size=1024,
    local_mem_bytes=48 * 1024,
    is_cpu=False,
    compute_units=132,
    vector_lanes=1,
    vector_registers=64,
)


@pytest.mark.parametrize("limits", [POCL_AVX2, POCL_AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("shape", [(512, 512, 512), (127, 1000, 333), (251, 509, 127)])
def test_opencl_on_a_cpu_seeds_one_work_item_per_group_with_a_register_tile(limits, shape):
    """One work-item per group, whole vectors, the accumulators in the register file, and
    no vector tail where one register's lanes divide the axis (N=1000: a tail costs OpenCL
    kernels of their own, 75 GFLOP/s on the Zen 3's PoCL where 8 x 8 ran 120-125)."""
    m, n, k = shape
    space = _matmul_space(limits, m, n, k, target="opencl")
    seed, twin = space.seeds()  # and the same tile with B packed into panels
    assert space.check(seed) is None and space.check(twin) is None
    assert twin == seed.replace(**{"stage.B": "pack"})
    lanes, registers = limits.vector_lanes, limits.vector_registers
    (threads_i, mr), (threads_j, nr) = seed["tile.i"], seed["tile.j"]
    assert threads_i == threads_j == 1 and seed["tile.k"] == (1, 1)
    assert seed["vec"] == lanes or (seed["vec"] == 2 * lanes and nr == seed["vec"]), seed
    assert (seed["stage.A"], seed["stage.B"]) == ("global", "global")
    per_row = nr // lanes
    assert mr * per_row + per_row + 1 <= registers < 2 * mr * per_row + per_row + 1, seed
    # The least padding of N (none where one register's lanes divide it), then the most
    # registers per row.
    assert padded(n, nr) == min(padded(n, lanes), padded(n, 2 * lanes)), seed
    if n % (2 * lanes) == 0:
        assert nr == 2 * lanes, seed


def test_opencl_on_a_gpu_has_no_seed():
    assert _matmul_space(GPU, 512, 512, 512, target="opencl").seeds() == []
    wl = autosched.workload("conv2d", n=1, c=64, h=56, w=56, k=64, r=3, s=3, stride=1, pad=1)
    assert make_space(wl, target="opencl", limits=GPU).seeds() == []


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_an_opencl_conv_seed_pads_apart_and_takes_image_rows_or_columns(layout):
    """NCHW: the lanes along q, two rows of p as a second column, the channels as rows
    (4 x 2 x 8 ran 97 GFLOP/s on the Zen 3's PoCL, the sample's best 105). NHWC: the lanes
    along the channels, the rows along q (175 there, 146 along p). Both pad the image by
    a kernel of its own (fused into the reads, every read is guarded: 60 against 97)."""
    wl = autosched.workload(
        "conv2d", n=1, c=64, h=56, w=56, k=64, r=3, s=3, stride=1, pad=1, layout=layout
    )
    seed, *twin = make_space(wl, target="opencl", limits=POCL_AVX2).seeds()
    # NHWC's weights run along the lanes, the channels: they may be packed into panels.
    assert twin == ([seed.replace(**{"stage.weight": "pack"})] if layout == "NHWC" else [])
    assert seed["fuse.pad"] is False and all(seed[f"tile.{a}"][0] == 1 for a in "kpq"), seed
    if layout == "NCHW":
        assert (seed["tile.k"], seed["tile.p"], seed["tile.q"], seed["vec"]) == (
            (1, 4),
            (1, 2),
            (1, 8),
            8,
        )
    else:
        assert (seed["tile.p"], seed["tile.q"], seed["tile.k"][1] % 8) == ((1, 1), (1, 4), 0)


@pytest.mark.parametrize("stride,r", [(2, 3), (2, 1)])
def test_a_strided_nchw_conv_seed_packs_the_image_it_reads_at_a_stride(stride, r):
    """The image is read along the lanes at a stride (2q + s): llvm's seed packs it as it
    packs a unit-stride image. On the Zen 3 ResNet's 56 -> 28 3x3 conv ran 72 GFLOP/s
    so, where a 48-trial search without the seed ended at 21 (numpy 91-94)."""
    wl = autosched.workload(
        "conv2d", n=1, c=64, h=56, w=56, k=128, r=r, s=r, stride=stride, pad=r // 2
    )
    for limits in (AVX2, AVX512):
        (seed,) = make_space(wl, target="llvm", limits=limits).seeds()
        image = "pad" if r > 1 else "data"
        assert (seed[f"stage.{image}"], seed["stage.weight"]) == ("pack", "global"), seed
        assert seed["tile.p"] == (1, 2) and 28 % seed["vec"] == 0, seed
    assert make_space(wl, target="opencl", limits=POCL_AVX2).seeds() == []  # read in place


@pytest.mark.parametrize(
    "target,op,params",
    [
        ("llvm", "matmul", dict(M=61, N=200, K=67)),
        ("opencl", "matmul", dict(M=61, N=200, K=67)),
        ("llvm", "conv2d", dict(n=1, c=8, h=16, w=16, k=16, r=3, s=3, stride=2, pad=1)),
    ],
)
def test_a_tune_measures_the_seed_right_after_the_default_and_it_computes_the_reference(
    tmp_path, target, op, params
):
    wl = autosched.workload(op, **params)
    db = tmp_path / "records.db"
    quick = TimingOptions(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.01)
    autosched.tune(wl, trials=3, batch=2, target=target, db=db, seed=1, timing=quick)
    space = make_space(wl, target=target, limits=select_device(target=target).limits)
    seeds = space.seeds()  # OpenCL: the seed and its twin with B packed into panels
    assert len(seeds) == (2 if target == "opencl" else 1)
    with SQLiteDatabase(db) as store:
        records = store.query(workload_key=wl.key, target=target)
    by_key = {r.config_key: r for r in records}
    for seed in seeds:
        assert seed.key in by_key, [r.config for r in records]
        assert by_key[seed.key].status == "ok", by_key[seed.key].error  # checked, then timed
