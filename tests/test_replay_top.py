"""bench/replay_top: a sample measured on this machine has its top configs read again until
each holds the readings asked for, appended to the sample; a sample of another device is
named and left as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import autosched
from autosched.records.drift import drift_free
from autosched.records.files import export_jsonl
from autosched.records.sqlite import SQLiteDatabase
from autosched.tuning.replay import caches_from_records, read_records

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "bench" / "replay" / "matmul-512-opencl-h100.jsonl.gz"


def test_a_sample_of_this_machine_gets_its_top_read_again_and_one_of_another_device_not(
    tmp_path,
):
    wl = autosched.workload("matmul", M=64, N=64, K=64)
    db_path = tmp_path / "sample.db"
    autosched.tune(wl, trials=12, strategy="random", target="llvm", db=db_path, seed=1)
    sample = tmp_path / "sample.jsonl"
    with SQLiteDatabase(db_path) as db:
        assert export_jsonl(db, sample) >= 12
    before = read_records(sample)
    h100 = H100.read_bytes()
    out = tmp_path / "top.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.replay_top", str(sample), str(H100)]
        + ["--top", "3", "--reads", "4", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "matmul-512-opencl-h100.jsonl.gz: measured on device" in done.stdout
    assert H100.read_bytes() == h100  # the GPU's sample is untouched
    after = read_records(sample)
    # every record kept, in order; the new readings come after them
    assert [r.to_json() for r in after[: len(before)]] == [r.to_json() for r in before]
    added = after[len(before) :]
    assert added and {r.workload_key for r in added} == {before[0].workload_key}
    (cache,) = caches_from_records(after)  # still one device's sample
    assert set(cache.records) == {r.config_key for r in before}
    reads = Counter(r.config_key for r in after if r.ok and r.latency_s)
    top = sorted(
        (r for r in drift_free(after).values() if r.ok and r.gflops), key=lambda r: -r.gflops
    )[:3]
    assert all(reads[r.config_key] >= 4 for r in top)
    # read in batches of their own (each a batch the drift fit can link), one reading
    # per config and batch: as many batches as the least-read of them lacked
    had = Counter(r.config_key for r in before if r.ok and r.latency_s)
    batches = Counter(r.started_at for r in added)
    assert min(batches.values()) > 1
    assert len(batches) >= 4 - min(had[r.config_key] for r in top)
    (row,) = json.loads(out.read_text())["samples"]
    assert row["file"] == "sample.jsonl" and row["records_added"] == len(added)
    assert row["after"]["best_reads"] >= 4
    assert row["before"]["best_gflops"] > 0 and row["after"]["best_gflops"] > 0
