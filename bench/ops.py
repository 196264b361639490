"""Benchmark: every operator on a representative ResNet-50 / BERT-base shape, tuned from
a cold database, against its default schedule and the best CPU library here.

    python -m bench.ops [--ops conv2d,softmax] [--trials 64] [--target opencl]

The library figure is numpy (OpenBLAS for matmul-like ops, im2col + OpenBLAS for
convolutions, plain numpy for the row-wise ops), measured in this same run before and
after each tuning run; the table shows the lower of the two, since a neighbour on this
machine can slow either. Targets (issue 4): matmul-like ops reach at least 50% of the
library; softmax, layernorm and the elementwise chain beat it.

Prints a table and writes bench/results/ops.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import autosched
from autosched.measure.device import select_device
from autosched.report.vendor import time_vendor

# op -> (parameters, where the shape comes from, what a tuned kernel must reach)
SHAPES: dict[str, tuple[dict, str, str]] = {
    "matmul": (dict(M=512, N=512, K=512), "square 512^3 (the tuning loop's figure)", "0.5x"),
    "dense": (
        dict(m=128, n=3072, k=768, epilogue="bias_gelu"),
        "BERT-base FFN up-projection, seq 128, bias+GELU fused",
        "0.5x",
    ),
    "batch_matmul": (
        dict(b=12, m=128, n=128, k=64),
        "BERT-base attention scores Q.K^T, 12 heads, seq 128",
        "0.5x",
    ),
    "conv2d": (
        dict(n=1, c=64, h=56, w=56, k=64, r=3, s=3, stride=1, pad=1),
        "ResNet-50 conv2_x 3x3, 56x56x64",
        "0.5x",
    ),
    "depthwise_conv2d": (
        dict(n=1, c=144, h=56, w=56, r=3, s=3, stride=1, pad=1, layout="NHWC"),
        "MobileNet-V2 block 2 depthwise 3x3 (ResNet-50 and BERT have none)",
        "0.5x",
    ),
    "softmax": (dict(rows=1536, cols=128), "BERT-base attention softmax, 12x128 rows", "1x"),
    "layernorm": (dict(rows=128, cols=768), "BERT-base layernorm, seq 128", "1x"),
    "reduce": (
        dict(rows=2048, cols=49, kind="sum"),
        "ResNet-50 global average pool (sum over 7x7)",
        "-",
    ),
    "elementwise": (
        dict(rows=128, cols=3072, ops="add+gelu"),
        "BERT-base FFN bias+GELU as its own kernel",
        "1x",
    ),
}


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def run_one(op: str, *, trials: int, batch: int, target: str, seed: int) -> dict:
    params, source, goal = SHAPES[op]
    wl = autosched.workload(op, **params)
    lib_before = time_vendor(wl)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = autosched.tune(
            wl,
            trials=trials,
            batch=batch,
            strategy="model",
            target=target,
            db=Path(tmp) / "bench.db",
            seed=seed,
        )
    wall = time.perf_counter() - t0
    lib_after = time_vendor(wl)
    library = min(lib_before.gflops, lib_after.gflops)
    best = res.best.gflops if res.best else None
    default = res.default.gflops if res.default else None
    ratio = best / library if best else None
    need = {"0.5x": 0.5, "1x": 1.0}.get(goal)
    return {
        "op": op,
        "params": wl.params,
        "shape_source": source,
        "target_ratio": need,
        "tuned_gflops": best,
        "tuned_spread": res.best.spread if res.best else None,
        "default_gflops": default,
        "x_default": res.speedup,
        "library": lib_before.method + (f" ({lib_before.blas})" if lib_before.blas else ""),
        "library_gflops_before": lib_before.gflops,
        "library_gflops_after": lib_after.gflops,
        "tuned_vs_library": ratio,
        "met": None if need is None or ratio is None else ratio >= need,
        "best_config": res.best.config if res.best else None,
        "trials": res.trials,
        "wall_s": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=",".join(SHAPES), help="comma-separated subset")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--target", default="opencl", choices=("opencl", "llvm"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "ops.json"))
    args = p.parse_args()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in SHAPES]
    if unknown:
        p.error(f"unknown ops {unknown}; accepted: {', '.join(SHAPES)}")
    device = select_device(target=args.target)
    rows = []
    for op in ops:
        row = run_one(op, trials=args.trials, batch=args.batch, target=args.target, seed=args.seed)
        rows.append(row)
        print(
            f"{op:17s} tuned {_fmt(row['tuned_gflops']):>7s}  default "
            f"{_fmt(row['default_gflops']):>6s}  library "
            f"{_fmt(min(row['library_gflops_before'], row['library_gflops_after'])):>7s}"
            f"  ratio {_fmt(row['tuned_vs_library'], '.2f')}  {row['wall_s']:.0f} s",
            flush=True,
        )
    header = (
        "| op | shape (source) | tuned GFLOP/s | default | x default | library | library "
        "GFLOP/s (before/after) | tuned / library | goal | met | wall |"
    )
    print()
    print(header)
    print("|" + "---|" * 11)
    for r in rows:
        shape = ",".join(f"{k}={v}" for k, v in r["params"].items())
        print(
            f"| {r['op']} | {shape} ({r['shape_source']}) | {_fmt(r['tuned_gflops'])} | "
            f"{_fmt(r['default_gflops'])} | {_fmt(r['x_default'], '.0f')}x | {r['library']} | "
            f"{_fmt(r['library_gflops_before'])} / {_fmt(r['library_gflops_after'])} | "
            f"{_fmt(r['tuned_vs_library'], '.2f')} | "
            f"{'>= ' + str(r['target_ratio']) if r['target_ratio'] else '-'} | "
            f"{'-' if r['met'] is None else ('yes' if r['met'] else 'NO')} | {r['wall_s']:.0f} s |"
        )
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "device": device.fingerprint(args.target),
        "target": args.target,
        "trials": args.trials,
        "command": "python -m bench.ops "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
