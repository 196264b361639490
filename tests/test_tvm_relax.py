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
    import tvm
    from tvm import relax

    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    return tvm.transform.Sequential(passes)(mod)


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
    return out, float(np.median(times))


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


def test_recognises_relax_prim_funcs():
    from autosched.tvm.recognize import recognize

    mod = _fuse(linear_bias_relu(64, 32, 16))
    (func,) = [f for gv, f in mod.functions.items() if gv.name_hint.startswith("fused_matmul")]
    assert recognize(func) == autosched.workload("matmul", M=64, N=16, K=32, epilogue="bias_relu")
