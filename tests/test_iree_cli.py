"""The IREE targets end to end: ``autosched tune`` on both backends, ``tune --mlir`` on
a user's file, and the compiler side (``iree annotate``, ``iree spec``) checked by
building the result with the real ``iree-compile`` and running it with
``iree-run-module`` against numpy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autosched
from autosched.iree.toolchain import compile_flags, iree_compile_path
from autosched.measure.device import select_device
from autosched.records import open_database
from autosched.tuner import Tuner

RUN = [sys.executable, "-m", "autosched"]

# A user's module: other names, a matmul whose bias and ReLU IREE fuses into its
# dispatch, and a row sum; neither written by autosched.
USER_MLIR = """
func.func @forward(%x: tensor<64x32xf32>, %w: tensor<32x48xf32>, %b: tensor<48xf32>)
    -> (tensor<64x48xf32>, tensor<64xf32>) {
  %c0 = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<64x48xf32>
  %acc = linalg.fill ins(%c0 : f32) outs(%empty : tensor<64x48xf32>) -> tensor<64x48xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<64x32xf32>, tensor<32x48xf32>)
      outs(%acc : tensor<64x48xf32>) -> tensor<64x48xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
      affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<64x48xf32>, tensor<48xf32>) outs(%empty : tensor<64x48xf32>) {
  ^bb0(%m: f32, %bb: f32, %o: f32):
    %s = arith.addf %m, %bb : f32
    %r = arith.maximumf %s, %c0 : f32
    linalg.yield %r : f32
  } -> tensor<64x48xf32>
  %e1 = tensor.empty() : tensor<64xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e1 : tensor<64xf32>) -> tensor<64xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
      iterator_types = ["parallel", "reduction"]} ins(%y : tensor<64x48xf32>) outs(%z : tensor<64xf32>) {
  ^bb0(%a: f32, %acc2: f32):
    %t = arith.addf %a, %acc2 : f32
    linalg.yield %t : f32
  } -> tensor<64xf32>
  return %y, %sum : tensor<64x48xf32>, tensor<64xf32>
}
"""
MATMUL = autosched.workload("matmul", M=64, N=48, K=32)
TUNED = {
    "iree-llvm-cpu": {"pipeline": "DoubleTilingExpert", "dist.m": 16, "dist.n": 16,
                      "vec.m": 4, "vec.n": 8, "red.k": 2, "peel": False, "cache.m": 0,
                      "cache.n": 0},
    "iree-vulkan": {"pipeline": "BaseVectorize", "wg.m": 8, "wg.n": 16, "thr.m": 1,
                    "thr.n": 2, "red.k": 4, "stages": 1},
}  # fmt: skip
LOWERING = {
    "iree-llvm-cpu": "distribution = [16, 16, 0], vector_common_parallel = [4, 8, 0]",
    "iree-vulkan": "tile_sizes = [[8, 16], [1, 2], [0, 0, 4]]",
}


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=timeout)


def _record(db_path, target: str, wl=MATMUL, config: dict | None = None) -> None:
    """Measure ``config`` of ``wl`` (the tuned config of MATMUL) for real and store it:
    the workload's only record, so the lookup's answer is known."""
    from autosched.space.config import Config

    db = open_database(db_path)
    dev = select_device(None, target=target)
    tuner = Tuner(wl, db=db, device=dev, target=target, timeout_s=60)
    try:
        (rec,) = tuner.measure([Config(config or TUNED[target])])
    finally:
        tuner.close()
    assert rec.status == "ok", rec.error
    db.add([rec])
    db.close()


def _compile_and_run(tmp_path, mlir, target: str, extra: list[str] = ()) -> None:
    """iree-compile ``mlir`` for ``target`` and run it with iree-run-module on random
    inputs; both outputs must match numpy."""
    vmfb = tmp_path / f"{target}.vmfb"
    subprocess.run(
        [iree_compile_path(), str(mlir), *compile_flags(target), *extra, "-o", str(vmfb)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    rng = np.random.default_rng(0)
    x, w, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((64, 32), (32, 48), (48,)))
    for name, arr in (("x", x), ("w", w), ("b", b)):
        np.save(tmp_path / f"{name}.npy", arr)
    tool = str(Path(sys.executable).parent / "iree-run-module")  # iree-base-runtime's
    device = "local-task" if target == "iree-llvm-cpu" else "vulkan"
    subprocess.run(
        [tool, f"--module={vmfb}", f"--device={device}", "--function=forward"]
        + [f"--input=@{tmp_path / n}.npy" for n in ("x", "w", "b")]
        + [f"--output=@{tmp_path / 'y.npy'}", f"--output=@{tmp_path / 's.npy'}"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    y = np.maximum(x.astype(np.float64) @ w + b, 0)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), y.sum(axis=1), rtol=1e-4, atol=1e-3)


def _configs(mlir, target: str, extra: list[str] = ()) -> str:
    out = subprocess.run(
        [iree_compile_path(), str(mlir), *compile_flags(target), *extra]
        + ["--compile-to=executable-configurations", "-o", "-"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "warning" not in out.stderr, out.stderr  # what the user's build would print
    return out.stdout


@pytest.mark.parametrize("target", ["iree-llvm-cpu", "iree-vulkan"])
def test_annotate_writes_the_records_config_and_iree_builds_it_correctly(tmp_path, target):
    db = tmp_path / "r.db"
    user = tmp_path / "model.mlir"
    user.write_text(USER_MLIR)
    _record(db, target)
    out = tmp_path / "tuned.mlir"
    res = _run("iree", "annotate", str(user), "--target", target, "--db", str(db), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "linalg.matmul [matmul(M=64, N=48, K=32, epilogue=none)]: record" in res.stdout
    assert "reduce(rows=64, cols=48, kind=sum)]: no record" in res.stdout
    assert out.read_text().count("{compilation_info = ") == 1  # on the matmul only
    # The tuned tiles reach the executable, and the built module computes the reference.
    assert LOWERING[target] in _configs(out, target)
    assert LOWERING[target] not in _configs(user, target)
    _compile_and_run(tmp_path, out, target)


def test_spec_steers_an_unannotated_llvm_cpu_build(tmp_path):
    db = tmp_path / "r.db"
    _record(db, "iree-llvm-cpu")
    # The module's row sum, and a matmul of a shape the module does not have.
    cpu = dict(TUNED["iree-llvm-cpu"])
    row_sum = {"pipeline": "DoubleTilingExpert", "dist.row": 16, "cache.row": 0,
               "vec.row": 4, "red.col": 8, "peel": False}  # fmt: skip
    _record(
        db, "iree-llvm-cpu", autosched.workload("reduce", rows=64, cols=48, kind="sum"), row_sum
    )
    other = {**cpu, "dist.m": 32, "vec.m": 2}
    _record(db, "iree-llvm-cpu", autosched.workload("matmul", M=32, N=48, K=32), other)
    spec = tmp_path / "spec.mlir"
    res = _run("iree", "spec", "--db", str(db), "-o", str(spec))
    assert res.returncode == 0, res.stderr
    assert "3 configs" in res.stdout
    # One named sequence: iree-compile 3.13 verifies a spec's named sequences in
    # parallel while it holds the lock its other executables wait on, and deadlocks.
    assert spec.read_text().count("transform.named_sequence") == 1
    user = tmp_path / "model.mlir"
    user.write_text(USER_MLIR)
    extra = [f"--iree-codegen-tuning-spec-path={spec}"]
    configs = _configs(user, "iree-llvm-cpu", extra)
    assert LOWERING["iree-llvm-cpu"] in configs
    assert (
        "distribution = [16, 0], vector_common_parallel = [4, 0], vector_reduction = [0, 8]"
        in configs
    )
    assert "distribution = [32, 16, 0]" not in configs  # the other shape's config
    _compile_and_run(tmp_path, user, "iree-llvm-cpu", extra)


def test_spec_reaches_a_convolution_and_a_softmax(tmp_path):
    """IREE configures a convolution generalized (a linalg.generic), and a softmax's
    dispatch holds three generics of the row's shape, of which a config goes on the first
    reduction only (IREE refuses a dispatch with two). The spec's config reaches both
    roots and each builds (the softmax's build failed, the conv's config was not applied)."""
    from autosched.iree.linalg import domain, emit
    from autosched.iree.render import compilation_info
    from autosched.space.select import make_space

    db = tmp_path / "r.db"
    limits = select_device(None, target="iree-llvm-cpu").limits
    wls = [
        autosched.workload("conv2d", n=2, c=8, h=8, w=8, k=16, r=3, s=3, pad=1, layout="NHWC"),
        autosched.workload("softmax", rows=16, cols=64),
    ]
    infos = []
    for wl in wls:
        space = make_space(wl, target="iree-llvm-cpu", limits=limits)
        rng = np.random.default_rng(0)
        config = next(c for c in space.sample(rng, 64) if c["pipeline"] != "auto")
        _record(db, "iree-llvm-cpu", wl, dict(config))
        infos.append(compilation_info(domain(wl), "iree-llvm-cpu", config))
    spec = tmp_path / "spec.mlir"
    res = _run("iree", "spec", "--db", str(db), "-o", str(spec))
    assert res.returncode == 0 and "2 configs" in res.stdout, res.stderr
    extra = [f"--iree-codegen-tuning-spec-path={spec}"]
    for wl, info in zip(wls, infos):
        module = tmp_path / f"{wl.op}.mlir"
        module.write_text(emit(wl))
        tiles = info[info.index("lowering_config<") :].split(">")[0]
        assert tiles in _configs(module, "iree-llvm-cpu", extra), wl
        subprocess.run(
            [iree_compile_path(), str(module), *compile_flags("iree-llvm-cpu"), *extra]
            + ["-o", str(tmp_path / f"{wl.op}.vmfb")],
            check=True,
            capture_output=True,
            timeout=300,
        )


def test_tune_on_both_backends_then_mlir_tasks_share_the_records(tmp_path):
    db = str(tmp_path / "t.db")
    common = ["--db", db, "--batch", "3", "--strategy", "random", "--timeout", "60"]
    for target in ("iree-llvm-cpu", "iree-vulkan"):
        out = tmp_path / f"{target}.json"
        res = _run("tune", "--op", "matmul", "--shape", "64,48,32", "--target", target,
                   "--trials", "3", "--json", str(out), *common)  # fmt: skip
        assert res.returncode == 0, res.stderr
        data = json.loads(out.read_text())
        assert data["trials"] == 3 and data["best"]["gflops"] > 0
        assert data["device"]["iree_version"] and "IREE's default config" in res.stdout
    user = tmp_path / "model.mlir"
    user.write_text(USER_MLIR)
    res = _run("tune", "--mlir", str(user), "--target", "iree-llvm-cpu", "--trials", "4", *common)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "trials)" in ln]
    assert len(lines) == 2 and f"key {MATMUL.key}" in lines[0]
    records = open_database(db)
    try:
        # The file's matmul is --op matmul's task: it topped up the 3 trials to 4.
        def trials(wl, target):  # configs measured; finalists add re-measurements
            return len({r.config_key for r in records.query(workload_key=wl.key, target=target)})

        by_target = {t: trials(MATMUL, t) for t in ("iree-llvm-cpu", "iree-vulkan")}
        reduce = autosched.workload("reduce", rows=64, cols=48, kind="sum")
        assert by_target == {"iree-llvm-cpu": 4, "iree-vulkan": 3}
        # On llvm-cpu, IREE's own config written out as knobs was measured right after
        # the default (pipeline auto).
        from autosched.space.select import make_space

        limits = select_device(None, target="iree-llvm-cpu").limits
        (seed,) = make_space(MATMUL, target="iree-llvm-cpu", limits=limits).seeds()
        mine = records.query(workload_key=MATMUL.key, target="iree-llvm-cpu")
        assert seed.key in {r.config_key for r in mine}
        assert trials(reduce, "iree-llvm-cpu") == 4
        fp = records.query(workload_key=MATMUL.key, target="iree-vulkan")[0].device
        assert fp["driver_info"] and fp["subgroup_size"] >= 1 and fp["isa"] is not None
    finally:
        records.close()


def test_a_job_file_tunes_on_both_iree_backends_through_the_local_farm(tmp_path):
    """IREE targets in a job file: the embedded Dask cluster's host worker owns the
    iree-llvm-cpu device and lavapipe's Vulkan device, and the job tops both up."""
    job = tmp_path / "night.toml"
    job.write_text(
        'name = "iree"\ntrials = 3\nbatch = 3\nstrategy = "random"\n\n'
        '[[tasks]]\nop = "matmul"\nshape = "64,48,32"\n'
        'targets = ["iree-llvm-cpu", "iree-vulkan"]\n'
    )
    db = str(tmp_path / "j.db")
    res = _run("job", "run", str(job), "--db", db, "--json", str(tmp_path / "j.json"))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads((tmp_path / "j.json").read_text())["tasks"]
    assert sorted(r["target"] for r in rows) == ["iree-llvm-cpu", "iree-vulkan"]
    assert all(r["trials"] == 3 and r["best_gflops"] > 0 for r in rows), rows
    records = open_database(db)
    try:
        for target in ("iree-llvm-cpu", "iree-vulkan"):
            recs = records.query(workload_key=MATMUL.key, target=target)
            assert len({r.config_key for r in recs}) == 3 and recs[0].worker
    finally:
        records.close()


def test_a_job_with_a_convolution_iree_builds_its_own_way_says_so_and_ends(tmp_path):
    """A job's batch-1 convolution task on iree-llvm-cpu: its space is IREE's config alone,
    so the job says so for that task (not for the matmul beside it), measures it once
    and ends with the rest of the job instead of waiting on trials it cannot have."""
    job = tmp_path / "night.toml"
    job.write_text(
        'name = "iree"\ntrials = 3\nbatch = 3\nstrategy = "random"\n\n'
        '[[tasks]]\nname = "stem"\nop = "conv2d"\n'
        'shape = "n=1,c=8,h=8,w=8,k=16,r=3,s=3,pad=1,layout=NHWC"\n'
        'targets = ["iree-llvm-cpu"]\n\n'
        '[[tasks]]\nname = "head"\nop = "matmul"\nshape = "64,48,32"\n'
        'targets = ["iree-llvm-cpu"]\n'
    )
    out = tmp_path / "j.json"
    res = _run("job", "run", str(job), "--db", str(tmp_path / "j.db"), "--json", str(out),
               timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    notes = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "task stem on iree-llvm-cpu" in notes[0], res.stderr
    assert "(n: it folds them away)" in notes[0]
    rows = {r["task"]: r for r in json.loads(out.read_text())["tasks"]}
    assert rows["stem"]["trials"] == 1 and rows["stem"]["best_gflops"] > 0, rows
    assert rows["head"]["trials"] == 3, rows


def test_bad_iree_input_is_one_line_and_status_2(tmp_path):
    empty = tmp_path / "none.mlir"
    empty.write_text(
        "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }"
    )
    res = _run(
        "tune", "--mlir", str(empty), "--target", "iree-llvm-cpu", "--db", str(tmp_path / "d")
    )
    assert res.returncode == 2 and "has no root op that autosched tunes" in res.stderr
    res = _run("tune", "--mlir", str(empty), "--target", "llvm")
    assert res.returncode == 2 and "--mlir needs an IREE target" in res.stderr
    res = _run("iree", "annotate", str(tmp_path / "missing.mlir"), "--target", "iree-vulkan",
               "-o", str(tmp_path / "o.mlir"))  # fmt: skip
    assert res.returncode == 2 and "cannot read" in res.stderr
    broken = tmp_path / "broken.mlir"
    broken.write_text("func.func @f( {")
    res = _run("iree", "annotate", str(broken), "--target", "iree-vulkan", "--db",
               str(tmp_path / "d"), "-o", str(tmp_path / "o.mlir"))  # fmt: skip
    assert res.returncode == 2 and "does not parse" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_devices_lists_every_target_with_the_key_its_records_carry(tmp_path):
    out = tmp_path / "devices.json"
    res = _run("devices", "--json", str(out))
    assert res.returncode == 0, res.stderr
    listed = json.loads(out.read_text())
    by_target: dict[str, list[dict]] = {}
    for d in listed:
        by_target.setdefault(d["target"], []).append(d)
    assert set(by_target) == {"opencl", "llvm", "iree-llvm-cpu", "iree-vulkan"}, res.stdout
    for target, devices in by_target.items():
        first = select_device(None if target == "opencl" else "0", target=target)
        assert first.key(target) in {d["key"] for d in devices}, (target, res.stdout)
        assert f"{target}\n" in res.stdout


def _onnx_model(path: Path) -> np.ndarray:
    """A dense layer as an ONNX file (x @ W + B, ReLU; weights inside), and its weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = rng.uniform(-1, 1, (32, 48)).astype(np.float32)
    b = rng.uniform(-1, 1, 48).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["mm"], name="dense/matmul"),
            helper.make_node("Add", ["mm", "B"], ["pre"], name="dense/bias"),
            helper.make_node("Relu", ["pre"], ["y"], name="dense/relu"),
        ],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 48])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w


def test_an_onnx_model_is_tuned_annotated_and_built_by_iree(tmp_path):
    """``tune --mlir model.onnx`` imports the model with IREE's ONNX importer and tunes
    its matmul; ``iree annotate model.onnx`` writes the record's config into the
    imported module, which IREE builds and runs to onnxruntime's output."""
    import onnxruntime

    model = tmp_path / "dense.onnx"
    _onnx_model(model)
    db = str(tmp_path / "o.db")
    res = _run("tune", "--mlir", str(model), "--target", "iree-llvm-cpu", "--trials", "3",
               "--batch", "3", "--strategy", "random", "--db", db)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"key {MATMUL.key}: " in res.stdout, res.stdout
    # The annotation, from a database whose one record is a known config (a short tune
    # may well find IREE's own config fastest, which is then left alone).
    tuned = tmp_path / "t.db"
    _record(tuned, "iree-llvm-cpu")
    out = tmp_path / "tuned.mlir"
    res = _run("iree", "annotate", str(model), "--target", "iree-llvm-cpu", "--db", str(tuned),
               "-o", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    # The importer's module computes in dense$async; dense is its synchronous entry.
    assert "dense$async: linalg.matmul [matmul(M=64, N=48, K=32" in res.stdout, res.stdout
    assert out.read_text().count("{compilation_info = ") == 1
    assert LOWERING["iree-llvm-cpu"] in _configs(out, "iree-llvm-cpu")
    vmfb = tmp_path / "m.vmfb"
    subprocess.run(
        [iree_compile_path(), str(out), *compile_flags("iree-llvm-cpu"), "-o", str(vmfb)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    x = np.random.default_rng(2).uniform(-1, 1, (64, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    tool = str(Path(sys.executable).parent / "iree-run-module")
    subprocess.run(
        [tool, f"--module={vmfb}", "--device=local-task", "--function=dense",
         f"--input=@{tmp_path / 'x.npy'}", f"--output=@{tmp_path / 'y.npy'}"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4)


def test_a_broken_onnx_file_is_one_line_and_status_2(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07not a model")
    res = _run("tune", "--mlir", str(bad), "--target", "iree-llvm-cpu", "--trials", "1")
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"autosched: error: IREE cannot import {bad}") and "accepted" in line


@pytest.mark.parametrize("target", ["iree-vulkan", "iree-llvm-cpu"])
def test_configs_built_here_are_measured_by_another_machine_s_runtime(tmp_path, target):
    """bench/iree_prebuilt.py: a sample built with the compiler (here, for this machine's
    Vulkan device or CPU, described as another machine's would be) and timed by a
    process that only loads the built modules (a lent GPU machine has no compiler),
    records and a replay export out, IREE's config among them; each batch after the
    first times the fastest config so far again, so the batches' speeds can be fitted."""
    from autosched.tuning.control import MIN_NEW
    from autosched.tuning.replay import read_records

    if target == "iree-vulkan":
        info = tmp_path / "vulkaninfo.txt"
        info.write_text(subprocess.run(["vulkaninfo"], capture_output=True, text=True).stdout)
        describe = ["--vulkaninfo", str(info)]
    else:
        describe = ["--cpuinfo", "/proc/cpuinfo"]
    bench = [sys.executable, "-m", "bench.iree_prebuilt"]
    root = Path(__file__).resolve().parent.parent
    build = subprocess.run(
        [*bench, "build", "--op", "conv2d", *describe, "--configs", "7"]
        + ["-o", str(tmp_path / "b")],
        capture_output=True, text=True, cwd=root, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    assert (tmp_path / "b" / "conv2d.pkl").exists()
    measure = subprocess.run(
        [*bench, "measure", str(tmp_path / "b"), "--db", str(tmp_path / "m.db")]
        + ["--export", str(tmp_path / "m.jsonl.gz"), "--summary", str(tmp_path / "s.json")]
        + ["--finalists", "1", "--batch", "4"],
        capture_output=True, text=True, cwd=root, timeout=600,
    )  # fmt: skip
    assert measure.returncode == 0, measure.stderr[-2000:]
    (row,) = json.loads((tmp_path / "s.json").read_text())
    assert row["configs"] >= 8 and row["ok"] >= 1 and row["speedup"] > 0  # 7 drawn, IREE's
    records = read_records(tmp_path / "m.jsonl.gz")
    assert {r.config["pipeline"] for r in records} >= {"auto"}
    assert all(r.target == target and r.device["name"] == row["device"] for r in records)
    final = max(r.started_at for r in records)  # the finalists' side-by-side round
    batches = sorted({r.started_at for r in records if r.started_at != final})
    seen: set[str] = set()
    controls = 0
    for at in batches:
        keys = [r.config_key for r in records if r.started_at == at]
        again = [k for k in keys if k in seen]
        assert len(again) == (1 if len(keys) > MIN_NEW else 0), (keys, seen)
        controls += len(again)
        seen.update(keys)
    assert controls >= 1


def test_a_tune_of_a_convolution_iree_builds_its_own_way_says_so(tmp_path):
    """A batch-1 convolution on iree-llvm-cpu: IREE drops any config given (see
    tests/test_iree.py), so the tune measures IREE's own config alone and says why."""
    out = tmp_path / "t.json"
    res = _run("tune", "--op", "conv2d", "--shape", "n=1,c=8,h=8,w=8,k=16,r=3,s=3,pad=1,layout=NHWC",
               "--target", "iree-llvm-cpu", "--trials", "8", "--db", str(tmp_path / "t.db"),
               "--json", str(out), "--timeout", "60")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "note: IREE 3.13 drops the lowering config" in res.stderr
    assert "(n: it folds them away)" in res.stderr
    data = json.loads(out.read_text())
    assert data["trials"] == 1 and data["best"]["config"]["pipeline"] == "auto"
