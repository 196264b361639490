"""One round of an interleaved comparison: every program once through one measurement
worker, its latencies added to its list. Benchmarks alternate such rounds with the
vendor library's, so that every figure they compare comes from one window."""

from __future__ import annotations

from collections.abc import Mapping

from autosched.measure.runner import TestData, TimingOptions
from autosched.measure.worker import MeasureWorker


def measure_round(
    worker: MeasureWorker,
    programs: Mapping[str, object],
    data: TestData,
    timing: TimingOptions,
    latencies: dict[str, list[float]],
) -> None:
    """Measure each of ``programs`` once, in order, extending ``latencies[name]``.

    Raises:
        RuntimeError: a program failed (its status and error).
    """
    for name, program in programs.items():
        out = worker.measure(program, data, timing)
        if out.status != "ok":
            raise RuntimeError(f"{name}: {out.status}: {out.error}")
        latencies[name].extend(out.latencies)
