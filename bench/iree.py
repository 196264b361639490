"""Benchmark: autosched's tuned IREE configs against IREE's own, and numpy for scale.

    python -m bench.iree [--target iree-llvm-cpu,iree-vulkan] [--op matmul,conv2d]
                         [--trials 64] [--rounds 5] [--db PATH]

For each target and operator, ``autosched.tune`` runs the usual loop (space -> cost
model -> measure -> records) until the database holds ``--trials`` measurements. Then
the tuned config, IREE's default config (pipeline ``auto``: no ``compilation_info``)
and numpy are timed in ``--rounds`` interleaved rounds: the two modules through one
measurement worker, numpy in a process of its own with its BLAS's own threads and with
one, the faster counting each round, as the peers benchmark times it. The machine is
shared and noisy, so only figures from one window are compared. The database persists
(``--db``), so the benchmark can run in chunks (one target and operator per call) and
each call resumes where the last stopped. Prints a table and merges its rows into
bench/results/iree.json.

Workloads (``--op``): ``matmul`` 512^3; ``conv2d`` NHWC n=2, c=32, 28x28, k=64, 3x3,
pad 1; ``conv2d-resnet`` NHWC n=2, c=64, 56x56, k=64, 3x3, pad 1 (ResNet's first stage,
eight times the work). Convolutions run a batch of 2: IREE folds a unit batch away
before the SPIR-V config is chosen, dropping a ``compilation_info`` written on the
named op. Each row names the CPU it ran on (the file gathers rows of several runs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np

import autosched
from autosched.iree.build import build_iree
from autosched.measure.device import select_device
from autosched.measure.runner import TestData, TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.report.vendor import blas_name
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.tuning.tune import tune
from bench.interleave import measure_round
from bench.peers_retime import Vendor

RESULTS = Path(__file__).resolve().parent / "results" / "iree.json"
# --op name -> (autosched operator, its parameters)
WORKLOADS = {
    "matmul": ("matmul", dict(M=512, N=512, K=512)),
    "conv2d": ("conv2d", dict(n=2, c=32, h=28, w=28, k=64, r=3, s=3, pad=1, layout="NHWC")),
    "conv2d-resnet": (
        "conv2d",
        dict(n=2, c=64, h=56, w=56, k=64, r=3, s=3, pad=1, layout="NHWC"),
    ),
}


KERNEL_REPEAT = 9  # dispatches per call when the kernels are timed without the call
TIMING = TimingOptions(warmup=2, min_repeats=10, max_repeats=200, min_time_s=0.3)


def _stats(latencies: list[float]) -> dict[str, float]:
    lat = np.asarray(latencies, dtype=float)
    med = float(np.median(lat))
    iqr = float(np.percentile(lat, 75) - np.percentile(lat, 25))
    return {"ms": med * 1e3, "spread": iqr / med, "samples": int(lat.size)}


def side_by_side(
    wl,
    dev,
    target: str,
    configs: dict[str, dict],
    *,
    rounds: int,
    repeat: int | None = None,
    numpy_too: bool = True,
) -> dict:
    """Interleaved rounds: each config's module through one worker, then numpy in a
    process of its own (the peers benchmark's :class:`~bench.peers_retime.Vendor`: its
    BLAS's own threads and one thread, the faster counting). ``repeat``: time the
    modules' dispatches instead of their calls (:func:`~autosched.iree.build.build_iree`)."""
    space = make_space(wl, target=target, limits=dev.limits)
    # One module per distinct config: when the search's best is IREE's own config, both
    # rows are the one module's figures, not two timings of it that differ by noise.
    first = {}
    for name, cfg in configs.items():
        first.setdefault(Config(cfg).key, name)
    programs = {
        name: build_iree(space, Config(configs[name]), repeat=repeat) for name in first.values()
    }
    inputs = wl.make_inputs(np.random.default_rng(0))
    data = TestData(wl.key, inputs, wl.reference(inputs), *wl.tolerance())
    lats: dict[str, list[float]] = {n: [] for n in [*programs, *(["numpy"] if numpy_too else [])]}
    threads: set[str] = set()
    vendor = Vendor(wl) if numpy_too else None
    try:
        with MeasureWorker(dev, timeout_s=300) as worker:
            for _ in range(rounds):
                measure_round(worker, programs, data, TIMING, lats)
                if vendor is None:
                    continue
                lats["numpy"].extend(
                    vendor.latencies(
                        min_time_s=TIMING.min_time_s,
                        min_repeats=TIMING.min_repeats,
                        warmup=TIMING.warmup,
                    )
                )
                threads.add(vendor.threads)
    finally:
        if vendor is not None:
            vendor.close()
    stats = {name: _stats(v) for name, v in lats.items()}
    if numpy_too:
        stats["numpy"]["threads"] = " or ".join(sorted(threads))
    for name, cfg in configs.items():
        stats[name] = stats[first[Config(cfg).key]]
    return stats


def run_one(target: str, op: str, *, trials: int, db: str, batch: int, rounds: int) -> dict:
    operator, params = WORKLOADS[op]
    wl = autosched.workload(operator, **params)
    dev = select_device(None, target=target)
    start = time.perf_counter()
    result = tune(wl, trials=trials, batch=batch, db=db, device=dev, target=target, seed=0)
    wall = time.perf_counter() - start
    best, default = result.best, result.default
    if best is None or default is None:
        raise RuntimeError(f"{target} {op}: the tuning run left no measured best or default")
    timed = side_by_side(
        wl, dev, target, {"tuned": best.config, "default": default.config}, rounds=rounds
    )
    tuned, iree, numpy_ = timed["tuned"], timed["default"], timed["numpy"]
    flops = wl.flops()
    row = {
        "target": target,
        "op": op,
        "workload": wl.to_json(),
        "device": dev.name,
        "device_fingerprint": dev.fingerprint(target),
        "cpu": cpu_summary(),
        "trials": result.trials,
        "new_trials": result.new_trials,
        "wall_s": wall,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "timing": f"{rounds} interleaved rounds; median ms; spread = IQR / median",
        "tuned_ms": tuned["ms"],
        "tuned_gflops": flops / tuned["ms"] / 1e6,
        "tuned_spread": tuned["spread"],
        "tuned_config": best.config,
        "tuned_in_search_ms": best.latency_s * 1e3,
        "iree_default_ms": iree["ms"],
        "iree_default_gflops": flops / iree["ms"] / 1e6,
        "iree_default_spread": iree["spread"],
        "numpy_ms": numpy_["ms"],
        "numpy_gflops": flops / numpy_["ms"] / 1e6,
        "numpy_spread": numpy_["spread"],
        "numpy_blas": f"{blas_name()[0]}, {numpy_['threads']}",
        "vs_iree_default": iree["ms"] / tuned["ms"],
        "vs_numpy": numpy_["ms"] / tuned["ms"],
    }
    if target == "iree-llvm-cpu":
        row.update(kernel_figures(wl, dev, target, best.config, default.config, rounds=rounds))
    return row


def kernel_figures(wl, dev, target: str, tuned: dict, default: dict, *, rounds: int) -> dict:
    """The two configs' kernels alone: each module's dispatches timed without its call
    (on 2 cores IREE's local-task call took about 60 us around a 0.12 ms convolution, the
    same for every config), and their share of this CPU's multiply-add peak
    (``bench/peak.py``): how much any config could still give."""
    from bench.peak import peak_gflops

    timed = side_by_side(
        wl, dev, target, {"tuned": tuned, "default": default}, rounds=rounds,
        repeat=KERNEL_REPEAT, numpy_too=False,
    )  # fmt: skip
    peak = peak_gflops()
    flops = wl.flops()
    t, d = timed["tuned"]["ms"], timed["default"]["ms"]
    return {
        "kernels_timing": f"dispatches run {KERNEL_REPEAT}x per call, per dispatch",
        "tuned_kernels_ms": t,
        "iree_default_kernels_ms": d,
        "vs_iree_default_kernels": d / t,
        "peak_gflops": peak,
        "tuned_kernels_of_peak": flops / t / 1e6 / peak,
        "iree_default_kernels_of_peak": flops / d / 1e6 / peak,
    }


def cpu_summary() -> dict:
    """The host CPU (model, cores and ISA) as the IREE benchmarks' JSON records it."""
    from autosched.measure.cpu import host_cpu

    c = host_cpu()
    return {
        "name": c.name,
        "mcpu": c.mcpu,
        "model": c.model_id,
        "cores": c.cores,
        "isa": list(c.isa),
    }


def machine_summary() -> dict:
    """:func:`cpu_summary` with the load average when a benchmark's figures were taken."""
    return {**cpu_summary(), "load_average": [round(x, 2) for x in os.getloadavg()]}


def _fmt(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def print_table(rows: list[dict]) -> None:
    head = f"{'target':<15}{'op':<15}{'trials':>7}{'tuned ms':>10}{'IREE ms':>10}{'numpy ms':>10}"
    print(head + f"{'vs IREE':>9}{'vs numpy':>10}{'kernels vs IREE':>17}{'of peak':>9}")
    for r in rows:
        kernels = r.get("vs_iree_default_kernels")
        of_peak = r.get("tuned_kernels_of_peak")
        print(
            f"{r['target']:<15}{r['op']:<15}{r['trials']:>7}{_fmt(r['tuned_ms'], '.3f'):>10}"
            f"{_fmt(r['iree_default_ms'], '.3f'):>10}{_fmt(r['numpy_ms'], '.3f'):>10}"
            f"{_fmt(r['vs_iree_default'], '.2f'):>8}x{_fmt(r['vs_numpy'], '.2f'):>9}x"
            f"{_fmt(kernels, '.2f'):>16}{'x' if kernels else ' '}"
            f"{_fmt(of_peak and 100 * of_peak, '.0f'):>8}{'%' if of_peak else ' '}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="iree-llvm-cpu,iree-vulkan")
    ap.add_argument("--op", default="matmul,conv2d", help=f"of {', '.join(WORKLOADS)}")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--db", default="/tmp/autosched-bench-iree.db")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    args = ap.parse_args()
    unknown = [op for op in args.op.split(",") if op not in WORKLOADS]
    if unknown:
        ap.error(f"unknown --op {', '.join(unknown)}; accepted: {', '.join(WORKLOADS)}")
    logging.basicConfig(level=logging.WARNING)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    rows = {(r["target"], r["op"]): r for r in data["rows"]}
    for target in args.target.split(","):
        for op in args.op.split(","):
            rows[(target, op)] = run_one(
                target, op, trials=args.trials, db=args.db, batch=args.batch, rounds=args.rounds
            )
    out = {
        "machine": {
            "cpu": cpu_summary(),
            "python": platform.python_version(),
            "of": "the last run",
        },
        "rows": sorted(rows.values(), key=lambda r: (r["target"], r["op"])),
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print_table(out["rows"])


if __name__ == "__main__":
    main()
