"""Benchmark: records per second into SQLite and PostgreSQL with concurrent writers.

    python -m bench.records [--writers 1,4,8 --batches 40 --batch 16]

Each writer is a process of its own (as farm clients and tuners are) that adds
``--batches`` batches of ``--batch`` records, one transaction per batch, then adds one
batch written by another writer again (a retried batch). Afterwards the database must
hold every record exactly once. PostgreSQL runs as a throwaway local server (Debian's
postgresql, as the tests start it); SQLite is a file in WAL mode on local disk.
Prints a table and writes bench/results/records.json with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from autosched.measure.cpu import host_cpu
from autosched.records import open_database
from autosched.records.record import OK, Record


def _record(writer: int, i: int) -> Record:
    latency = 1e-3 * (1 + (i % 7))
    return Record(
        workload_key="matmul-bench",
        workload={"op": "matmul", "params": {"M": 512, "N": 512, "K": 512}, "dtype": "float32"},
        target="opencl",
        device_key="bench-device",
        device_family="bench-family",
        device={"name": "bench", "target": "opencl"},
        config_key=f"w{writer}-c{i}",
        config={"tile.i": [1, 16, 4], "tile.j": [2, 16, 8], "vec": 16, "writer": writer, "i": i},
        status=OK,
        error="",
        latencies=tuple(latency * (1 + 0.01 * k) for k in range(20)),
        latency_s=latency,
        spread=0.02,
        gflops=0.268 / latency,
        timestamp=1.7e9 + writer * 1e5 + i,
        run_id=f"bench-{writer}",
    )


def _writer(url: str, writer: int, batches: int, size: int, others: int, go) -> None:
    db = open_database(url)
    go.wait()
    for b in range(batches):
        db.add([_record(writer, b * size + k) for k in range(size)])
    other = (writer + 1) % others
    db.add([_record(other, k) for k in range(size)])  # a batch retried by someone else
    db.close()


def run(url: str, writers: int, batches: int, size: int) -> tuple[float, int]:
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    procs = [
        ctx.Process(target=_writer, args=(url, w, batches, size, writers, go))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    time.sleep(2.0)  # every writer has opened the database
    start = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    wall = time.perf_counter() - start
    db = open_database(url)
    stored = len(db.query())
    db.close()
    return wall, stored


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writers", default="1,4,8")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "records.json"))
    args = p.parse_args()
    from tests.pg_server import PgServer

    cpu = host_cpu()
    rows = []
    server = PgServer().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in (int(x) for x in args.writers.split(",")):
                for backend in ("sqlite", "postgresql"):
                    if backend == "sqlite":
                        url = str(Path(tmp) / f"bench-{n}.db")
                    else:
                        url = server.url(server.new_database())
                    wall, stored = run(url, n, args.batches, args.batch)
                    expected = n * args.batches * args.batch
                    assert stored == expected, (backend, n, stored, expected)
                    rows.append(
                        {
                            "backend": backend,
                            "writers": n,
                            "records": expected,
                            "wall_s": wall,
                            "records_per_s": (expected + n * args.batch) / wall,
                            "stored_once": stored == expected,
                        }
                    )
    finally:
        server.stop()
    print(f"CPU {cpu.name} ({', '.join(cpu.isa)}), {cpu.cores} cores; batches of {args.batch}")
    print(f"{'backend':<12}{'writers':>8}{'records':>9}{'wall s':>8}{'records/s':>11}  stored once")
    for r in rows:
        print(
            f"{r['backend']:<12}{r['writers']:>8}{r['records']:>9}{r['wall_s']:>8.2f}"
            f"{r['records_per_s']:>11.0f}  {'yes' if r['stored_once'] else 'NO'}"
        )
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": {"model": cpu.name, "isa": list(cpu.isa), "cores": cpu.cores},
        "batch": args.batch,
        "batches_per_writer": args.batches,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
