"""The operators: TE compute against numpy reference through TVM's LLVM backend, stable
keys, parameter checks, and the grouped / NHWC convolution references against naive loops.

No schedule space here: each compute is built as TE writes it (``te.create_prim_func``,
no schedule), which checks that the compute and the reference agree.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from autosched.errors import InvalidInputError
from autosched.ops import OPS, Workload, workload, workload_from_json

# Tiny shapes covering every operator and option; each builds and runs in well under 1 s.
CASES: list[tuple[str, dict]] = [
    ("matmul", dict(M=5, N=6, K=7, epilogue="bias_relu")),
    ("batch_matmul", dict(b=2, m=3, n=5, k=4)),
    ("dense", dict(m=3, n=5, k=7)),
    ("dense", dict(m=3, n=5, k=7, epilogue="bias")),
    ("dense", dict(m=3, n=5, k=7, epilogue="bias_relu")),
    ("dense", dict(m=3, n=5, k=7, epilogue="bias_gelu")),
    ("conv2d", dict(n=2, c=3, h=5, w=6, k=4, r=3, s=2)),
    ("conv2d", dict(n=1, c=3, h=7, w=6, k=4, r=3, s=3, stride=2, pad=1, dilation=2)),
    ("conv2d", dict(n=1, c=4, h=6, w=5, k=6, r=3, s=3, pad=1, groups=2)),
    ("conv2d", dict(n=2, c=3, h=5, w=6, k=4, r=3, s=2, pad=1, layout="NHWC")),
    (
        "conv2d",
        dict(
            n=1, c=6, h=7, w=7, k=9, r=3, s=2, stride=2, pad=2, dilation=2, groups=3, layout="NHWC"
        ),
    ),
    ("depthwise_conv2d", dict(n=1, c=3, h=5, w=6, r=3, s=3)),
    ("depthwise_conv2d", dict(n=2, c=3, h=6, w=5, r=3, s=2, stride=2, pad=1)),
    ("depthwise_conv2d", dict(n=1, c=4, h=6, w=6, r=3, s=3, pad=1, layout="NHWC")),
    ("softmax", dict(rows=3, cols=7)),
    ("layernorm", dict(rows=3, cols=7)),
    ("reduce", dict(rows=3, cols=7, kind="sum")),
    ("reduce", dict(rows=3, cols=7, kind="max")),
    ("elementwise", dict(rows=3, cols=7, ops="gelu")),
    ("elementwise", dict(rows=3, cols=7, ops="add+gelu")),
    ("elementwise", dict(rows=3, cols=7, ops="mul+relu+add+gelu+add+mul+relu+gelu")),
]
CONTRACTIONS = {"matmul", "batch_matmul", "dense", "conv2d", "depthwise_conv2d"}


def _case_id(case: tuple[str, dict]) -> str:
    op, params = case
    return op + ":" + ",".join(f"{k}={v}" for k, v in params.items())


def _run_llvm(wl: Workload, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tvm
    from tvm import te

    st = wl.stages()
    func = te.create_prim_func([*st.inputs, *st.outputs])
    lib = tvm.compile(func, target=tvm.target.Target({"kind": "llvm"}))
    args = [tvm.runtime.tensor(inputs[t.op.name]) for t in st.inputs]
    outs = [
        tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], str(t.dtype))) for t in st.outputs
    ]
    lib(*args, *outs)
    return {t.op.name: o.numpy() for t, o in zip(st.outputs, outs)}


def _computed(tensors) -> list:
    """Every computed tensor the given ones depend on (themselves included), topologically."""
    from tvm import te

    seen: dict[str, object] = {}

    def visit(t) -> None:
        if t.op.name in seen or not isinstance(t.op, te.ComputeOp):
            return
        for src in t.op.input_tensors:
            visit(src)
        seen[t.op.name] = t

    for t in tensors:
        visit(t)
    return list(seen.values())


# -- compute against reference ---------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_compute_matches_reference_through_llvm(case):
    wl = workload(case[0], **case[1])
    inputs = wl.make_inputs(np.random.default_rng(0))
    expected = wl.reference(inputs)
    got = _run_llvm(wl, inputs)
    rtol, atol = wl.tolerance()
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert value.dtype == np.float32 and got[name].shape == value.shape
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)
    # The tolerance is tight enough that a slightly wrong output fails.
    for name, value in expected.items():
        off = got[name] + 2 * (atol + rtol * np.abs(got[name]))
        assert not np.allclose(off, value, rtol=rtol, atol=atol), name


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_stages_follow_the_contract(case):
    from tvm import te

    wl = workload(case[0], **case[1])
    st = wl.stages()
    inputs = wl.make_inputs(np.random.default_rng(0))
    # Inputs in argument order, named and shaped as make_inputs gives them.
    assert [t.op.name for t in st.inputs] == list(inputs)
    for t in st.inputs:
        assert isinstance(t.op, te.PlaceholderOp)
        assert tuple(int(d) for d in t.shape) == inputs[t.op.name].shape
        assert inputs[t.op.name].dtype == np.float32
        assert np.all(np.abs(inputs[t.op.name]) <= 1)
    assert [t.op.name for t in st.outputs] == list(wl.reference(inputs))
    # intermediates: every computed tensor that is not an output, in compute order.
    computed = _computed(st.outputs)
    assert [t.op.name for t in st.intermediates] == [
        t.op.name for t in computed if t.op.name not in {o.op.name for o in st.outputs}
    ]
    reductions = [t for t in computed if t.op.reduce_axis]
    if wl.op in CONTRACTIONS:
        assert len(reductions) == 1 and st.main is not None
        assert st.main.op.name == reductions[0].op.name
    else:
        assert st.main is None
    # TVM keeps the stages in this order as the blocks of the PrimFunc.
    names = [t.op.name for t in (*st.intermediates, *st.outputs)]
    assert _block_names(st) == names
    assert len(set(names) | {t.op.name for t in st.inputs}) == len(names) + len(st.inputs)
    assert wl.flops() > 0
    roles = [s.role for s in wl.tensor_specs(scratch=[t.op.name for t in st.intermediates])]
    counts = (len(st.inputs), len(st.outputs), len(st.intermediates))
    assert roles == ["input"] * counts[0] + ["output"] * counts[1] + ["scratch"] * counts[2]


def _blocks(st):
    from tvm import te
    from tvm.s_tir import Schedule

    sch = Schedule(te.create_prim_func([*st.inputs, *st.outputs]))
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _block_names(st) -> list[str]:
    return [b.name_hint for b in _blocks(st)]


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in CONTRACTIONS], ids=_case_id)
def test_contraction_indices_are_affine(case):
    import tvm

    wl = workload(case[0], **case[1])
    st = wl.stages()
    for block in _blocks(st):
        variables = [iv.var for iv in block.iter_vars]
        for region in block.reads:  # what the space's loop-nest analysis reads
            for rng in region.region:
                coeffs = tvm.sym.detect_linear_equation(rng.min, variables)
                assert len(coeffs) == len(variables) + 1, (block.name_hint, region)
                assert int(rng.extent) == 1, (block.name_hint, region)


def test_pad_stage_only_with_padding():
    no_pad = workload("conv2d", n=1, c=3, h=5, w=5, k=4, r=3, s=3)
    padded = workload("conv2d", n=1, c=3, h=5, w=5, k=4, r=3, s=3, pad=1)
    assert no_pad.stages().intermediates == ()
    assert [t.op.name for t in padded.stages().intermediates] == ["pad"]
    dw = workload("depthwise_conv2d", n=1, c=3, h=5, w=5, r=3, s=3, pad=2, layout="NHWC")
    (pad,) = dw.stages().intermediates
    assert pad.op.name == "pad" and tuple(int(d) for d in pad.shape) == (1, 9, 9, 3)


def test_axis_names_follow_the_parameters():
    def axes(wl):
        (main,) = [b for b in _blocks(wl.stages()) if b.name_hint == wl.stages().main.op.name]
        return [str(iv.var.name).removeprefix("v_") for iv in main.iter_vars]

    conv = dict(n=1, c=4, h=5, w=5, k=4, r=3, s=3)
    assert axes(workload("conv2d", **conv)) == ["n", "k", "p", "q", "c", "r", "s"]
    assert axes(workload("conv2d", **conv, groups=2, layout="NHWC")) == [
        "n",
        "p",
        "q",
        "g",
        "k",
        "r",
        "s",
        "c",
    ]
    assert axes(workload("depthwise_conv2d", n=1, c=4, h=5, w=5, r=3, s=3)) == [
        "n",
        "c",
        "p",
        "q",
        "r",
        "s",
    ]
    assert axes(workload("dense", m=2, n=3, k=4)) == ["i", "j", "k"]
    assert axes(workload("batch_matmul", b=2, m=3, n=4, k=5)) == ["b", "i", "j", "k"]


# -- convolution references against naive loops -----------------------------------------
def _naive_conv_nchw(data, weight5, *, stride, pad, dilation):
    """Grouped NCHW convolution, one output element at a time, weight (g, k/g, c/g, r, s)."""
    g, kg, cg, r, s = weight5.shape
    n, c, h, w = data.shape
    p = (h + 2 * pad - dilation * (r - 1) - 1) // stride + 1
    q = (w + 2 * pad - dilation * (s - 1) - 1) // stride + 1
    out = np.zeros((n, g, kg, p, q))
    for b, gi, ki, y, x in itertools.product(range(n), range(g), range(kg), range(p), range(q)):
        acc = 0.0
        for ci, ry, rx in itertools.product(range(cg), range(r), range(s)):
            hy = y * stride + ry * dilation - pad
            wx = x * stride + rx * dilation - pad
            if 0 <= hy < h and 0 <= wx < w:
                acc += float(data[b, gi * cg + ci, hy, wx]) * float(weight5[gi, ki, ci, ry, rx])
        out[b, gi, ki, y, x] = acc
    return out


@pytest.mark.parametrize(
    "params",
    [
        dict(n=2, c=4, h=6, w=5, k=6, r=3, s=2, pad=1, groups=2),
        dict(n=1, c=6, h=7, w=8, k=3, r=2, s=3, stride=2, pad=2, dilation=2, groups=3),
        dict(n=1, c=3, h=5, w=5, k=2, r=3, s=3, stride=2),
    ],
)
def test_conv2d_reference_matches_naive_loops(params):
    nchw = workload("conv2d", **params)
    inputs = nchw.make_inputs(np.random.default_rng(1))
    g, k, c = nchw.params["groups"], nchw.params["k"], nchw.params["c"]
    weight5 = inputs["weight"].reshape(g, k // g, c // g, params["r"], params["s"])
    geometry = {x: nchw.params[x] for x in ("stride", "pad", "dilation")}
    naive = _naive_conv_nchw(inputs["data"], weight5, **geometry)
    got = nchw.reference(inputs)["conv2d"]
    assert got.shape == nchw.out_shape
    np.testing.assert_allclose(got.reshape(naive.shape), naive, rtol=1e-5, atol=1e-5)

    # NHWC: the same numbers after moving the axes, for the data, the weight and the output.
    nhwc = workload("conv2d", **params, layout="NHWC")
    w_nhwc = weight5.transpose(3, 4, 2, 0, 1).reshape(nhwc.weight_shape)  # (r, s, c/g, g, k/g)
    out = nhwc.reference({"data": inputs["data"].transpose(0, 2, 3, 1), "weight": w_nhwc})
    assert out["conv2d"].shape == nhwc.out_shape
    np.testing.assert_allclose(
        out["conv2d"].reshape(naive.shape[0], *naive.shape[3:], g, k // g),
        naive.transpose(0, 3, 4, 1, 2),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_depthwise_is_a_conv2d_with_one_channel_per_group(layout):
    params = dict(n=2, c=3, h=6, w=7, r=3, s=2, stride=2, pad=1)
    dw = workload("depthwise_conv2d", **params, layout=layout)
    inputs = dw.make_inputs(np.random.default_rng(2))
    data, weight = inputs["data"], inputs["weight"]
    if layout == "NHWC":
        data, weight = data.transpose(0, 3, 1, 2), weight.transpose(2, 0, 1)
    naive = _naive_conv_nchw(data, weight.reshape(3, 1, 1, 3, 2), stride=2, pad=1, dilation=1)
    naive = naive.reshape(2, 3, *naive.shape[3:])
    if layout == "NHWC":
        naive = naive.transpose(0, 2, 3, 1)
    got = dw.reference(inputs)["depthwise_conv2d"]
    assert got.shape == dw.out_shape
    np.testing.assert_allclose(got, naive, rtol=1e-5, atol=1e-5)


def test_conv2d_shapes_and_flops():
    wl = workload("conv2d", n=1, c=64, h=56, w=56, k=64, r=3, s=3, stride=1, pad=1)
    assert (wl.out_h, wl.out_w) == (56, 56)
    assert wl.flops() == 2 * 64 * 56 * 56 * 64 * 9
    strided = workload("conv2d", n=1, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, pad=3)
    assert strided.out_shape == (1, 64, 112, 112) and strided.weight_shape == (64, 3, 7, 7)
    grouped = workload("conv2d", n=1, c=8, h=5, w=5, k=4, r=1, s=1, groups=4, layout="NHWC")
    assert grouped.weight_shape == (1, 1, 2, 4, 1) and grouped.out_shape == (1, 5, 5, 4, 1)
    assert grouped.flops() == 2 * 4 * 25 * 2
    dw = workload("depthwise_conv2d", n=1, c=144, h=56, w=56, r=3, s=3, stride=2, pad=1)
    assert dw.out_shape == (1, 144, 28, 28) and dw.flops() == 2 * 144 * 28 * 28 * 9


def test_row_op_flops_are_documented_counts():
    assert workload("softmax", rows=4, cols=8).flops() == 5 * 32
    assert workload("layernorm", rows=4, cols=8).flops() == 8 * 32
    assert workload("reduce", rows=4, cols=8, kind="max").flops() == 32
    assert workload("elementwise", rows=4, cols=8, ops="add+gelu").flops() == 6 * 32
    assert workload("dense", m=2, n=3, k=4, epilogue="bias_gelu").flops() == 2 * 24
    assert workload("batch_matmul", b=2, m=3, n=4, k=5).flops() == 2 * 120


def test_elementwise_operands_are_named_by_position():
    wl = workload("elementwise", rows=2, cols=3, ops=["mul", "relu", "add", "mul"])
    assert wl.params["ops"] == "mul+relu+add+mul"
    assert wl == workload("elementwise", rows=2, cols=3, ops="mul+relu+add+mul")
    st = wl.stages()
    assert [t.op.name for t in st.inputs] == ["x", "mul0", "add2", "mul3"]
    assert [tuple(int(d) for d in t.shape) for t in st.inputs[1:]] == [(3,)] * 3
    assert [t.op.name for t in (*st.intermediates, *st.outputs)] == ["t0", "t1", "t2", "t3"]


# -- keys ----------------------------------------------------------------------------
EXAMPLES = [(op, cls.example) for op, cls in OPS.items()]


def _example_params() -> list[tuple[str, dict]]:
    return [(op, _from_example(op, text).params) for op, text in EXAMPLES]


def _from_example(op: str, text: str) -> Workload:
    pairs = (item.split("=") for item in text.split(","))
    return workload(op, **{k: int(v) if v.isdigit() else v for k, v in pairs})


def test_keys_are_stable_across_instances_and_processes():
    here = {op: _from_example(op, text).key for op, text in EXAMPLES}
    assert here == {op: _from_example(op, text).key for op, text in EXAMPLES}
    code = (
        "import json; from autosched.ops import workload; "
        f"print(json.dumps({{op: workload(op, **p).key for op, p in {_example_params()!r}}}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # str hashes differ from this process
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert json.loads(out.stdout) == here
    # Pinned: records and shipped files are looked up by these; a change orphans them.
    assert (
        here["conv2d"]
        == workload(
            "conv2d",
            n=1,
            c=64,
            h=56,
            w=56,
            k=64,
            r=3,
            s=3,
            stride=1,
            pad=1,
            dilation=1,
            groups=1,
            layout="NCHW",
        ).key
    )
    assert here == PINNED_KEYS


PINNED_KEYS = {
    "matmul": "matmul-b6b5bb9b2ebd691b",
    "batch_matmul": "batch_matmul-9a00bfc1af3511bb",
    "dense": "dense-56676ea784003b46",
    "conv2d": "conv2d-91c249847874523a",
    "depthwise_conv2d": "depthwise_conv2d-17a068c36e146b5e",
    "softmax": "softmax-84108c06638f0f6d",
    "layernorm": "layernorm-9d6600125ff71949",
    "reduce": "reduce-e2019538c85cfb75",
    "elementwise": "elementwise-a3b46e2772714de5",
}


def test_defaults_are_filled_and_stored():
    short = workload("conv2d", n=1, c=8, h=9, w=9, k=8, r=3, s=3)
    full = workload(
        "conv2d",
        n=1,
        c=8,
        h=9,
        w=9,
        k=8,
        r=3,
        s=3,
        stride=1,
        pad=0,
        dilation=1,
        groups=1,
        layout="NCHW",
    )
    assert short.key == full.key and short == full
    assert set(short.params) == set(OPS["conv2d"].shape_params)
    dw = workload("depthwise_conv2d", n=1, c=8, h=9, w=9, r=3, s=3)
    assert dw.params == dict(n=1, c=8, h=9, w=9, r=3, s=3, stride=1, pad=0, layout="NCHW")
    assert workload("dense", m=1, n=2, k=3).params["epilogue"] == "none"
    numpy_ints = workload("conv2d", n=np.int64(1), c=8, h=9, w=9, k=8, r=3, s=3, pad=np.int32(0))
    assert numpy_ints == short and type(numpy_ints.params["n"]) is int
    for op, cls in OPS.items():  # every op stores every parameter
        assert set(_from_example(op, cls.example).params) == set(cls.shape_params), op


def _variants(op: str, params: dict) -> list[dict]:
    """One valid change of each parameter."""
    out = []
    for name, value in params.items():
        if isinstance(value, int):
            changed = value + 1 if name == "pad" else value * 2  # keeps c, k divisible
        else:
            changed = next(v for v in OPS[op].choices[name] if v != value)
        out.append({**params, name: changed})
    return out


@pytest.mark.parametrize(
    "op, params",
    [
        ("matmul", dict(M=8, N=8, K=8, epilogue="none")),
        ("batch_matmul", dict(b=2, m=8, n=8, k=8)),
        ("dense", dict(m=8, n=8, k=8, epilogue="none")),
        (
            "conv2d",
            dict(
                n=1,
                c=4,
                h=8,
                w=8,
                k=4,
                r=3,
                s=3,
                stride=1,
                pad=1,
                dilation=1,
                groups=2,
                layout="NCHW",
            ),
        ),
        ("depthwise_conv2d", dict(n=1, c=4, h=8, w=8, r=3, s=3, stride=1, pad=1, layout="NCHW")),
        ("softmax", dict(rows=4, cols=8)),
        ("layernorm", dict(rows=4, cols=8)),
        ("reduce", dict(rows=4, cols=8, kind="sum")),
        ("elementwise", dict(rows=4, cols=8, ops="add")),
    ],
)
def test_keys_differ_when_any_parameter_differs(op, params):
    base = workload(op, **params)
    keys = {base.key}
    for changed in _variants(op, params):
        keys.add(workload(op, **changed).key)
    assert len(keys) == len(params) + 1
    assert all(k.startswith(op + "-") for k in keys)
    assert workload_from_json(json.loads(json.dumps(base.to_json()))) == base


def test_ops_with_the_same_numbers_have_different_keys():
    assert workload("softmax", rows=4, cols=8).key != workload("layernorm", rows=4, cols=8).key
    assert workload("matmul", M=2, N=3, K=4).key != workload("dense", m=2, n=3, k=4).key


# -- parameter checks ------------------------------------------------------------------
CONV = dict(n=1, c=4, h=8, w=8, k=4, r=3, s=3)
DW = dict(n=1, c=4, h=8, w=8, r=3, s=3)


@pytest.mark.parametrize(
    "op, params, message",
    [
        ("conv9", {}, "unknown op 'conv9'; accepted: matmul, batch_matmul, dense, conv2d"),
        ("conv2d", {**CONV, "x": 1}, "unknown parameter 'x'; accepted: n, c, h, w, k, r, s"),
        ("conv2d", {"n": 1, "c": 4}, "missing parameter h, w, k, r, s; accepted: n, c,"),
        ("conv2d", {**CONV, "n": 0}, "conv2d n=0 is not positive; accepted: a positive integer"),
        ("conv2d", {**CONV, "h": 2.0}, "h=2.0 is not an integer; accepted: a positive integer"),
        ("conv2d", {**CONV, "k": True}, "k=True is not an integer"),
        ("conv2d", {**CONV, "stride": 0}, "stride=0 is not positive; accepted: a positive integer"),
        ("conv2d", {**CONV, "dilation": 0}, "dilation=0 is not positive"),
        ("conv2d", {**CONV, "pad": -1}, "pad=-1 is negative; accepted: an integer >= 0"),
        ("conv2d", {**CONV, "groups": 0}, "groups=0 is not positive"),
        ("conv2d", {**CONV, "groups": 3}, "c=4 is not divisible by groups=3"),
        ("conv2d", {**CONV, "k": 6, "groups": 4}, "k=6 is not divisible by groups=4"),
        ("conv2d", {**CONV, "layout": "NWHC"}, "layout='NWHC' is not valid; accepted: NCHW, NHWC"),
        ("conv2d", {**CONV, "h": 2}, "h-size 0 (h=2, r=3, pad=0, dilation=1)"),
        ("conv2d", {**CONV, "w": 5, "dilation": 3}, "w-size -1"),
        ("depthwise_conv2d", {**DW, "s": 9}, "accepted: w + 2*pad >= dilation*(s-1) + 1"),
        ("depthwise_conv2d", {**DW, "dilation": 2}, "unknown parameter 'dilation'"),
        ("depthwise_conv2d", {**DW, "layout": "nchw"}, "accepted: NCHW, NHWC"),
        ("depthwise_conv2d", {**DW, "stride": -2}, "stride=-2 is not positive"),
        ("dense", dict(m=1, n=2, k=3, epilogue="gelu"), "none, bias, bias_relu, bias_gelu"),
        ("dense", dict(m=1, n=0, k=3), "dense n=0 is not positive"),
        ("batch_matmul", dict(b=0, m=1, n=2, k=3), "batch_matmul b=0 is not positive"),
        ("batch_matmul", dict(m=1, n=2, k=3), "missing parameter b"),
        ("softmax", dict(rows=0, cols=3), "softmax rows=0 is not positive"),
        ("layernorm", dict(rows=2, cols="8"), "layernorm cols='8' is not an integer"),
        (
            "reduce",
            dict(rows=2, cols=3, kind="mean"),
            "kind='mean' is not valid; accepted: sum, max",
        ),
        ("reduce", dict(rows=2, cols=3), "missing parameter kind"),
        ("elementwise", dict(rows=2, cols=3, ops=""), "'' is not an operation"),
        ("elementwise", dict(rows=2, cols=3, ops=[]), "has 0 operations; accepted: 1 to 8"),
        ("elementwise", dict(rows=2, cols=3, ops="add+" * 8 + "relu"), "has 9 operations"),
        ("elementwise", dict(rows=2, cols=3, ops="add+tanh"), "'tanh' is not an operation"),
        ("elementwise", dict(rows=2, cols=3, ops=3), "ops=3 is not valid"),
        ("matmul", dict(M=1, N=2, K=3, epilogue="bias_gelu"), "accepted: none, bias, bias_relu"),
        ("matmul", dict(M=1, N=-2, K=3), "matmul N=-2 is not positive"),
        ("softmax", dict(rows=2, cols=3, dtype="float16"), "accepted: float32"),
    ],
)
def test_bad_parameters_are_named_with_what_is_accepted(op, params, message):
    with pytest.raises(InvalidInputError) as info:
        workload(op, **params)
    assert message in str(info.value)


def test_metadata_is_complete():
    for op, cls in OPS.items():
        assert cls.op == op and cls.summary and cls.example
        assert set(cls.positional) <= set(cls.shape_params)
        assert set(cls.defaults) <= set(cls.shape_params)
        assert set(cls.choices) <= set(cls.shape_params) and set(cls.chains) <= set(cls.choices)
        for name, value in cls.defaults.items():
            if name in cls.choices:
                assert value in cls.choices[name]
        assert _from_example(op, cls.example).op == op
