"""Measure a replay cache: a random sample of a workload's space, through the normal tuner.

One call measures one chunk of about ``--chunk-s`` seconds (run it under the shared CPU
lock, and again for the next chunk): ``autosched tune --strategy random --batch 32
--seed 1 --db F``. ``--trials`` counts every config the database holds for that
workload and device (not the trials of this call), so each chunk asks for what the
database holds plus what fits in the chunk at the rate the last chunk measured; the
random strategy skips what the database already holds, so the chunks add up to one
sample. A chunk that overruns by three minutes is stopped (its process group killed;
every finished batch is already stored). After each chunk the
records are exported (``autosched records export``) to ``bench/replay/NAME.jsonl.gz``.

    flock /tmp/autosched-cpu.lock .venv/bin/python bench/replay_measure.py matmul-512

The working databases live in ``bench/replay/work/`` (not committed).
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHES = HERE / "replay"
AUTOSCHED = [sys.executable, "-m", "autosched"]

# name -> (op, shape, configs wanted, target)
WORKLOADS: dict[str, tuple[str, str, int, str]] = {
    "matmul-512": ("matmul", "M=512,N=512,K=512", 1500, "opencl"),
    "conv2d-resnet3x3": ("conv2d", "n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1", 1000, "opencl"),
    "softmax-1536x128": ("softmax", "rows=1536,cols=128", 1000, "opencl"),
    "matmul-127x1000x333": ("matmul", "M=127,N=1000,K=333", 1000, "opencl"),
    # ResNet-18's last-stage 3x3 convolution (7x7 outputs, 512 -> 512 channels) in the
    # layout a model's convolutions are built in, on TVM's llvm target: the task whose
    # searches end furthest apart in a whole-model tune.
    "conv2d-resnet7x7": (
        "conv2d",
        "n=1,c=512,h=7,w=7,k=512,r=3,s=3,pad=1,layout=NHWC",
        1000,
        "llvm",
    ),
}


def measured(db: Path) -> int:
    """Distinct configs the working database holds (one workload per database)."""
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        return con.execute("SELECT COUNT(DISTINCT config_key) FROM records").fetchone()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(WORKLOADS))
    parser.add_argument("--chunk-s", type=float, default=480.0, help="seconds of measuring")
    parser.add_argument("--tag", default="zen3", help="file name suffix (the CPU family)")
    parser.add_argument(
        "--configs", type=int, default=None, help="configs wanted (default: the workload's)"
    )
    parser.add_argument(
        "--rate", type=float, default=0.8, help="trials/s before a chunk has measured it"
    )
    parser.add_argument(
        "--target", choices=("opencl", "llvm"), help="the target (default: the workload's)"
    )
    args = parser.parse_args(argv)
    op, shape, wanted, target = WORKLOADS[args.name]
    target = args.target or target
    wanted = args.configs or wanted
    work = CACHES / "work"
    work.mkdir(parents=True, exist_ok=True)
    db = work / f"{args.name}-{target}-{args.tag}.db"
    before = measured(db)
    rate_file = work / f"{args.name}-{target}-{args.tag}.rate"
    rate = float(rate_file.read_text()) if rate_file.exists() else args.rate
    if before < wanted:
        trials = min(wanted, before + max(32, int(rate * args.chunk_s)))
        cmd = [*AUTOSCHED, "tune", "--op", op, "--shape", shape, "--target", target]
        cmd += ["--strategy", "random", "--trials", str(trials), "--batch", "32"]
        cmd += ["--seed", "1", "--db", str(db)]
        start = time.time()
        proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            proc.wait(timeout=args.chunk_s + 180)
        except subprocess.TimeoutExpired:  # its finished batches are stored: export them
            print(f"{args.name}: the chunk overran by three minutes; stopped")
        finally:
            if proc.poll() is None:  # overran (or we were interrupted): stop all of it
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        took = time.time() - start
        after = measured(db)
        if after > before and took > 60:
            rate_file.write_text(f"{(after - before) / took:.3f}\n")
        print(f"{args.name}: {before} -> {after} configs in {took:.0f} s")
    out = CACHES / f"{args.name}-{target}-{args.tag}.jsonl.gz"  # export gzips a .gz path
    subprocess.run(
        [*AUTOSCHED, "records", "export", "--db", str(db), "--op", op, "-o", str(out)],
        check=True,
    )
    done = measured(db)
    print(f"{args.name}: {done}/{wanted} configs; wrote {out}")
    return 0 if done >= wanted else 3


if __name__ == "__main__":
    sys.exit(main())
