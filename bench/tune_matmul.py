"""Benchmark: tune a float32 matmul from a cold database and compare with numpy/OpenBLAS.

    python -m bench.tune_matmul --shape 512,512,512 --trials 64 [--strategy model] [--seeds 1]

numpy is measured in this same run, before and after tuning (the machine is noisy, so
the table shows both). Prints a table and writes bench/results/tune_matmul.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

import autosched
from autosched.measure.device import select_device


def numpy_gflops(m: int, n: int, k: int, *, repeats: int = 50) -> float:
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2.0 * m * n * k / float(np.median(times)) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="512,512,512")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--strategy", default="model")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "tune_matmul.json"))
    args = p.parse_args()
    m, n, k = (int(x) for x in args.shape.split(","))
    device = select_device()
    rows = []
    for seed in range(args.seeds):
        np_before = numpy_gflops(m, n, k)
        with tempfile.TemporaryDirectory() as tmp:
            wl = autosched.workload("matmul", M=m, N=n, K=k)
            res = autosched.tune(
                wl,
                trials=args.trials,
                batch=args.batch,
                strategy=args.strategy,
                db=Path(tmp) / "bench.db",
                device=device,
                seed=seed,
            )
        np_after = numpy_gflops(m, n, k)
        curve, best = [], 0.0
        for h in res.history:
            best = max(best, h.gflops or 0.0) if h.ok else best
            curve.append(best)
        numpy_ref = max(np_before, np_after)
        rows.append(
            {
                "seed": seed,
                "strategy": args.strategy,
                "trials": res.trials,
                "best_gflops": res.best.gflops if res.best else None,
                "best_config": res.best.config if res.best else None,
                "default_gflops": res.default.gflops if res.default else None,
                "speedup_vs_default": res.speedup,
                "numpy_gflops_before": np_before,
                "numpy_gflops_after": np_after,
                "fraction_of_numpy": (res.best.gflops / numpy_ref) if res.best else None,
                "wall_s": res.wall_s,
                "curve": curve,
                "errors": {
                    s: sum(1 for h in res.history if h.status == s)
                    for s in {h.status for h in res.history}
                    if s != "ok"
                },
            }
        )
    print(
        f"\nmatmul {m}x{n}x{k} float32 on {device.name}, {args.trials} trials, strategy {args.strategy}"
    )
    head = f"{'seed':>4} {'best GF/s':>10} {'default':>8} {'x default':>9} {'numpy':>14} {'of numpy':>8} {'wall s':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['seed']:>4} {r['best_gflops']:>10.1f} {r['default_gflops']:>8.1f} {r['speedup_vs_default']:>9.1f}"
            f" {r['numpy_gflops_before']:>6.0f}/{r['numpy_gflops_after']:<7.0f} {100 * r['fraction_of_numpy']:>7.0f}%"
            f" {r['wall_s']:>7.1f}"
        )
    out = {
        "benchmark": "tune_matmul",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "device": device.name,
            "device_key": device.key(),
            "cores": os.cpu_count(),
        },
        "workload": {"op": "matmul", "M": m, "N": n, "K": k},
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
