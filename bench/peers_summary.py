"""The peers benchmark's summary: per-run rows, the 95% figures, means over seeds.

The peers' own stopwatches are put on the shared harness's scale here: a family's curve
is multiplied by the median re-timed / own figure of its finalists on that target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.peers_metrics import (
    CHECKPOINTS,
    best_after,
    checkpoint_leaders,
    mean_or_none,
    trials_to_reach,
    wall_to_reach,
)
from bench.peers_runs import TUNERS, Run

TARGET_FRACTION = 0.95
# Families whose curves are put on the shared harness's scale: Kernel Tuner times with
# its own busy-polling loop. autosched and MetaSchedule OpenCL are timed by autosched's
# worker during tuning; MetaSchedule llvm by TVM's time_evaluator, as autosched's llvm runner.
# Peers whose own stopwatch is not the shared harness: their curves are put on its scale.
SCALED_FAMILIES = ("kernel_tuner", "metaschedule")


def stopwatch_ratios(runs: Sequence[Run], flops: float) -> dict[str, float | None]:
    """Per tuner family and target (``"metaschedule/llvm"``): median over its finalists
    of re-timed / own GFLOP/s.

    How a family's own stopwatch on a target reads against the shared harness. Pooled
    over seeds and strategies, so one lucky own reading (the best of many noisy trials
    reads high) does not decide it.
    """
    ratios: dict[str, list[float]] = {}
    for r in runs:
        for f in r.finalists:
            g = f.retimed_gflops(flops)
            if g and f.own_gflops:
                ratios.setdefault(f"{TUNERS[r.tuner][0]}/{r.target}", []).append(g / f.own_gflops)
    return {key: float(np.median(v)) for key, v in ratios.items()}


def summarize(
    runs: Sequence[Run], flops: float
) -> tuple[list[dict], dict[str, float | None], dict[str, float | None]]:
    """Per-run results (JSON rows), the references the 95% figures are measured against,
    and each family's stopwatch ratio (see :func:`stopwatch_ratios`)."""
    ratios = stopwatch_ratios(runs, flops)
    retimed_best = {}
    for r in runs:
        figs = [g for g in (f.retimed_gflops(flops) for f in r.finalists) if g is not None]
        retimed_best[id(r)] = max(figs) if figs else None
    ref = max((g for g in retimed_best.values() if g is not None), default=None)
    ref_own = max((max(r.curve) for r in runs if r.curve), default=None)
    rows = []
    for r in runs:
        family = TUNERS[r.tuner][0]
        curve = r.curve
        scale = (ratios.get(f"{family}/{r.target}") or 1.0) if family in SCALED_FAMILIES else 1.0
        scaled = [g * scale for g in curve]
        row: dict[str, Any] = {
            "tuner": r.tuner,
            "family": family,
            "target": r.target,
            "seed": r.seed,
            "trials": len(curve),
            "best_gflops": curve[-1] if curve else None,
            **{f"best_at_{n}": best_after(curve, n) for n in CHECKPOINTS},
            "retimed_gflops": retimed_best[id(r)],
            "stopwatch_scale": scale,
            "curve": curve,
            "trial_gflops": r.gflops,
            "trial_wall_s": r.times,
            "wall_s": r.wall_s,
            "trials_to_95": None,
            "wall_to_95": None,
            "trials_to_95_own": None,
            "wall_to_95_own": None,
            "finalists": [
                {
                    "label": f.label,
                    "config": f.config,
                    "own_gflops": f.own_gflops,
                    "retimed_gflops": f.retimed_gflops(flops),
                    "retimed_median_gflops": f.retimed_median_gflops(flops),
                    "retimed_visits": [len(v) for v in f.visits],
                    "trial": f.trial,
                    "leads": f.leads,
                    "error": f.error,
                }
                for f in r.finalists
            ],
            "info": {k: v for k, v in r.info.items() if k != "best_source"},
            "error": r.error,
        }
        if ref and curve:
            row["trials_to_95"] = trials_to_reach(scaled, TARGET_FRACTION * ref)
            row["wall_to_95"] = wall_to_reach(scaled, r.times, TARGET_FRACTION * ref)
        if ref_own and curve:
            row["trials_to_95_own"] = trials_to_reach(curve, TARGET_FRACTION * ref_own)
            row["wall_to_95_own"] = wall_to_reach(curve, r.times, TARGET_FRACTION * ref_own)
        rows.append(row)
    add_retimed_at(rows)
    return rows, {"retimed": ref, "own": ref_own}, ratios


def add_retimed_at(rows: Sequence[dict]) -> None:
    """``retimed_at_N`` per row and checkpoint shorter than the run: the re-timed figure of
    the program the run's own best-so-far stood on after N trials, what the tuner would
    have handed its user had it stopped there.

    Each run's finalists hold those programs (bench.peers_runs; ``leads`` names the
    checkpoints), so every tuner is judged at 16 and 32 trials by the shared harness, not
    by its own stopwatch. Files whose finalists carry only ``trial`` match the leader's
    trial; None where no finalist matches (files written before finalists carried either).
    """
    for row in rows:
        leaders = checkpoint_leaders(row["trial_gflops"])
        for n in CHECKPOINTS:
            if n >= row["trials"]:
                continue
            lead = [
                f
                for f in row["finalists"]
                if n in (f.get("leads") or [])
                or ("leads" not in f and f.get("trial") is not None and n in leaders
                    and f["trial"] == leaders[n] + 1)
            ]  # fmt: skip
            row[f"retimed_at_{n}"] = lead[0]["retimed_gflops"] if lead else None


def add_same_target_t95(rows: Sequence[dict]) -> dict[str, float]:
    """Trials and seconds to 95% of the best re-timed figure found *on the run's own target*.

    The overall reference can be an llvm kernel that no OpenCL tuner can produce (or the
    other way round); against its own target's best, a tuner is compared with the peers
    that generate the same kind of code. Adds ``trials_to_95_target`` and
    ``wall_to_95_target`` to each row; returns the reference per target.
    """
    refs: dict[str, float] = {}
    for row in rows:
        g = row.get("retimed_gflops")
        if g is not None and row.get("error") is None:
            refs[row["target"]] = max(refs.get(row["target"], 0.0), g)
    for row in rows:
        ref = refs.get(row["target"])
        scaled = [g * (row.get("stopwatch_scale") or 1.0) for g in row["curve"]]
        row["trials_to_95_target"] = trials_to_reach(scaled, TARGET_FRACTION * ref) if ref else None
        row["wall_to_95_target"] = (
            wall_to_reach(scaled, row["trial_wall_s"], TARGET_FRACTION * ref) if ref else None
        )
    return refs


def by_tuner(rows: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["tuner"], []).append(row)
    return out


def table(rows: Sequence[dict], *, vendor_gflops: float | None, trials: int) -> list[dict]:
    """Means over seeds per tuner."""
    out = []
    for tuner, rs in by_tuner(rows).items():
        ok = [r for r in rs if r["error"] is None]
        reached = [r["trials_to_95"] for r in ok if r["trials_to_95"] is not None]
        reached_t = [
            r["trials_to_95_target"] for r in ok if r.get("trials_to_95_target") is not None
        ]
        entry = {
            "tuner": tuner,
            "runs": len(rs),
            "failed_runs": len(rs) - len(ok),
            "trials": mean_or_none([r["trials"] for r in ok]),
            **{
                f"best_at_{n}": mean_or_none([r[f"best_at_{n}"] for r in ok])
                for n in CHECKPOINTS
                if n <= trials
            },
            "best_gflops": mean_or_none([r["best_gflops"] for r in ok]),
            **{
                f"retimed_at_{n}": _mean_of_all([r.get(f"retimed_at_{n}") for r in ok])
                for n in CHECKPOINTS
                if n < trials
            },
            "retimed_gflops": mean_or_none([r["retimed_gflops"] for r in ok]),
            "trials_to_95": mean_or_none(reached),
            "reached_95": f"{len(reached)}/{len(ok)}",
            "wall_to_95": mean_or_none([r["wall_to_95"] for r in ok]),
            "trials_to_95_target": mean_or_none(reached_t),
            "reached_95_target": f"{len(reached_t)}/{len(ok)}",
            "wall_s": mean_or_none([r["wall_s"] for r in ok]),
        }
        g = entry["retimed_gflops"]
        entry["of_vendor"] = g / vendor_gflops if g and vendor_gflops else None
        out.append(entry)
    return out


def _mean_of_all(values: Sequence[float | None]) -> float | None:
    """The mean, or None if any run lacks the figure: no mean over a subset of seeds."""
    return None if not values or None in values else float(np.mean(values))


def rescale_rows(rows: Sequence[dict]) -> tuple[dict[str, float], float | None]:
    """:func:`stopwatch_ratios` and the 95% figures of :func:`summarize`, from JSON rows."""
    pooled: dict[str, list[float]] = {}
    for row in rows:
        for f in row["finalists"]:
            if f["retimed_gflops"] and f["own_gflops"]:
                key = f"{row['family']}/{row['target']}"
                pooled.setdefault(key, []).append(f["retimed_gflops"] / f["own_gflops"])
    ratios = {key: float(np.median(v)) for key, v in pooled.items()}
    ref = max((r["retimed_gflops"] for r in rows if r["retimed_gflops"]), default=None)
    for row in rows:
        key = f"{row['family']}/{row['target']}"
        scale = (ratios.get(key) or 1.0) if row["family"] in SCALED_FAMILIES else 1.0
        row["stopwatch_scale"] = scale
        scaled = [g * scale for g in row["curve"]]
        row["trials_to_95"] = trials_to_reach(scaled, TARGET_FRACTION * ref) if ref else None
        row["wall_to_95"] = (
            wall_to_reach(scaled, row["trial_wall_s"], TARGET_FRACTION * ref) if ref else None
        )
    return ratios, ref
