"""Benchmark: a farm job's client proposing for many device kinds, in 1 or more threads.

    python -m bench.proposers [--device-s 8] [--trials 48] [--proposers 1,2] [--rounds 2]

A farm job keeps one batch in flight per device, and its client proposes every batch:
the model search refits its cost models (seconds once the records grow) while the device
that asked waits. With many device kinds the proposals queue behind each other and the
devices idle. Here the job is the four OpenCL replay workloads (bench/replay: a 512^3
and a 127x1000x333 matmul, a softmax, a ResNet 3x3 conv) on the four CPU kinds sampled
(Xeon 6, Zen 3, Zen 4, Zen 5): 16 pairs, 16 devices. Each device answers a batch from its
sample after ``--device-s`` seconds of wall time (a remote device: it costs this machine
nothing), so the run's wall time is what a farm's would be with devices that take that
long. Each ``--proposers`` value runs the same job, in turn, ``--rounds`` times. Prints
a table (wall time, the devices' busy share, seconds a device waited for its next
batch) and writes bench/results/proposers.json (``--out``) with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np

from autosched.records.sqlite import SQLiteDatabase
from autosched.tuning.job import Job, Task
from autosched.tuning.loop import run_job
from autosched.tuning.replay import ReplayRunner, load_caches
from bench.iree import machine_summary

HERE = Path(__file__).resolve().parent
WORKLOADS = ("matmul-512", "matmul-127x1000x333", "softmax-1536x128", "conv2d-resnet3x3")
KINDS = ("xeon6", "zen3", "zen4", "zen5")


class TimedReplay(ReplayRunner):
    """A replay whose devices take ``device_s`` of wall time per batch."""

    def __init__(self, caches, *, device_s: float, devices: int, proposers: int) -> None:
        super().__init__(caches, devices=devices, proposers=proposers)
        self.device_s = device_s
        self.ready: dict[int, float] = {}  # handle -> when its device finishes
        self.busy_s = 0.0

    def submit(self, slot, request) -> int:
        handle = super().submit(slot, request)
        self.ready[handle] = time.monotonic() + self.device_s
        self.busy_s += self.device_s
        return handle

    def wait(self, handles, timeout_s: float):
        pending = [h for h in handles if h in self.ready]
        if not pending:
            return []
        first = min(self.ready[h] for h in pending)
        time.sleep(max(0.0, min(first - time.monotonic(), timeout_s)))
        now = time.monotonic()
        done = sorted(h for h in pending if self.ready[h] <= now)
        for h in done:
            del self.ready[h]
        return [(h, self._done.pop(h)) for h in done]


def one_run(caches, trials, batch, device_s, devices, proposers, seed):
    tasks, seen = [], set()
    for c in caches:
        if c.workload.key not in seen:
            seen.add(c.workload.key)
            tasks.append(Task(c.workload.op + str(len(tasks)), c.workload, c.target, trials))
    job = Job(name="farm", tasks=tuple(tasks), strategy="model", seed=seed, batch=batch)
    runner = TimedReplay(caches, device_s=device_s, devices=devices, proposers=proposers)
    db = SQLiteDatabase(":memory:")
    start = time.perf_counter()
    try:
        result = run_job(job, runner, db, finalists=0)
    finally:
        db.close()
    wall = time.perf_counter() - start
    devices = sum(s.count for s in runner.slots())
    batches = runner.busy_s / device_s
    top = {(c.workload.key, c.slot.device_key): c.best_gflops for c in caches}
    best = [
        max((r.gflops or 0.0) for r in p.history) / top[p.task.workload.key, p.slot.device_key]
        for p in result.pairs
    ]
    return {
        "proposers": proposers,
        "wall_s": wall,
        "devices": devices,
        "batches": int(batches),
        "trials": sum(len(p.measured) for p in result.pairs),
        "busy_share": runner.busy_s / (wall * devices),
        # Wall time a device spent waiting for its next batch, per batch after its first.
        "wait_per_batch_s": (wall * devices - runner.busy_s) / max(1.0, batches - devices),
        "best_fraction_mean": float(np.mean(best)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device-s", type=float, default=8.0, help="seconds a device takes a batch")
    ap.add_argument("--devices", type=int, default=4, help="devices of each kind")
    ap.add_argument("--trials", type=int, default=48, help="trials per task and device kind")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--proposers", default="1,2", help="thread counts, run in turn")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "proposers.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("autosched").setLevel(logging.ERROR)
    caches = []
    for w in WORKLOADS:
        for k in KINDS:
            caches += load_caches(HERE / "replay" / f"{w}-opencl-{k}.jsonl.gz")
    counts = [int(p) for p in args.proposers.split(",")]
    runs = []
    for r in range(args.rounds):
        for p in counts:  # in turn, so that their ratio is read in one run
            row = one_run(caches, args.trials, args.batch, args.device_s, args.devices, p, r)
            row["round"] = r
            runs.append(row)
            print(
                f"round {r} proposers {p}: {row['wall_s']:.1f} s, {row['batches']} batches, "
                f"devices busy {100 * row['busy_share']:.0f} %, "
                f"waited {row['wait_per_batch_s']:.1f} s a batch",
                flush=True,
            )
    summary = []
    base = statistics.median(x["wall_s"] for x in runs if x["proposers"] == counts[0])
    print(f"\n{'proposers':>9} {'wall s':>7} {'busy %':>7} {'wait s/batch':>12} {'speedup':>8}")
    for p in counts:
        mine = [x for x in runs if x["proposers"] == p]
        row = {
            "proposers": p,
            "wall_s": statistics.median(x["wall_s"] for x in mine),
            "busy_share": statistics.median(x["busy_share"] for x in mine),
            "wait_per_batch_s": statistics.median(x["wait_per_batch_s"] for x in mine),
            "best_fraction_mean": statistics.median(x["best_fraction_mean"] for x in mine),
        }
        row["speedup"] = base / row["wall_s"]
        summary.append(row)
        print(
            f"{p:>9} {row['wall_s']:>7.1f} {100 * row['busy_share']:>7.0f} "
            f"{row['wait_per_batch_s']:>12.2f} {row['speedup']:>7.2f}x"
        )
    data = {
        "benchmark": "a farm job's client proposing for 16 pairs on 4 device kinds in N threads",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python -m bench.proposers "
        + f"--device-s {args.device_s} --devices {args.devices} --trials {args.trials} "
        + f"--batch {args.batch} "
        + f"--proposers {args.proposers} --rounds {args.rounds}",
        "machine": machine_summary(),
        "workloads": list(WORKLOADS),
        "kinds": list(KINDS),
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
