"""End-to-end latency of a model's runtimes, timed side by side.

A runner is a no-argument callable that computes the model once on fixed inputs and
returns its outputs as numpy arrays: a built Relax executable in TVM's VM
(:func:`tvm_runner`), or one of the model's own frameworks (:meth:`Model.runtimes`:
onnxruntime, torch eager). :func:`time_rounds` times them in interleaved rounds, so that
figures compared with each other come from one window of a shared machine.
``autosched model tune`` and ``bench/models.py`` both time through here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from autosched.models.model import Model


class Runner(Protocol):
    """One way of computing the model: call it, get numpy outputs."""

    def __call__(self) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    spread: float  # interquartile range over the median
    samples: int

    @classmethod
    def of(cls, seconds: list[float]) -> Timing:
        lat = np.asarray(seconds) * 1e3
        q1, med, q3 = np.percentile(lat, [25, 50, 75])
        return cls(float(med), float(lat.min()), float((q3 - q1) / med), int(lat.size))


def tvm_runner(executable: Any, model: Model, arrays: Mapping[str, np.ndarray]) -> Runner:
    """A built Relax executable on the host CPU, its inputs copied to the device once."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(arrays[spec.name]) for spec in model.inputs]
    main = vm["main"]

    def run() -> list[np.ndarray]:
        out = main(*args)
        return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]

    return run


def max_error(got: list[np.ndarray], expected: tuple[np.ndarray, ...]) -> float:
    """Largest absolute difference relative to the reference's largest magnitude
    (infinite where the outputs' count or shapes differ)."""
    if len(got) != len(expected):
        return float("inf")
    errs = [
        float(np.abs(g - e).max() / max(np.abs(e).max(), 1e-30))
        if g.shape == e.shape
        else float("inf")
        for g, e in zip(got, expected)
    ]
    return max(errs)


def time_rounds(
    runners: Mapping[str, Runner], *, rounds: int, round_s: float, warmup: int = 1
) -> dict[str, Timing]:
    """Interleaved rounds: in each, every runner runs for about ``round_s`` (at least once)."""
    for run in runners.values():
        for _ in range(warmup):
            run()
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            spent = 0.0
            while spent < round_s:
                t = time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - t)
                spent += samples[name][-1]
    return {name: Timing.of(s) for name, s in samples.items()}
