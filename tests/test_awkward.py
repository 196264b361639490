"""Awkward shapes (issue 13, part 3): tiles that do not divide their axes.

Prime and odd extents get the wide register tiles and vectors of their power-of-two
neighbours (guarded tails; vector tails padded to whole vectors), power-of-two spaces
keep exactly the knobs they had, and every such config computes the reference on both
targets through real TVM codegen, PoCL and the host CPU.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import autosched
from autosched.measure.build import build
from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.space.select import make_space
from autosched.space.space import MAX_PAD_WASTE, divisors, padded, tile_sizes
from tests.conftest import make_data

ONCE = TimingOptions(warmup=0, min_repeats=1, max_repeats=1, min_time_s=0.0)
TARGETS = ("opencl", "llvm")


@pytest.fixture(scope="module")
def devices():
    return {"opencl": select_device(), "llvm": select_device(target="llvm")}


@pytest.fixture(scope="module")
def workers(devices):
    with (
        MeasureWorker(devices["opencl"], timeout_s=60) as cl,
        MeasureWorker(devices["llvm"], timeout_s=60) as host,
    ):
        yield {"opencl": cl, "llvm": host}


def _space(devices, target, op, **params):
    return make_space(
        autosched.workload(op, **params), target=target, limits=devices[target].limits
    )


def _guarded(space, config) -> bool:
    """Whether some tile of ``config`` does not divide its axis (a guard or a vector tail)."""
    inner = space.nest.spatial[-1]
    blocks = any(a.extent % math.prod(config[f"tile.{a.name}"]) for a in space.nest.spatial)
    return blocks or space.pad_waste(config) > 1 or inner.extent % config["vec"] != 0


def _guarded_blocks(script: str) -> list[str]:
    """The blocks of a TVMScript that carry a ``T.where`` guard, in order."""
    out, block = [], None
    for line in script.splitlines():
        found = re.search(r'T\.sblock\("([^"]+)"\)', line)
        if found:
            block = found.group(1)
        elif "T.where" in line and block not in out:
            out.append(block)
    return out


def _check_all(workers, space, configs) -> None:
    assert configs
    data = make_data(space.workload, seed=5)
    for config in configs:
        assert space.check(config) is None, config
        outcome = workers[space.target].measure(build(space, config), data, ONCE)
        assert outcome.status == "ok", (space.target, config, outcome.error)


# -- the spaces ---------------------------------------------------------------------------


def test_tile_sizes_add_powers_of_two_within_the_waste_limit():
    assert tile_sizes(127, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert tile_sizes(333, 64) == [1, 2, 3, 4, 8, 9, 16, 32, 37, 64]
    assert tile_sizes(7, 64) == [1, 2, 4, 7, 8]  # 16 would pad 7 to 16
    for n in (64, 96, 512):  # these have all the powers of two they can take as divisors
        assert tile_sizes(n, 64) == [d for d in divisors(n) if d <= 64]
    for n, cap in ((127, 64), (333, 1024), (1000, 256), (7, 7)):
        assert all(padded(n, t) <= MAX_PAD_WASTE * n for t in tile_sizes(n, cap))


@pytest.mark.parametrize("target", TARGETS)
def test_power_of_two_spaces_keep_exactly_their_knobs(devices, target):
    """What the divisor-only spaces offered, in the same order: old records keep working
    and a seeded search on a power-of-two shape samples what it sampled before."""
    space = _space(devices, target, "matmul", M=64, N=128, K=32)
    for ax in space.nest.spatial:
        if target == "opencl":
            old = [
                (t, r)
                for t in divisors(ax.extent)
                if t <= 256
                for r in divisors(ax.extent // t)
                if r <= 64
            ]
        else:
            old = sorted(
                (m, r) for r in divisors(ax.extent) if r <= 64 for m in divisors(ax.extent // r)
            )
        assert list(space.knob(f"tile.{ax.name}").choices) == old
    cap = 64 if target == "opencl" else 1024
    assert space.knob("tile.k").choices == tuple(
        (c, u) for c in divisors(32) if c <= cap for u in (1, 2, 4, 8) if c % u == 0
    )
    assert space.knob("vec").choices == (1, 2, 4, 8, 16)


@pytest.mark.parametrize("target", TARGETS)
def test_prime_extents_get_wide_register_tiles_and_vectors(devices, target):
    space = _space(devices, target, "matmul", M=127, N=509, K=333)
    regs_i = {r for _, r in space.knob("tile.i").choices}
    regs_j = {r for _, r in space.knob("tile.j").choices}
    chunks = {c for c, _ in space.knob("tile.k").choices}
    assert {4, 8, 16} <= regs_i and {16, 32} <= regs_j and {16, 32, 64} <= chunks
    assert 16 in space.knob("vec").choices  # a vector tail on N=509
    stage = "local" if target == "opencl" else "pack"  # OpenCL pads B in local memory
    wide = space.default().replace(
        **{"tile.i": (1, 8), "tile.j": (1, 32), "tile.k": (64, 4), "vec": 16, "stage.B": stage}
    )
    assert space.check(wide) is None and _guarded(space, wide)
    assert space.groups(wide) == 16 * 16  # ceil(127 / 8) x ceil(509 / 32)
    assert space.describe(wide)["log_pad_waste"] == pytest.approx(
        np.log2(128 * 512 * 384 / (127 * 509 * 333))
    )
    # Each tile within the limit, together past it: 16 x 40 x 32 for 13 x 37 x 29.
    small = _space(devices, target, "matmul", M=13, N=37, K=29)
    over = small.default().replace(
        **{"tile.i": (1, 4), "tile.j": (1, 8), "tile.k": (32, 1), "vec": 8}
    )
    assert "pad the work by 47%" in small.check(over)
    # A conv with 7x7 outputs: register tiles of 8 along its rows and columns (or along
    # the 49 of both, where OpenCL fuses narrow rows: autosched.space.im2col.window_rows).
    conv = _space(devices, target, "conv2d", n=1, c=32, h=7, w=7, k=64, r=3, s=3, pad=1)
    for axis in ("pq",) if conv.rows else ("p", "q"):
        assert {r for _, r in conv.knob(f"tile.{axis}").choices} >= {2, 4, 8}


def test_rowwise_spaces_take_tails_on_odd_rows(devices):
    llvm = _space(devices, "llvm", "softmax", rows=127, cols=96)
    assert {16, 32, 64} <= set(llvm.knob("rows_per_task").choices)
    opencl = _space(devices, "opencl", "softmax", rows=127, cols=96)
    base = opencl.default().replace(reduce="item", threads=32)
    assert opencl.check(base) is None and opencl.groups(base) == 4
    assert "does not divide rows=127" in opencl.check(base.replace(threads=256))


# -- every guarded config computes the reference ------------------------------------------

MATMUL = dict(M=13, N=37, K=29)


@pytest.mark.parametrize("target", TARGETS)
def test_guarded_and_vector_tail_matmuls_are_correct(devices, workers, target):
    space = _space(devices, target, "matmul", **MATMUL)
    stage = "local" if target == "opencl" else "pack"
    base = space.default()
    # M and K guarded, N padded to whole vectors, A and B staged or not.
    tail = {"tile.i": (1, 2), "tile.j": (1, 8), "tile.k": (29, 1), "vec": 8}
    chosen = [
        {**tail, "stage.B": stage},
        {**tail, "stage.A": stage, "stage.B": stage, "tile.i": (2, 1)},
        {"tile.i": (1, 13), "tile.j": (1, 4), "tile.k": (32, 4), "vec": 4, "stage.B": stage},
        {"tile.i": (1, 13), "tile.j": (1, 8), "tile.k": (8, 4), "vec": 8, "stage.B": stage},
        {"tile.i": (1, 2), "tile.j": (1, 1), "tile.k": (8, 2), "vec": 1, "stage.A": stage},
    ]
    configs = [base.replace(**c) for c in chosen]
    configs += [base.replace(**tail)]  # B unstaged: a padded copy, made by its own loop
    if target == "llvm":
        configs += [base.replace(**tail, tile_inner="i")]
        # Blocks of register tiles cut short: 7 tiles of 2 rows in blocks of 4, 5 of 8
        # columns in blocks of 2.
        blocks = {**tail, "tile.i": (4, 2), "tile.j": (2, 8)}
        configs += [base.replace(**blocks), base.replace(**blocks, **{"stage.B": stage})]
        configs += [c.replace(reduce_at="block") for c in configs]
    else:  # OpenCL: a kernel of its own pads B; the main kernel writes C's real outputs
        program = build(space, base.replace(**tail))
        scratch = [(t.name, t.shape) for t in program.tensors if t.role == "scratch"]
        assert scratch == [("B_pad", (29, 40))]
        assert len(program.kernels) == 2
    rng = np.random.default_rng(3)
    configs += [c for c in space.sample(rng, 300) if _guarded(space, c)][:8]
    assert all(_guarded(space, c) for c in configs)
    _check_all(workers, space, configs)


def test_past_a_vector_tail_the_main_kernel_writes_the_real_outputs(devices, workers):
    """OpenCL: where N is padded to whole vectors of 8 (36 and 37 to 40), the main kernel
    writes the real outputs itself, with a fused epilogue too: each vector of
    accumulators is stored whole into a private vector and written out of it in the
    widest vectors that divide a row (4 for 36, single outputs for 37), a guard per
    vector. The accumulators stay vector-typed (``float8``; where the tile is one
    vector, the private vector is given a row stride of 12 so that TVM's storage rewrite
    does not merge the two and read the accumulators in halves: the 127x1000x333 matmul
    with a tile of one vector of 16 ran 4.5x slower that way), and there is no padded
    output nor a kernel copying it out. Until 2026-12-04 a kernel of its own copied the
    real outputs out of a padded output: on a Xeon's PoCL, interleaved by profiling
    events, the 127x1000x333 matmul's best config ran 380-411 us against 436-466 us that
    way, the 251x509x127 one's 129 us against 164-172."""
    tail = {"tile.i": (1, 2), "tile.j": (1, 8), "tile.k": (29, 1), "vec": 8, "stage.B": "local"}
    for n, rows, store in (
        (36, 2, r"vstore4\(vload4\(0, \w+ \+ \d+\), 0, C_ptr"),
        (36, 1, r"vstore4\(vload4\(0, \w+ \+ \d+\), 0, C_ptr"),
        (37, 2, r"C_ptr\[[^]]+\] = \w+\[\d+\];"),
    ):
        space = _space(devices, "opencl", "matmul", M=13, N=n, K=29)
        config = space.default().replace(**{**tail, "tile.i": (1, rows)})
        program = build(space, config)
        assert len(program.kernels) == 1
        assert not [t.name for t in program.tensors if t.role == "scratch"]
        assert re.search(rf"float8 \w+\[{rows}\];", program.source)
        assert re.search(store, program.source)
        _check_all(workers, space, [config])
    space = _space(devices, "opencl", "dense", m=13, n=37, k=29, epilogue="bias_gelu")
    config = space.default().replace(
        **{"tile.i": (1, 2), "tile.j": (1, 8), "tile.k": (29, 1), "vec": 8, "fuse": True}
    )
    program = build(space, config)
    assert [t.name for t in program.tensors if t.role == "scratch"] == ["W_pad"]
    assert len(program.kernels) == 2  # W's padded copy, then everything else
    _check_all(workers, space, [config])


def test_a_packed_input_past_a_vector_tail_is_copied_in_whole_vectors_of_a_row(devices, workers):
    """OpenCL: B packed into panels of 16 columns where N=56 is padded to 64 for vectors
    of 16 copies whole vectors of 8, the widest that divides a row, the zero panel half
    chosen per vector. Until 2026-12-04 the pack was scalar whenever ``vec`` did not
    divide N (a guard per lane): on a Xeon's PoCL the 127x1000x333 matmul's packing of
    B took 70-84 us that way and 62-69 us in vectors of 8, interleaved."""
    space = _space(devices, "opencl", "matmul", M=13, N=56, K=29)
    config = space.default().replace(
        **{"tile.i": (1, 2), "tile.j": (1, 16), "tile.k": (29, 1), "vec": 16, "stage.B": "pack"}
    )
    program = build(space, config)
    pack = program.kernels[0]
    body = program.source[program.source.index(f"__kernel void {pack.name}(") :]
    body = body[: body.index("\n}")]
    assert "vload8(0, B_ptr" in body and "vstore8" in body
    assert "B_ptr[" not in body  # no scalar reads
    _check_all(workers, space, [config])


def test_llvm_pads_spatial_tails_to_whole_register_tiles_where_opencl_guards_them(devices):
    """On llvm a matmul's spatial axes are padded to whole register tiles (no guard in the
    register tile's reduction loop, where it kept the accumulators out of registers);
    OpenCL keeps its guards. The reduction's tail stays guarded on both."""
    from autosched.space.schedule import schedule

    # M=13 in register tiles of 2 rows, N=37 in vectors of 8: both tails, K=29 whole.
    tail = {"tile.i": (1, 2), "tile.j": (1, 8), "tile.k": (29, 1), "vec": 8}
    llvm = _space(devices, "llvm", "matmul", **MATMUL)
    script = schedule(llvm, llvm.default().replace(**tail)).script()
    assert _guarded_blocks(script) == ["C_pad"]  # only the real outputs' write-back
    # ... from the task's own register tile: no padded output in global memory.
    assert 'C_pad_local = T.sblock_alloc_buffer((14, 40), scope="local")' in script
    assert "C_pad = T.sblock_alloc_buffer" not in script
    assert "A_pad = T.sblock_alloc_buffer((14, 29))" in script  # 13 rows padded to 14
    opencl = _space(devices, "opencl", "matmul", **MATMUL)
    guarded = schedule(opencl, opencl.default().replace(**tail)).script()
    assert "T.where" in guarded
    chunks = {"tile.i": (1, 13), "tile.j": (37, 1), "tile.k": (8, 4), "vec": 1}
    chunked = schedule(llvm, llvm.default().replace(**chunks)).script()
    assert "T.where" in chunked and "A_pad" not in chunked  # K=29 in chunks of 8: guarded


def test_llvm_cuts_a_last_block_short_by_whole_register_tiles_above_the_reduction(devices):
    """257 rows in register tiles of 4 are padded to 260, not to whole blocks. Blocks of
    16 tiles end in a block of one, whose guard names only the block and mid loops: TVM's
    HoistIfThenElse lifts it above the reduction loop, so the register tile's loops carry
    no guard. The axis also takes blocks of 13 tiles and one of all 65."""
    import tvm
    from tvm import s_tir

    from autosched.space.schedule import schedule

    llvm = _space(devices, "llvm", "matmul", M=257, N=512, K=129)
    assert {(13, 4), (16, 4), (65, 4)} <= set(llvm.knob("tile.i").choices)
    tiles = {"tile.i": (16, 4), "tile.j": (1, 16), "tile.k": (129, 1), "vec": 16}
    config = llvm.default().replace(**tiles, **{"stage.B": "pack"})
    assert llvm.check(config) is None
    assert llvm.pad_waste(config) == pytest.approx(260 / 257)
    mod = schedule(llvm, config)
    assert "A_pad = T.sblock_alloc_buffer((260, 129))" in mod.script()
    lower = [
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LowerOpaqueBlock(),
        s_tir.transform.HoistIfThenElse(),
    ]
    lines = [ln.strip() for ln in tvm.ir.transform.Sequential(lower)(mod).script().splitlines()]
    guards = [i for i, ln in enumerate(lines) if ln.startswith("if ")]
    tiles_guards = [i for i in guards if lines[i].endswith("< 65:")]
    assert tiles_guards, guards
    # Besides, only the write-back of the real outputs is guarded, on whole vectors of a
    # row (the 257th row is real, the rest of the last tile padding).
    rest = [i for i in guards if i not in tiles_guards]
    assert all(lines[i].endswith("< 257:") and "T.vectorized(16)" in lines[i + 1] for i in rest)
    assert any(lines[i + 1].startswith("for k_1 in range(129)") for i in tiles_guards)
    # One block of all 65 tiles: no guard but the real rows' write-back.
    whole = schedule(llvm, config.replace(**{"tile.i": (65, 4)})).script()
    assert _guarded_blocks(whole) == ["C_pad"]


@pytest.mark.parametrize("target", TARGETS)
def test_dense_with_odd_n_and_a_fused_epilogue_is_correct(devices, workers, target):
    space = _space(devices, target, "dense", m=9, n=37, k=23, epilogue="bias_gelu")
    base = space.default()
    stage = "local" if target == "opencl" else "pack"
    vec = {"tile.i": (1, 2), "tile.j": (1, 8), "tile.k": (23, 1), "vec": 8, "stage.W": stage}
    configs = [base.replace(**vec), base.replace(**vec, fuse=False)]
    configs += [base.replace(**{**vec, "stage.W": "global"})]  # W's padded copy: its own loop
    rng = np.random.default_rng(4)
    configs += [c for c in space.sample(rng, 300) if _guarded(space, c)][:4]
    _check_all(workers, space, configs)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_with_7x7_outputs_is_correct(devices, workers, target, layout):
    space = _space(
        devices, target, "conv2d", n=1, c=8, h=7, w=7, k=16, r=3, s=3, pad=1, layout=layout
    )
    rng = np.random.default_rng(5)
    configs = [c for c in space.sample(rng, 300) if _guarded(space, c)][:6]
    staged = "local" if target == "opencl" else "pack"
    wide = {"tile.pq": (1, 8)} if space.rows else {"tile.p": (1, 7), "tile.q": (1, 8)}
    base = space.default().replace(**wide)
    (produced,) = space.nest.produced  # the padding, or the im2col matrix that reads it
    configs += [base, base.replace(**{f"stage.{produced}": staged, f"fuse.{produced}": True})]
    _check_all(workers, space, [c for c in configs if space.check(c) is None])


ROWWISE = [
    ("softmax", dict(rows=13, cols=40)),
    ("reduce", dict(rows=11, cols=49, kind="sum")),
    ("elementwise", dict(rows=7, cols=36, ops="add+gelu")),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op,params", ROWWISE, ids=[op for op, _ in ROWWISE])
def test_rowwise_tails_are_correct(devices, workers, target, op, params):
    space = _space(devices, target, op, **params)
    rng = np.random.default_rng(6)
    configs = []
    for c in space.sample(rng, 400):
        rows, cols = space.nest.rows, space.nest.cols
        tails = (
            rows % c.get("rows_per_task", 1)
            or (c.get("reduce") == "item" and rows % c["threads"])
            or cols % c.get("per_item", 1)
            or (cols // c["vec"]) % c.get("unroll", 1)
        )
        if tails:
            configs.append(c)
    _check_all(workers, space, configs[:6])
