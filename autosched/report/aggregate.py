"""Reading the records of one workload on one device into a report :class:`Section`.

How records are read (the tuner writes them so, see :mod:`autosched.tuner`):

* The search proposes a config once on one device, so a record whose config was
  already recorded for that workload and device is a re-measurement: a batch's control
  (the best so far, timed again among the batch's new configs,
  :mod:`autosched.tuning.control`) or a finalist. The records that end a run and are
  all re-measurements are that run's finalists, measured side by side with the default
  schedule.
* The default schedule is ``Space.default()`` of the workload for the device limits
  in the record's fingerprint; when the space cannot be rebuilt, none is shown (the
  tuner measured it first until 2026-12-07 and last in its first batch since, so no
  place in a run says which it is).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from autosched.errors import AutoschedError
from autosched.records.base import Database
from autosched.records.choice import chosen
from autosched.records.record import OK, STATUSES, Record
from autosched.report.sections import (
    ConfigRow,
    ErrorKind,
    Finalist,
    FinalRound,
    Importance,
    RunInfo,
    Section,
    VendorFigure,
)
from autosched.space.device import device_limits
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits, Space

log = logging.getLogger(__name__)

TOP_CONFIGS = 10


class SpaceCache:
    """Spaces rebuilt from records, cached per workload, target and device limits."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, DeviceLimits], Space] = {}

    def get(self, workload: Mapping[str, Any], target: str, limits: DeviceLimits) -> Space:
        from autosched.ops import workload_from_json
        from autosched.records.record import canonical_json

        key = (canonical_json(dict(workload)), target, limits)
        space = self._cache.get(key)
        if space is None:
            space = self._cache[key] = make_space(
                workload_from_json(dict(workload)), target=target, limits=limits
            )
        return space


def _default_key(first: Record, spaces: SpaceCache) -> str | None:
    try:
        limits = device_limits(first.device, first.target)
        return spaces.get(first.workload, first.target, limits).default().key
    except (AutoschedError, KeyError, TypeError, ValueError) as exc:
        log.info("cannot rebuild the space of %s (%s); no default shown", first.op, exc)
    return None


def split_final(records: Sequence[Record]) -> list[bool]:
    """Mark each record (in time order) that a run's final re-measurement produced: its
    ``rounds`` say so, or, for a run recorded before records kept them, the run's tail of
    configs that were all recorded before."""
    first_seen: dict[str, int] = {}
    for i, r in enumerate(records):
        first_seen.setdefault(r.config_key, i)
    by_run: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_run[r.run_id].append(i)
    final = [False] * len(records)
    for indices in by_run.values():
        if any(records[i].rounds for i in indices):
            for i in indices:
                final[i] = records[i].rounds > 0
            continue
        # The tail of a run whose configs were all recorded before: the finalists.
        for i in reversed(indices):
            r = records[i]
            if not (r.ok and first_seen[r.config_key] < i):
                break
            final[i] = True
    return final


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Kendall's tau of ``a`` against ``b``; None where it says nothing (fewer than three
    values, or either constant)."""
    if len(a) < 3:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau(a, b).statistic
    return None if tau is None or not math.isfinite(tau) else float(tau)


def build_section(
    db: Database,
    records: list[Record],
    *,
    spaces: SpaceCache,
    importance: Importance,
    vendor: tuple[VendorFigure, ...],
) -> Section:
    records = sorted(records, key=lambda r: (r.timestamp, r.id or 0))
    first = records[0]
    final_mask = split_final(records)
    search = [r for r, f in zip(records, final_mask) if not f]
    default_key = _default_key(first, spaces)

    # Runs, in order of their first record.
    runs: list[RunInfo] = []
    by_run: dict[str, list[tuple[Record, bool]]] = defaultdict(list)
    for r, f in zip(records, final_mask):
        by_run[r.run_id].append((r, f))
    for run_id, items in by_run.items():
        gflops = [r.gflops for r, f in items if not f and r.ok and r.gflops is not None]
        runs.append(
            RunInfo(
                run_id=run_id,
                start=items[0][0].timestamp,
                end=items[-1][0].timestamp,
                trials=sum(not f for _, f in items),
                finalists=sum(f for _, f in items),
                best_gflops=max(gflops) if gflops else None,
            )
        )

    # The fastest configs.
    by_config: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_config[r.config_key].append(r)
    rows = []
    for recs in by_config.values():
        ok = [r for r in recs if r.ok and r.latency_s is not None]
        if not ok:
            continue
        fastest = min(ok, key=lambda r: (r.latency_s, r.id or 0))
        gflops = [r.gflops for r in ok if r.gflops is not None]
        rows.append((fastest, len(recs), min(gflops, default=0.0), max(gflops, default=0.0)))
    rows.sort(key=lambda row: (row[0].latency_s, row[0].id or 0))
    top = tuple(
        ConfigRow(
            rank=i + 1,
            record=fastest,
            measured=n,
            gflops_min=lo,
            gflops_max=hi,
            is_default=fastest.config_key == default_key,
        )
        for i, (fastest, n, lo, hi) in enumerate(rows[:TOP_CONFIGS])
    )

    # Failures by kind, with the first message of each.
    counts = Counter(r.status for r in records)
    examples: dict[str, str] = {}
    for r in records:
        if not r.ok:
            examples.setdefault(r.status, r.error)
    errors = tuple(
        ErrorKind(status=s, count=counts.get(s, 0), example=examples.get(s, ""))
        for s in STATUSES
        if s != OK
    )

    # Search-phase figure of each config: its first measurement.
    search_first: dict[str, tuple[int, Record]] = {}
    for i, (r, f) in enumerate(zip(records, final_mask)):
        if not f:
            search_first.setdefault(r.config_key, (i, r))

    rounds = []
    for run_id in by_run:
        indices = [i for i, r in enumerate(records) if r.run_id == run_id and final_mask[i]]
        if not indices:
            continue
        # Ranks among what the run knew when it picked its finalists.
        known = sorted(
            (r for i, r in search_first.values() if i < indices[0] and r.ok and r.gflops),
            key=lambda r: (-(r.gflops or 0.0), r.id or 0),
        )
        search_rank = {r.config_key: k + 1 for k, r in enumerate(known)}
        finals = sorted((records[i] for i in indices), key=lambda r: (r.latency_s, r.id or 0))
        finalists = []
        for k, r in enumerate(finals):
            first_search = search_first.get(r.config_key)
            s = first_search[1] if first_search is not None else None
            finalists.append(
                Finalist(
                    final=r,
                    search=s if s is not None and s.ok else None,
                    search_rank=search_rank.get(r.config_key),
                    final_rank=k + 1,
                    is_default=r.config_key == default_key,
                )
            )
        both = [f for f in finalists if f.search is not None and f.search.gflops]
        tau = kendall_tau(
            [f.search.gflops for f in both if f.search],  # type: ignore[misc]
            [f.final.gflops or 0.0 for f in both],
        )
        rounds.append(FinalRound(run_id=run_id, finalists=tuple(finalists), kendall_tau=tau))

    default_search = next(
        (r for r in search if r.config_key == default_key and r.ok),
        None,
    )
    best = chosen(db, first.workload_key, target=first.target, device_key=first.device_key)
    return Section(
        workload=first.workload,
        workload_key=first.workload_key,
        target=first.target,
        device=first.device,
        device_key=first.device_key,
        device_family=first.device_family,
        records=tuple(records),
        search=tuple(search),
        runs=tuple(runs),
        default_config_key=default_key,
        default_search=default_search,
        best=best,
        top=top,
        errors=errors,
        final_rounds=tuple(rounds),
        importance=importance,
        vendor=vendor,
    )
