"""Benchmark: tune a float32 matmul on the llvm target (host CPU) against numpy/OpenBLAS.

    python -m bench.tune_llvm --shape 512,512,512 --trials 64 [--seeds 1] [--metaschedule]

From a cold temporary database, ``autosched.tune(..., target="llvm")`` runs for
``--trials`` trials; numpy is measured in this same run, before and after tuning. With
``--metaschedule`` TVM MetaSchedule (``tune_tir``, the same trial count and batch size)
tunes the same PrimFunc for the same target. At the end the best kernels (autosched's,
MetaSchedule's, the untuned default) are measured again side by side, interleaved
round by round with numpy, through the same measurement worker: the machine is shared
and noisy, so only figures from one window are compared. Prints a table and writes
bench/results/tune_llvm.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import autosched
from autosched.measure.build import build
from autosched.measure.cpu import host_cpu
from autosched.measure.program import CpuProgram
from autosched.measure.runner import TestData, TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.space.config import Config
from autosched.space.select import make_space
from bench.interleave import measure_round

TIMING = TimingOptions(warmup=2, min_repeats=20, max_repeats=400, min_time_s=0.3)


def numpy_latencies(a: np.ndarray, b: np.ndarray, *, min_time_s: float = 0.3) -> list[float]:
    """Timed runs of ``a @ b`` (after warm-up) until ``min_time_s`` of them."""
    for _ in range(5):
        a @ b
    times: list[float] = []
    while len(times) < 20 or sum(times) < min_time_s:
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return times


def gflops(flops: float, latencies) -> dict[str, float]:
    lat = np.asarray(latencies, dtype=float)
    return {
        "median_gflops": flops / float(np.median(lat)) / 1e9,
        "best_gflops": flops / float(lat.min()) / 1e9,
        "spread": float((np.percentile(lat, 75) - np.percentile(lat, 25)) / np.median(lat)),
        "samples": int(lat.size),
    }


def metaschedule(
    wl, *, trials: int, batch: int, seed: int, top: int = 1, measure_callbacks=()
) -> dict:
    """Tune ``wl`` with TVM MetaSchedule on the host target; its best as a CpuProgram.

    Args:
        top: also build the next best schedules: ``programs`` holds ``top`` pairs of
            (CpuProgram, MetaSchedule's own GFLOP/s), best first.
        measure_callbacks: added to MetaSchedule's default callbacks (bench/peers.py
            records the trial order with one; the database keeps none).
    """
    import tvm
    import tvm.s_tir.meta_schedule as ms

    mod = prim_module(wl)
    target = tvm.target.Target(host_cpu().tvm_target())
    start = time.perf_counter()
    # TVM's runtime runs a kernel on half the logical CPUs unless told (it assumes
    # hyper-threading): on a 2-vCPU machine MetaSchedule's runner timed every candidate
    # on one thread, reading 1.98x slow against the shared harness (committed
    # peers_matmul.json, November 2026). Its runner processes inherit this environment,
    # so they time on every usable core, as the target's num-cores and autosched's
    # worker do.
    with (
        _tvm_threads(host_cpu().cores),
        tempfile.TemporaryDirectory(prefix="bench-ms-") as work_dir,
    ):
        db = ms.tune_tir(
            mod,
            target,
            work_dir,
            max_trials_global=trials,
            num_trials_per_iter=batch,
            builder=lean_builder(),
            seed=seed,
            measure_callbacks=[
                *ms.measure_callback.MeasureCallback.create("default"),
                *measure_callbacks,
            ],
        )
        wall = time.perf_counter() - start
        records = db.get_all_tuning_records()
        best_records = db.get_top_k(db.commit_workload(mod), top)
        programs = [
            (trace_program(wl, rec.trace, mod=rec.workload.mod), _ms_gflops(wl, rec.run_secs))
            for rec in best_records
        ]
    if not programs:  # every build or run failed: say so, not an IndexError
        raise RuntimeError(
            f"MetaSchedule measured no program in {len(records)} trials: every build or run "
            "failed (a builder that outruns its timeout is one way; see lean_builder)"
        )
    # Its database keeps no trial order, so only the best of its own measurements.
    best = max((_ms_gflops(wl, r.run_secs) for r in records), default=0.0)
    return {
        "program": programs[0][0],
        "programs": programs,
        "best_trace": str(best_records[0].trace) if best_records else None,
        "wall_s": wall,
        "trials": len(records),
        "best_gflops": best,
    }


# MetaSchedule's builder processes: seconds a build may take (TVM's default is 30).
BUILD_TIMEOUT_S = 120.0


def lean_builder():
    """MetaSchedule's ``LocalBuilder`` with its default build function minus the first
    line, ``import tvm.s_tir.tensor_intrin``. That import registers every target's tensor
    intrinsics (CUDA's, Arm's, Hexagon's) and took some 28 s before, 45 s on a Zen 3, in
    each builder process, which MetaSchedule starts afresh for every batch: on the Zen 3
    every build outran the default 30 s timeout, and the peers benchmark's MetaSchedule
    llvm runs measured nothing. An fp32 llvm build uses none of those intrinsics; the
    build is otherwise the same. The build function is made in here so that cloudpickle
    sends it to the builder processes by value (they cannot import ``bench``)."""
    import tvm.s_tir.meta_schedule as ms

    def build(mod, target, _params):
        from tvm.driver import build as tvm_build
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm_build(mod, target=target)

    return ms.builder.LocalBuilder(f_build=build, timeout_sec=BUILD_TIMEOUT_S)


def prim_module(wl):
    """The workload as the IRModule MetaSchedule tunes (one PrimFunc, ``main``)."""
    import tvm
    from tvm import te

    st = wl.stages()
    return tvm.IRModule({"main": te.create_prim_func([*st.inputs, *st.outputs])})


def trace_program(wl, trace, *, mod=None) -> CpuProgram:
    """The CpuProgram of one MetaSchedule schedule (a trace from its database or from a
    measure callback's candidate), built for the host CPU as MetaSchedule built it."""
    import tvm

    sch = tvm.s_tir.Schedule(prim_module(wl) if mod is None else mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    executable = tvm.compile(sch.mod, target=tvm.target.Target(host_cpu().tvm_target()))
    with tempfile.TemporaryDirectory(prefix="bench-ms-") as tmp:
        path = Path(tmp) / "ms.so"
        executable.export_library(str(path))
        library = path.read_bytes()
    return CpuProgram(library=library, entry="main", tensors=tuple(wl.tensor_specs()))


@contextlib.contextmanager
def _tvm_threads(n: int):
    old = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TVM_NUM_THREADS", None)
        else:
            os.environ["TVM_NUM_THREADS"] = old


def _ms_gflops(wl, run_secs) -> float:
    """GFLOP/s of a MetaSchedule record; 0 for a failed run (those read 1e10 s)."""
    secs = [float(x) for x in (run_secs or [])]
    if secs and all(s < 1e9 for s in secs):
        return wl.flops() / float(np.mean(secs)) / 1e9
    return 0.0


def side_by_side(
    wl, programs: dict[str, CpuProgram], data: TestData, a, b, *, rounds: int
) -> dict[str, dict[str, float]]:
    """Interleaved rounds: every program through the worker, then numpy in this process."""
    lats: dict[str, list[float]] = {name: [] for name in [*programs, "numpy"]}
    with MeasureWorker(host_cpu(), timeout_s=120) as worker:
        for _ in range(rounds):
            measure_round(worker, programs, data, TIMING, lats)
            lats["numpy"].extend(numpy_latencies(a, b))
    return {name: gflops(wl.flops(), v) for name, v in lats.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="512,512,512")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--strategy", default="model")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5, help="side-by-side rounds at the end")
    p.add_argument("--metaschedule", action="store_true", help="also tune with MetaSchedule")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "tune_llvm.json"))
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    m, n, k = (int(x) for x in args.shape.split(","))
    cpu = host_cpu()
    wl = autosched.workload("matmul", M=m, N=n, K=k)
    space = make_space(wl, target="llvm", limits=cpu.limits)
    rng = np.random.default_rng(0)
    inputs = wl.make_inputs(rng)
    data = TestData(wl.key, inputs, wl.reference(inputs), *wl.tolerance())
    a, b = inputs["A"], inputs["B"]
    rows = []
    for seed in range(args.seeds):
        np_before = gflops(wl.flops(), numpy_latencies(a, b))
        with tempfile.TemporaryDirectory() as tmp:
            res = autosched.tune(
                wl,
                trials=args.trials,
                batch=args.batch,
                strategy=args.strategy,
                target="llvm",
                db=Path(tmp) / "bench.db",
                seed=seed,
            )
        np_after = gflops(wl.flops(), numpy_latencies(a, b))
        curve, best = [], 0.0
        for h in res.history:
            best = max(best, h.gflops or 0.0) if h.ok else best
            curve.append(best)
        programs = {
            "autosched": build(space, Config(res.best.config)),
            "default": build(space, space.default()),
        }
        ms_info = None
        if args.metaschedule:
            ms_info = metaschedule(wl, trials=args.trials, batch=args.batch, seed=seed)
            programs["metaschedule"] = ms_info.pop("program")
            ms_info.pop("programs")
        final = side_by_side(wl, programs, data, a, b, rounds=args.rounds)
        row = {
            "seed": seed,
            "strategy": args.strategy,
            "trials": res.trials,
            "wall_s": res.wall_s,
            "tuned_gflops": res.best.gflops,
            "best_config": res.best.config,
            "default_gflops": res.default.gflops if res.default else None,
            "numpy_before": np_before,
            "numpy_after": np_after,
            "side_by_side": final,
            "fraction_of_numpy": final["autosched"]["median_gflops"]
            / final["numpy"]["median_gflops"],
            "curve": curve,
            "errors": {
                s: sum(1 for h in res.history if h.status == s)
                for s in {h.status for h in res.history}
                if s != "ok"
            },
        }
        if ms_info is not None:
            row["metaschedule"] = ms_info
        rows.append(row)

    print(f"\nmatmul {m}x{n}x{k} float32, llvm on {cpu.name} ({cpu.mcpu}, {cpu.cores} cores)")
    head = (
        f"{'seed':>4} {'kernel':<13} {'GFLOP/s':>8} {'best':>7} {'of numpy':>8}"
        f" {'in tuning':>9} {'trials':>6} {'wall s':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        f = r["side_by_side"]
        ref = f["numpy"]["median_gflops"]
        tuning = {
            "autosched": (r["tuned_gflops"], r["trials"], r["wall_s"]),
            "default": (r["default_gflops"], None, None),
            "numpy": (
                max(r["numpy_before"]["median_gflops"], r["numpy_after"]["median_gflops"]),
                None,
                None,
            ),
        }
        if "metaschedule" in r:
            ms_row = r["metaschedule"]
            tuning["metaschedule"] = (
                ms_row["best_gflops"],
                ms_row["trials"],
                ms_row["wall_s"],
            )
        for name, v in f.items():
            g, trials, wall = tuning.get(name, (None, None, None))
            print(
                f"{r['seed']:>4} {name:<13} {v['median_gflops']:>8.1f} {v['best_gflops']:>7.1f}"
                f" {100 * v['median_gflops'] / ref:>7.0f}%"
                f" {g if g is None else round(g, 1)!s:>9} {trials or '':>6}"
                f" {'' if wall is None else f'{wall:.1f}':>7}"
            )
        print(
            f"     numpy before/after tuning: {r['numpy_before']['median_gflops']:.0f} / "
            f"{r['numpy_after']['median_gflops']:.0f} GFLOP/s (median)"
        )
    out = {
        "benchmark": "tune_llvm",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "cpu": cpu.name,
            "mcpu": cpu.mcpu,
            "model": cpu.model_id,
            "cores": cpu.cores,
            "device_key": cpu.key(),
            "load_average": os.getloadavg(),
        },
        "workload": {"op": "matmul", "M": m, "N": n, "K": k},
        "timing": {
            "side_by_side_rounds": args.rounds,
            "figures": "median GFLOP/s of the pooled side-by-side samples; best = fastest sample",
        },
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
