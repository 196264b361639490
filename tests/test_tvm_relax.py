"""TVM Relax builds that apply autosched's records (real TVM, real records, llvm)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

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
    """The records of tuning linear_bias_relu's own tasks (the model's fused functions)."""
    from autosched.records.sqlite import SQLiteDatabase
    from autosched.tuning.model import tune_tasks
    from autosched.tuning.runner import LocalRunner
    from autosched.tvm.tasks import extract_tasks

    db = tmp_path_factory.mktemp("relax") / "records.db"
    host = select_device(target="llvm")
    tasks = extract_tasks(linear_bias_relu(M, K, N), limits=host.limits)
    runner = LocalRunner(host, "llvm", timing=TimingOptions(min_time_s=0.01))
    with SQLiteDatabase(db) as store:
        try:
            tune_tasks(tasks, runner, store, name="linear", target="llvm", trials=8, batch=4)
        finally:
            runner.close()
    return db, tasks


def test_relax_build_applies_the_record_of_its_own_task(tuned_db):
    import tvm

    from autosched.records.choice import chosen
    from autosched.records.sqlite import SQLiteDatabase

    db, tasks = tuned_db
    (task,) = tasks
    assert task.family == "contraction" and task.weight == 1
    rng = np.random.default_rng(0)
    arrays = [
        rng.uniform(-1, 1, (M, K)).astype("float32"),
        rng.uniform(-1, 1, (K, N)).astype("float32"),
        rng.uniform(-1, 1, (N,)).astype("float32"),
    ]
    tuned = autosched.tvm.build(linear_bias_relu(M, K, N), "llvm", db=db, shipped=False)
    (applied,) = tuned.applied
    dev = select_device(target="llvm")
    with SQLiteDatabase(db, create=False) as store:
        best = chosen(store, task.workload.key, device_key=dev.key("llvm"), target="llvm")
    assert best is not None
    assert applied.provenance == "exact" and applied.record_id == best.id
    assert applied.workload == task.workload
    fused = [
        f for gv, f in tuned.module.functions.items() if gv.name_hint.startswith("fused_matmul")
    ]
    assert len(fused) == 1 and bool(fused[0].attrs["tirx.is_scheduled"])

    untuned_ex = tvm.compile(
        autosched.tvm.fuse(linear_bias_relu(M, K, N)),
        target=tvm.target.Target(dev.tvm_target()),
    )
    out_tuned, _ = _run(tuned.executable, arrays, repeats=0)
    out_untuned, _ = _run(untuned_ex, arrays, repeats=0)
    expected = np.maximum(arrays[0].astype(np.float64) @ arrays[1] + arrays[2], 0)
    np.testing.assert_allclose(out_tuned, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out_tuned, out_untuned, rtol=1e-4, atol=1e-4)


def test_a_baseline_build_consults_no_records_and_warns_of_none(tuned_db, caplog):
    """``records=False`` (``model tune``'s untuned column) builds what TVM makes of the
    module whatever the databases hold, and no lookup warns that a function is untuned."""
    db, _ = tuned_db
    mod = linear_bias_relu(M, K, N)
    with caplog.at_level(logging.WARNING, logger="autosched"):
        plain = autosched.tvm.build(mod, "llvm", db=db, untuned=False, records=False)
        defaults = autosched.tvm.build(mod, "llvm", db=db, records=False)
    assert plain.applied == [] and not caplog.records, caplog.text
    assert [a.provenance for a in defaults.applied] == ["untuned"]
    # The same database, consulted, gives the record.
    tuned = autosched.tvm.build(mod, "llvm", db=db, untuned=False, shipped=False)
    assert [a.provenance for a in tuned.applied] == ["exact"]


def test_functions_without_records_get_the_default_or_are_left_to_tvm(tmp_path):
    empty = _empty(tmp_path)
    built = autosched.tvm.build(linear_bias_relu(64, 32, 16), "llvm", db=empty, shipped=False)
    assert [a.provenance for a in built.applied] == ["untuned"]
    left = autosched.tvm.build(
        linear_bias_relu(64, 32, 16), "llvm", db=empty, shipped=False, untuned=False
    )
    assert left.applied == []
    fused = [
        f for gv, f in left.module.functions.items() if gv.name_hint.startswith("fused_matmul")
    ]
    assert not (fused[0].attrs and "tirx.is_scheduled" in fused[0].attrs)


def test_a_config_tvm_refuses_falls_back_to_the_untuned_then_the_default_schedule(
    tuned_db, monkeypatch, caplog
):
    """A record TVM cannot apply (written by another version of the schedule code, say)
    costs its function the tuning, not the model its parallel loops: the space's untuned
    config is applied instead, and where TVM refuses every config of the space, llvm's
    default schedule; each refusal is logged and the outputs stay right."""
    import autosched.tvm.database as database
    from autosched.errors import ScheduleError

    db, _ = tuned_db
    mod = linear_bias_relu(M, K, N)
    real_apply = database.apply
    refused: set[str] = set()
    tried: list[str] = []

    def refusing_apply(sch, space, config):
        tried.append(config.key)
        if config.key in refused or "*" in refused:
            raise ScheduleError(f"refused {config.key}")
        real_apply(sch, space, config)

    monkeypatch.setattr(database, "apply", refusing_apply)
    rng = np.random.default_rng(1)
    arrays = [
        rng.uniform(-1, 1, (M, K)).astype("float32"),
        rng.uniform(-1, 1, (K, N)).astype("float32"),
        rng.uniform(-1, 1, (N,)).astype("float32"),
    ]
    expected = np.maximum(arrays[0].astype(np.float64) @ arrays[1] + arrays[2], 0)
    (exact,) = autosched.tvm.build(mod, "llvm", db=db, shipped=False).applied
    assert exact.provenance == "exact" and len(tried) == 1
    refused.add(tried.pop())
    with caplog.at_level(logging.WARNING, logger="autosched"):
        built = autosched.tvm.build(mod, "llvm", db=db, shipped=False)
    (fallback,) = built.applied
    assert fallback.provenance == "untuned" and fallback.record_id is None
    assert tried[0] in refused and tried[-1] not in refused
    assert "the exact config could not be applied" in caplog.text
    np.testing.assert_allclose(_run(built.executable, arrays, 0)[0], expected, 1e-4, 1e-4)

    refused.add("*")
    tried.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autosched"):
        built = autosched.tvm.build(mod, "llvm", db=db, shipped=False)
    assert [a.provenance for a in built.applied] == ["default-schedule"]
    assert len(tried) >= 2 and caplog.text.count("could not be applied") == len(tried)
    np.testing.assert_allclose(_run(built.executable, arrays, 0)[0], expected, 1e-4, 1e-4)
    # With the untuned configs off, only the record is tried: the function is TVM's.
    tried.clear()
    left = autosched.tvm.build(mod, "llvm", db=db, shipped=False, untuned=False)
    assert left.applied == [] and len(tried) == 1


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


_THREADS_CHILD = """
import sys
import numpy as np
import tvm
import autosched.tvm
from autosched.measure.cpu import host_cpu
from tests.test_tvm_relax import linear_bias_relu
built = autosched.tvm.build(linear_bias_relu(64, 32, 16), "llvm", db=sys.argv[1], shipped=False)
x, w, b = (np.ones(s.shape, np.float32) for s in built.inputs)
built(x, w, b)
print(tvm.get_global_func("runtime.NumThreads")(), host_cpu().cores)
"""


@pytest.mark.parametrize("user_threads", [None, "1"])
def test_a_built_model_runs_on_the_threads_its_records_were_measured_on(tmp_path, user_threads):
    """TVM's own default pool is half the logical CPUs (one thread on a 2-vCPU VM, where
    the measurement workers ran on two); a build run in the user's process gets the
    device's cores, unless the user set TVM_NUM_THREADS."""
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    if user_threads:
        env["TVM_NUM_THREADS"] = user_threads
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    res = subprocess.run(
        [sys.executable, "-c", _THREADS_CHILD, str(_empty(tmp_path))],
        capture_output=True, text=True, timeout=300, env=env, cwd=root,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    threads, cores = map(int, res.stdout.split()[-2:])
    assert threads == (int(user_threads) if user_threads else cores), res.stdout


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


# -- every kind of fused function: scheduled from records of its own task ------------------


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


def _conv(**attrs):
    from tvm import relax

    return lambda bb, x, w: relax.op.nn.conv2d(x, w, **attrs)


def _cases():
    """name -> (module, the family of each tunable function)."""
    from tvm import relax

    dense_in = [("x", (8, 24)), ("w", (16, 24)), ("b", (16,))]
    rows = [("x", (4, 16, 64))]
    return {
        "cnn_head": (cnn_head(), ["contraction", "contraction"]),
        "batch_matmul": (
            _relax_call(
                [("a", (2, 16, 8)), ("b", (2, 8, 12))], lambda bb, a, b: relax.op.matmul(a, b)
            ),
            ["contraction"],
        ),
        "linear_bias_relu": (
            _relax_call(
                dense_in, lambda bb, x, w, b: relax.op.nn.relu(bb.emit(relax.op.linear(x, w, b)))
            ),
            ["contraction"],
        ),
        "conv2d_stride2_pad2_dilation2": (
            _relax_call(
                [("x", (1, 4, 12, 12)), ("w", (8, 4, 3, 3))],
                _conv(strides=2, padding=2, dilation=2),
            ),
            ["contraction"],
        ),
        "conv2d_nhwc": (
            _relax_call(
                [("x", (1, 8, 8, 4)), ("w", (3, 3, 4, 8))],
                _conv(padding=1, data_layout="NHWC", kernel_layout="HWIO"),
            ),
            ["contraction"],
        ),
        "softmax_3d": (_relax_call(rows, lambda bb, x: relax.op.nn.softmax(x)), ["rowwise"]),
        "sum": (_relax_call(rows, lambda bb, x: relax.op.sum(x, axis=2)), ["rowwise"]),
        "max": (_relax_call(rows, lambda bb, x: relax.op.max(x, axis=2)), ["rowwise"]),
        "layer_norm": (
            _relax_call(
                [*rows, ("g", (64,)), ("beta", (64,))],
                lambda bb, x, g, beta: relax.op.nn.layer_norm(x, g, beta, axes=[-1]),
            ),
            ["rowwise"],
        ),
    }


def _buildable(space, rng, *, default: bool):
    """The default config, or the first of a few sampled ones that TVM schedules."""
    from autosched.errors import ScheduleError
    from autosched.space.schedule import schedule

    if default:
        return space.default()
    for config in space.sample(rng, 10):
        try:
            schedule(space, config)
        except ScheduleError:
            continue
        return config
    raise AssertionError(f"no sampled config of {space.workload} schedules")


@pytest.mark.parametrize("name", list(_cases()))
def test_fused_functions_are_scheduled_from_records_of_their_own_tasks(tmp_path, name):
    """Each fused function's task, scheduled from a record with the default and sampled
    configs, computes what the unscheduled build computes, and the build says which
    record scheduled it."""
    from autosched.records.sqlite import SQLiteDatabase
    from autosched.space.select import make_space
    from autosched.tvm.tasks import extract_tasks
    from tests.tuned_records import record_for

    mod, families = _cases()[name]
    dev = select_device(target="llvm")
    tasks = [t for t in extract_tasks(mod, limits=dev.limits) if t.family]
    assert sorted(t.family for t in tasks) == sorted(families)
    plain = autosched.tvm.build(mod, "llvm", db=_empty(tmp_path), shipped=False, untuned=False)
    rng = np.random.default_rng(2)
    arrays = [rng.uniform(-1, 1, s.shape).astype("float32") for s in plain.inputs]
    want = plain(*arrays)
    spaces = {t.name: make_space(t.workload, target="llvm", limits=dev.limits) for t in tasks}
    for i in range(3):
        # Records exist only of configs that built (a failing one is a build_error record).
        configs = {t.name: _buildable(spaces[t.name], rng, default=i == 0) for t in tasks}
        db = tmp_path / f"{i}.db"
        with SQLiteDatabase(db) as store:
            store.add([record_for(t.workload, dev, configs[t.name], target="llvm") for t in tasks])
        built = autosched.tvm.build(mod, "llvm", db=db, shipped=False)
        applied = {a.function: a for a in built.applied if a.provenance != "default-schedule"}
        assert sorted(applied) == sorted(t.name for t in tasks)
        with SQLiteDatabase(db, create=False) as store:
            ids = {r.workload_key: r.id for r in store.query()}
        for t in tasks:
            assert applied[t.name].provenance == "exact"
            assert applied[t.name].record_id == ids[t.workload.key]
            assert bool(built.module[t.name].attrs["tirx.is_scheduled"])
        got = built(*arrays)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=str(configs))
