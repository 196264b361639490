"""Which config the records hand a compiler, re-timed: the fastest single reading against
``Database.best`` (a config's readings' geometric mean).

For every replay sample (bench/replay) measured on this machine's device family, both
picks are taken from the sample's records (``Database.best`` through an in-memory SQLite
database, the code path ``compile`` takes) and, where they differ, timed again here side
by side: ``--reps`` times, each ``--rounds`` interleaved rounds pooled to one median.

    flock /tmp/autosched-cpu.lock .venv/bin/python -m bench.best_pick
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

from autosched.measure.device import select_device
from autosched.records.record import Record
from autosched.records.sqlite import MEMORY, SQLiteDatabase
from autosched.tuning.replay import read_records
from autosched.tuning.runner import BatchRequest, DeviceSession
from bench.iree import cpu_summary

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "replay"
RESULTS = HERE / "results"
TARGETS = ("llvm", "opencl")


def picks(records: list[Record]) -> tuple[Record, Record]:
    """(the config of the fastest single ok reading, ``Database.best``'s config)."""
    reading = min((r for r in records if r.ok and r.latency_s), key=lambda r: r.latency_s)
    with SQLiteDatabase(MEMORY) as db:
        db.add(records)
        (best,) = db.best(records[0].workload_key, device_key=records[0].device_key)
    return reading, best


def readings(records: list[Record], key: str) -> list[float]:
    return [r.gflops for r in records if r.config_key == key and r.ok and r.gflops]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULTS / "best_pick.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    entries = json.loads((SAMPLES / "caches.json").read_text())["caches"]
    devices = {t: select_device(None, target=t) for t in TARGETS}
    rows = []
    started = time.time()
    for entry in entries:
        records = read_records(SAMPLES / entry["file"])
        target = records[0].target
        device = devices.get(target)
        if device is None or records[0].device_family != device.family(target):
            continue
        reading, best = picks(records)
        row = {
            "sample": entry["file"].removesuffix(".jsonl.gz"),
            "workload": records[0].workload,
            "target": target,
            "same": reading.config_key == best.config_key,
        }
        for name, r in (("fastest_reading", reading), ("best", best)):
            seen = readings(records, r.config_key)
            row[name] = {
                "config": r.config,
                "readings": len(seen),
                "gflops_readings": [round(x, 2) for x in seen],
                "gflops_best": round(best.gflops, 2) if r is best else None,
            }
        if not row["same"]:
            session = DeviceSession(device, target)
            request = BatchRequest(
                workload=records[0].workload,
                target=target,
                device_key=device.key(target),
                configs=(reading.config, best.config),
                rounds=args.rounds,
                timeout_s=60.0,
            )
            now: dict[str, list[float]] = {"fastest_reading": [], "best": []}
            try:
                for _ in range(args.reps):
                    out = session.run(request)
                    for name, r in zip(now, out):
                        now[name].append(round(r.gflops, 2) if r.ok and r.gflops else 0.0)
            finally:
                session.close()
            for name, figures in now.items():
                row[name]["gflops_now"] = figures
            row["best_over_fastest_reading_now"] = [
                round(b / a, 3) if a else None for a, b in zip(now["fastest_reading"], now["best"])
            ]
        rows.append(row)
        _print(row)
    result = {
        "benchmark": "best_pick",
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "machine": {**cpu_summary(), "load_average": [round(x, 2) for x in os.getloadavg()]},
        "rounds": args.rounds,
        "reps": args.reps,
        "samples": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


def _print(row: dict) -> None:
    print(f"\n{row['sample']}: {'the same config' if row['same'] else 'two configs'}")
    for name in ("fastest_reading", "best"):
        p = row[name]
        seen = p["gflops_readings"]
        now = p.get("gflops_now")
        line = f"  {name:16} sample: {p['readings']:3d} readings {min(seen):7.1f}-{max(seen):7.1f}"
        if now:
            line += f"  now: median {statistics.median(now):7.1f} ({min(now):.1f}-{max(now):.1f})"
        print(line)
    if not row["same"]:
        print(f"  best / fastest reading now, per rep: {row['best_over_fastest_reading_now']}")


if __name__ == "__main__":
    main()
