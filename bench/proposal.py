"""Benchmark: how long the model search takes to propose a batch as its records grow.

    python -m bench.proposal [--sizes 64,512,1200,3000] [--repeats 2] [--believer-rows N,...]

An overnight tune of one workload keeps adding records, and every batch the search
refits its cost models on them while the device waits. For each replay sample below
(records of one workload measured on one device, bench/replay), a model search over the
device's whole space observes the sample's first N records (a seeded shuffle) and
proposes one batch of 16; each N is timed ``--repeats`` times (a fresh search each, on
one core of this machine), median and range reported. ``--believer-rows`` sets the cap
on the rows of a batch's believer refits (:data:`autosched.search.sources.BELIEVER_ROWS`;
a large number: no cap, as before it); several values are timed in turn, repeat by
repeat, so their ratio is read in one run. Prints a table and writes
bench/results/proposal.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

import autosched.search.sources as sources
from autosched.search import make_strategy
from autosched.tuning.replay import load_caches
from autosched.tuning.runner import device_space
from bench.iree import machine_summary

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLES = ("softmax-1536x128-llvm-xeon6", "matmul-512-opencl-xeon6")
BATCH = 16


def time_proposal(cache, n: int, seed: int) -> float:
    """Seconds for a fresh model search that has observed ``n`` of the sample's records
    to propose a batch (its refits included)."""
    space = device_space(cache.workload, target=cache.target, slot=cache.slot)
    records = list(cache.records.values())
    order = np.random.default_rng(seed).permutation(len(records))[:n]
    search = make_strategy(
        "model", space, rng=np.random.default_rng(seed), family=cache.slot.family
    )
    search.observe([records[i] for i in order])
    start = time.perf_counter()
    configs = search.propose(BATCH)
    elapsed = time.perf_counter() - start
    if not configs:
        raise RuntimeError(f"{n} records: the search proposed nothing")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,512,1200,3000")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--believer-rows", default=str(sources.BELIEVER_ROWS))
    ap.add_argument("--samples", default=",".join(SAMPLES))
    ap.add_argument("--out", type=Path, default=RESULTS / "proposal.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    caps = [int(c) for c in args.believer_rows.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    replay = Path(__file__).resolve().parent / "replay"
    rows = []
    print(f"{'sample':40s} {'records':>7s} {'believer rows':>13s} {'propose s':>9s}  range")
    for name in args.samples.split(","):
        (cache,) = load_caches(replay / f"{name}.jsonl.gz")
        time_proposal(cache, min(sizes), 0)  # warm-up: first calls, caches of the space
        for n in sizes:
            if n > len(cache.records):
                continue
            times: dict[int, list[float]] = {cap: [] for cap in caps}
            for seed in range(args.repeats):
                for cap in caps:  # in turn, so that their ratio is read side by side
                    sources.BELIEVER_ROWS = cap
                    times[cap].append(time_proposal(cache, n, seed))
            for cap in caps:
                row = {
                    "sample": name,
                    "records": n,
                    "believer_rows": cap,
                    "propose_s": float(np.median(times[cap])),
                    "times_s": times[cap],
                }
                rows.append(row)
                low, high = min(times[cap]), max(times[cap])
                print(f"{name:40s} {n:7d} {cap:13d} {row['propose_s']:9.2f}  {low:.2f}-{high:.2f}")
    data = {
        "benchmark": "model search: seconds to propose a batch of 16 after N records",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_summary(),
        "batch": BATCH,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
