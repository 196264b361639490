"""Compiling from the records on the real device: every lookup step, outputs, the manifest."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import autosched
from autosched.compiler import compile, find_config
from autosched.compiler.lookup import (
    SHIPPED,
    adapt_config,
    shape_distance,
    shipped_database,
    shipped_records_dir,
)
from autosched.errors import InvalidInputError, RecordsError
from autosched.records.choice import chosen
from autosched.records.files import parse_line
from autosched.records.record import Record, canonical_json
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.space.space import TARGETS, DeviceLimits, Space

WL64 = autosched.workload("matmul", M=64, N=64, K=64)


def _cli(*args: str, env_home: Path) -> subprocess.CompletedProcess:
    # The default records database lives under XDG_DATA_HOME: keep the user's out of tests.
    env = dict(os.environ, XDG_DATA_HOME=str(env_home))
    return subprocess.run(
        [sys.executable, "-m", "autosched", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """A records database written by ``autosched tune`` in another process."""
    home = tmp_path_factory.mktemp("home")
    db = home / "tuned.db"
    res = _cli(
        "tune",
        "--op",
        "matmul",
        "--shape",
        "64,64,64",
        "--trials",
        "4",
        "--batch",
        "4",
        "--strategy",
        "random",
        "--db",
        str(db),
        env_home=home,
    )
    assert res.returncode == 0, res.stderr
    return db


def _empty_db(path: Path) -> Path:
    SQLiteDatabase(path).close()
    return path


def _check_outputs(kernel, seed: int = 0) -> None:
    wl = kernel.workload
    inputs = wl.make_inputs(np.random.default_rng(seed))
    expected = wl.reference(inputs)
    got = kernel(**inputs)
    assert [s.name for s in kernel.outputs] == list(expected)
    rtol, atol = wl.tolerance()
    for got_one, want in zip(got if isinstance(got, tuple) else (got,), expected.values()):
        np.testing.assert_allclose(got_one, want, rtol=rtol, atol=atol)


def _copy(record: Record, **changes) -> Record:
    return dataclasses.replace(record, id=None, run_id="copy-" + record.run_id, **changes)


# -- the lookup steps ------------------------------------------------------------------------


def test_compile_after_tune_uses_the_exact_best_record(tuned, device):
    kernel = compile(WL64, db=tuned, shipped=False)
    with SQLiteDatabase(tuned, create=False) as db:
        best = chosen(db, WL64.key, device_key=device.key(), target="opencl")
        assert best is not None and best.rounds == 3  # the leader of the tune's final round
    assert kernel.provenance == "exact"
    assert kernel.record is not None and kernel.record.id == best.id
    assert kernel.config == Config.from_json(best.config)
    assert kernel.database == str(tuned)
    assert "__kernel" in kernel.source and kernel.program.kernels
    _check_outputs(kernel)
    # The shipped records come after the user's database: the answer is the same.
    assert find_config(WL64, db=tuned).record.id == best.id


def test_compile_takes_the_leader_of_the_latest_side_by_side_round(tuned, tmp_path, device):
    where = dict(device_key=device.key(), target="opencl")
    with SQLiteDatabase(tuned, create=False) as db:
        records = db.query(workload_key=WL64.key, status="ok", **where)
        fastest = db.best(WL64.key, k=1, **where)[0]
    runner_up = next(r for r in records if r.config_key != fastest.config_key)
    # A later run re-timed both side by side, and the runner-up ran ahead there.
    at = max(r.timestamp for r in records) + 60.0
    side_by_side = [
        _copy(r, latency_s=fastest.latency_s * f, timestamp=at, started_at=at, rounds=3)
        for r, f in ((fastest, 1.10), (runner_up, 1.02))
    ]
    with SQLiteDatabase(tmp_path / "final.db") as db:
        db.add([*records, *side_by_side])
        assert db.best(WL64.key, k=1, **where)[0].config_key == fastest.config_key
    kernel = compile(WL64, db=tmp_path / "final.db", shipped=False)
    assert kernel.provenance == "exact" and kernel.record is not None
    assert kernel.config == Config.from_json(runner_up.config)
    assert kernel.record.rounds == 3 and kernel.record.timestamp == at
    _check_outputs(kernel)


def test_a_record_tvm_refuses_falls_back_to_the_untuned_config(tuned, device, monkeypatch, caplog):
    """A record whose config TVM will not build (written by another version of the
    schedule code, say) costs the kernel its tuning, not the build: the space's untuned
    config is built instead, with a warning, and the kernel says so. Where TVM refuses
    every config the lookup and the space offer, the error reaches the caller."""
    import autosched.measure.build as building
    from autosched.errors import ScheduleError

    real_build = building.build
    refused: set[str] = set()
    built: list[str] = []

    def refusing_build(space, config):
        built.append(config.key)
        if config.key in refused or "*" in refused:
            raise ScheduleError(f"refused {config.key}")
        return real_build(space, config)

    monkeypatch.setattr(building, "build", refusing_build)
    exact = compile(WL64, db=tuned, shipped=False)
    assert exact.provenance == "exact" and built == [exact.config.key]
    refused.add(exact.config.key)
    built.clear()
    with caplog.at_level(logging.WARNING, logger="autosched.compiler"):
        kernel = compile(WL64, db=tuned, shipped=False)
    space = make_space(WL64, limits=device.limits)
    assert kernel.provenance == "untuned" and kernel.record is None
    # The untuned config, or the default where the record's config was the untuned one.
    assert kernel.config != exact.config and kernel.config in (space.untuned(), space.default())
    assert built == [exact.config.key, kernel.config.key]
    assert "could not be built" in caplog.text
    _check_outputs(kernel)
    refused.add("*")
    with pytest.raises(ScheduleError, match="refused"):
        compile(WL64, db=tuned, shipped=False)


def test_driver_mismatch_uses_the_same_hardware_and_warns(tuned, tmp_path, device, caplog):
    with SQLiteDatabase(tuned, create=False) as db:
        best = db.best(WL64.key, device_key=device.key(), target="opencl")[0]
    other = _copy(
        best,
        device_key="0123456789abcdef",
        device=dict(best.device, driver_version="0.0-older"),
    )
    assert other.device_family == device.family()
    with SQLiteDatabase(tmp_path / "other.db") as db:
        (other_id,) = db.add([other])
    with caplog.at_level(logging.WARNING, logger="autosched.compiler"):
        kernel = compile(WL64, db=tmp_path / "other.db", shipped=False)
    assert kernel.provenance == "driver_mismatch"
    assert kernel.record.id == other_id and kernel.record.device_key == "0123456789abcdef"
    assert kernel.config == Config.from_json(best.config)
    assert any(
        "driver_version" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"
    )
    _check_outputs(kernel)


def test_nearest_shape_adapts_a_tuned_config_and_computes_correctly(tuned, device, caplog):
    wl = autosched.workload("matmul", M=96, N=64, K=64)
    with caplog.at_level(logging.WARNING, logger="autosched.compiler"):
        kernel = compile(wl, db=tuned, shipped=False)
    assert kernel.provenance == "nearest_shape"
    assert kernel.record.workload_key == WL64.key
    assert make_space(wl, limits=device.limits).check(kernel.config) is None
    assert any("never tuned" in r.getMessage() for r in caplog.records)
    _check_outputs(kernel, seed=3)


def test_untuned_uses_the_spaces_untuned_config(tmp_path, device, caplog):
    """No record: the space's untuned config, here (a CPU's OpenCL driver) its seed, the
    register tile the device's properties suggest, not the default's scalar loops."""
    wl = autosched.workload("matmul", M=32, N=48, K=16, epilogue="bias")
    with caplog.at_level(logging.WARNING, logger="autosched.compiler"):
        kernel = compile(wl, db=_empty_db(tmp_path / "empty.db"), shipped=False)
    assert kernel.provenance == "untuned" and kernel.record is None
    space = make_space(wl, limits=device.limits)
    assert kernel.config == space.untuned()
    if device.limits.is_cpu:
        assert kernel.config == space.seeds()[0] != space.default()
    assert any("untuned" in r.getMessage() for r in caplog.records)
    _check_outputs(kernel)


def test_an_epilogue_never_borrows_a_config_of_another_epilogue(tuned):
    wl = autosched.workload("matmul", M=64, N=64, K=64, epilogue="bias_relu")
    assert find_config(wl, db=tuned, shipped=False).provenance == "untuned"


def test_a_missing_database_is_an_error_and_is_not_created(tmp_path):
    missing = tmp_path / "nope.db"
    with pytest.raises(RecordsError, match="does not exist"):
        find_config(WL64, db=missing)
    assert not missing.exists()
    with pytest.raises(InvalidInputError, match="accepted: opencl"):
        find_config(WL64, target="cuda", db=missing)


# -- shipped records -------------------------------------------------------------------------


def test_shipped_records_are_small_valid_and_ok():
    files = sorted(shipped_records_dir().glob("*.jsonl"))
    assert files, "records/ ships no *.jsonl"
    for path in files:
        assert path.stat().st_size < 100_000, path
        records = [parse_line(line) for line in path.read_text().splitlines() if line.strip()]
        assert records and all(r.ok for r in records)
    assert len(shipped_database()) == sum(
        1 for p in files for line in p.read_text().splitlines() if line.strip()
    )


def test_user_database_wins_at_the_same_step_and_steps_win_over_databases(
    tmp_path, device, monkeypatch
):
    """The shipped records come from files the test writes for this very device, so the
    test does not depend on which CPU family ``records/`` happens to cover."""
    from tests.tuned_records import record_for

    wl = autosched.workload("matmul", M=512, N=512, K=512)
    space = make_space(wl, limits=device.limits)
    other_config = next(
        c for c in space.sample(np.random.default_rng(0), 8) if c != space.default()
    )
    shipped_dir = tmp_path / "shipped"
    shipped_dir.mkdir()
    shipped = record_for(wl, device, space.default(), latency_s=1e-3, run_id="shipped")
    (shipped_dir / "this-device.jsonl").write_text(canonical_json(shipped.to_json()) + "\n")
    monkeypatch.setattr("autosched.compiler.lookup.shipped_records_dir", lambda: shipped_dir)
    found = find_config(wl, db=_empty_db(tmp_path / "empty.db"))
    assert (found.provenance, found.database) == ("exact", SHIPPED)
    assert found.config == space.default()

    # A slower record in the user's database still wins over the shipped one at its step.
    mine = record_for(wl, device, other_config, latency_s=1e-2, run_id="mine")
    with SQLiteDatabase(tmp_path / "mine.db") as db:
        (mine_id,) = db.add([mine])
    found = find_config(wl, db=tmp_path / "mine.db")
    assert (found.provenance, found.database, found.record.id) == ("exact", str(db.path), mine_id)
    assert found.config == other_config

    # A driver mismatch in the user's database loses to an exact shipped record.
    sibling = _copy(
        mine, device_key="fedcba9876543210", device=dict(mine.device, driver_version="0.0-older")
    )
    assert sibling.device_family == device.family()
    with SQLiteDatabase(tmp_path / "sibling.db") as db:
        db.add([sibling])
    found = find_config(wl, db=tmp_path / "sibling.db")
    assert (found.provenance, found.database) == ("exact", SHIPPED)
    assert found.config == space.default()
    # Without the shipped records, the sibling serves as a driver mismatch.
    found = find_config(wl, db=tmp_path / "sibling.db", shipped=False)
    assert (found.provenance, found.config) == ("driver_mismatch", other_config)


# -- adapting configs ------------------------------------------------------------------------


def test_adapt_config_keeps_what_fits_and_moves_the_rest_least():
    space = make_space(
        autosched.workload("matmul", M=96, N=48, K=64), limits=DeviceLimits(is_cpu=True)
    )
    source = {
        "tile.i": [1, 4],
        "tile.j": [1, 64],
        "tile.k": [16, 2],
        "vec": 16,
        "stage.A": "global",
        "stage.B": "global",
    }
    adapted = adapt_config(source, space)
    # 64 does not divide N=48: the nearest register tile is 48, and vec=16 divides it.
    assert adapted == Config(dict(source, **{"tile.j": (1, 48)}))
    # 8 x 48 accumulators exceed the register budget: one of the tiles must shrink.
    adapted = adapt_config(dict(source, **{"tile.i": [1, 8]}), space)
    assert adapted is not None and space.check(adapted) is None
    assert space.reg_elems(adapted) <= 256 and adapted["vec"] == 16
    # Tiny work-groups: the threads move down until the device accepts the config.
    small = make_space(WL64, limits=DeviceLimits(max_work_group_size=4, max_work_item_size=4))
    adapted = adapt_config(dict(source, **{"tile.i": [8, 1], "tile.j": [8, 4], "vec": 4}), small)
    assert adapted is not None and small.check(adapted) is None
    assert small.threads(adapted) <= 4 and adapted["vec"] == 4


def test_shape_distance_is_symmetric_in_log_space():
    a, b = {"M": 64, "N": 64, "K": 64}, {"M": 128, "N": 64, "K": 32}
    assert shape_distance(a, b) == pytest.approx(np.log(2) * np.sqrt(2))
    assert shape_distance(a, b) == shape_distance(b, a)
    assert shape_distance(a, {"M": 1}) == float("inf")


# -- the kernel ------------------------------------------------------------------------------


# M, N, K all differ: an input bound to the wrong name cannot go unnoticed.
WL_CALL = autosched.workload("matmul", M=64, N=48, K=32)


@pytest.fixture(scope="module", params=TARGETS)
def called(request, tmp_path_factory):
    """An untuned 64x48x32 matmul compiled for each target, and two inputs."""
    db = _empty_db(tmp_path_factory.mktemp("call") / "e.db")
    kernel = compile(WL_CALL, target=request.param, db=db, shipped=False)
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
    b = rng.uniform(-1, 1, (32, 48)).astype(np.float32)
    return kernel, a, b


def test_a_kernel_is_called_like_a_function(called):
    kernel, a, b = called
    assert [(s.name, s.shape) for s in kernel.inputs] == [("A", (64, 32)), ("B", (32, 48))]
    assert [(s.name, s.shape, s.dtype) for s in kernel.outputs] == [("C", (64, 48), "float32")]
    want = a.astype(np.float64) @ b
    c = kernel(a, b)
    assert isinstance(c, np.ndarray) and c.shape == (64, 48) and c.dtype == np.float32
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)
    # By name, mixed, in any keyword order, and from float64 (cast to float32).
    for got in (
        kernel(A=a, B=b),
        kernel(B=b, A=a),
        kernel(a, B=b),
        kernel(a.astype(np.float64), b.astype(np.float64)),
        kernel(np.asfortranarray(a), b),
    ):
        np.testing.assert_array_equal(got, c)
    assert kernel.run({"A": a, "B": b}).keys() == {"C"}
    np.testing.assert_array_equal(kernel.run({"A": a, "B": b})["C"], c)


def test_out_receives_the_output_and_is_returned(called):
    kernel, a, b = called
    out = np.full((64, 48), np.nan, np.float32)
    assert kernel(a, b, out=out) is out
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    # A second call overwrites it; numpy's one-element tuple form is accepted.
    assert kernel(A=a, B=np.zeros_like(b), out=(out,)) is out
    np.testing.assert_array_equal(out, np.zeros((64, 48), np.float32))


def _out(**changes):
    return np.empty(changes.get("shape", (64, 48)), changes.get("dtype", np.float32))


CALL_ERRORS = [
    (lambda k, a, b: k(a), "missing input(s) B"),
    (lambda k, a, b: k(B=b), "missing input(s) A"),
    (lambda k, a, b: k(a, b, a), "takes 2 input(s), got 3 positional arguments"),
    (lambda k, a, b: k(a, b, C=a), "unknown input(s) C"),
    (lambda k, a, b: k(a, b, A=a), "given both by position and by name: A"),
    (lambda k, a, b: k(b, a), "input A has shape [32, 48], expected [64, 32]"),
    (lambda k, a, b: k(a, b[:, :40]), "input B has shape [32, 40], expected [32, 48]"),
    (lambda k, a, b: k(a, b.astype(np.complex64)), "input B has dtype complex64, expected float32"),
    (lambda k, a, b: k(a, b, out=_out(dtype=np.float64)), "out= for C has dtype float64"),
    (lambda k, a, b: k(a, b, out=_out(shape=(64, 40))), "out= for C has shape [64, 40], expected"),
    (lambda k, a, b: k(a, b, out=_out(shape=(48, 64)).T), "out= for C is not C-contiguous"),
    (lambda k, a, b: k(a, b, out=np.broadcast_to(_out(), (64, 48))), "out= for C is read-only"),
    (lambda k, a, b: k(a, b, out=_out().tolist()), "out= has 64 array(s), expected one array"),
    (lambda k, a, b: k(a, b, out=(_out(), _out())), "out= has 2 array(s), expected one array"),
    (lambda k, a, b: k(a, b, out=[[0.0] * 48]), "out= for C is a list, not a numpy array"),
]


@pytest.mark.parametrize(("call", "message"), CALL_ERRORS, ids=[m for _, m in CALL_ERRORS])
def test_a_bad_call_is_one_clear_error(called, call, message):
    kernel, a, b = called
    with pytest.raises(InvalidInputError) as info:
        call(kernel, a, b)
    text = str(info.value)
    assert message in text and text.startswith(f"{WL_CALL}: "), text
    if "out=" in message:
        assert text.endswith("; outputs: C[64, 48] float32"), text
    else:
        assert text.endswith("; accepted: A[64, 32] float32, B[32, 48] float32"), text


def test_run_takes_a_mapping(called):
    kernel, a, b = called
    with pytest.raises(InvalidInputError, match="as a mapping of name to array"):
        kernel.run([a, b])
    with pytest.raises(InvalidInputError, match="unknown input\\(s\\) a"):
        kernel.run({"A": a, "B": b, "a": a})


def test_a_kernel_with_two_outputs_returns_a_tuple(tmp_path, device):
    """No operator has two outputs yet: a hand-written OpenCL program with two, run as a
    compiled kernel on the real device, takes the tuple paths of the call and of out=."""
    from autosched.compiler import CompiledKernel
    from autosched.measure.program import KernelLaunch, KernelProgram
    from autosched.ops.base import TensorSpec

    n = 64
    source = (
        "__kernel void sum_diff(__global const float* A, __global const float* B,"
        " __global float* S, __global float* D) {"
        " int i = get_global_id(0); S[i] = A[i] + B[i]; D[i] = A[i] - B[i]; }"
    )
    program = KernelProgram(
        source=source,
        kernels=(KernelLaunch("sum_diff", (0, 1, 2, 3), (n,), (8,)),),
        tensors=tuple(
            TensorSpec(name, (n,), "float32", role)
            for name, role in (("A", "input"), ("B", "input"), ("S", "output"), ("D", "output"))
        ),
    )
    kernel = CompiledKernel(
        workload=WL64, target="opencl", device=device, config=Config({}), program=program,
        provenance="untuned",
    )  # fmt: skip
    rng = np.random.default_rng(2)
    a, b = rng.uniform(-1, 1, (2, n)).astype(np.float32)
    got = kernel(a, B=b)
    assert isinstance(got, tuple) and len(got) == 2
    np.testing.assert_array_equal(got[0], a + b)
    np.testing.assert_array_equal(got[1], a - b)
    s, d = np.empty(n, np.float32), np.empty(n, np.float32)
    result = kernel(a, b, out=(s, d))
    assert result[0] is s and result[1] is d
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(d, a - b)
    with pytest.raises(InvalidInputError, match=r"out= has 1 array\(s\), expected a tuple of 2"):
        kernel(a, b, out=s)
    with pytest.raises(InvalidInputError, match=r"out= for D has shape \[32\]"):
        kernel(a, b, out=(s, d[:32]))


# -- the command and its manifest ------------------------------------------------------------


def _unfused_record(wl, device, space: Space) -> Record:
    """A record whose config runs the epilogue as a second kernel through a scratch buffer."""
    config = adapt_config(
        {
            "tile.i": [1, 4],
            "tile.j": [1, 16],
            "tile.k": [8, 2],
            "vec": 8,
            "stage.A": "global",
            "stage.B": "global",
            "stage.bias": "global",
            "fuse": False,
        },
        space,
    )
    assert config is not None and config["fuse"] is False
    return Record(
        workload_key=wl.key,
        workload=wl.to_json(),
        target="opencl",
        device_key=device.key(),
        device_family=device.family(),
        device=device.fingerprint(),
        config_key=config.key,
        config=config.to_json(),
        status="ok",
        latencies=(1e-4, 1e-4, 1e-4),
        latency_s=1e-4,
        spread=0.0,
        gflops=wl.flops() / 1e-4 / 1e9,
        timestamp=time.time(),
        run_id="test-manifest",
    )


def _launch_from_files(out: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the kernels of ``out`` knowing only kernel.cl and manifest.json."""
    import pyopencl as cl

    manifest = json.loads((out / "manifest.json").read_text())
    source = (out / manifest["source"]).read_text()
    ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
    queue = cl.CommandQueue(ctx)
    program = cl.Program(ctx, source).build()
    bufs: dict[str, cl.Buffer] = {}
    outputs: dict[str, np.ndarray] = {}
    for t in manifest["tensors"]:
        if t["role"] == "input":
            host = np.ascontiguousarray(inputs[t["name"]], dtype=t["dtype"])
            assert list(host.shape) == t["shape"]
            bufs[t["name"]] = cl.Buffer(
                ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host
            )
        else:  # outputs and scratch
            nbytes = int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
            bufs[t["name"]] = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=nbytes)
            if t["role"] == "output":
                outputs[t["name"]] = np.empty(t["shape"], dtype=t["dtype"])
    for k in manifest["kernels"]:
        kern = cl.Kernel(program, k["name"])
        kern.set_args(*(bufs[a["name"]] for a in k["args"]))
        cl.enqueue_nd_range_kernel(queue, kern, k["global_size"], k["local_size"])
    for name, host in outputs.items():
        cl.enqueue_copy(queue, host, bufs[name])
    queue.finish()
    return outputs


def test_compile_command_writes_a_manifest_another_runtime_can_launch(tmp_path, device):
    wl = autosched.workload("matmul", M=64, N=48, K=32, epilogue="bias_relu")
    space = make_space(wl, limits=device.limits)
    db = tmp_path / "m.db"
    with SQLiteDatabase(db) as store:
        (record_id,) = store.add([_unfused_record(wl, device, space)])
    out = tmp_path / "out"
    res = _cli(
        "compile",
        "--op",
        "matmul",
        "--shape",
        "64,48,32",
        "--epilogue",
        "bias_relu",
        "--db",
        str(db),
        "-o",
        str(out),
        env_home=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["kernel.cl", "manifest.json"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    assert manifest["workload"] == wl.to_json() and manifest["workload_key"] == wl.key
    assert manifest["device_key"] == device.key() and manifest["device"]["name"] == device.name
    assert manifest["provenance"] == "exact"
    assert manifest["record"]["id"] == record_id
    assert manifest["record"]["latency_s"] == pytest.approx(1e-4)
    assert manifest["record"]["gflops"] == pytest.approx(wl.flops() / 1e-4 / 1e9)
    kernels = manifest["kernels"]
    assert len(kernels) == 2  # the main kernel, then the epilogue
    roles = [[a["role"] for a in k["args"]] for k in kernels]
    assert "scratch" in roles[0] and "scratch" in roles[1]
    for k in kernels:
        assert len(k["global_size"]) == len(k["local_size"]) >= 1
        assert all(g % w == 0 for g, w in zip(k["global_size"], k["local_size"]))

    # The same kernel in-process: the same manifest, and it runs both kernels correctly.
    kernel = compile(wl, db=db, shipped=False)
    assert kernel.manifest() == manifest
    _check_outputs(kernel, seed=2)

    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
    b = rng.uniform(-1, 1, (32, 48)).astype(np.float32)
    bias = rng.uniform(-1, 1, (48,)).astype(np.float32)
    got = _launch_from_files(out, {"A": a, "B": b, "bias": bias})
    want = np.maximum(a.astype(np.float64) @ b + bias, 0.0)
    np.testing.assert_allclose(got["D"], want, rtol=1e-4, atol=1e-4)


def test_compile_command_untuned_manifest(tmp_path):
    out = tmp_path / "u"
    res = _cli(
        "compile", "--op", "matmul", "--shape", "M=32,N=32,K=32", "--no-shipped", "-o", str(out),
        env_home=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["provenance"] == "untuned" and manifest["record"] is None
    assert "untuned" in res.stdout
    a = np.eye(32, dtype=np.float32)
    b = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    np.testing.assert_array_equal(_launch_from_files(out, {"A": a, "B": b})["C"], b)


def test_compile_command_serves_a_padded_conv2d(tmp_path):
    wl = autosched.workload("conv2d", n=1, c=4, h=8, w=8, k=8, r=3, s=3, pad=1)
    out = tmp_path / "conv"
    res = _cli(
        "compile", "--op", "conv2d", "--shape", "n=1,c=4,h=8,w=8,k=8,r=3,s=3,pad=1",
        "--no-shipped", "-o", str(out), env_home=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["workload"] == wl.to_json() and manifest["provenance"] == "untuned"
    inputs = wl.make_inputs(np.random.default_rng(4))
    got = _launch_from_files(out, inputs)
    rtol, atol = wl.tolerance()
    np.testing.assert_allclose(got["conv2d"], wl.reference(inputs)["conv2d"], rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "64,64,64", "--target", "cuda"], "accepted: opencl"),
        (["--shape", "64,64"], "malformed"),
        (["--shape", "64,64,64", "--epilogue", "gelu"], "accepted: none, bias, bias_relu"),
        (["--shape", "64,64,64", "--db", "missing.db"], "does not exist"),
        (["--shape", "64,64,64", "--device", "no-such-device"], "no device matches"),
    ],
)
def test_compile_command_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    res = _cli("compile", "--op", "matmul", *args, "-o", str(tmp_path / "o"), env_home=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not (tmp_path / "o").exists()


def test_compile_command_output_must_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    res = _cli(
        "compile", "--op", "matmul", "--shape", "8,8,8", "-o", str(tmp_path / "file"),
        env_home=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2 and "is a file" in res.stderr


# -- the llvm target -------------------------------------------------------------------------


def test_opencl_records_never_serve_the_llvm_target(tuned):
    found = find_config(WL64, target="llvm", db=tuned, shipped=False)
    assert found.provenance == "untuned" and found.record is None


def test_llvm_compile_runs_in_process_and_from_its_manifest(tmp_path):
    import tvm

    wl = autosched.workload("matmul", M=32, N=48, K=16, epilogue="bias_relu")
    kernel = compile(wl, target="llvm", db=_empty_db(tmp_path / "e.db"), shipped=False)
    assert kernel.provenance == "untuned" and kernel.source is None
    _check_outputs(kernel)

    out = tmp_path / "llvm"
    res = _cli(
        "compile", "--op", "matmul", "--shape", "32,48,16", "--epilogue", "bias_relu",
        "--target", "llvm", "--no-shipped", "-o", str(out), env_home=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == "llvm" and manifest["source"] == "kernel.so"
    (entry,) = manifest["kernels"]
    module = tvm.runtime.load_module(str(out / manifest["source"]))
    inputs = wl.make_inputs(np.random.default_rng(1))
    args = [
        tvm.runtime.tensor(
            inputs[a["name"]] if a["role"] == "input" else np.empty(a["shape"], a["dtype"]),
            tvm.cpu(0),
        )
        for a in entry["args"]
    ]
    module[entry["name"]](*args)
    (d,) = [t for t, a in zip(args, entry["args"]) if a["role"] == "output"]
    np.testing.assert_allclose(d.numpy(), wl.reference(inputs)["D"], rtol=1e-4, atol=1e-4)
