"""Benchmark: does the config the records choose hold up when it is timed again?

    python -m bench.choice [--shape 512,512,512] [--target opencl] [--runs 5] [--trials 64]

Tunes a matmul ``--runs`` times (seeds 1, 2, ...) from cold temporary databases, the
way ``autosched tune`` does (the finalists timed side by side at the end). For each
run it takes what compilers build, the config the records choose
(:func:`autosched.records.choice.chosen`: the leader of the final side-by-side round),
and the config of the fastest single reading (``Database.best``'s first, which they
took before 2026-12-02), with the rest of that final round, and times them again side
by side in a fresh measurement: ``--repeats`` batches of ``--rounds`` interleaved
rounds, in alternating order. Prints a table and writes bench/results/choice.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import autosched
from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions
from autosched.records import open_database
from autosched.records.choice import chosen
from autosched.tuning.runner import BatchRequest, DeviceSession
from bench.iree import machine_summary

RESULTS = Path(__file__).resolve().parent / "results"


def retime(session: DeviceSession, wl, target: str, configs: dict, repeats: int, rounds: int):
    """Each config's pooled median GFLOP/s in each of ``repeats`` side-by-side batches."""
    keys = list(configs)
    figures: dict[str, list[float]] = {k: [] for k in keys}
    for rep in range(repeats):
        order = keys if rep % 2 == 0 else keys[::-1]
        request = BatchRequest(
            wl.to_json(),
            target,
            session.slot().device_key,
            tuple(configs[k] for k in order),
            rounds=rounds,
        )
        for record in session.run(request):
            if record.ok and record.gflops:
                figures[record.config_key].append(record.gflops)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="512,512,512", help="M,N,K of the matmul")
    ap.add_argument("--target", default="opencl", choices=("opencl", "llvm"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "choice.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    m, n, k = (int(x) for x in args.shape.split(","))
    wl = autosched.workload("matmul", M=m, N=n, K=k)
    device = select_device(None, target=args.target)
    started = time.time()
    runs = []
    session = DeviceSession(device, args.target, timing=TimingOptions())
    try:
        for seed in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "records.db"
                autosched.tune(
                    wl, trials=args.trials, target=args.target, db=path, device=device, seed=seed
                )
                with open_database(path, create=False) as db:
                    dkey = device.key(args.target)
                    fastest = db.best(wl.key, device_key=dkey, target=args.target)[0]
                    pick = chosen(db, wl.key, device_key=dkey, target=args.target)
                    final = db.latest_round(wl.key, device_key=dkey, config_key=fastest.config_key)
            assert pick is not None
            best_final = max(r.gflops or 0.0 for r in final) if final else 0.0
            # the default schedule (far behind) is left out of the re-timing
            shown = {r.config_key: r for r in final if (r.gflops or 0) > 0.2 * best_final}
            shown.setdefault(fastest.config_key, fastest)
            configs = {c: r.config for c, r in shown.items()}
            figures = retime(session, wl, args.target, configs, args.repeats, args.rounds)
            median = {c: statistics.median(v) for c, v in figures.items() if v}
            run = {
                "seed": seed,
                "chosen": pick.config_key,
                "fastest_reading": fastest.config_key,
                "same": pick.config_key == fastest.config_key,
                "fastest_reading_gflops": fastest.gflops,
                "final_round_gflops": {r.config_key: r.gflops for r in final},
                "retimed_gflops": figures,
                "retimed_median": median,
                "chosen_over_fastest_reading": median[pick.config_key] / median[fastest.config_key],
                "best_retimed": max(median, key=median.get),
            }
            runs.append(run)
            print(
                f"run {seed}: chosen {pick.config_key[:8]} {median[pick.config_key]:7.1f}"
                f"  fastest reading {fastest.config_key[:8]} {median[fastest.config_key]:7.1f}"
                f"  ratio {run['chosen_over_fastest_reading']:.3f}"
                f"  {'same config' if run['same'] else 'differ'}",
                flush=True,
            )
    finally:
        session.close()
    differ = [r for r in runs if not r["same"]]
    ratios = [r["chosen_over_fastest_reading"] for r in differ]
    print(
        f"\n{len(runs)} runs; the final round's leader differed from the fastest reading in "
        f"{len(differ)}; re-timed, chosen / fastest reading there: "
        + (", ".join(f"{x:.3f}" for x in ratios) or "-")
    )
    result = {
        "benchmark": "choice",
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "machine": machine_summary(),
        "device": device.fingerprint(args.target),
        "workload": wl.to_json(),
        "target": args.target,
        "trials": args.trials,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "runs": runs,
        "differ": len(differ),
        "chosen_over_fastest_reading_where_they_differ": ratios,
        "wall_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
