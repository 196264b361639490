"""Benchmark: how far the same configs time apart from batch to batch, and what a control fixes.

    python -m bench.batch_noise [--batches 10] [--configs 12] [--trials 48]

Tunes ResNet-18's last 3x3 convolution (1x512x7x7, 512 filters, channels-last, llvm on
the host CPU) for ``--trials`` trials from a cold temporary database, takes its
``--configs`` best distinct configs, and times them again as one search batch
``--batches`` times in a row, the search's way, each batch twice in turn: timed in one
go and in three interleaved passes (``TimingOptions.passes``). Each config's figures are
compared with its own median over the batches: as measured, and scaled by how fast the
batch's middle config (the control, where the tuning loop puts it:
:mod:`autosched.tuning.control`) ran against its median. Prints a table and writes
bench/results/batch_noise.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

import autosched
from autosched.measure.cpu import host_cpu
from autosched.measure.runner import TimingOptions
from autosched.space.config import Config
from autosched.tuning.runner import BatchRequest, DeviceSession
from bench.iree import machine_summary

RESULTS = Path(__file__).resolve().parent / "results"
PASSES = (1, 3)  # timed in one go, and in the search's interleaved passes
WORKLOAD = dict(n=1, c=512, h=9, w=9, k=512, r=3, s=3, layout="NHWC")  # 7x7 outputs


def deviation(figures: np.ndarray) -> dict[str, float]:
    """|log(figure / the config's median over batches)|: median, 90th percentile, max."""
    dev = np.abs(np.log(figures / np.median(figures, axis=0)))
    return {
        "median": float(np.median(dev)),
        "p90": float(np.percentile(dev, 90)),
        "max": float(dev.max()),
        "config_max_over_min": float((figures.max(axis=0) / figures.min(axis=0)).max()),
    }


def scaled_by_control(figures: np.ndarray, control: int) -> np.ndarray:
    """Each batch's figures divided by its control's figure over the control's median;
    the control's own column left out."""
    ratio = figures[:, control] / np.median(figures[:, control])
    return np.delete(figures / ratio[:, None], control, axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--configs", type=int, default=12)
    ap.add_argument("--trials", type=int, default=48)
    ap.add_argument("--out", type=Path, default=RESULTS / "batch_noise.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    wl = autosched.workload("conv2d", **WORKLOAD)
    cpu = host_cpu()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "records.db"
        t0 = time.perf_counter()
        tuned = autosched.tune(wl, trials=args.trials, target="llvm", db=db, device=cpu, seed=1)
        tune_s = time.perf_counter() - t0
    ranked = sorted((r for r in tuned.history if r.ok), key=lambda r: r.latency_s)
    configs = list({r.config_key: Config(r.config) for r in ranked}.values())[: args.configs]
    request = BatchRequest(
        wl.to_json(), "llvm", cpu.key("llvm"), tuple(c.to_json() for c in configs)
    )
    sessions = {p: DeviceSession(cpu, "llvm", timing=TimingOptions(passes=p)) for p in PASSES}
    rows: dict[int, list[list[float]]] = {p: [] for p in PASSES}
    wall = dict.fromkeys(PASSES, 0.0)
    started = time.time()
    try:
        for b in range(args.batches):  # the two ways in turn, batch by batch
            for p, session in sessions.items():
                t = time.perf_counter()
                records = session.run(request)
                wall[p] += time.perf_counter() - t
                rows[p].append([r.latency_s if r.ok else np.nan for r in records])
                line = " ".join(f"{x * 1e3:6.3f}" for x in rows[p][-1])
                print(f"batch {b + 1:2d}, {p} pass{'es' if p > 1 else '  '}: {line}", flush=True)
    finally:
        for session in sessions.values():
            session.close()
    table = {}
    print(f"\n{'':34} {'median':>7} {'p90':>7} {'max':>7}  worst max/min  s/batch")
    for p in PASSES:
        figures = np.array(rows[p])
        figures = figures[:, ~np.isnan(figures).any(axis=0)]
        control = figures.shape[1] // 2
        for how, f in (("as measured", figures), ("scaled by the control", None)):
            d = deviation(f if f is not None else scaled_by_control(figures, control))
            name = f"{p} pass{'es' if p > 1 else ''}, {how}"
            table[f"passes={p}, {how}"] = d
            print(
                f"{name:34} {d['median']:7.1%} {d['p90']:7.1%} {d['max']:7.1%}  "
                f"{d['config_max_over_min']:12.2f}x  {wall[p] / args.batches:6.1f}"
            )
    result = {
        "benchmark": "batch_noise",
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "machine": machine_summary(),
        "workload": wl.to_json(),
        "tune": {"trials": args.trials, "wall_s": tune_s},
        "batches": args.batches,
        "configs": len(configs),
        "control_index": len(configs) // 2,
        "seconds_per_batch": {f"passes={p}": wall[p] / args.batches for p in PASSES},
        "latency_ms": {f"passes={p}": (np.array(rows[p]) * 1e3).round(4).tolist() for p in PASSES},
        "deviation_from_config_median": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
