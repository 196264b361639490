"""The peers benchmark's metrics: pure functions of a run's per-trial GFLOP/s."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

CHECKPOINTS = (16, 32, 64)


def best_so_far(gflops: Sequence[float | None]) -> list[float]:
    """Best GFLOP/s after each trial; failed trials (None) keep the best so far (0 at first)."""
    out, best = [], 0.0
    for g in gflops:
        if g is not None and g > best:
            best = g
        out.append(best)
    return out


def best_after(curve: Sequence[float], trials: int) -> float | None:
    """The best after ``trials`` trials; a run that stopped earlier keeps its last figure."""
    if not curve:
        return None
    return curve[min(trials, len(curve)) - 1]


def trials_to_reach(curve: Sequence[float], threshold: float) -> int | None:
    """Trials (1-based) until the curve first reaches ``threshold``; None if it never does."""
    for i, g in enumerate(curve):
        if g >= threshold:
            return i + 1
    return None


def wall_to_reach(curve: Sequence[float], times: Sequence[float], threshold: float) -> float | None:
    """Seconds since the tuner started until the curve first reaches ``threshold``."""
    n = trials_to_reach(curve, threshold)
    return None if n is None else times[n - 1]


def mean_or_none(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def best_round_gflops(visits: Sequence[Sequence[float]], flops: float) -> float | None:
    """GFLOP/s of the fastest round's median latency; None without a timed round."""
    medians = [float(np.median(v)) for v in visits if len(v)]
    return flops / min(medians) / 1e9 if medians else None


def checkpoint_leaders(
    gflops: Sequence[float | None], checkpoints: Sequence[int] = CHECKPOINTS
) -> dict[int, int]:
    """Per checkpoint shorter than the run, the index (0-based) of the trial its best-so-far
    curve stands on there: the program a user of the tuner would take had it stopped."""
    out, best, lead = {}, None, None
    marks = {n for n in checkpoints if n < len(gflops)}
    for i, g in enumerate(gflops):
        if g is not None and (best is None or g > best):
            best, lead = g, i
        if i + 1 in marks and lead is not None:
            out[i + 1] = lead
    return out


def first_trials(keys: Sequence[Hashable]) -> dict[Hashable, int]:
    """Each config's first trial (1-based) in a run's order."""
    out: dict[Hashable, int] = {}
    for i, key in enumerate(keys):
        out.setdefault(key, i + 1)
    return out
