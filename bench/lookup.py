"""Time ``autosched.compile``'s record lookup (not the TVM build) on a 100k-record database.

The database is synthetic but built through the real API (``Space.sample`` configs,
``Record`` objects, ``SQLiteDatabase.add``): 200 matmul workloads (shapes from
64..1024 per dimension, three epilogues) x 4 devices x 125 configs, 80% ok. The devices
are this machine's OpenCL device (exact key), the same hardware with another driver
version (same family), and two devices of another family. A quarter of the workloads
have no record on this exact device, so their lookup falls back to the sibling driver.

Scenarios, each on random workloads, every lookup consulting the temp database and the
shipped records like ``compile`` does:

* ``exact``: a workload tuned on this device;
* ``driver_mismatch``: a workload tuned only under the other driver version;
* ``nearest_shape``: a shape never tuned (the nearest tuned one is found and adapted);
* ``untuned``: a device of a family with no records (every step runs and finds nothing).

Two timings per scenario: ``lookup_config()`` with the databases open and the
workload's space built (the lookup proper), and ``find_config()``, which is everything
``compile`` does before building: opening the database file, the space, the lookup.
The first ``Space`` of a workload in a process runs TVM's loop-nest analysis; that cost
is reported apart, as are a few TVM builds, for scale.

Example::

    python -m bench.lookup                 # 100,000 records, 500 lookups per scenario
    python -m bench.lookup --records 20000 --lookups 200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from autosched.compiler import find_config
from autosched.compiler.lookup import SHIPPED, Source, lookup_config, shipped_database
from autosched.measure.device import Device, select_device
from autosched.ops import workload
from autosched.ops.base import Workload
from autosched.records.record import BUILD_ERROR, OK, RUN_ERROR, WRONG_RESULT, Record
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.select import make_space

log = logging.getLogger("bench.lookup")

SIZES = (64, 96, 128, 192, 256, 384, 512, 768, 1024)
EPILOGUES = ("none", "bias", "bias_relu")
DEVICES = 4
CONFIGS = 125


def synthetic_devices(dev: Device) -> list[Device]:
    """This device, itself under another driver, and two devices of another family."""
    return [
        dev,
        dataclasses.replace(dev, driver_version=dev.driver_version + "-other"),
        dataclasses.replace(dev, name="Synthetic GPU A", type="gpu", compute_units=64),
        dataclasses.replace(dev, name="Synthetic GPU B", type="gpu", compute_units=128),
    ]


def all_shapes() -> list[tuple[int, int, int, str]]:
    return [(m, n, k, e) for m in SIZES for n in SIZES for k in SIZES for e in EPILOGUES]


def fill(
    db: SQLiteDatabase, dev: Device, n_records: int, rng: np.random.Generator
) -> tuple[list[Workload], list[Workload], list[Workload]]:
    """Add ``n_records`` records; return (exact, driver-only, never tuned) workloads."""
    devices = synthetic_devices(dev)
    keys = [(d.key(), d.family(), d.fingerprint()) for d in devices]
    n_workloads = max(4, n_records // (DEVICES * CONFIGS))
    shapes = all_shapes()
    order = rng.permutation(len(shapes))
    tuned = [
        workload("matmul", M=m, N=n, K=k, epilogue=e)
        for m, n, k, e in (shapes[i] for i in order[:n_workloads])
    ]
    untuned = [
        workload("matmul", M=m, N=n, K=k, epilogue=e)
        for m, n, k, e in (shapes[i] for i in order[n_workloads : n_workloads + 200])
    ]
    exact, driver_only = [], []
    statuses = (OK,) * 8 + (BUILD_ERROR, WRONG_RESULT)
    errors = {BUILD_ERROR: "synthetic build error", WRONG_RESULT: "synthetic", RUN_ERROR: "x"}
    t0 = time.perf_counter()
    for w_index, wl in enumerate(tuned):
        space = make_space(wl, limits=dev.limits)
        configs = space.sample(rng, CONFIGS)
        # A quarter of the workloads were tuned only under the other driver version.
        slots = [0, 1, 2, 3] if w_index % 4 else [1, 1, 2, 3]
        (exact if w_index % 4 else driver_only).append(wl)
        batch = []
        for slot_i, slot in enumerate(slots):
            d_key, d_family, d_fp = keys[slot]
            for c_index in range(CONFIGS):
                config = configs[c_index % len(configs)]
                status = statuses[int(rng.integers(len(statuses)))]
                lat = float(rng.lognormal(-6.0, 1.0)) if status == OK else None
                batch.append(
                    Record(
                        workload_key=wl.key,
                        workload=wl.to_json(),
                        target="opencl",
                        device_key=d_key,
                        device_family=d_family,
                        device=d_fp,
                        config_key=config.key,
                        config=config.to_json(),
                        status=status,
                        error=errors.get(status, ""),
                        latencies=(lat,) * 3 if lat else (),
                        latency_s=lat,
                        spread=0.01 if lat else None,
                        gflops=wl.flops() / lat / 1e9 if lat else None,
                        timestamp=1.7e9 + w_index * 1e3 + slot_i * CONFIGS + c_index,
                        run_id=f"synthetic-{w_index}-{slot_i}",
                    )
                )
        db.add(batch)
    log.info("added %d records in %.1f s", len(db), time.perf_counter() - t0)
    return exact, driver_only, untuned


def _stats_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {
        "n": int(ms.size),
        "median_ms": float(np.median(ms)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def _time(calls: Sequence[Callable[[], object]], expect: str) -> list[float]:
    out = []
    for call in calls:
        t0 = time.perf_counter()
        found = call()
        out.append(time.perf_counter() - t0)
        assert found.provenance == expect, (found.provenance, expect)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000, help="records in the database")
    p.add_argument("--lookups", type=int, default=500, help="lookups per scenario")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench/results/lookup.json"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # The fallbacks warn on every lookup; the benchmark wants only its own lines.
    logging.getLogger("autosched").setLevel(logging.ERROR)
    rng = np.random.default_rng(args.seed)
    dev = select_device()
    unseen = dataclasses.replace(dev, name="Unseen device", type="gpu", compute_units=7)

    with tempfile.TemporaryDirectory(prefix="autosched-bench-lookup-") as tmp:
        path = Path(tmp) / "records.db"
        with SQLiteDatabase(path) as db:
            exact, driver_only, untuned = fill(db, dev, args.records, rng)
            n_records = len(db)

        t0 = time.perf_counter()
        shipped = shipped_database()
        shipped_load_s = time.perf_counter() - t0
        # A workload the shipped records hold exactly would not take its scenario's path.
        in_shipped = {r.workload_key for r in shipped.query()}
        exact, driver_only, untuned = (
            [w for w in ws if w.key not in in_shipped] for ws in (exact, driver_only, untuned)
        )

        scenarios = {
            "exact": (exact, dev),
            "driver_mismatch": (driver_only, dev),
            "nearest_shape": (untuned, dev),
            "untuned": (exact, unseen),
        }
        picks = {
            name: [wls[int(i)] for i in rng.integers(len(wls), size=args.lookups)]
            for name, (wls, _) in scenarios.items()
        }
        # The first Space of a workload runs TVM's loop-nest analysis once per process
        # (the never-tuned shapes have not been seen by this process yet).
        analyze_s = []
        for wl in {w.key: w for w in picks["nearest_shape"]}.values():
            t0 = time.perf_counter()
            make_space(wl, limits=dev.limits)
            analyze_s.append(time.perf_counter() - t0)

        results: dict[str, dict[str, dict[str, float]]] = {}
        with SQLiteDatabase(path, create=False) as db:
            sources = [Source(str(path), db), Source(SHIPPED, shipped)]
            for name, (_, device) in scenarios.items():
                spaces = [make_space(wl, limits=device.limits) for wl in picks[name]]
                lookup_config(spaces[0], device=device, sources=sources)  # warm the caches
                proper = _time(
                    [
                        lambda s=s, d=device: lookup_config(s, device=d, sources=sources)
                        for s in spaces
                    ],
                    name,
                )
                whole = _time(
                    [
                        lambda wl=wl, d=device: find_config(wl, device=d, db=path)
                        for wl in picks[name]
                    ],
                    name,
                )
                results[name] = {
                    "lookup_config": _stats_ms(proper),
                    "find_config": _stats_ms(whole),
                }
            build_cases = [
                (space, lookup_config(space, device=dev, sources=sources).config)
                for space in (make_space(wl, limits=dev.limits) for wl in picks["exact"][:5])
            ]

    # TVM builds of found configs, for scale (this is what the lookup is not).
    from autosched.measure.build import build

    build_s = []
    for space, config in build_cases:
        t0 = time.perf_counter()
        build(space, config)
        build_s.append(time.perf_counter() - t0)

    print(f"{n_records} records, {args.lookups} lookups per scenario (ms)")
    print(f"{'scenario':<16} {'what':<14} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for name, per in results.items():
        for what, s in per.items():
            print(
                f"{name:<16} {what:<14} {s['median_ms']:8.3f} {s['p90_ms']:8.3f} "
                f"{s['p99_ms']:8.3f} {s['max_ms']:8.3f}"
            )
    print(
        f"once per process: shipped records {shipped_load_s * 1e3:.1f} ms ({len(shipped)} records); "
        f"first Space of a workload (TVM analysis) median {statistics.median(analyze_s) * 1e3:.1f} ms"
    )
    print(f"for scale: a TVM build takes {statistics.median(build_s) * 1e3:.0f} ms (median of 5)")
    report = {
        "records": n_records,
        "lookups_per_scenario": args.lookups,
        "seed": args.seed,
        "machine": {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version},
        "device": dev.name,
        "results": results,
        "shipped_load_ms": shipped_load_s * 1e3,
        "shipped_records": len(shipped),
        "first_space_median_ms": statistics.median(analyze_s) * 1e3,
        "tvm_build_median_ms": statistics.median(build_s) * 1e3,
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
