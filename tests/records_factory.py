"""Plausible measurement records for the records tests (no device needed)."""

from __future__ import annotations

import hashlib
from typing import Any

from autosched.records import Record
from autosched.records.record import canonical_json

PLATFORM = "Portable Computing Language"


def _hash(value: Any) -> str:
    return hashlib.sha1(canonical_json(value).encode()).hexdigest()[:16]


def make_record(
    i: int = 0,
    *,
    op: str = "matmul",
    m: int = 64,
    device_name: str = "cpu",
    driver: str = "3.1",
    target: str = "opencl",
    status: str = "ok",
    latency: float | None = None,
    run_id: str = "run-1",
    timestamp: float | None = None,
    config_key: str | None = None,
    started_at: float | None = None,
    rounds: int = 0,
) -> Record:
    """A plausible measurement of config ``i`` of a matmul on a PoCL device; ``started_at``
    is its batch's start, ``rounds`` > 0 makes it a side-by-side round's reading."""
    workload = {
        "op": op,
        "params": {"M": m, "N": 64, "K": 64, "epilogue": "none"},
        "dtype": "float32",
    }
    device = {"platform": PLATFORM, "device": device_name, "driver_version": driver}
    ok = status == "ok"
    lat = latency if latency is not None else 1e-3 * (1 + i)
    return Record(
        workload_key=f"{op}-{_hash(workload)}",
        workload=workload,
        target=target,
        device_key=_hash({"target": target, **device}),
        device_family=_hash({"target": target, "platform": PLATFORM, "device": device_name}),
        device=device,
        config_key=config_key if config_key is not None else f"cfg-{i:04d}",
        config={"tile_m": 4 * (i + 1), "vector": 16, "unroll_k": 2},
        status=status,
        error="" if ok else f"{status} of config {i}",
        latencies=(lat * 0.99, lat, lat * 1.02) if ok else (),
        latency_s=lat if ok else None,
        spread=0.03 if ok else None,
        gflops=2 * m * 64 * 64 / lat / 1e9 if ok else None,
        timestamp=1.7e9 + i if timestamp is None else timestamp,
        run_id=run_id,
        started_at=started_at,
        rounds=rounds,
    )
