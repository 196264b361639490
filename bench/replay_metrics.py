"""What bench/replay.py reports per cache and strategy, from the runs' trial sequences.

A run is the sequence of configs a strategy measured, in order (its trials); each trial's
value is the cache's recorded GFLOP/s (0 for a config that failed). From a run's
best-so-far curve, as a fraction of the cache's best:

* ``trials_to_X``: the first trial at which the curve reaches X (90/95/99 %); the
  median over the seeds, a run that never gets there counting as infinitely many
  (``None`` when the median is such a run).
* ``best_at_N``: the curve at trial N (16/32/64), the median over the seeds.
* ``score``: the score of Willemsen, van Nieuwpoort and van Werkhoven, "A methodology
  for comparing optimization algorithms for auto-tuning" (FGCS 2024): the mean best-so-far
  curve of the runs (in latency, lower is better) standardised against the calculated
  random-search baseline, ``(curve - random) / (optimum - random)`` at each trial, and
  averaged over the budget. 0 is random search, 1 the cache's optimum from the first
  trial. The baseline and the standardisation are the `autotuning-methodology` package's
  own (:class:`autotuning_methodology.baseline.RandomSearchCalculatedBaseline`), fed
  through :class:`CacheStatistics`, which stands in for its ``SearchspaceStatistics`` (that
  class reads Kernel Tuner cache files from an experiment folder; the cache is already
  in memory here). Where the paper averages over a time range cut off where random
  search reaches a percentile of the optimum, this averages over trials 1..budget (the
  budget is fixed in trials here); a run's trials before its first working config count
  as the cache's slowest latency.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

TARGETS = (0.90, 0.95, 0.99)
CHECKPOINTS = (16, 32, 64)
# Bootstrap resamples of a cache's seeds for the interval of transfer's paired difference.
NOISE_RESAMPLES = 2000


def best_so_far(values: Sequence[float], best: float, budget: int) -> np.ndarray:
    """The run's best value after each of ``budget`` trials, as a fraction of ``best``
    (a run that stopped early keeps its last best)."""
    curve = np.zeros(budget)
    if len(values):
        acc = np.maximum.accumulate(np.asarray(values[:budget], dtype=float))
        curve[: len(acc)] = acc
        curve[len(acc) :] = acc[-1]
    return curve / best


def trials_to(curve: np.ndarray, fraction: float) -> float:
    """The 1-based trial at which ``curve`` first reaches ``fraction`` (inf if never)."""
    hit = np.flatnonzero(curve >= fraction - 1e-12)
    return float(hit[0] + 1) if len(hit) else math.inf


def median_or_none(values: Sequence[float]) -> float | None:
    m = float(np.median(np.asarray(values, dtype=float)))
    return None if math.isinf(m) else m


class CacheStatistics:
    """The part of ``autotuning_methodology``'s ``SearchspaceStatistics`` its random
    baseline reads, built from the latencies of a cache's working configs."""

    minimization = True

    def __init__(self, latencies: Sequence[float]) -> None:
        finite = np.sort(np.asarray([x for x in latencies if x and math.isfinite(x)], dtype=float))
        self.objective_performances_total_sorted = finite  # ascending
        self.objective_performances_total_sorted_nan = finite  # best first (no NaN kept)

    def total_performance_absolute_optimum(self) -> float:
        return float(self.objective_performances_total_sorted[0])

    def total_performance_minimum(self) -> float:
        return float(self.objective_performances_total_sorted[0])

    def total_performance_maximum(self) -> float:
        return float(self.objective_performances_total_sorted[-1])


def seed_scores(
    runs: Sequence[Sequence[float | None]], cache_latencies: Sequence[float], budget: int
) -> np.ndarray:
    """Each run's share of the score of Willemsen et al. (see the module docstring): the
    standardisation is linear in the curve, so the score of the runs' mean curve is the
    mean of these; resampling them resamples the score (:func:`support`).

    Args:
        runs: per seed, each trial's latency in seconds (None for a failed config).
        cache_latencies: the latency of every working config of the cache.
        budget: trials per run.
    """
    from autotuning_methodology.baseline import RandomSearchCalculatedBaseline

    stats = CacheStatistics(cache_latencies)
    worst = stats.total_performance_maximum()
    curves = []
    for run in runs:
        lat = np.array([worst if x is None else x for x in run[:budget]], dtype=float)
        if len(lat) == 0:
            lat = np.array([worst])
        acc = np.minimum.accumulate(lat)
        curve = np.full(budget, acc[-1])
        curve[: len(acc)] = acc
        curves.append(curve)
    fevals = np.arange(1, budget + 1)
    baseline = RandomSearchCalculatedBaseline(stats)
    # On a small cache random search is expected to hold the optimum before the budget
    # ends (121 configs, 64 trials: at trial 48), where the standardised curve divides
    # by zero: the score is then taken over the trials before that. (Up to rounding: the
    # baseline's curve can end 1e-21 s above an optimum that is a mean of readings.)
    random_curve = baseline.get_curve(fevals, "fevals")
    optimum = stats.total_performance_absolute_optimum()
    reached = np.flatnonzero(random_curve <= optimum * (1.0 + 1e-9))
    n = int(reached[0]) if len(reached) else budget
    if n == 0:
        return np.full(len(curves), np.nan)
    standardised = baseline.get_standardised_curves(
        fevals[:n], [c[:n] for c in curves], x_type="fevals"
    )
    return np.array([float(np.mean(c)) for c in standardised])


def methodology_score(
    runs: Sequence[Sequence[float | None]], cache_latencies: Sequence[float], budget: int
) -> float:
    """The score of Willemsen et al. (see the module docstring): 0 is random search, 1
    the optimum from the first trial. Arguments as :func:`seed_scores`'."""
    return float(np.mean(seed_scores(runs, cache_latencies, budget)))


def seed_curves(runs: Sequence[Sequence[float]], best: float, budget: int) -> np.ndarray:
    """Every run's best-so-far curve (a fraction of ``best``), one row per run."""
    return np.array([best_so_far(r, best, budget) for r in runs])


def per_seed(
    curves: np.ndarray,
    latencies: Sequence[Sequence[float | None]],
    cache_latencies: Sequence[float],
    budget: int,
) -> dict[str, list[float | None]]:
    """Each run's trials to 95 % (None: never), best after ``budget`` trials (a fraction
    of the cache's best) and share of the score: what :func:`support` resamples.
    ``curves`` from :func:`seed_curves`."""
    t95 = [trials_to(c, 0.95) for c in curves]
    return {
        "trials_to_95": [None if math.isinf(t) else t for t in t95],
        f"best_at_{budget}": [round(float(c[-1]), 4) for c in curves],
        "score": [round(float(x), 4) for x in seed_scores(latencies, cache_latencies, budget)],
    }


def support(
    seeds: dict[str, dict[str, list[float | None]]],
    targets: Callable[[dict[str, dict[str, Any]]], dict[str, bool | None]],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """How often each target holds when every strategy's seeds are resampled (a
    bootstrap): 1.0 or 0.0 is a clear hit or miss, values between say how much of the
    verdict the seeds' luck decides.

    Args:
        seeds: per strategy, :func:`per_seed`'s lists (one value per seed).
        targets: the verdicts from per-strategy figures (trials_to_95, best_at_N, score:
            medians and the mean as in the report).
        resamples: bootstrap resamples.
        seed: seeds the resampling (a report is deterministic).
    """
    rng = np.random.default_rng(seed)
    arrays = {
        name: {
            k: np.array([np.inf if v is None else v for v in vals], dtype=float)
            for k, vals in figures.items()
        }
        for name, figures in seeds.items()
    }
    held: dict[str, list[bool]] = {}
    for _ in range(resamples):
        sample: dict[str, dict[str, Any]] = {}
        for name, figures in arrays.items():
            n = len(next(iter(figures.values())))
            idx = rng.integers(n, size=n)
            sample[name] = {
                k: (float(np.mean(v[idx])) if k == "score" else median_or_none(v[idx]))
                for k, v in figures.items()
            }
        for k, v in targets(sample).items():
            if v is not None:
                held.setdefault(k, []).append(bool(v))
    return {k: round(float(np.mean(v)), 3) for k, v in held.items()}


def summarise(curves: np.ndarray, budget: int) -> tuple[dict[str, float | None], np.ndarray]:
    """trials_to_X and best_at_N (medians over the runs' :func:`seed_curves`) and the
    median curve."""
    out: dict[str, float | None] = {}
    for fraction in TARGETS:
        out[f"trials_to_{round(fraction * 100)}"] = median_or_none(
            [trials_to(c, fraction) for c in curves]
        )
    for n in CHECKPOINTS:
        if n <= budget:
            out[f"best_at_{n}"] = float(np.median(curves[:, n - 1]))
    return out, np.median(curves, axis=0)


def transfer_summary(caches: Sequence[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Cold start against transfer over every cache that has both runs: each run's trials
    to 95 % (one that never gets there counting as ``budget + 1``), averaged over a
    cache's seeds, for autosched's model search cold, with transfer and for random
    search; how many caches transfer needs fewer, as many or more trials on, and the
    mean over the caches. Medians per cache flip on one seed where a sample's best is a
    handful of configs; the mean over seeds and caches says what transfer buys a farm
    starting workloads on many device families.

    A mean over 20 seeds moves with them: 2.00 against 2.05 counts as more. So each
    cache also gets the 90 % bootstrap interval of the mean paired difference (transfer
    minus cold, run by run: the two runs of a seed share it), and the caches where that
    interval lies wholly below or above 0 are counted apart: fewer or more trials
    beyond the seeds' noise."""
    names = ("autosched-model", "autosched-model-transfer", "autosched-random")

    def t95(strategy: dict[str, Any]) -> np.ndarray:
        runs = strategy["per_seed"]["trials_to_95"]
        return np.array([budget + 1 if t is None else t for t in runs], dtype=float)

    rows = []
    for entry in caches:
        s = entry["strategies"]
        if not all(n in s and "per_seed" in s[n] for n in names):
            continue
        cold, transfer, rnd = (t95(s[n]) for n in names)
        paired = min(len(cold), len(transfer))
        diff = transfer[:paired] - cold[:paired]
        rng = np.random.default_rng(zlib.crc32(entry["file"].encode()))
        means = diff[rng.integers(paired, size=(NOISE_RESAMPLES, paired))].mean(axis=1)
        lo, hi = np.percentile(means, [5, 95])
        rows.append(
            {
                "file": entry["file"],
                "cold": float(cold.mean()),
                "transfer": float(transfer.mean()),
                "random": float(rnd.mean()),
                "difference_90": [round(float(lo), 2), round(float(hi), 2)],
            }
        )
    if not rows:
        return {}
    fewer = sum(r["transfer"] < r["cold"] for r in rows)
    more = sum(r["transfer"] > r["cold"] for r in rows)
    return {
        "caches": len(rows),
        "statistic": f"mean over seeds of trials to 95 % (never: {budget + 1})",
        "transfer_fewer": fewer,
        "transfer_as_many": len(rows) - fewer - more,
        "transfer_more": more,
        "transfer_fewer_beyond_noise": sum(r["difference_90"][1] < 0 for r in rows),
        "transfer_more_beyond_noise": sum(r["difference_90"][0] > 0 for r in rows),
        "transfer_more_than_random": sum(r["transfer"] > r["random"] for r in rows),
        "mean_cold": round(float(np.mean([r["cold"] for r in rows])), 2),
        "mean_transfer": round(float(np.mean([r["transfer"] for r in rows])), 2),
        "mean_random": round(float(np.mean([r["random"] for r in rows])), 2),
        "per_cache": [
            {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()} for r in rows
        ],
    }
