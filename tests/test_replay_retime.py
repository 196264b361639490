"""bench/replay_retime: a sample measured on this machine has its top timed again side by
side; a sample of another device is named and skipped, never timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import autosched
from autosched.records.files import export_jsonl
from autosched.records.sqlite import SQLiteDatabase

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "bench" / "replay" / "matmul-512-opencl-h100.jsonl.gz"


def _retime(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.replay_retime", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_sample_of_this_machine_is_timed_again_and_one_of_another_device_skipped(tmp_path):
    wl = autosched.workload("matmul", M=64, N=64, K=64)
    db_path = tmp_path / "sample.db"
    autosched.tune(wl, trials=10, strategy="random", target="llvm", db=db_path, seed=1)
    sample = tmp_path / "sample.jsonl"
    with SQLiteDatabase(db_path) as db:
        assert export_jsonl(db, sample) >= 10
    out = tmp_path / "retime.json"
    args = ["--top", "3", "--random", "3", "--repeats", "2", "--rounds", "1", "--out", str(out)]
    done = _retime(str(sample), str(H100), *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "matmul-512-opencl-h100.jsonl.gz: measured on device" in done.stdout
    result = json.loads(out.read_text())
    assert result["machine"]["isa"] and result["repeats"] == 2
    (row,) = result["samples"]  # the GPU's sample was not timed
    assert row["file"] == "sample.jsonl" and row["target"] == "llvm"
    assert (row["top"], row["random"]) == (3, 3)
    assert 1 <= row["sample_best_retimed_place"] <= 6
    assert 0 < row["sample_best_retimed_share"] <= 1.0
    assert 0 <= row["top_within_5pct"] <= 3
    # every config timed in both side-by-side batches, the top first, then the draw
    assert [c["drawn"] for c in row["configs"]] == [False] * 3 + [True] * 3
    for c in row["configs"]:
        assert len(c["retimed_gflops"]) == 2 and all(g > 0 for g in c["retimed_gflops"])
    tops = [c["sample_gflops"] for c in row["configs"][:3]]
    assert tops == sorted(tops, reverse=True)
    assert min(tops) >= max(c["sample_gflops"] for c in row["configs"][3:])
