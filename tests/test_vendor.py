"""The numpy vendor baselines compute what each operator's reference computes."""

from __future__ import annotations

import numpy as np
import pytest

import autosched
from autosched.errors import InvalidInputError
from autosched.ops import OPS
from autosched.report.vendor import VENDOR_OPS, measure_vendor, time_vendor, vendor_callable

W = autosched.workload
CASES = [
    W("matmul", M=16, N=24, K=8),
    W("matmul", M=16, N=24, K=8, epilogue="bias"),
    W("matmul", M=16, N=24, K=8, epilogue="bias_relu"),
    W("dense", m=8, n=16, k=12),
    W("dense", m=8, n=16, k=12, epilogue="bias_relu"),
    W("dense", m=8, n=16, k=12, epilogue="bias_gelu"),
    W("batch_matmul", b=3, m=8, n=4, k=5),
    W("conv2d", n=2, c=4, h=9, w=9, k=6, r=3, s=3, stride=2, pad=1),
    W("conv2d", n=1, c=4, h=8, w=8, k=6, r=1, s=1),
    W("conv2d", n=2, c=4, h=10, w=9, k=6, r=3, s=3, stride=2, pad=2, dilation=2, groups=2),
    W("conv2d", n=2, c=4, h=9, w=9, k=6, r=3, s=2, pad=1, layout="NHWC"),
    W(
        "conv2d",
        n=2,
        c=4,
        h=9,
        w=9,
        k=6,
        r=3,
        s=3,
        stride=2,
        pad=1,
        dilation=2,
        groups=2,
        layout="NHWC",
    ),  # fmt: skip
    W("depthwise_conv2d", n=2, c=4, h=9, w=9, r=3, s=3, stride=2, pad=1),
    W("depthwise_conv2d", n=2, c=4, h=9, w=8, r=3, s=2, layout="NHWC"),
    W("softmax", rows=8, cols=33),
    W("layernorm", rows=8, cols=33),
    W("reduce", rows=8, cols=33, kind="sum"),
    W("reduce", rows=8, cols=33, kind="max"),
    W("elementwise", rows=8, cols=33, ops="add+gelu+mul+relu"),
    W("elementwise", rows=4, cols=16, ops="gelu"),
]


def test_every_op_has_a_baseline():
    assert set(VENDOR_OPS) == set(OPS)
    assert {wl.op for wl in CASES} == set(OPS)


@pytest.mark.parametrize("wl", CASES, ids=repr)
def test_baseline_computes_the_reference(wl):
    fn, inputs = vendor_callable(wl, seed=3)
    want = wl.reference(inputs)
    for _ in range(2):  # the buffers a call reuses start from what the last call left
        got = fn(**inputs)
        assert got.keys() == want.keys()
        rtol, atol = wl.tolerance()
        for name, expected in want.items():
            assert got[name].shape == expected.shape and got[name].dtype == np.float32
            np.testing.assert_allclose(got[name], expected, rtol=rtol, atol=max(atol, 1e-6))


def test_timing_and_json_workloads():
    wl = W("conv2d", n=1, c=8, h=16, w=16, k=8, r=3, s=3, pad=1)
    timing = time_vendor(wl.to_json(), min_time_s=0.01)
    assert timing.repeats >= 5 and timing.median_s > 0
    assert timing.gflops == pytest.approx(wl.flops() / timing.median_s / 1e9)
    assert timing.blas and timing.threads and "im2col" in timing.method
    rowwise = time_vendor(W("layernorm", rows=16, cols=64), min_time_s=0)
    assert rowwise.blas == "" and rowwise.threads == ""
    assert measure_vendor(W("reduce", rows=16, cols=64, kind="max"), min_time_s=0) > 0
    with pytest.raises(InvalidInputError, match="min_time_s"):
        time_vendor(wl, min_time_s=-1)
