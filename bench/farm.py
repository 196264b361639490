"""Benchmark: what running on Dask costs against the single-workload tuner.

    python -m bench.farm [--op matmul --shape 256,256,256 --trials 32 --rounds 2]

Two figures, measured in one run on the default OpenCL device:

* trials per hour of a one-task job on a one-worker local Dask cluster against
  ``autosched.tune`` of the same workload on the same device, each from a cold
  database, interleaved for ``--rounds`` rounds (target: job / tune >= 0.9);
* batch dispatch latency: the round trip of an empty batch from the job's client to
  the device's worker and back (submit -> result), median and spread over 50.

Prints a table and writes bench/results/farm.json with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import autosched
from autosched.measure.cpu import host_cpu
from autosched.measure.device import select_device


def _tune(wl, trials: int, batch: int, seed: int, db: Path) -> float:
    start = time.perf_counter()
    res = autosched.tune(wl, trials=trials, batch=batch, db=db, seed=seed)
    assert res.trials == trials, res.trials
    return time.perf_counter() - start


def _job(wl, trials: int, batch: int, seed: int, db: Path) -> tuple[float, float]:
    """Wall time of the job (the loop alone, and with the cluster's start and stop)."""
    from distributed import Client

    from autosched.farm.runner import DaskRunner, local_cluster
    from autosched.records.sqlite import SQLiteDatabase
    from autosched.tuning import Job, Task
    from autosched.tuning.loop import run_job

    job = Job(name="bench", tasks=(Task("bench", wl, "opencl", trials),), batch=batch, seed=seed)
    start = time.perf_counter()
    database = SQLiteDatabase(db)
    with local_cluster(["opencl"]) as cluster, Client(cluster) as client:
        loop_start = time.perf_counter()
        result = run_job(job, DaskRunner(client), database)
        loop_s = time.perf_counter() - loop_start
    database.close()
    assert len(result.pairs[0].measured) == trials
    return loop_s, time.perf_counter() - start


def _dispatch_latency(n: int = 50) -> list[float]:
    from distributed import Client

    from autosched.farm.runner import DaskRunner, local_cluster
    from autosched.tuning.runner import BatchRequest

    wl = autosched.workload("matmul", M=64, N=64, K=64)
    with local_cluster(["opencl"]) as cluster, Client(cluster) as client:
        runner = DaskRunner(client)
        (slot,) = runner.slots()
        request = BatchRequest(wl.to_json(), "opencl", slot.device_key, ())
        runner.wait([runner.submit(slot, request)], 60)  # the worker opens the workload once
        out = []
        for _ in range(n):
            start = time.perf_counter()
            handle = runner.submit(slot, request)
            while not runner.wait([handle], 10):
                pass
            out.append(time.perf_counter() - start)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="matmul")
    p.add_argument("--shape", default="256,256,256")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "farm.json"))
    args = p.parse_args()
    from autosched.ops.shape import parse_shape

    wl = autosched.workload(args.op, **parse_shape(args.op, args.shape))
    device = select_device()
    cpu = host_cpu()
    tune_s, job_s, job_total_s = [], [], []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            # Alternate which goes first, so drift on a shared machine hits both alike.
            order = ("tune", "job") if r % 2 == 0 else ("job", "tune")
            for what in order:
                db = Path(tmp) / f"{what}.db"
                if what == "tune":
                    tune_s.append(_tune(wl, args.trials, args.batch, r, db))
                else:
                    loop_s, total = _job(wl, args.trials, args.batch, r, db)
                    job_s.append(loop_s)
                    job_total_s.append(total)
    latency = _dispatch_latency()
    per_hour = lambda s: args.trials / s * 3600  # noqa: E731
    ratios = [t / j for t, j in zip(tune_s, job_s)]
    rows = [
        ("autosched tune", statistics.median(tune_s), per_hour(statistics.median(tune_s))),
        ("job, loop only", statistics.median(job_s), per_hour(statistics.median(job_s))),
        ("job, with cluster start", statistics.median(job_total_s),
         per_hour(statistics.median(job_total_s))),
    ]  # fmt: skip
    print(f"{wl} x {args.trials} trials on {device.name}; CPU {cpu.name} ({', '.join(cpu.isa)})")
    print(f"{'':<26}{'wall s':>9}{'trials/hour':>13}")
    for name, wall, rate in rows:
        print(f"{name:<26}{wall:>9.1f}{rate:>13.0f}")
    print(f"job/tune trials per hour, per round: {', '.join(f'{x:.2f}' for x in ratios)} "
          f"(target >= 0.9)")  # fmt: skip
    lat = np.asarray(latency) * 1e3
    q1, med, q3 = np.percentile(lat, [25, 50, 75])
    print(
        f"batch dispatch latency: median {med:.1f} ms, IQR {q1:.1f}-{q3:.1f} ms ({len(lat)} batches)"
    )
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": {"model": cpu.name, "isa": list(cpu.isa), "cores": cpu.cores},
        "device": device.name,
        "workload": wl.to_json(),
        "trials": args.trials,
        "batch": args.batch,
        "tune_wall_s": tune_s,
        "job_loop_wall_s": job_s,
        "job_total_wall_s": job_total_s,
        "job_over_tune_trials_per_hour": ratios,
        "dispatch_latency_ms": {"median": med, "q1": q1, "q3": q3, "n": len(lat)},
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
