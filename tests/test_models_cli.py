"""``autosched model tasks|tune|build`` end to end on a PyTorch factory file: a real
torch.export import, real tuning on the host CPU, and a library that TVM's runtime
loads and a Relax VM runs to torch eager's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from autosched.tuning import load_job

RUN = [sys.executable, "-m", "autosched", "model"]

FACTORY = """
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self, d=32, ff=64):
        super().__init__()
        self.f1, self.f2, self.ln = nn.Linear(d, ff), nn.Linear(ff, d), nn.LayerNorm(d)

    def forward(self, x):
        return torch.softmax(self.ln(x + self.f2(nn.functional.gelu(self.f1(x)))), -1)


def mlp():
    torch.manual_seed(0)
    return Mlp().eval(), (torch.rand(16, 32) * 2 - 1,)
"""


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=600, **kw)


def test_model_tasks_tune_and_build_from_a_factory(tmp_path):
    import torch
    import tvm
    from tvm import relax

    src = tmp_path / "mlp.py"
    src.write_text(FACTORY)
    model = f"{src}:mlp"
    res = _run(
        "tasks", model, "--job", str(tmp_path / "m.toml"), "--json", str(tmp_path / "t.json")
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads((tmp_path / "t.json").read_text())["tasks"]
    families = {r["family"] for r in rows}
    assert {"contraction", "rowwise"} <= families, rows
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-6
    job = load_job(tmp_path / "m.toml")  # a farm job of the tunable tasks, as written
    assert job.policy == "gradient"
    assert len(job.tasks) == sum(r["family"] is not None for r in rows)

    # Without --db, the records database of every other command (`tune`, `job`, `report`):
    # what they stored reaches the model's build, and nothing lands in the working folder.
    home = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    work = tmp_path / "work"
    work.mkdir()
    lib = tmp_path / "model.so"
    res = _run("build", model, "-o", str(lib), env=home, cwd=work)
    assert res.returncode == 2 and "does not exist" in res.stderr, res.stderr[-2000:]
    out = tmp_path / "r.json"
    res = _run(
        "tune", model, "--trials", "6", "--batch", "2", "--json", str(out), env=home, cwd=work
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "data" / "autosched" / "records.db").is_file()
    assert list(work.iterdir()) == []
    data = json.loads(out.read_text())
    assert data["trials"] == 6 and sum(t["trials"] for t in data["tasks"]) == 6
    latency = data["latency_ms"]  # timed side by side, each checked against torch first
    assert set(latency) == {"untuned", "tuned", "onnxruntime", "torch"}, latency
    assert all(v > 0 for v in latency.values()), latency
    assert data["correct"] is True and data["max_rel_error"] < 1e-3, data
    tuned = [t for t in data["tasks"] if t["trials"]]
    assert tuned and all(t["applied"] and t["best_ms"] for t in tuned), data["tasks"]
    assert "differs from the reference" not in res.stderr

    res = _run("build", model, "-o", str(lib), env=home, cwd=work)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "from records" in res.stdout and "matches torch" in res.stdout
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    x = np.random.default_rng(3).uniform(-1, 1, (16, 32)).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu()))
    got = got[0] if not hasattr(got, "numpy") else got
    sys.path.insert(0, str(tmp_path))
    try:
        import mlp as factory
    finally:
        sys.path.remove(str(tmp_path))
    module, _ = factory.mlp()
    want = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


def test_an_opencl_tuning_of_a_model_is_compiled_kernel_by_kernel(tmp_path):
    """TVM's Python package runs no OpenCL: `model tune --target opencl` tunes the tasks
    on the OpenCL device and `model compile` writes each tuned kernel with its manifest,
    every one checked against its task's reference on the device first."""
    src = tmp_path / "mlp.py"
    src.write_text(FACTORY)
    model = f"{src}:mlp"
    db = str(tmp_path / "o.db")
    res = _run("tune", model, "--target", "opencl", "--trials", "4", "--batch", "2", "--db", db)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "model compile --target opencl" in res.stdout
    out = tmp_path / "kernels"
    res = _run("compile", model, "--target", "opencl", "--db", db, "-o", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(folders) >= 3 and "from records" in res.stdout
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        assert (folder / "kernel.cl").read_text().count("__kernel") >= 1
        assert manifest["workload"]["op"] == "fused" and manifest["target"] == "opencl"
    assert sum(" exact " in line for line in res.stdout.splitlines()) == len(folders)


def test_model_commands_refuse_bad_input_in_one_line(tmp_path):
    missing = tmp_path / "none.onnx"
    for args in (
        ("tasks", str(missing)),
        ("build", str(missing), "--db", str(tmp_path / "x.db"), "-o", str(tmp_path / "m.so")),
        ("tasks", f"{tmp_path / 'mlp.py'}:mlp", "--input", "x=1x0"),
    ):
        res = _run(*args)
        assert res.returncode == 2, (args, res.stderr)
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith("autosched: error: ") and "accepted" in line, line
