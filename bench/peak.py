"""Benchmark: this CPU's float32 multiply-add peak, the ceiling every tuned kernel meets.

A kernel's GFLOP/s says how fast it is; this says how fast anything could be. A small C
loop (compiled here with the system's C compiler for this CPU, ``-march=native``) keeps
12 independent vector accumulators in registers and multiply-adds into them, on 1 and on
all usable cores at once; the best of 5 runs is the peak. The vector is the widest the
CPU has (64 bytes with AVX-512, else 32: 12 of them fit the register file either way).
A tuned kernel's share of it is how much any tuner could still give: IREE's default
config for ResNet's 56x56 conv at 79 % of it cannot be beaten by 1.3x, say.

    flock /tmp/autosched-cpu.lock .venv/bin/python bench/peak.py

Prints a table and writes ``bench/results/peak.json`` (the CPU's model and ISA with it).
Needs ``cc`` (Debian's ``gcc``); x86-64 or AArch64.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

ACCUMULATORS = 12
SOURCE = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef float vec __attribute__((vector_size(VEC_BYTES)));
#define LANES (VEC_BYTES / 4)
static volatile float sink;
static long steps;
static void *run(void *arg) {
  vec acc[ACC], x, y;
  for (int j = 0; j < LANES; j++) { x[j] = 1.0000001f; y[j] = 0.9999999f; }
  for (int i = 0; i < ACC; i++) for (int j = 0; j < LANES; j++) acc[i][j] = (float)i;
  for (long k = 0; k < steps; k++) {
#pragma GCC unroll 16
    for (int i = 0; i < ACC; i++) acc[i] = acc[i] * x + y;
  }
  float s = 0;
  for (int i = 0; i < ACC; i++) for (int j = 0; j < LANES; j++) s += acc[i][j];
  sink = s;
  return arg;
}
int main(int argc, char **argv) {
  int threads = atoi(argv[1]);
  steps = atol(argv[2]);
  pthread_t *t = calloc(threads > 0 ? threads : 1, sizeof *t);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, run, 0);
  for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
  printf("%.9f\n", s);
  free(t);
  return 0;
}
"""


def build(folder: Path, vec_bytes: int) -> Path:
    """The loop compiled for this CPU.

    Raises:
        SystemExit: no C compiler.
    """
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("bench/peak.py needs a C compiler (cc); accepted: Debian's gcc")
    src, exe = folder / "peak.c", folder / "peak"
    src.write_text(SOURCE)
    subprocess.run(
        [cc, "-O2", "-march=native", "-ffp-contract=fast", "-pthread",
         f"-DVEC_BYTES={vec_bytes}", f"-DACC={ACCUMULATORS}", str(src), "-o", str(exe)],
        check=True,
    )  # fmt: skip
    return exe


def measure(exe: Path, threads: int, vec_bytes: int, *, seconds: float, runs: int) -> float:
    """GFLOP/s of ``threads`` copies of the loop, best of ``runs`` (each about
    ``seconds``)."""
    flops_per_step = ACCUMULATORS * (vec_bytes // 4) * 2
    probe = 2_000_000
    t = float(subprocess.run([exe, "1", str(probe)], capture_output=True, text=True).stdout)
    steps = max(probe, int(probe * seconds / max(t, 1e-6)))
    best = 0.0
    for _ in range(runs):
        out = subprocess.run([exe, str(threads), str(steps)], capture_output=True, text=True)
        best = max(best, threads * steps * flops_per_step / float(out.stdout) / 1e9)
    return best


def vector_bytes(isa: tuple[str, ...] | list[str]) -> int:
    """The widest float vector of an ISA: AVX-512 64 bytes, AVX 32, else 16."""
    return 64 if "avx512f" in isa else 32 if "avx" in isa else 16


def peaks(threads: list[int], *, seconds: float, runs: int) -> dict[int, float]:
    """GFLOP/s of the loop on each count of ``threads``, compiled once for this CPU."""
    from autosched.measure.cpu import host_cpu

    vec = vector_bytes(host_cpu().isa)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp), vec)
        return {n: measure(exe, n, vec, seconds=seconds, runs=runs) for n in threads}


@functools.lru_cache(maxsize=1)
def peak_gflops(*, seconds: float = 0.3, runs: int = 5) -> float:
    """This CPU's multiply-add peak on all usable cores (GFLOP/s), measured now."""
    cores = len(os.sched_getaffinity(0))
    return peaks([cores], seconds=seconds, runs=runs)[cores]


def main(argv: list[str] | None = None) -> int:
    from autosched.measure.cpu import host_cpu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="per run (default 0.5)")
    parser.add_argument("--runs", type=int, default=5, help="best of (default 5)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "peak.json")
    args = parser.parse_args(argv)
    cpu = host_cpu()
    vec_bytes = vector_bytes(cpu.isa)
    cores = len(os.sched_getaffinity(0))
    found = peaks(sorted({1, cores}), seconds=args.seconds, runs=args.runs)
    rows = [{"threads": n, "gflops": round(g, 1)} for n, g in found.items()]
    report = {
        "benchmark": "peak",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu": {
            "name": cpu.name, "mcpu": cpu.mcpu, "model": cpu.model_id,
            "cores": cores, "isa": list(cpu.isa),
        },
        "what": f"float32 multiply-add, {ACCUMULATORS} accumulators of {vec_bytes} bytes, "
        f"best of {args.runs}",
        "rows": rows,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{cpu.name} ({cpu.mcpu}, {cpu.model_id}), {vec_bytes * 8}-bit vectors")
    print(f"{'threads':>7} {'GFLOP/s':>9}")
    for r in rows:
        print(f"{r['threads']:>7} {r['gflops']:>9.1f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
