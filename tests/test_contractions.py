"""Every contraction operator tunes on both targets: correct kernels, faster than the default.

Batch matmul, dense with a GELU epilogue, conv2d in both layouts (with padding, stride
and groups) and depthwise conv2d go through the same space, search, measure and
records code as matmul; these tests hold the whole path to what a user cares about.
"""

from __future__ import annotations

import dataclasses

import pytest

import autosched
from autosched.measure.build import build
from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.config import Config
from autosched.space.select import make_space
from tests.conftest import make_data

QUICK = TimingOptions(warmup=1, min_repeats=3, max_repeats=30, min_time_s=0.02)

SMALL = {
    "batch_matmul": dict(b=4, m=64, n=64, k=64),
    "dense": dict(m=32, n=128, k=128, epilogue="bias_gelu"),
    "conv2d": dict(n=1, c=16, h=16, w=16, k=32, r=3, s=3, pad=1),
    "depthwise_conv2d": dict(n=1, c=64, h=32, w=32, r=3, s=3, pad=1, layout="NHWC"),
}


@pytest.mark.timed
@pytest.mark.parametrize("target", ["opencl", "llvm"])
@pytest.mark.parametrize("op", sorted(SMALL))
def test_short_tune_beats_the_default_and_its_best_kernel_is_correct(tmp_path, op, target):
    wl = autosched.workload(op, **SMALL[op])
    db = tmp_path / "records.db"
    result = autosched.tune(
        wl, trials=10, batch=5, target=target, db=db, seed=2, timing=QUICK, strategy="model"
    )
    assert result.best is not None and result.default is not None
    # Measured side by side at the end of the run.
    assert result.speedup > 1.5, (op, target, result.best.gflops, result.default.gflops)
    device = select_device(target=target)
    with SQLiteDatabase(db) as store:
        best = store.best(wl.key, device_key=device.key(target), target=target)[0]
    program = build(
        make_space(wl, target=target, limits=device.limits), Config.from_json(best.config)
    )
    with MeasureWorker(device) as w:  # fresh inputs: the kernel is right, not just lucky
        assert w.measure(program, make_data(wl, seed=7), QUICK).status == "ok"


PADDED = [
    dict(n=1, c=8, h=12, w=12, k=16, r=3, s=3, pad=1),
    dict(n=2, c=8, h=13, w=11, k=8, r=3, s=3, pad=2, stride=2, dilation=2, layout="NHWC"),
    dict(n=1, c=8, h=10, w=10, k=16, r=3, s=3, pad=1, groups=4),
    dict(n=1, c=8, h=10, w=10, k=8, r=3, s=3, pad=1, groups=2, layout="NHWC"),
]


@pytest.mark.parametrize("target", ["opencl", "llvm"])
@pytest.mark.parametrize(
    "params", PADDED, ids=lambda p: f"{p.get('layout', 'NCHW')}-g{p.get('groups', 1)}"
)
def test_padding_fused_staged_or_its_own_kernel_is_correct(params, target):
    """Every way of placing the padding producer computes the reference."""
    wl = autosched.workload("conv2d", **params)
    device = select_device(target=target)
    space = make_space(wl, target=target, limits=device.limits)
    # The padding, or where OpenCL fuses narrow rows (autosched.space.im2col.window_rows)
    # the im2col matrix that computes the padding inside it.
    (produced,) = space.nest.produced
    assert produced == ("pad_reindex" if space.rows else "pad")
    staged = "local" if target == "opencl" else "pack"
    base = space.default()
    if target == "opencl":  # room in local memory for a staged tile
        base = base.replace(**{f"tile.{a.name}": (1, 1) for a in space.nest.spatial})
    data = make_data(wl, seed=3)
    with MeasureWorker(device) as w:
        for fuse in (True, False):
            for stage in ("global", staged):
                config = base.replace(**{f"fuse.{produced}": fuse, f"stage.{produced}": stage})
                assert space.scratch(config) == (() if fuse else (produced,))
                outcome = w.measure(build(space, config), data, QUICK)
                assert outcome.status == "ok", (fuse, stage, outcome.error)


@pytest.mark.parametrize("target", ["opencl", "llvm"])
def test_dense_epilogue_fused_and_unfused_is_correct(target):
    wl = autosched.workload("dense", m=16, n=64, k=32, epilogue="bias_gelu")
    device = select_device(target=target)
    space = make_space(wl, target=target, limits=device.limits)
    data = make_data(wl, seed=4)
    with MeasureWorker(device) as w:
        for fuse in (True, False):
            config = space.default().replace(fuse=fuse)
            assert space.scratch(config) == (() if fuse else ("Y",))
            outcome = w.measure(build(space, config), data, QUICK)
            assert outcome.status == "ok", (fuse, outcome.error)


# OpenCL on a CPU driver: inputs along the lanes packed into panels by a kernel of their
# own. (operator, parameters, configs over the default); every one computes the reference.
PANELS = [
    (
        "matmul",
        dict(M=13, N=37, K=29),  # N padded to whole vectors: the padded copy is the packed one
        [
            {"tile.i": (1, 2), "tile.j": (1, 8), "tile.k": (29, 1), "vec": 8},
            {"tile.i": (13, 1), "tile.j": (1, 8), "tile.k": (4, 2), "vec": 4, "stage.A": "local"},
            {"tile.i": (1, 13), "tile.j": (1, 1), "tile.k": (1, 1), "vec": 1},
        ],
    ),
    ("matmul", dict(M=16, N=32, K=8), [{"tile.i": (1, 4), "tile.j": (1, 16), "vec": 16}]),
    (  # W laid out [n, k]: its panels run along the reduction
        "dense",
        dict(m=9, n=37, k=23, epilogue="bias_gelu"),
        [
            {"tile.i": (1, 2), "tile.j": (1, 8), "vec": 8},
            {"tile.j": (1, 8), "vec": 8, "fuse": False},
        ],
    ),
    ("batch_matmul", dict(b=3, m=5, n=24, k=7), [{"tile.j": (1, 8), "vec": 8}]),
    (
        "conv2d",
        dict(n=1, c=8, h=7, w=7, k=16, r=3, s=3, pad=1, layout="NHWC"),
        [{"tile.k": (1, 8), "vec": 8}, {"tile.k": (1, 16), "tile.q": (1, 7), "vec": 8}],
    ),
    (  # rows of 7: the im2col matrix, whose producer writes the panels (past a vector
        # tail, its zero-padded copy does)
        "conv2d",
        dict(n=1, c=8, h=7, w=7, k=16, r=3, s=3, pad=1),
        [
            {"fuse.pad_reindex": False, "tile.pq": (1, 8), "vec": 8, "tile.k": (1, 4)},
            {"fuse.pad_reindex": False, "tile.pq": (1, 7), "tile.k": (1, 4)},
            {"fuse.pad_reindex": False, "tile.pq": (7, 7)},
        ],
    ),
]


@pytest.mark.parametrize(
    "op,params,chosen", PANELS, ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(PANELS)]
)
def test_opencl_inputs_packed_into_panels_compute_the_reference(op, params, chosen):
    wl = autosched.workload(op, **params)
    device = select_device()
    space = make_space(wl, target="opencl", limits=device.limits)
    (packed,) = [
        a.buffer for a in space.nest.inputs if "pack" in space.knob(f"stage.{a.buffer}").choices
    ]
    base = space.default().replace(**{f"stage.{packed}": "pack"})
    configs = [base.replace(**c) for c in chosen]
    data = make_data(wl, seed=6)
    with MeasureWorker(device) as w:
        for config in configs:
            assert space.check(config) is None, config
            program = build(space, config)
            # A kernel of its own writes the panels: [n / reg, ..., n % reg].
            reg = config[f"tile.{space.nest.spatial[-1].name}"][1]
            (panels,) = [
                t
                for t in program.tensors
                if t.role == "scratch" and t.shape[-1] == reg and t.name.startswith(packed)
            ]
            assert len(program.kernels) >= 2
            outcome = w.measure(program, data, QUICK)
            assert outcome.status == "ok", (config, outcome.error)


def test_opencl_panels_take_register_tiles_that_divide_their_axis_and_not_on_a_gpu():
    wl = autosched.workload("matmul", M=13, N=37, K=29)
    space = make_space(wl, target="opencl", limits=select_device().limits)
    # N=37 padded to 38 by 2-lane vectors: panels of 4 columns do not divide it.
    config = space.default().replace(**{"tile.j": (1, 4), "vec": 2, "stage.B": "pack"})
    assert "stage.B=pack takes register tiles that divide axis j of 38" in space.check(config)
    assert space.check(config.replace(**{"stage.B": "global"})) is None
    conv = autosched.workload("conv2d", n=1, c=8, h=7, w=7, k=16, r=3, s=3, pad=1)
    space = make_space(conv, target="opencl", limits=select_device().limits)
    config = space.default().replace(**{"stage.pad_reindex": "pack"})
    assert config["fuse.pad_reindex"] is True
    assert "writes the panels in a kernel of its own: fuse.pad_reindex=False" in space.check(config)
    gpu = dataclasses.replace(select_device().limits, is_cpu=False)
    assert make_space(wl, target="opencl", limits=gpu).knob("stage.B").choices == (
        "global",
        "local",
    )
