"""Measure random and mutated-good matmul configs on the OpenCL device; write JSON Lines.

The output is a file of real measurements (one ``Record.to_json()`` per line) that the
cost model's tests and benchmark replay without hardware. Workloads are interleaved
round-robin so that a burst of noise on the machine hits every shape alike.

``tests/data/matmul_pocl_records.jsonl`` (826 records, about 5 minutes) was written by::

    python -m bench.collect_records --out tests/data/matmul_pocl_records.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from autosched.errors import ScheduleError
from autosched.measure.build import build
from autosched.measure.device import Device, select_device
from autosched.measure.runner import TestData, TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import workload
from autosched.ops.base import Workload
from autosched.records.record import BUILD_ERROR, INVALID, OK, Record
from autosched.space.config import Config
from autosched.space.select import make_space
from autosched.space.space import Space

log = logging.getLogger("collect_records")

SHAPES: tuple[tuple[int, int, int], ...] = (
    (128, 128, 128),
    (256, 256, 128),
    (256, 256, 256),
    (512, 256, 256),
    (256, 512, 128),
)


class Collector:
    """Measures configs of several workloads on one device and keeps the records."""

    def __init__(
        self,
        device: Device,
        workloads: Sequence[Workload],
        *,
        timing: TimingOptions,
        timeout_s: float,
        run_id: str,
    ) -> None:
        self.device = device
        self.timing = timing
        self.run_id = run_id
        self.spaces = {w.key: make_space(w, limits=device.limits) for w in workloads}
        self.data = {}
        for w in workloads:
            inputs = w.make_inputs(np.random.default_rng(0))
            rtol, atol = w.tolerance()
            self.data[w.key] = TestData(w.key, inputs, w.reference(inputs), rtol, atol)
        self.worker = MeasureWorker(device, timeout_s=timeout_s)
        self.records: list[Record] = []
        self.seen: set[tuple[str, str]] = set()
        self._device_fields = {
            "device_key": device.key(),
            "device_family": device.family(),
            "device": device.fingerprint(),
        }

    def measure(self, space: Space, config: Config) -> Record | None:
        w = space.workload
        if (w.key, config.key) in self.seen:
            return None
        self.seen.add((w.key, config.key))
        status, error, latencies = OK, "", ()
        try:
            program = build(space, config)
        except ScheduleError as exc:
            status, error = INVALID, str(exc)[:2000]
        except Exception as exc:  # TVM errors come in many types; all are build errors here
            status, error = BUILD_ERROR, f"{type(exc).__name__}: {str(exc)[:2000]}"
        else:
            outcome = self.worker.measure(program, self.data[w.key], self.timing)
            status, error, latencies = outcome.status, outcome.error, outcome.latencies
        fields: dict = {}
        if status == OK:
            lat = np.asarray(latencies)
            median = float(np.median(lat))
            q1, q3 = np.percentile(lat, [25, 75])
            fields = {
                "latencies": tuple(float(x) for x in lat),
                "latency_s": median,
                "spread": float((q3 - q1) / median),
                "gflops": w.flops() / median / 1e9,
            }
        record = Record(
            workload_key=w.key,
            workload=w.to_json(),
            target="opencl",
            config_key=config.key,
            config=config.to_json(),
            status=status,
            error=error,
            timestamp=time.time(),
            run_id=self.run_id,
            **self._device_fields,
            **fields,
        )
        self.records.append(record)
        log.info(
            "%s %s %s %s",
            w,
            status,
            f"{record.gflops:.1f} GFLOP/s" if record.gflops else error[:100],
            config.to_json(),
        )
        return record

    def best_configs(self, workload_key: str, k: int) -> list[Config]:
        ok = [r for r in self.records if r.workload_key == workload_key and r.ok]
        ok.sort(key=lambda r: -(r.gflops or 0.0))
        return [Config.from_json(r.config) for r in ok[:k]]

    def close(self) -> None:
        self.worker.close()


def collect(
    *,
    shapes: Sequence[tuple[int, int, int]],
    n_random: int,
    n_mutated: int,
    seed: int,
    timing: TimingOptions,
    timeout_s: float,
    out: Path,
) -> list[Record]:
    rng = np.random.default_rng(seed)
    device = select_device()
    workloads = [workload("matmul", M=m, N=n, K=k) for m, n, k in shapes]
    col = Collector(
        device, workloads, timing=timing, timeout_s=timeout_s, run_id=uuid.uuid4().hex[:12]
    )
    spaces = list(col.spaces.values())
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0

    def flush() -> None:
        nonlocal written
        with out.open("a") as f:
            for r in col.records[written:]:
                f.write(json.dumps(r.to_json(), sort_keys=True) + "\n")
        written = len(col.records)

    try:
        # Phase 1: the default plus uniform random configs, shapes interleaved.
        pools = {s.workload.key: [s.default(), *s.sample(rng, n_random)] for s in spaces}
        for i in range(n_random + 1):
            for s in spaces:
                pool = pools[s.workload.key]
                if i < len(pool):
                    col.measure(s, pool[i])
            flush()
        # Phase 2: one-knob mutations and crossovers of each shape's best so far, so the
        # data also covers the good region the search will spend its time in.
        for _ in range(n_mutated):
            for s in spaces:
                best = col.best_configs(s.workload.key, 6)
                if not best:
                    continue
                parent = best[int(rng.integers(len(best)))]
                child = (
                    s.crossover(parent, best[int(rng.integers(len(best)))], rng)
                    if rng.random() < 0.25
                    else s.mutate(parent, rng)
                )
                if child is not None:
                    col.measure(s, child)
            flush()
    finally:
        flush()
        col.close()
    return col.records


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("tests/data/matmul_pocl_records.jsonl"))
    p.add_argument("--random", type=int, default=120, help="random configs per shape")
    p.add_argument("--mutated", type=int, default=60, help="mutated-good configs per shape")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-time", type=float, default=0.03, help="timed kernel seconds per config")
    p.add_argument("--max-repeats", type=int, default=30)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per candidate")
    p.add_argument(
        "--shape",
        action="append",
        default=None,
        metavar="MxNxK",
        help="repeatable; default: 5 shapes",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    shapes = (
        [tuple(int(x) for x in s.lower().split("x")) for s in args.shape] if args.shape else SHAPES
    )
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; remove it or choose another --out")
    t0 = time.time()
    records = collect(
        shapes=shapes,
        n_random=args.random,
        n_mutated=args.mutated,
        seed=args.seed,
        timing=TimingOptions(min_time_s=args.min_time, max_repeats=args.max_repeats),
        timeout_s=args.timeout,
        out=args.out,
    )
    n_ok = sum(r.ok for r in records)
    log.info("%d records (%d ok) in %.0f s -> %s", len(records), n_ok, time.time() - t0, args.out)


if __name__ == "__main__":
    main()
