"""NCHW convolutions with narrow rows, tiled on OpenCL as im2col products.

The rewrite (:mod:`autosched.space.im2col`) fuses the output rows and columns into one
axis, copies the image into an im2col matrix laid out with that axis innermost, and
leaves the main block an einsum whose fused axis takes padded vector tails. These tests
hold which nests it applies to, the space it gives, and that every placement of the
matrix (fused, staged, its own kernel, padded past a vector tail) computes the reference
on PoCL through real TVM codegen.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autosched
from autosched.measure.build import build
from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.space.im2col import window_rows
from autosched.space.loopnest import analyze
from autosched.space.select import make_space
from tests.conftest import make_data

ONCE = TimingOptions(warmup=0, min_repeats=1, max_repeats=1, min_time_s=0.0)
CONV7 = dict(n=1, c=8, h=7, w=7, k=16, r=3, s=3, pad=1)


@pytest.fixture(scope="module")
def device():
    return select_device()


def _space(device, op, *, lanes=16, target="opencl", **params):
    """The space on this device as if its native vectors had ``lanes`` lanes (the rule
    reads the lanes; the kernels run on the real device either way)."""
    limits = dataclasses.replace(device.limits, vector_lanes=lanes)
    return make_space(autosched.workload(op, **params), target=target, limits=limits)


def test_only_an_image_read_through_a_window_has_its_rows_fused():
    conv = analyze(autosched.workload("conv2d", **CONV7))
    assert window_rows(conv, 16) == ("p", "q")
    assert window_rows(conv, 4) == ("p", "q")  # 1 lane of 4: a quarter
    assert window_rows(conv, 2) is None  # half of a 2-lane vector
    # Rows of 28 take 4 lanes: fused on a 16-lane device, not on an 8-lane one; rows of
    # 56 take 8 and keep their own nest at 16 lanes (it ran faster there).
    conv28 = analyze(autosched.workload("conv2d", **dict(CONV7, h=28, w=28)))
    assert window_rows(conv28, 16) == ("p", "q") and window_rows(conv28, 8) is None
    conv56 = analyze(autosched.workload("conv2d", **dict(CONV7, h=56, w=56)))
    assert window_rows(conv56, 16) is None and window_rows(conv56, 32) == ("p", "q")
    nhwc = analyze(autosched.workload("conv2d", **CONV7, layout="NHWC"))
    assert window_rows(nhwc, 16) is None  # its innermost axis is the channels
    depthwise = analyze(autosched.workload("depthwise_conv2d", n=1, c=8, h=7, w=7, r=3, s=3))
    assert window_rows(depthwise, 16) == ("p", "q")
    # A matmul of 7 columns: A reads the rows alone, so a fused axis would copy A 7 times.
    matmul = analyze(autosched.workload("matmul", M=64, N=7, K=64))
    assert window_rows(matmul, 16) is None


def test_the_rewritten_space_tiles_the_fused_rows_and_pads_their_vector_tail(device):
    space = _space(device, "conv2d", **CONV7)
    assert space.rows == ("p", "q")
    names = {k.name for k in space.knobs}
    assert {"tile.pq", "fuse.pad_reindex", "stage.pad_reindex", "fuse"} <= names
    assert not names & {"tile.p", "tile.q", "fuse.pad"}
    assert space.nest.spatial[-1].extent == 49
    assert {8} <= set(space.knob("vec").choices)  # 49 outputs padded to 56 lanes
    # The same conv keeps its own nest on llvm and where its rows fill half a vector.
    assert {"tile.p", "tile.q"} <= {
        k.name for k in _space(device, "conv2d", lanes=2, **CONV7).knobs
    }
    llvm = _space(device, "conv2d", target="llvm", **CONV7)
    assert llvm.rows is None and "tile.q" in {k.name for k in llvm.knobs}
    # Past a vector tail the padded matrix is staged (fused) or its own kernel (unfused).
    tail = space.default().replace(**{"tile.pq": (1, 8), "vec": 8})
    assert space.check(tail.replace(**{"fuse.pad_reindex": False})) is None
    reason = space.check(tail.replace(**{"fuse.pad_reindex": True}))
    assert "fuse.pad_reindex=True with stage.pad_reindex='global'" in reason


CONVS = [
    ("conv2d", CONV7),
    ("conv2d", dict(n=1, c=8, h=13, w=11, k=8, r=3, s=3, pad=2, stride=2, dilation=2)),
    ("conv2d", dict(n=2, c=8, h=6, w=6, k=8, r=3, s=3, groups=2)),  # pad 0: no producer
    ("depthwise_conv2d", dict(n=1, c=16, h=7, w=7, r=3, s=3, pad=1)),
]


@pytest.mark.parametrize("op,params", CONVS, ids=["7x7", "stride-dilation", "groups", "depthwise"])
def test_every_placement_of_the_im2col_matrix_computes_the_reference(device, op, params):
    space = _space(device, op, **params)
    assert space.rows is not None
    (matrix,) = space.nest.produced
    base = space.default()
    configs = []
    for vec, reg in ((1, 1), (4, 4), (8, 8)):  # no tail (vec 1), and tails of whole vectors
        for fuse in (True, False):
            for stage in ("global", "local"):
                config = base.replace(
                    **{"tile.pq": (1, reg), "vec": vec, f"fuse.{matrix}": fuse},
                    **{f"stage.{matrix}": stage, "fuse": fuse},
                )
                if space.check(config) is None:
                    configs.append(config)
    configs += space.sample(np.random.default_rng(7), 6)
    assert len(configs) >= 12
    data = make_data(space.workload, seed=8)
    with MeasureWorker(device, timeout_s=60) as worker:
        for config in configs:
            outcome = worker.measure(build(space, config), data, ONCE)
            assert outcome.status == "ok", (config, outcome.error)


def test_a_short_tune_of_the_7x7_conv_records_fused_rows_where_the_device_has_wide_vectors(
    tmp_path, device
):
    wl = autosched.workload("conv2d", **CONV7)
    result = autosched.tune(wl, trials=8, batch=4, target="opencl", db=tmp_path / "r.db", seed=1)
    assert result.best is not None and result.best.status == "ok"
    # Rows of 7 take 1 lane: fused wherever a native vector has 4 or more.
    assert ("tile.pq" in result.best.config) == (device.limits.vector_lanes >= 4)
