"""A reduction's partial results in OpenCL C: TVM's private scalar array becomes one vector
variable where every use allows it (autosched.measure.opencl_source), checked on text
and on a real row-wise kernel built by TVM and run on PoCL against numpy."""

from __future__ import annotations

import re

import pytest

from autosched.measure.build import build
from autosched.measure.opencl_source import vector_accumulators
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import workload
from autosched.space.config import Config
from autosched.space.select import make_space
from tests.conftest import make_data

FUSED_SOFTMAX = ("row_max", "exp", "row_sum")

KERNEL = """\
__kernel void main_kernel(__global float* restrict x_ptr, __global float* restrict y_ptr) {
  float acc[4];
  float total[1];
  if (get_local_id(0) < 3) {
    vstore4(((float4)(0.000000e+00f, 0.000000e+00f, 0.000000e+00f, 0.000000e+00f)), 0, acc + 0);
  }
  for (int j = 0; j < 8; ++j) {
    vstore4((vload4(0, acc + 0) + vload4(0, x_ptr + (j * 4))), 0, acc + 0);
  }
  acc[3] = (acc[3] * 2.000000e+00f);
  total[0] = ((acc[0] + acc[1]) + (acc[2] + acc[3]));
  y_ptr[0] = total[0];
}
"""


def test_partial_results_read_whole_or_by_lane_become_one_vector_variable():
    out = vector_accumulators(KERNEL)
    assert "float4 acc;" in out and "float acc[4]" not in out
    assert "    acc = ((float4)(" in out  # the whole store
    assert "acc = (acc + vload4(0, x_ptr + (j * 4)));" in out  # load and store
    assert "acc.s3 = (acc.s3 * 2.000000e+00f);" in out  # lanes, read and written
    assert "total[0] = ((acc.s0 + acc.s1) + (acc.s2 + acc.s3));" in out
    assert "float total[1];" in out  # not a vector width: as it was
    assert vector_accumulators(out) == out


def test_a_lane_the_code_computes_is_read_through_a_pointer_to_the_vector():
    # TVM's loop over the lanes of a row's last, partial vector; OpenCL C names a
    # vector's lanes only by constants.
    tail = KERNEL.replace("acc[3] = (acc[3] * 2", "acc[(j - 5)] = (acc[(j - 5)] * 2")
    out = vector_accumulators(tail)
    assert "((float*)&acc)[(j - 5)] = (((float*)&acc)[(j - 5)] * 2" in out
    assert "float4 acc;" in out and "acc.s0" in out


def test_an_array_used_any_other_way_is_left_as_tvm_wrote_it():
    offset = KERNEL.replace("vload4(0, acc + 0) +", "vload4(0, acc + 0) + vload4(0, acc + 4) +")
    past_the_end = KERNEL.replace("acc[3] = (acc[3]", "acc[5] = (acc[3]")
    nested = KERNEL.replace("acc[3] = (acc[3]", "acc[idx[3]] = (acc[3]")
    passed_on = KERNEL.replace("y_ptr[0] = total[0];", "y_ptr[0] = f(acc);")
    for text in (offset, past_the_end, nested, passed_on):
        assert vector_accumulators(text) == text
    # Used lane by lane only (a contraction's register tile of four scalars): as it was.
    tile = (
        "__kernel void k(__global float* y) {\n  float C[4];\n  C[0] = 0.0f;\n  y[0] = C[0];\n}\n"
    )
    assert vector_accumulators(tile) == tile


def test_each_kernel_of_a_source_is_rewritten_on_its_own():
    second = KERNEL.replace("main_kernel", "main_kernel_1")
    out = vector_accumulators(KERNEL + second)
    assert out.count("float4 acc;") == 2 and "float acc[4]" not in out


@pytest.mark.parametrize(
    ("op", "params", "config"),
    [  # 768 columns in 16-wide vectors; 197 (a ViT's tokens): a five-lane tail
        ("layernorm", {"rows": 37, "cols": 768}, {"fuse.row_sum": True, "fuse.var_sum": True}),
        ("softmax", {"rows": 24, "cols": 197}, {f"fuse.{s}": True for s in FUSED_SOFTMAX}),
    ],
)
def test_tvm_row_kernels_keep_their_partial_results_in_vector_registers(device, op, params, config):
    wl = workload(op, **params)
    space = make_space(wl, limits=device.limits)
    config = Config(config | {"reduce": "item", "threads": 4, "unroll": 4, "vec": 16})
    assert space.check(config) is None, space.check(config)
    program = build(space, config)
    assert len(re.findall(r"^\s*float16 \w+;$", program.source, re.M)) == 2  # both reductions
    assert not re.search(r"^\s*float \w+\[16\];", program.source, re.M)
    # A tail's live lanes are written one by one, by constant lanes: .s0 to .s4 of 197.
    assert "((float*)&" not in program.source
    assert bool(re.search(r"\w+\.s4 = ", program.source)) == bool(params["cols"] % 16)
    options = TimingOptions(warmup=0, min_repeats=2, max_repeats=3, min_time_s=0.0)
    with MeasureWorker(device, timeout_s=60) as worker:
        outcome = worker.measure(program, make_data(wl), options)
    assert outcome.status == "ok", outcome.error  # checked against numpy's
