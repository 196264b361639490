"""Records as the tuner writes them, for a chosen config, without measuring anything."""

from __future__ import annotations

import time

from autosched.ops.base import Workload
from autosched.records.record import Record
from autosched.space.config import Config


def record_for(
    workload: Workload,
    device,
    config: Config,
    *,
    target: str = "opencl",
    latency_s: float = 1e-4,
    run_id: str = "test-run",
) -> Record:
    """An ok record of ``config`` for ``workload`` on ``device`` (an OpenCL device or the
    host CPU), as if it had run in ``latency_s``."""
    return Record(
        workload_key=workload.key,
        workload=workload.to_json(),
        target=target,
        device_key=device.key(target),
        device_family=device.family(target),
        device=device.fingerprint(target),
        config_key=config.key,
        config=config.to_json(),
        status="ok",
        latencies=(latency_s, latency_s, latency_s),
        latency_s=latency_s,
        spread=0.0,
        gflops=workload.flops() / latency_s / 1e9,
        timestamp=time.time(),
        run_id=run_id,
    )
