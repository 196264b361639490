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
matmul, im2col + sgemm for conv2d) is timed first, in a separate process. After all runs, every run's best few programs are timed again by one
harness (autosched's measurement worker: blocking waits, the same warm-up and repeats),
interleaved round-robin with the vendor library, so no comparison is decided by a tool's
own stopwatch (Kernel Tuner's busy-polling loop reads 20-45% slow on a CPU device). A
program's re-timed figure is its best round's median: a neighbour on a shared machine
only ever slows a kernel down.

Metrics per run: best-so-far GFLOP/s after each trial (the tuner's own measurements),
best after 16/32/64 trials and at the end, the re-timed best, and trials and wall seconds
to reach 95% of the best re-timed figure any tuner found (and of the best on the run's
own target). For those, Kernel Tuner's and MetaSchedule's curves are put on the shared
harness's scale: times the median re-timed/own ratio of that tool's finalists on that
target (Kernel Tuner's busy-polling loop reads ~25% slow here, MetaSchedule's llvm
runner about 2x slow); autosched's curves come from the shared harness already.
Unscaled figures are in the JSON.
Prints a table (means over seeds), writes the JSON and a PNG of the curves.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from autosched.measure.runner import TimingOptions

log = logging.getLogger("bench.peers")

RESULTS = Path(__file__).parent / "results"

# name -> (family, target, strategy)
TUNERS: dict[str, tuple[str, str, str]] = {
    "autosched-model": ("autosched", "opencl", "model"),
    "autosched-random": ("autosched", "opencl", "random"),
    "autosched-tpe": ("autosched", "opencl", "tpe"),
    "autosched-llvm": ("autosched", "llvm", "model"),
    "kt-bayes_opt": ("kernel_tuner", "opencl", "bayes_opt"),
    "kt-genetic_algorithm": ("kernel_tuner", "opencl", "genetic_algorithm"),
    "kt-random_sample": ("kernel_tuner", "opencl", "random_sample"),
    "ms-llvm": ("metaschedule", "llvm", "evolutionary"),
    "ms-opencl": ("metaschedule", "opencl", "evolutionary"),
}
# Quick: no genetic algorithm (its first generation, 26 configs, is a random sample, so
# within 24 trials it is random sampling) and no llvm pair (MetaSchedule llvm alone takes
# 1-2 minutes for 24 trials here).
QUICK_TUNERS = (
    "autosched-model",
    "autosched-random",
    "kt-bayes_opt",
    "kt-random_sample",
    "ms-opencl",
)
CHECKPOINTS = (16, 32, 64)
# How the shared re-timing times every finalist (and the vendor library, per round).
RETIME = TimingOptions(warmup=2, min_repeats=10, max_repeats=400, min_time_s=0.2)
TARGET_FRACTION = 0.95
# Families whose curves are put on the shared harness's scale: Kernel Tuner times with
# its own busy-polling loop. autosched and MetaSchedule OpenCL are timed by autosched's
# worker during tuning; MetaSchedule llvm by TVM's time_evaluator, as autosched's llvm runner.
# Peers whose own stopwatch is not the shared harness: their curves are put on its scale.
SCALED_FAMILIES = ("kernel_tuner", "metaschedule")


# -- metrics (pure) ---------------------------------------------------------------------


def best_so_far(gflops: Sequence[float | None]) -> list[float]:
    """Best GFLOP/s after each trial; failed trials (None) keep the best so far (0 at first)."""
    out, best = [], 0.0
    for g in gflops:
        if g is not None and g > best:
            best = g
        out.append(best)
    return out


def best_after(curve: Sequence[float], trials: int) -> float | None:
    """The best after ``trials`` trials; a run that stopped earlier keeps its last figure."""
    if not curve:
        return None
    return curve[min(trials, len(curve)) - 1]


def trials_to_reach(curve: Sequence[float], threshold: float) -> int | None:
    """Trials (1-based) until the curve first reaches ``threshold``; None if it never does."""
    for i, g in enumerate(curve):
        if g >= threshold:
            return i + 1
    return None


def wall_to_reach(curve: Sequence[float], times: Sequence[float], threshold: float) -> float | None:
    """Seconds since the tuner started until the curve first reaches ``threshold``."""
    n = trials_to_reach(curve, threshold)
    return None if n is None else times[n - 1]


def mean_or_none(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


# -- runs -------------------------------------------------------------------------------


@dataclass
class Finalist:
    """One of a run's best programs, to be timed again by the shared harness."""

    label: str
    program: Any  # KernelProgram or CpuProgram
    own_gflops: float
    config: Any = None
    visits: list[list[float]] = field(default_factory=list)  # latencies, per round
    error: str | None = None

    def retimed_gflops(self, flops: float) -> float | None:
        """The best round's median: on this machine noise only ever slows a kernel."""
        return best_round_gflops(self.visits, flops) if not self.error else None

    def retimed_median_gflops(self, flops: float) -> float | None:
        """The median of every round's samples pooled."""
        pooled = [x for v in self.visits for x in v]
        return flops / float(np.median(pooled)) / 1e9 if pooled and not self.error else None


def best_round_gflops(visits: Sequence[Sequence[float]], flops: float) -> float | None:
    medians = [float(np.median(v)) for v in visits if len(v)]
    return flops / min(medians) / 1e9 if medians else None


@dataclass
class Run:
    """One tuner, one seed: every trial's own figure, when it was known, the finalists."""

    tuner: str
    seed: int
    target: str
    gflops: list[float | None] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    finalists: list[Finalist] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def curve(self) -> list[float]:
        return best_so_far(self.gflops)


def _top_distinct(items: Sequence[tuple[Any, float]], k: int) -> list[tuple[Any, float]]:
    """The ``k`` best (key, gflops) pairs with distinct keys, best first."""
    seen, out = set(), []
    for key, g in sorted(items, key=lambda x: -x[1]):
        if key in seen:
            continue
        seen.add(key)
        out.append((key, g))
        if len(out) == k:
            break
    return out


def run_autosched(wl, *, strategy: str, target: str, seed: int, args, device) -> Run:
    import autosched
    from autosched.measure.build import build
    from autosched.measure.device import select_device
    from autosched.space.config import Config
    from autosched.space.select import make_space

    dev = select_device(device if target == "opencl" else None, target=target)
    run = Run(tuner="", seed=seed, target=target)
    start = time.perf_counter()

    def progress(event) -> None:
        rec = event.record
        run.gflops.append(rec.gflops if rec.ok else None)
        run.times.append(time.perf_counter() - start)

    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        res = autosched.tune(
            wl,
            trials=args.trials,
            batch=args.batch,
            strategy=strategy,
            target=target,
            db=Path(tmp) / "records.db",
            device=dev,
            seed=seed,
            timeout_s=args.timeout,
            progress=progress,
        )
    run.wall_s = time.perf_counter() - start
    errors: dict[str, int] = {}
    for rec in res.history:
        if not rec.ok:
            errors[rec.status] = errors.get(rec.status, 0) + 1
    run.info = {
        "final_gflops": res.best.gflops if res.best else None,
        "final_config": res.best.config if res.best else None,
        "default_gflops": res.default.gflops if res.default else None,
        "errors": errors,
    }
    by_key = {r.config_key: r.config for r in res.history if r.ok}
    ranked = [(r.config_key, r.gflops) for r in res.history if r.ok and r.gflops]
    if res.best is not None:  # its own final re-measurement's winner goes first
        ranked.append((res.best.config_key, float("inf")))
    space = make_space(wl, target=target, limits=dev.limits)
    for key, _ in _top_distinct(ranked, args.retime_top):
        own = max(
            (r.gflops or 0.0 for r in res.history if r.ok and r.config_key == key), default=0.0
        )
        try:
            program = build(space, Config(by_key[key]))
        except Exception as exc:  # a config that measured fine builds again; say so if not
            log.warning("%s: cannot rebuild %s: %s", wl, key, exc)
            continue
        run.finalists.append(Finalist(key, program, own, by_key[key]))
    return run


def run_kernel_tuner(wl, *, strategy: str, seed: int, args, device) -> Run:
    from bench import peers_kt, peers_sgemm

    m, n, k = wl.M, wl.N, wl.K
    result = peers_kt.tune(
        m=m,
        n=n,
        k=k,
        strategy=strategy,
        trials=args.trials,
        seed=seed,
        platform=device.platform_index,
        device=device.device_index,
        tolerance=wl.tolerance(),
        local_mem_bytes=device.local_mem_bytes,
        timeout_s=max(600.0, 60.0 * args.trials),
    )
    run = Run(tuner="", seed=seed, target="opencl", wall_s=result["wall_s"])
    for ev in result["evaluations"]:
        g = wl.flops() / (ev["time_ms"] * 1e-3) / 1e9 if ev["time_ms"] else None
        run.gflops.append(g)
        run.times.append(ev["t"])
    evs = result["evaluations"]
    keyed = {peers_sgemm.config_key(ev["config"]): ev["config"] for ev in evs}
    ranked = [
        (peers_sgemm.config_key(ev["config"]), g) for ev, g in zip(evs, run.gflops) if g is not None
    ]
    for key, g in _top_distinct(ranked, args.retime_top):
        cfg = keyed[key]
        run.finalists.append(Finalist(key, peers_sgemm.program(cfg, m, n, k), g, cfg))
    errors: dict[str, int] = {}
    for ev in evs:
        if ev["error"]:
            errors[ev["error"]] = errors.get(ev["error"], 0) + 1
    run.info = {
        "evaluations": len(evs),
        "unique_configs": len(keyed),
        "iterations": result["iterations"],
        "errors": errors,
        "best_config": run.finalists[0].config if run.finalists else None,
    }
    return run


def run_metaschedule(wl, *, target: str, seed: int, args, device) -> Run:
    from bench import peers_ms

    _quiet_metaschedule()
    if target == "llvm":
        result = peers_ms.tune_llvm(
            wl, trials=args.trials, batch=args.batch, seed=seed, top=args.retime_top
        )
    else:
        result = peers_ms.tune_opencl(
            wl,
            device=device,
            trials=args.trials,
            batch=args.batch,
            seed=seed,
            top=args.retime_top,
            timeout_s=args.timeout,
        )
    run = Run(tuner="", seed=seed, target=target, wall_s=result["wall_s"])
    for entry in result["history"]:
        run.gflops.append(entry["gflops"])
        run.times.append(entry["t"])
    for i, (program, g) in enumerate(result["programs"]):
        run.finalists.append(Finalist(f"top{i + 1}", program, g))
    errors: dict[str, int] = {}
    for entry in result["history"]:
        if entry["error"]:
            # MetaSchedule's messages start with who failed and why (one line, say
            # "LocalBuilder: Timeout, killed after 30.0 seconds"); the rest is a traceback.
            kind = entry["error"].strip().splitlines()[0][:160]
            errors[kind] = errors.get(kind, 0) + 1
    run.info = {"errors": errors, "wall_clock": result["wall_clock"]}
    if "target" in result:
        run.info["tvm_target"] = result["target"]
    if target == "opencl" and run.finalists:
        run.info["best_source"] = run.finalists[0].program.source
    return run


def _quiet_metaschedule() -> None:
    # MetaSchedule's console handler takes the level its logger has when tuning starts,
    # and each tune_tir call resets that level to DEBUG.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


# -- the vendor library, in its own process ----------------------------------------------


def _vendor_child(conn, workload_json: dict, seed: int) -> None:
    from threadpoolctl import threadpool_limits

    from autosched.report.vendor import vendor_callable

    fn, inputs = vendor_callable(workload_json, seed=seed)

    def sample(min_time_s: float, min_repeats: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            fn(**inputs)
        times: list[float] = []
        while len(times) < min_repeats or sum(times) < min_time_s:
            t = time.perf_counter()
            fn(**inputs)
            times.append(time.perf_counter() - t)
        return times

    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        # As autosched.report.vendor times it: the BLAS's own threads and one thread, the
        # faster counts (a BLAS spinning its threads on busy cores can be far slower).
        default = sample(*msg[1:])
        with threadpool_limits(limits=1, user_api="blas"):
            single = sample(*msg[1:])
        if np.median(single) < np.median(default):
            conn.send((single, "1 thread"))
        else:
            conn.send((default, "the BLAS's default threads"))


def vendor_name(wl) -> str | None:
    """What the vendor baseline is (autosched.report.vendor's numpy call), or None."""
    from autosched.report.vendor import VENDOR_OPS

    if wl.op not in VENDOR_OPS:
        return None
    blas = _versions().get("numpy_blas") or "numpy's BLAS"
    return f"numpy baseline of {wl.op} (autosched.report.vendor; {blas})"


class Vendor:
    """numpy/OpenBLAS in a spawned process: no state shared with the tuners."""

    def __init__(self, wl, *, seed: int = 0) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_vendor_child, args=(child, wl.to_json(), seed), daemon=True
        )
        self._proc.start()
        child.close()
        self.threads = ""

    def latencies(self, *, min_time_s: float, min_repeats: int, warmup: int) -> list[float]:
        """Timed calls (seconds) with the faster of the BLAS's threads and one thread;
        ``threads`` says which."""
        self._conn.send(("time", min_time_s, min_repeats, warmup))
        times, self.threads = self._conn.recv()
        return times

    def close(self) -> None:
        try:
            self._conn.send(("stop",))
        except OSError:
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


# -- the shared re-timing -----------------------------------------------------------------


def retime(
    runs: Sequence[Run], wl, *, device, rounds: int, vendor: Vendor | None, timeout_s: float
) -> list[list[float]]:
    """Time every finalist again, round-robin with the vendor library; its latencies per round.

    Each round visits the finalists in a rotated order, so no program always follows
    the same neighbour; every one gets the same warm-up and repeats.
    """
    from autosched.measure.cpu import host_cpu
    from autosched.measure.runner import TestData
    from autosched.measure.worker import MeasureWorker

    inputs = wl.make_inputs(np.random.default_rng([0, 0x5EED]))
    data = TestData(wl.key, inputs, wl.reference(inputs), *wl.tolerance())
    finalists = [f for r in runs for f in r.finalists]
    workers: dict[str, MeasureWorker] = {}
    vendor_lat: list[list[float]] = []
    try:
        for rnd in range(rounds):
            shift = (rnd * len(finalists)) // max(rounds, 1)
            for f in finalists[shift:] + finalists[:shift]:
                if f.error:
                    continue
                kind = f.program.kind
                if kind not in workers:
                    dev = device if kind == "opencl" else host_cpu()
                    workers[kind] = MeasureWorker(dev, timeout_s=timeout_s)
                out = workers[kind].measure(f.program, data, RETIME)
                if out.status == "ok":
                    f.visits.append(list(out.latencies))
                else:
                    f.error = f"{out.status}: {out.error}"[:500]
            if vendor is not None:
                vendor_lat.append(
                    vendor.latencies(
                        min_time_s=RETIME.min_time_s,
                        min_repeats=RETIME.min_repeats,
                        warmup=RETIME.warmup,
                    )
                )
            log.info("re-timing: round %d of %d done", rnd + 1, rounds)
    finally:
        for w in workers.values():
            w.close()
    return vendor_lat


# -- summary -------------------------------------------------------------------------------


def stopwatch_ratios(runs: Sequence[Run], flops: float) -> dict[str, float | None]:
    """Per tuner family and target (``"metaschedule/llvm"``): median over its finalists
    of re-timed / own GFLOP/s.

    How a family's own stopwatch on a target reads against the shared harness. Pooled
    over seeds and strategies, so one lucky own reading (the best of many noisy trials
    reads high) does not decide it.
    """
    ratios: dict[str, list[float]] = {}
    for r in runs:
        for f in r.finalists:
            g = f.retimed_gflops(flops)
            if g and f.own_gflops:
                ratios.setdefault(f"{TUNERS[r.tuner][0]}/{r.target}", []).append(g / f.own_gflops)
    return {key: float(np.median(v)) for key, v in ratios.items()}


def summarize(
    runs: Sequence[Run], flops: float
) -> tuple[list[dict], dict[str, float | None], dict[str, float | None]]:
    """Per-run results (JSON rows), the references the 95% figures are measured against,
    and each family's stopwatch ratio (see :func:`stopwatch_ratios`)."""
    ratios = stopwatch_ratios(runs, flops)
    retimed_best = {}
    for r in runs:
        figs = [g for g in (f.retimed_gflops(flops) for f in r.finalists) if g is not None]
        retimed_best[id(r)] = max(figs) if figs else None
    ref = max((g for g in retimed_best.values() if g is not None), default=None)
    ref_own = max((max(r.curve) for r in runs if r.curve), default=None)
    rows = []
    for r in runs:
        family = TUNERS[r.tuner][0]
        curve = r.curve
        scale = (ratios.get(f"{family}/{r.target}") or 1.0) if family in SCALED_FAMILIES else 1.0
        scaled = [g * scale for g in curve]
        row: dict[str, Any] = {
            "tuner": r.tuner,
            "family": family,
            "target": r.target,
            "seed": r.seed,
            "trials": len(curve),
            "best_gflops": curve[-1] if curve else None,
            **{f"best_at_{n}": best_after(curve, n) for n in CHECKPOINTS},
            "retimed_gflops": retimed_best[id(r)],
            "stopwatch_scale": scale,
            "curve": curve,
            "trial_gflops": r.gflops,
            "trial_wall_s": r.times,
            "wall_s": r.wall_s,
            "trials_to_95": None,
            "wall_to_95": None,
            "trials_to_95_own": None,
            "wall_to_95_own": None,
            "finalists": [
                {
                    "label": f.label,
                    "config": f.config,
                    "own_gflops": f.own_gflops,
                    "retimed_gflops": f.retimed_gflops(flops),
                    "retimed_median_gflops": f.retimed_median_gflops(flops),
                    "retimed_visits": [len(v) for v in f.visits],
                    "error": f.error,
                }
                for f in r.finalists
            ],
            "info": {k: v for k, v in r.info.items() if k != "best_source"},
            "error": r.error,
        }
        if ref and curve:
            row["trials_to_95"] = trials_to_reach(scaled, TARGET_FRACTION * ref)
            row["wall_to_95"] = wall_to_reach(scaled, r.times, TARGET_FRACTION * ref)
        if ref_own and curve:
            row["trials_to_95_own"] = trials_to_reach(curve, TARGET_FRACTION * ref_own)
            row["wall_to_95_own"] = wall_to_reach(curve, r.times, TARGET_FRACTION * ref_own)
        rows.append(row)
    return rows, {"retimed": ref, "own": ref_own}, ratios


def add_same_target_t95(rows: Sequence[dict]) -> dict[str, float]:
    """Trials and seconds to 95% of the best re-timed figure found *on the run's own target*.

    The overall reference can be an llvm kernel that no OpenCL tuner can produce (or the
    other way round); against its own target's best, a tuner is compared with the peers
    that generate the same kind of code. Adds ``trials_to_95_target`` and
    ``wall_to_95_target`` to each row; returns the reference per target.
    """
    refs: dict[str, float] = {}
    for row in rows:
        g = row.get("retimed_gflops")
        if g is not None and row.get("error") is None:
            refs[row["target"]] = max(refs.get(row["target"], 0.0), g)
    for row in rows:
        ref = refs.get(row["target"])
        scaled = [g * (row.get("stopwatch_scale") or 1.0) for g in row["curve"]]
        row["trials_to_95_target"] = trials_to_reach(scaled, TARGET_FRACTION * ref) if ref else None
        row["wall_to_95_target"] = (
            wall_to_reach(scaled, row["trial_wall_s"], TARGET_FRACTION * ref) if ref else None
        )
    return refs


def by_tuner(rows: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["tuner"], []).append(row)
    return out


def table(rows: Sequence[dict], *, vendor_gflops: float | None, trials: int) -> list[dict]:
    """Means over seeds per tuner."""
    out = []
    for tuner, rs in by_tuner(rows).items():
        ok = [r for r in rs if r["error"] is None]
        reached = [r["trials_to_95"] for r in ok if r["trials_to_95"] is not None]
        reached_t = [
            r["trials_to_95_target"] for r in ok if r.get("trials_to_95_target") is not None
        ]
        entry = {
            "tuner": tuner,
            "runs": len(rs),
            "failed_runs": len(rs) - len(ok),
            "trials": mean_or_none([r["trials"] for r in ok]),
            **{
                f"best_at_{n}": mean_or_none([r[f"best_at_{n}"] for r in ok])
                for n in CHECKPOINTS
                if n <= trials
            },
            "best_gflops": mean_or_none([r["best_gflops"] for r in ok]),
            "retimed_gflops": mean_or_none([r["retimed_gflops"] for r in ok]),
            "trials_to_95": mean_or_none(reached),
            "reached_95": f"{len(reached)}/{len(ok)}",
            "wall_to_95": mean_or_none([r["wall_to_95"] for r in ok]),
            "trials_to_95_target": mean_or_none(reached_t),
            "reached_95_target": f"{len(reached_t)}/{len(ok)}",
            "wall_s": mean_or_none([r["wall_s"] for r in ok]),
        }
        g = entry["retimed_gflops"]
        entry["of_vendor"] = g / vendor_gflops if g and vendor_gflops else None
        out.append(entry)
    return out


def _fmt(v, width: int, digits: int = 1) -> str:
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, str):
        return f"{v:>{width}}"
    return f"{v:>{width}.{digits}f}"


def print_table(summary: Sequence[dict], *, trials: int, out=sys.stdout) -> None:
    checkpoints = [n for n in CHECKPOINTS if n < trials]
    head = (
        f"{'tuner':<21}{'runs':>5}{'trials':>7}"
        + "".join(f"{'@' + str(n):>7}" for n in checkpoints)
        + f"{'best':>7}{'retimed':>8}{'vendor':>7}{'t95':>6}{'reach':>6}{'t95 s':>7}"
        + f"{'t95tgt':>7}{'reach':>6}{'wall s':>8}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for e in summary:
        line = f"{e['tuner']:<21}{e['runs']:>5}{_fmt(e['trials'], 7, 0)}"
        line += "".join(_fmt(e.get(f"best_at_{n}"), 7) for n in checkpoints)
        of_vendor = e["of_vendor"]
        line += (
            f"{_fmt(e['best_gflops'], 7)}{_fmt(e['retimed_gflops'], 8)}"
            f"{_fmt(None if of_vendor is None else f'{100 * of_vendor:.0f}%', 7)}"
            f"{_fmt(e['trials_to_95'], 6, 0)}{e['reached_95']:>6}"
            f"{_fmt(e['wall_to_95'], 7, 0)}"
            f"{_fmt(e.get('trials_to_95_target'), 7, 0)}{e.get('reached_95_target', '-'):>6}"
            f"{_fmt(e['wall_s'], 8, 0)}"
        )
        if e["failed_runs"]:
            line += f"  ({e['failed_runs']} failed)"
        print(line, file=out)


# -- plot -----------------------------------------------------------------------------------


def plot(rows: Sequence[dict], path: Path, *, title: str, vendor_gflops: float | None) -> None:
    """Best-so-far GFLOP/s against trials and against wall seconds, one colour per tuner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_w) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    colors = plt.get_cmap("tab10")
    for i, (tuner, rs) in enumerate(by_tuner(rows).items()):
        color = colors(i % 10)
        curves = []
        for r in rs:
            if not r["curve"]:
                continue
            scale = r["stopwatch_scale"] or 1.0
            curve = [g * scale for g in r["curve"]]
            curves.append(curve)
            x = np.arange(1, len(curve) + 1)
            ax_t.step(x, curve, where="post", color=color, alpha=0.25, lw=0.8)
            # Held to the end of the run: tuners spend time after their last trial too.
            wall = [*r["trial_wall_s"], max(r["wall_s"], r["trial_wall_s"][-1])]
            ax_w.step(wall, [*curve, curve[-1]], where="post", color=color, alpha=0.8, lw=1.2)
        if curves:
            n = min(len(c) for c in curves)
            mean = np.mean([c[:n] for c in curves], axis=0)
            ax_t.step(np.arange(1, n + 1), mean, where="post", color=color, lw=2, label=tuner)
    for ax in (ax_t, ax_w):
        if vendor_gflops:
            label = "vendor library" if ax is ax_t else None
            ax.axhline(vendor_gflops, color="k", ls="--", lw=1, label=label)
        ax.grid(alpha=0.3)
    ax_t.set_xlabel("trials")
    ax_w.set_xscale("log")
    ax_w.set_xlabel("wall seconds since the tuner started (log)")
    ax_t.set_ylabel("best-so-far GFLOP/s (peers rescaled to the shared harness)")
    ax_t.set_title("mean over seeds (bold), each seed (faint)")
    ax_w.set_title("each seed")
    # Below the panels: inside, the legend hides curves.
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=9)
    fig.suptitle(textwrap.fill(title, 110))
    fig.tight_layout(rect=(0, 0.08 + 0.04 * ((len(labels) - 1) // 5), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main -------------------------------------------------------------------------------------


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


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in ("apache-tvm", "apache-tvm-ffi", "kernel_tuner", "pyopencl", "numpy", "optuna"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        out["numpy_blas"] = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError):
        out["numpy_blas"] = None
    return out


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
    log.setLevel(logging.INFO)

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
        vendor_lat = retime(
            runs, wl, device=device, rounds=args.rounds, vendor=vendor, timeout_s=4 * args.timeout
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
        "vendor: retimed / vendor in the re-timing;\n"
        f"t95: trials to 95% of the best retimed figure ({_fmt(refs['retimed'], 0)} GFLOP/s), "
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
            "cores": os.cpu_count(),
            "usable_cores": host_cpu().cores,
            "platform": platform.platform(),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
        },
        "device": device.fingerprint(),
        "device_key": device.key(),
        "versions": _versions(),
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


def rescale_rows(rows: Sequence[dict]) -> tuple[dict[str, float], float | None]:
    """:func:`stopwatch_ratios` and the 95% figures of :func:`summarize`, from JSON rows."""
    pooled: dict[str, list[float]] = {}
    for row in rows:
        for f in row["finalists"]:
            if f["retimed_gflops"] and f["own_gflops"]:
                key = f"{row['family']}/{row['target']}"
                pooled.setdefault(key, []).append(f["retimed_gflops"] / f["own_gflops"])
    ratios = {key: float(np.median(v)) for key, v in pooled.items()}
    ref = max((r["retimed_gflops"] for r in rows if r["retimed_gflops"]), default=None)
    for row in rows:
        key = f"{row['family']}/{row['target']}"
        scale = (ratios.get(key) or 1.0) if row["family"] in SCALED_FAMILIES else 1.0
        row["stopwatch_scale"] = scale
        scaled = [g * scale for g in row["curve"]]
        row["trials_to_95"] = trials_to_reach(scaled, TARGET_FRACTION * ref) if ref else None
        row["wall_to_95"] = (
            wall_to_reach(scaled, row["trial_wall_s"], TARGET_FRACTION * ref) if ref else None
        )
    return ratios, ref


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
    if note not in data["notes"]:
        data["notes"].append(note)
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
