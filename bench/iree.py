"""Benchmark: autosched's tuned IREE configs against IREE's own, and numpy for scale.

    python -m bench.iree [--target iree-llvm-cpu,iree-vulkan] [--op matmul,conv2d]
                         [--trials 64] [--db PATH]

For each target and operator, ``autosched.tune`` runs the usual loop (space -> cost
model -> measure -> records) until the database holds ``--trials`` measurements; its
finalists are re-measured side by side with IREE's default config (pipeline ``auto``:
no ``compilation_info``), and numpy is timed right after. The database persists
(``--db``), so the benchmark can run in chunks (one target and operator per call)
and each call resumes where the last stopped. Prints a table and merges its rows into
bench/results/iree.json.

Shapes: matmul 512^3; conv2d NHWC n=2, c=32, 28x28, k=64, 3x3, pad 1 (a batch of 2:
IREE folds a unit batch away before the SPIR-V config is chosen, dropping a
``compilation_info`` written on the named op).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import autosched
from autosched.measure.device import select_device
from autosched.report.vendor import time_vendor
from autosched.tuning.tune import tune

RESULTS = Path(__file__).resolve().parent / "results" / "iree.json"
WORKLOADS = {
    "matmul": dict(M=512, N=512, K=512),
    "conv2d": dict(n=2, c=32, h=28, w=28, k=64, r=3, s=3, pad=1, layout="NHWC"),
}


def run_one(target: str, op: str, *, trials: int, db: str, batch: int) -> dict:
    wl = autosched.workload(op, **WORKLOADS[op])
    dev = select_device(None, target=target)
    start = time.perf_counter()
    result = tune(wl, trials=trials, batch=batch, db=db, device=dev, target=target, seed=0)
    wall = time.perf_counter() - start
    vendor = time_vendor(wl)
    best, default = result.best, result.default
    row = {
        "target": target,
        "op": op,
        "workload": wl.to_json(),
        "device": dev.name,
        "device_fingerprint": dev.fingerprint(target),
        "trials": result.trials,
        "new_trials": result.new_trials,
        "wall_s": wall,
        "tuned_ms": best.latency_s * 1e3 if best else None,
        "tuned_gflops": best.gflops if best else None,
        "tuned_spread": best.spread if best else None,
        "tuned_config": best.config if best else None,
        "iree_default_ms": default.latency_s * 1e3 if default and default.latency_s else None,
        "iree_default_gflops": default.gflops if default else None,
        "numpy_ms": vendor.median_s * 1e3,
        "numpy_gflops": vendor.gflops,
        "numpy_blas": vendor.blas,
    }
    row["vs_iree_default"] = (
        default.latency_s / best.latency_s if best and default and default.latency_s else None
    )
    row["vs_numpy"] = vendor.median_s / best.latency_s if best else None
    return row


def _fmt(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def print_table(rows: list[dict]) -> None:
    head = f"{'target':<15}{'op':<8}{'trials':>7}{'tuned ms':>10}{'IREE ms':>10}{'numpy ms':>10}"
    print(head + f"{'vs IREE':>9}{'vs numpy':>10}")
    for r in rows:
        print(
            f"{r['target']:<15}{r['op']:<8}{r['trials']:>7}{_fmt(r['tuned_ms'], '.3f'):>10}"
            f"{_fmt(r['iree_default_ms'], '.3f'):>10}{_fmt(r['numpy_ms'], '.3f'):>10}"
            f"{_fmt(r['vs_iree_default'], '.2f'):>8}x{_fmt(r['vs_numpy'], '.2f'):>9}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="iree-llvm-cpu,iree-vulkan")
    ap.add_argument("--op", default="matmul,conv2d")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--db", default="/tmp/autosched-bench-iree.db")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    rows = {(r["target"], r["op"]): r for r in data["rows"]}
    for target in args.target.split(","):
        for op in args.op.split(","):
            rows[(target, op)] = run_one(
                target, op, trials=args.trials, db=args.db, batch=args.batch
            )
    cpu = {}
    try:
        from autosched.measure.cpu import host_cpu

        c = host_cpu()
        cpu = {"name": c.name, "mcpu": c.mcpu, "cores": c.cores, "isa": list(c.isa)}
    except Exception:  # the figures stand without it
        pass
    out = {
        "machine": {"cpu": cpu, "python": platform.python_version()},
        "rows": sorted(rows.values(), key=lambda r: (r["target"], r["op"])),
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print_table(out["rows"])


if __name__ == "__main__":
    main()
