"""Every contraction operator tunes on both targets: correct kernels, faster than the default.

Batch matmul, dense with a GELU epilogue, conv2d in both layouts (with padding, stride
and groups) and depthwise conv2d go through the same space, search, measure and
records code as matmul; these tests hold the whole path to what a user cares about.
"""

from __future__ import annotations

import pytest

import autosched
from autosched.measure.build import build
from autosched.measure.cpu import host_cpu
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


def _device(target):
    return select_device() if target == "opencl" else host_cpu()


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
    device = _device(target)
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
    device = _device(target)
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
    device = _device(target)
    space = make_space(wl, target=target, limits=device.limits)
    data = make_data(wl, seed=4)
    with MeasureWorker(device) as w:
        for fuse in (True, False):
            config = space.default().replace(fuse=fuse)
            assert space.scratch(config) == (() if fuse else ("Y",))
            outcome = w.measure(build(space, config), data, QUICK)
            assert outcome.status == "ok", (fuse, outcome.error)
