"""Benchmark: autosched against its peers, one after another on the same device and budget.

    python -m bench.peers --op matmul --shape 512,512,512 --trials 64 --seeds 3 --json OUT
    python -m bench.peers --quick          # 1 seed, 24 trials, fewer peers: under 5 minutes

Tuners (``--tuners`` picks a subset; every one gets the same trial budget and seeds):

- ``autosched-model``, ``autosched-random``, ``autosched-tpe``: ``autosched.tune`` with each
  strategy over the same space, OpenCL, a fresh records database per run;
  ``autosched-llvm``: the model strategy on TVM's llvm target (MetaSchedule llvm's pair).
- ``kt-bayes_opt``, ``kt-genetic_algorithm``, ``kt-random_sample``: Kernel Tuner 1.5 on its
  OpenCL backend tuning a hand-written CLBlast-style SGEMM (``bench/kernels/sgemm.cl``),
  what a user who writes the kernel would pick instead. Matmul without epilogue only.
- ``ms-llvm``, ``ms-opencl``: TVM MetaSchedule (``tune_tir``, XGBoost cost model) on llvm
  with its own runner, and on OpenCL through autosched's pyopencl measurement worker.

The vendor library (``autosched.report.vendor``'s numpy baseline: OpenBLAS sgemm for
matmul, im2col + sgemm for conv2d) is timed first, in a separate process. After all
runs, every run's best few programs, and the program its own best-so-far stood on after
16 and 32 trials, are timed again by one harness (autosched's measurement worker:
blocking waits, the same warm-up and repeats), interleaved round-robin with the vendor
library, so no comparison is decided by a tool's own stopwatch (Kernel Tuner's
busy-polling loop reads 20-45% slow on a CPU device). A program's re-timed figure is its
best round's median: a neighbour on a shared machine only ever slows a kernel down.

Metrics per run: best-so-far GFLOP/s after each trial (the tuner's own measurements),
best after 16/32/64 trials and at the end, the re-timed best after 16 and 32 trials
(``re@N``: the program its own best-so-far stood on then, re-timed) and at the end, and
trials and wall seconds to reach 95% of the best re-timed figure any tuner found (and of
the best on the run's own target). For those, Kernel Tuner's and MetaSchedule's curves are put on the shared
harness's scale: times the median re-timed/own ratio of that tool's finalists on that
target (Kernel Tuner's busy-polling loop reads ~25% slow here, MetaSchedule's llvm
runner about 2x slow); autosched's curves come from the shared harness already.
Unscaled figures are in the JSON.
Prints a table (means over seeds), writes the JSON and a PNG of the curves.

This module is the command line; the parts: :mod:`bench.peers_runs` (the tuners),
:mod:`bench.peers_retime` (the vendor library and the shared re-timing),
:mod:`bench.peers_metrics` and :mod:`bench.peers_summary` (the figures),
:mod:`bench.peers_output` (table and plot).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers_metrics import best_round_gflops
from bench.peers_output import fmt_cell, plot, print_table
from bench.peers_retime import RETIME, Vendor, retime, vendor_name, versions
from bench.peers_runs import (
    QUICK_TUNERS,
    TUNERS,
    Run,
    run_autosched,
    run_kernel_tuner,
    run_metaschedule,
)
from bench.peers_summary import (
    add_retimed_at,
    add_same_target_t95,
    rescale_rows,
    summarize,
    table,
)

log = logging.getLogger(__name__)

RESULTS = Path(__file__).parent / "results"
RETIMED_AT_NOTE = (
    "retimed_at_N (re@N): the retimed_gflops of the program the run's own best-so-far stood "
    "on after N trials (the finalist whose leads holds N): the finalists hold, besides its "
    "best few, those programs"
)


def parse_workload(op: str, shape: str | None):
    """``--op``/``--shape`` -> a workload; the shape is the op's parameters in order
    (``512,512,512`` for matmul M,N,K) or ``name=value`` pairs."""
    import autosched
    from autosched.ops import OPS

    if op not in OPS:
        raise SystemExit(f"--op {op!r}: accepted: {', '.join(sorted(OPS))}")
    if shape is None:
        if op not in DEFAULT_SHAPES:
            raise SystemExit(f"--op {op}: give --shape (parameters of {OPS[op].__name__})")
        shape = DEFAULT_SHAPES[op]
    params: dict[str, Any] = {}
    names = [
        p.name
        for p in inspect.signature(OPS[op].__init__).parameters.values()
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    for i, part in enumerate(x.strip() for x in shape.split(",") if x.strip()):
        name, sep, value = part.partition("=")
        if not sep:
            if i >= len(names):
                raise SystemExit(f"--shape {shape!r}: {op} takes {', '.join(names)}")
            name, value = names[i], part
        params[name] = int(value) if value.lstrip("-").isdigit() else value
    return autosched.workload(op, **params)


# conv2d: a ResNet-50 3x3 layer (conv2_x, 56x56x64), NCHW.
DEFAULT_SHAPES = {
    "matmul": "512,512,512",
    "conv2d": "n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1",
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.splitlines()[0])
    p.add_argument("--op", default="matmul")
    p.add_argument("--shape", default=None, help="the op's parameters: 512,512,512 or M=512,...")
    p.add_argument("--trials", type=int, default=None, help="trials per run (64; quick: 24)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per tuner (3; quick: 1)")
    p.add_argument("--batch", type=int, default=16, help="autosched and MetaSchedule batch size")
    p.add_argument("--tuners", default=None, help=f"comma-separated subset of: {', '.join(TUNERS)}")
    p.add_argument("--retime-top", type=int, default=None, help="finalists per run (3; quick: 2)")
    p.add_argument("--rounds", type=int, default=None, help="re-timing rounds (3; quick: 2)")
    p.add_argument("--device", default=None, help="OpenCL device selector (autosched's)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per candidate")
    p.add_argument("--quick", action="store_true", help="1 seed, 24 trials, fewer peers")
    p.add_argument("--json", default=None, help="output (bench/results/peers[-quick].json)")
    p.add_argument("--plot", default=None, help="PNG of the curves (next to --json)")
    p.add_argument(
        "--resummarize",
        metavar="JSON",
        help="recompute the summary and table of an earlier run's JSON (no tuning)",
    )
    args = p.parse_args(argv)
    if args.resummarize:
        return resummarize(Path(args.resummarize))
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("bench").setLevel(logging.INFO)  # this module's and its parts' progress

    q = args.quick
    args.trials = args.trials or (24 if q else 64)
    args.seeds = args.seeds or (1 if q else 3)
    args.retime_top = args.retime_top or (2 if q else 3)
    args.rounds = args.rounds or (2 if q else 3)
    names = args.tuners.split(",") if args.tuners else list(QUICK_TUNERS if q else TUNERS)
    unknown = [n for n in names if n not in TUNERS]
    if unknown:
        raise SystemExit(f"--tuners: unknown {', '.join(unknown)}; accepted: {', '.join(TUNERS)}")
    out_json = Path(args.json or RESULTS / ("peers-quick.json" if q else "peers.json"))
    out_png = Path(args.plot) if args.plot else out_json.with_suffix(".png")

    from autosched.measure.cpu import host_cpu
    from autosched.measure.device import select_device

    wl = parse_workload(args.op, args.shape)
    device = select_device(args.device)
    notes = [
        "curve, best_at_N, best_gflops: each tuner's own measurements (its own stopwatch)",
        "retimed_gflops: best of the run's finalists timed again by autosched's harness "
        f"(blocking waits, warmup {RETIME.warmup}, >= {RETIME.min_repeats} repeats and "
        f">= {RETIME.min_time_s} s per visit, {args.rounds} interleaved rounds, median)",
        "trials_to_95/wall_to_95: on the curve scaled by stopwatch_scale (the median "
        "re-timed / own figure of the tool's finalists on that target) against 95% of the "
        "best retimed_gflops of any run; "
        "*_own: unscaled curve against 95% of the best own figure",
        "*_target: as trials_to_95/wall_to_95, against 95% of the best retimed_gflops of "
        "any run on the same target (opencl or llvm)",
        RETIMED_AT_NOTE,
    ]
    if any(TUNERS[n][0] == "kernel_tuner" for n in names):
        notes.append(
            "Kernel Tuner's trials are its evaluations (max_fevals), repeats of a config served "
            "from its cache included; info.unique_configs counts distinct configs. It is seeded "
            "through Python's and numpy's global generators (tune_kernel ignores seed=)"
        )
    kt_ok = wl.op == "matmul" and wl.params.get("epilogue", "none") == "none"
    if not kt_ok and any(TUNERS[n][0] == "kernel_tuner" for n in names):
        notes.append(
            f"Kernel Tuner skipped: its hand-written kernel is a plain SGEMM; no kernel for {wl}"
        )
        names = [n for n in names if TUNERS[n][0] != "kernel_tuner"]
        print(notes[-1], file=sys.stderr)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()
    print(
        f"{wl} on {device.name}: {', '.join(names)}; {args.trials} trials x {args.seeds} seeds",
        file=sys.stderr,
    )

    vendor = Vendor(wl) if vendor_name(wl) else None
    vendor_first = vendor_threads = None
    if vendor is not None:
        lat = vendor.latencies(min_time_s=1.0, min_repeats=50, warmup=10)
        vendor_first = wl.flops() / float(np.median(lat)) / 1e9
        vendor_threads = vendor.threads
        print(
            f"vendor {vendor_name(wl)}: {vendor_first:.1f} GFLOP/s ({vendor_threads})",
            file=sys.stderr,
        )
    else:
        notes.append(f"no vendor library figure for {wl.op}")

    runs: list[Run] = []
    bench_start = time.perf_counter()
    try:
        for seed in range(args.seeds):
            for name in names:
                family, target, strategy = TUNERS[name]
                t0 = time.perf_counter()
                try:
                    if family == "autosched":
                        run = run_autosched(
                            wl,
                            strategy=strategy,
                            target=target,
                            seed=seed,
                            args=args,
                            device=device,
                        )
                    elif family == "kernel_tuner":
                        run = run_kernel_tuner(
                            wl, strategy=strategy, seed=seed, args=args, device=device
                        )
                    else:
                        run = run_metaschedule(
                            wl, target=target, seed=seed, args=args, device=device
                        )
                except Exception as exc:  # one peer failing must not lose the others
                    log.exception("%s seed %d failed", name, seed)
                    run = Run(
                        tuner=name, seed=seed, target=target, error=f"{type(exc).__name__}: {exc}"
                    )
                    run.wall_s = time.perf_counter() - t0
                run.tuner = name
                runs.append(run)
                best = run.curve[-1] if run.curve else 0.0
                print(
                    f"  {name:<21} seed {seed}: {len(run.gflops):>3} trials, own best "
                    f"{best:7.1f} GFLOP/s, {run.wall_s:6.1f} s"
                    + (f"  ERROR {run.error}" if run.error else ""),
                    file=sys.stderr,
                )
        tuning_s = time.perf_counter() - bench_start
        print(f"re-timing {sum(len(r.finalists) for r in runs)} programs ...", file=sys.stderr)
        finalists = [f for r in runs for f in r.finalists]
        vendor_lat = retime(
            finalists,
            wl,
            device=device,
            rounds=args.rounds,
            vendor=vendor,
            timeout_s=4 * args.timeout,
        )
    finally:
        if vendor is not None:
            vendor.close()
    vendor_retimed = best_round_gflops(vendor_lat, wl.flops())
    rows, refs, ratios = summarize(runs, wl.flops())
    refs["retimed_by_target"] = add_same_target_t95(rows)
    summary = table(rows, vendor_gflops=vendor_retimed, trials=args.trials)
    total_s = time.perf_counter() - bench_start

    print(
        f"\n{wl} float32 on {device.name} ({host_cpu().name}, {os.cpu_count()} cores); "
        f"{args.trials} trials, {args.seeds} seed(s), means over seeds"
    )
    print_table(summary, trials=args.trials)
    print(
        f"vendor {vendor_name(wl) or '-'}: "
        + (f"{vendor_first:.1f} GFLOP/s first, " if vendor_first else "")
        + (f"{vendor_retimed:.1f} in the re-timing" if vendor_retimed else "no figure")
    )
    print(
        "@N, best: own measurements; retimed: the same harness for all, interleaved; "
        "re@N: the program its own best stood on after N trials, re-timed; "
        "vendor: retimed / vendor in the re-timing;\n"
        f"t95: trials to 95% of the best retimed figure ({fmt_cell(refs['retimed'], 0)} GFLOP/s), "
        "Kernel Tuner's and MetaSchedule's curves rescaled to the shared harness; reach: runs that got there; "
        "t95 s: their wall seconds;\nt95tgt: the same against the best retimed figure on "
        "the run's own target ("
        + ", ".join(f"{t} {g:.0f}" for t, g in refs["retimed_by_target"].items())
        + " GFLOP/s)"
    )
    print(f"total {total_s:.0f} s (tuning {tuning_s:.0f} s)")

    ms_source = next(
        (r.info["best_source"] for r in runs if "best_source" in r.info and not r.error), None
    )
    data = {
        "benchmark": "peers",
        "date": started,
        "command": "python -m bench.peers " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {
            "cpu": host_cpu().name,
            "mcpu": host_cpu().mcpu,
            "model": host_cpu().model_id,
            "isa": list(host_cpu().isa),
            "cores": os.cpu_count(),
            "usable_cores": host_cpu().cores,
            "platform": platform.platform(),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
        },
        "device": device.fingerprint(),
        "device_key": device.key(),
        "versions": versions(),
        "workload": wl.to_json(),
        "workload_key": wl.key,
        "flops": wl.flops(),
        "trials": args.trials,
        "seeds": args.seeds,
        "batch": args.batch,
        "quick": args.quick,
        "vendor": vendor_name(wl),
        "vendor_gflops": vendor_first,
        "vendor_threads": vendor_threads,
        "vendor_gflops_retimed": vendor_retimed,
        "reference_gflops": refs,
        "stopwatch_ratios": ratios,
        "curve_source": "each tuner's own measurements (see notes)",
        "notes": notes,
        "summary": summary,
        "results": rows,
        "metaschedule_opencl_best_source": ms_source,
        "wall_s": total_s,
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(data, indent=1, default=_json_default) + "\n")
    plot(
        rows,
        out_png,
        title=f"{wl} float32, {device.name}, {args.trials} trials x {args.seeds} seeds",
        vendor_gflops=vendor_retimed,
    )
    print(f"written {out_json} and {out_png}")
    return 0


def resummarize(path: Path) -> int:
    """Recompute the derived figures of a results file from its per-run rows."""
    data = json.loads(path.read_text())
    rows = data["results"]
    data["stopwatch_ratios"], data["reference_gflops"]["retimed"] = rescale_rows(rows)
    data["reference_gflops"]["retimed_by_target"] = add_same_target_t95(rows)
    data["summary"] = table(
        rows, vendor_gflops=data["vendor_gflops_retimed"], trials=data["trials"]
    )
    note = (
        "*_target: as trials_to_95/wall_to_95, against 95% of the best retimed_gflops of "
        "any run on the same target (opencl or llvm)"
    )
    add_retimed_at(rows)
    for line in (note, RETIMED_AT_NOTE):
        if line not in data["notes"]:
            data["notes"].append(line)
    print_table(data["summary"], trials=data["trials"])
    path.write_text(json.dumps(data, indent=1, default=_json_default) + "\n")
    from autosched.ops import workload_from_json

    png = path.with_suffix(".png")
    plot(
        rows,
        png,
        title=f"{workload_from_json(data['workload'])} float32, {data['device']['name']}, "
        f"{data['trials']} trials x {data['seeds']} seeds",
        vendor_gflops=data["vendor_gflops_retimed"],
    )
    print(f"rewritten {path} and {png}")
    return 0


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


if __name__ == "__main__":
    raise SystemExit(main())
