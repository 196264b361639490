"""TVM Relax builds that apply autosched's records (real TVM, real records, llvm)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import autosched
import autosched.tvm
from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions

M, K, N = 128, 128, 128


def linear_bias_relu(m: int, k: int, n: int):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    b = relax.Var("b", relax.TensorType((n,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            z = bb.emit(relax.op.add(y, b))
            out = bb.emit_output(relax.op.nn.relu(z))
        bb.emit_func_output(out)
    return bb.get()


def _fuse(mod):
    """Relax's legalisation and fusion, as autosched.tvm.build runs them (no records)."""
    return autosched.tvm.legalize_and_fuse(mod)


def _run(executable, arrays, repeats: int = 5):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in arrays]
    out = vm["main"](*args).numpy()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        vm["main"](*args)
        times.append(time.perf_counter() - t)
    return out, float(np.median(times)) if times else None


@pytest.fixture(scope="module")
def tuned_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("relax") / "records.db"
    wl = autosched.workload("matmul", M=M, N=N, K=K, epilogue="bias_relu")
    quick = TimingOptions(min_time_s=0.01)
    autosched.tune(wl, trials=8, batch=4, target="llvm", db=db, timing=quick, strategy="model")
    return db


def test_relax_build_applies_the_record_and_runs_faster(tuned_db):
    import tvm

    rng = np.random.default_rng(0)
    arrays = [
        rng.uniform(-1, 1, (M, K)).astype("float32"),
        rng.uniform(-1, 1, (K, N)).astype("float32"),
        rng.uniform(-1, 1, (N,)).astype("float32"),
    ]
    tuned = autosched.tvm.build(linear_bias_relu(M, K, N), "llvm", db=tuned_db, shipped=False)
    (applied,) = tuned.applied
    assert applied.provenance == "exact" and applied.record_id is not None
    assert applied.workload.params == {"M": M, "N": N, "K": K, "epilogue": "bias_relu"}
    fused = [
        f for gv, f in tuned.module.functions.items() if gv.name_hint.startswith("fused_matmul")
    ]
    assert len(fused) == 1 and bool(fused[0].attrs["tirx.is_scheduled"])

    untuned_mod = linear_bias_relu(M, K, N)
    untuned_ex = tvm.compile(
        tvm.transform.Sequential(
            [
                tvm.relax.transform.LegalizeOps(),
                tvm.relax.transform.FuseOps(),
                tvm.relax.transform.FuseTIR(),
            ]
        )(untuned_mod),
        target=tvm.target.Target(select_device(target="llvm").tvm_target()),
    )
    out_tuned, t_tuned = _run(tuned.executable, arrays)
    out_untuned, t_untuned = _run(untuned_ex, arrays)
    expected = np.maximum(arrays[0].astype(np.float64) @ arrays[1] + arrays[2], 0)
    np.testing.assert_allclose(out_tuned, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out_tuned, out_untuned, rtol=1e-4, atol=1e-4)
    assert t_tuned * 2 < t_untuned, (t_tuned, t_untuned)


def test_functions_without_records_are_left_to_tvm(tmp_path):
    empty = tmp_path / "empty.db"
    from autosched.records.sqlite import SQLiteDatabase

    SQLiteDatabase(empty).close()
    built = autosched.tvm.build(linear_bias_relu(64, 32, 16), "llvm", db=empty, shipped=False)
    assert built.applied == []
    fused = [
        f for gv, f in built.module.functions.items() if gv.name_hint.startswith("fused_matmul")
    ]
    assert not (fused[0].attrs and "tirx.is_scheduled" in fused[0].attrs)


def _empty(tmp_path):
    from autosched.records.sqlite import SQLiteDatabase

    SQLiteDatabase(tmp_path / "empty.db").close()
    return tmp_path / "empty.db"


def test_a_relax_build_is_called_like_a_function(tmp_path):
    from autosched.errors import InvalidInputError

    built = autosched.tvm.build(
        linear_bias_relu(64, 32, 16), "llvm", db=_empty(tmp_path), shipped=False
    )
    assert [(s.name, s.shape, s.dtype) for s in built.inputs] == [
        ("x", (64, 32), "float32"),
        ("w", (32, 16), "float32"),
        ("b", (16,), "float32"),
    ]
    rng = np.random.default_rng(4)
    x, w, b = (rng.uniform(-1, 1, s.shape).astype(np.float32) for s in built.inputs)
    got = built(x, w, b)
    assert isinstance(got, np.ndarray) and got.shape == (64, 16)
    np.testing.assert_allclose(
        got, np.maximum(x.astype(np.float64) @ w + b, 0), rtol=1e-4, atol=1e-4
    )
    for again in (built(x=x, w=w, b=b), built(x, b=b, w=w), built(x.astype(np.float64), w, b)):
        np.testing.assert_array_equal(again, got)

    accepted = "; accepted: x[64, 32] float32, w[32, 16] float32, b[16] float32"
    for call, message in [
        (lambda: built(x, w), "main: missing input(s) b"),
        (lambda: built(x, w, b, b), "main: takes 3 input(s), got 4 positional arguments"),
        (lambda: built(x, w, b, y=x), "main: unknown input(s) y"),
        (lambda: built(x, w, x=x, b=b), "main: input(s) given both by position and by name: x"),
        (lambda: built(w, x, b), "main: input x has shape [32, 16], expected [64, 32]"),
        (lambda: built(x, w, b.astype(np.complex64)), "main: input b has dtype complex64"),
    ]:
        with pytest.raises(InvalidInputError) as info:
            call()
        assert str(info.value).startswith(message) and str(info.value).endswith(accepted)


def test_a_relax_build_returns_tuples_and_takes_symbolic_shapes(tmp_path):
    """main returning a tuple gives a tuple of arrays; a symbolic dimension takes any size."""
    import tvm
    from tvm import relax

    from autosched.errors import InvalidInputError

    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            relu = bb.emit(relax.op.nn.relu(x))
            double = bb.emit(relax.op.add(x, x))
            out = bb.emit_output(relax.Tuple([relu, double]))
        bb.emit_func_output(out)
    built = autosched.tvm.build(bb.get(), "llvm", db=_empty(tmp_path), shipped=False)
    assert [(s.name, s.shape) for s in built.inputs] == [("x", (-1, 8))]
    for rows in (3, 5):
        data = np.random.default_rng(rows).uniform(-1, 1, (rows, 8)).astype(np.float32)
        got = built(data)
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_array_equal(got[0], np.maximum(data, 0))
        np.testing.assert_array_equal(got[1], data + data)
    with pytest.raises(InvalidInputError, match=r"input x has shape \[3, 7\], expected \[\?, 8\]"):
        built(np.zeros((3, 7), np.float32))


def test_an_opencl_relax_build_is_not_called_in_process(tmp_path):
    from autosched.errors import InvalidInputError

    built = autosched.tvm.build(
        linear_bias_relu(8, 8, 8), "opencl", db=_empty(tmp_path), shipped=False
    )
    assert built.target == "opencl"
    with pytest.raises(InvalidInputError, match="accepted: a build for llvm"):
        built(*(np.zeros(s.shape, np.float32) for s in built.inputs))


def test_recognises_relax_prim_funcs():
    from autosched.tvm.recognize import recognize

    mod = _fuse(linear_bias_relu(64, 32, 16))
    (func,) = [f for gv, f in mod.functions.items() if gv.name_hint.startswith("fused_matmul")]
    assert recognize(func) == autosched.workload("matmul", M=64, N=16, K=32, epilogue="bias_relu")


# -- the other contractions: batch matmul, dense (linear), conv2d --------------------------------

CONV = autosched.workload("conv2d", n=2, c=4, h=8, w=8, k=8, r=3, s=3, pad=1)
DENSE = autosched.workload("dense", m=2, n=32, k=512, epilogue="bias_gelu")


def cnn_head():
    """conv2d (pad 1) -> flatten -> linear with bias -> gelu, as a model's last layers."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 4, 3, 3), "float32"))
    fc_w = relax.Var("fc_w", relax.TensorType((32, 512), "float32"))
    fc_b = relax.Var("fc_b", relax.TensorType((32,), "float32"))
    with bb.function("main", [x, w, fc_w, fc_b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            flat = bb.emit(relax.op.reshape(y, (2, 512)))
            z = bb.emit(relax.op.linear(flat, fc_w, fc_b))
            out = bb.emit_output(relax.op.nn.gelu(z))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def tuned_cnn(tmp_path_factory):
    db = tmp_path_factory.mktemp("cnn") / "records.db"
    quick = TimingOptions(min_time_s=0.01)
    for wl in (CONV, DENSE):
        autosched.tune(wl, trials=4, batch=4, strategy="random", target="llvm", db=db, timing=quick)
    return db


def test_relax_conv2d_and_linear_gelu_are_scheduled_from_their_records(tuned_cnn):
    import tvm_ffi

    from autosched.records.sqlite import SQLiteDatabase
    from autosched.space.config import Config

    dev = select_device(target="llvm")
    built = autosched.tvm.build(cnn_head(), "llvm", db=tuned_cnn, shipped=False)
    applied = {a.workload: a for a in built.applied}
    assert set(applied) == {CONV, DENSE}
    fused = _fuse(cnn_head())
    with SQLiteDatabase(tuned_cnn, create=False) as db:
        for wl, a in applied.items():
            best = db.best(wl.key, device_key=dev.key("llvm"), target="llvm")[0]
            assert a.provenance == "exact" and a.record_id == best.id
            # The function in the build is the fused one scheduled with the record's config.
            ours = autosched.tvm.apply_to_prim_func(
                fused[a.function], wl, Config.from_json(best.config), target="llvm",
                limits=dev.limits,
            )  # fmt: skip
            scheduled = built.module[a.function]
            assert bool(scheduled.attrs["tirx.is_scheduled"])
            assert tvm_ffi.structural_equal(
                scheduled.without_attr("tirx.is_scheduled"), ours.mod["main"]
            )

    rng = np.random.default_rng(0)
    conv_in = CONV.make_inputs(rng)
    dense_in = DENSE.make_inputs(rng)
    flat = CONV.reference(conv_in)["conv2d"].reshape(2, 512)
    want = DENSE.reference({**dense_in, "x": flat})["Z"]
    arrays = [conv_in["data"], conv_in["weight"], dense_in["W"], dense_in["bias"]]
    got = built(*arrays)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _relax_call(params, body):
    """A Relax module whose main takes ``params`` [(name, shape)] and returns ``body(*vars)``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in params]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get()


def _linear(epilogue: str):
    from tvm import relax

    def body(bb, x, w, b=None):
        y = relax.op.linear(x, w, b)
        if epilogue == "bias_relu":
            return relax.op.nn.relu(bb.emit(y))
        if epilogue == "bias_gelu":
            return relax.op.nn.gelu(bb.emit(y))
        return y

    return body


def _conv(**attrs):
    from tvm import relax

    return lambda bb, x, w: relax.op.nn.conv2d(x, w, **attrs)


def _relax_cases():
    from tvm import relax

    def wl(op, **params):
        return autosched.workload(op, **params)

    dense_in = [("x", (8, 24)), ("w", (16, 24))]
    return {
        "batch_matmul": (
            _relax_call(
                [("a", (2, 16, 8)), ("b", (2, 8, 12))], lambda bb, a, b: relax.op.matmul(a, b)
            ),
            wl("batch_matmul", b=2, m=16, n=12, k=8),
        ),
        "linear": (_relax_call(dense_in, _linear("none")), wl("dense", m=8, n=16, k=24)),
        "linear_bias": (
            _relax_call([*dense_in, ("b", (16,))], _linear("bias")),
            wl("dense", m=8, n=16, k=24, epilogue="bias"),
        ),
        "linear_bias_relu": (
            _relax_call([*dense_in, ("b", (16,))], _linear("bias_relu")),
            wl("dense", m=8, n=16, k=24, epilogue="bias_relu"),
        ),
        "linear_bias_gelu": (
            _relax_call([*dense_in, ("b", (16,))], _linear("bias_gelu")),
            wl("dense", m=8, n=16, k=24, epilogue="bias_gelu"),
        ),
        "conv2d_pad0": (
            _relax_call([("x", (1, 4, 8, 8)), ("w", (8, 4, 3, 3))], _conv()),
            wl("conv2d", n=1, c=4, h=8, w=8, k=8, r=3, s=3),
        ),
        "conv2d_stride2_pad2_dilation2": (
            _relax_call(
                [("x", (1, 4, 12, 12)), ("w", (8, 4, 3, 3))],
                _conv(strides=2, padding=2, dilation=2),
            ),
            wl("conv2d", n=1, c=4, h=12, w=12, k=8, r=3, s=3, stride=2, pad=2, dilation=2),
        ),
        "conv2d_1x1": (
            _relax_call([("x", (1, 8, 6, 6)), ("w", (16, 8, 1, 1))], _conv()),
            wl("conv2d", n=1, c=8, h=6, w=6, k=16, r=1, s=1),
        ),
        "conv2d_nhwc": (
            _relax_call(
                [("x", (1, 8, 8, 4)), ("w", (3, 3, 4, 8))],
                _conv(padding=1, data_layout="NHWC", kernel_layout="HWIO"),
            ),
            wl("conv2d", n=1, c=4, h=8, w=8, k=8, r=3, s=3, pad=1, layout="NHWC"),
        ),
    }


@pytest.mark.parametrize("name", list(_relax_cases()))
def test_relax_contractions_are_recognised_scheduled_and_correct(tmp_path, name):
    """Each Relax op is recognised as its workload and, scheduled from a record with a
    non-default config, computes what the unscheduled build computes."""
    import tvm

    from autosched.records.sqlite import SQLiteDatabase
    from autosched.space.select import make_space
    from autosched.tvm.recognize import recognize
    from tests.tuned_records import record_for

    mod, wl = _relax_cases()[name]
    fused = _fuse(mod)
    (func,) = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert recognize(func) == wl

    dev = select_device(target="llvm")
    space = make_space(wl, target="llvm", limits=dev.limits)
    config = next(c for c in space.sample(np.random.default_rng(7), 8) if c != space.default())
    with SQLiteDatabase(tmp_path / "one.db") as db:
        db.add([record_for(wl, dev, config, target="llvm")])
    built = autosched.tvm.build(mod, "llvm", db=tmp_path / "one.db", shipped=False)
    (applied,) = built.applied
    assert applied.workload == wl and applied.provenance == "exact"

    plain = tvm.compile(fused, target=tvm.target.Target(dev.tvm_target()))
    rng = np.random.default_rng(1)
    arrays = [
        rng.uniform(-1, 1, [int(d) for d in p.ty.shape]).astype("float32")
        for p in mod["main"].params
    ]
    got = built(*arrays)
    want, _ = _run(plain, arrays, repeats=0)
    rtol, atol = wl.tolerance()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_relax_functions_outside_the_workloads_are_not_recognised():
    import tvm
    from tvm import relax

    from autosched.tvm.recognize import recognize

    x, w = ("x", (1, 4, 8, 8)), ("w", (8, 4, 3, 3))
    dense = [("x", (8, 24)), ("w", (16, 24)), ("b", (16,))]
    others = {
        # An epilogue no workload has: conv2d + relu, dense + bias + silu.
        "conv2d_relu": _relax_call(
            [x, w], lambda bb, x, w: relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w)))
        ),
        "linear_bias_silu": _relax_call(
            dense, lambda bb, x, w, b: relax.op.nn.silu(bb.emit(relax.op.linear(x, w, b)))
        ),
        # topi's grouped convolution reads channel ff // (k/groups): not affine.
        "grouped": _relax_call(
            [x, ("w", (8, 2, 3, 3))], lambda bb, x, w: relax.op.nn.conv2d(x, w, groups=2)
        ),
        # topi's layer norm sums x and x*x in one pass; the layernorm workload is two-pass.
        "layer_norm": _relax_call(
            [("x", (16, 32)), ("g", (32,)), ("b", (32,))],
            lambda bb, x, g, b: relax.op.nn.layer_norm(x, g, b, axes=[-1]),
        ),
        # Softmax over the last axis of a 3-D tensor: not a [rows, cols] nest.
        "softmax_3d": _relax_call([("x", (2, 16, 32))], lambda bb, x: relax.op.nn.softmax(x)),
    }
    for name, mod in others.items():
        funcs = [f for f in _fuse(mod).functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        assert [recognize(f) for f in funcs] == [None] * len(funcs), name


def test_knob_names_and_values_are_renamed_by_position():
    """A conv2d's tile.<axis>, stage.<input>, fuse.<input> and tile_inner refer to
    autosched's names (n, k, p, q, c, r, s; pad, weight); Relax calls them nn, ff, yy,
    xx, rc, ry, rx; pad_temp, w."""
    import tvm

    from autosched.space.select import make_space

    dev = select_device(target="llvm")
    wl = autosched.workload("conv2d", n=1, c=4, h=8, w=8, k=8, r=3, s=3, pad=1)
    mod = _fuse(_relax_call([("x", (1, 4, 8, 8)), ("w", (8, 4, 3, 3))], _conv(padding=1)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    space = make_space(wl, target="llvm", limits=dev.limits)
    # An unfused padding runs as its own loop: a block writing pad_temp must remain.
    config = space.default().replace(**{"fuse.pad": False, "tile_inner": "k"})
    assert space.check(config) is None
    # Were a name or the tile_inner value not renamed, the config would not fit Relax's
    # nest and apply_to_prim_func would raise.
    sch = autosched.tvm.apply_to_prim_func(func, wl, config, target="llvm", limits=dev.limits)
    text = sch.mod.script()
    assert 'T.sblock("pad_temp")' in text
    inlined = autosched.tvm.apply_to_prim_func(
        func, wl, config.replace(**{"fuse.pad": True}), target="llvm", limits=dev.limits
    )
    assert 'T.sblock("pad_temp")' not in inlined.mod.script()


@pytest.mark.parametrize(
    "wl",
    [
        autosched.workload("matmul", M=8, N=16, K=4, epilogue="bias"),
        autosched.workload("dense", m=8, n=16, k=4, epilogue="bias_gelu"),
        autosched.workload("batch_matmul", b=3, m=8, n=4, k=2),
        autosched.workload("conv2d", n=1, c=4, h=9, w=9, k=6, r=3, s=3, stride=2, pad=1),
        autosched.workload("conv2d", n=2, c=4, h=8, w=8, k=6, r=3, s=3, groups=2, pad=1),
        autosched.workload(
            "conv2d", n=1, c=4, h=8, w=8, k=8, r=3, s=3, groups=4, dilation=2, layout="NHWC"
        ),
        autosched.workload("depthwise_conv2d", n=1, c=8, h=8, w=8, r=3, s=3, pad=1),
        autosched.workload(
            "depthwise_conv2d", n=1, c=8, h=9, w=9, r=3, s=3, stride=2, layout="NHWC"
        ),
    ],
    ids=repr,
)
def test_every_contraction_recognises_its_own_prim_func(wl):
    from tvm import te

    from autosched.tvm.recognize import recognize

    st = wl.stages()
    assert recognize(te.create_prim_func([*st.inputs, *st.outputs])) == wl


def _rowwise_cases():
    from tvm import relax

    x = [("x", (16, 64))]
    return {
        "softmax": (
            _relax_call(x, lambda bb, x: relax.op.nn.softmax(x)),
            autosched.workload("softmax", rows=16, cols=64),
        ),
        "sum": (
            _relax_call(x, lambda bb, x: relax.op.sum(x, axis=1)),
            autosched.workload("reduce", rows=16, cols=64, kind="sum"),
        ),
        "max": (
            _relax_call(x, lambda bb, x: relax.op.max(x, axis=1)),
            autosched.workload("reduce", rows=16, cols=64, kind="max"),
        ),
    }


@pytest.mark.parametrize("name", list(_rowwise_cases()))
def test_relax_softmax_and_reductions_are_scheduled_from_records(tmp_path, name):
    import tvm

    from autosched.records.sqlite import SQLiteDatabase
    from autosched.space.select import make_space
    from autosched.tvm.recognize import recognize
    from tests.tuned_records import record_for

    mod, wl = _rowwise_cases()[name]
    fused = _fuse(mod)
    (func,) = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert recognize(func) == wl

    dev = select_device(target="llvm")
    space = make_space(wl, target="llvm", limits=dev.limits)
    plain = tvm.compile(fused, target=tvm.target.Target(dev.tvm_target()))
    arrays = [np.random.default_rng(2).uniform(-1, 1, (16, 64)).astype("float32")]
    want, _ = _run(plain, arrays, repeats=0)
    configs = [space.default(), *space.sample(np.random.default_rng(3), 3)]
    for i, config in enumerate(configs):
        db = tmp_path / f"{i}.db"
        with SQLiteDatabase(db) as store:
            store.add([record_for(wl, dev, config, target="llvm")])
        built = autosched.tvm.build(mod, "llvm", db=db, shipped=False)
        (applied,) = built.applied
        assert applied.workload == wl and applied.provenance == "exact"
        got = built(*arrays)
        rtol, atol = wl.tolerance()
        np.testing.assert_allclose(got, want, rtol=rtol, atol=max(atol, 1e-6), err_msg=str(config))
