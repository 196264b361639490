"""The default install carries what tuning needs and nothing a CPU machine should not pay for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _would_install(tmp_path: Path, spec: str) -> set[str]:
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", "--report", str(report), spec],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}


def test_default_install_pulls_no_peer_and_no_cuda_wheel(tmp_path):
    names = _would_install(tmp_path, ".")
    # What tuning needs is there (so an empty or failed resolution cannot pass) ...
    assert {"apache-tvm", "pyopencl", "xgboost-cpu", "autosched"} <= names, sorted(names)
    # ... and neither the benchmark's peer nor NVIDIA's runtime wheels.
    assert "kernel-tuner" not in names and "kernel_tuner" not in names, sorted(names)
    assert not [n for n in names if n.startswith("nvidia-")], sorted(names)
    assert "xgboost" not in names, "plain xgboost pulls NCCL wheels; the CPU build is xgboost-cpu"


def test_bench_extra_brings_the_peers(tmp_path):
    names = _would_install(tmp_path, ".[bench]")
    assert "kernel-tuner" in names or "kernel_tuner" in names, sorted(names)
    assert not [n for n in names if n.startswith("nvidia-")], sorted(names)


def test_models_extra_brings_the_frontends_without_cuda(tmp_path):
    names = _would_install(tmp_path, ".[models]")
    assert {"torch", "onnx", "onnxruntime"} <= names, sorted(names)
    # torch==2.13.0 is met by the +cpu wheel where pip can find it (a find-links folder in
    # pip's configuration, or PyTorch's CPU index); PyPI's Linux wheel pulls CUDA's runtime.
    assert not [n for n in names if n.startswith("nvidia-")], sorted(names)
