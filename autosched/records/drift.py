"""The machine's drift, taken out of a workload's records: what each config measures at
its own speed, not at the speed of the minute it was measured in.

A shared machine runs batch after batch at different speeds (a replay sample's 32-config
batches ran 0.93-1.52x apart on a 2-core Zen 4 VM). Each batch of a tuning run also
times the config held best so far (the batch control, :mod:`autosched.tuning.control`)
and the finalists are timed again side by side, so the configs measured in several
batches say how fast each batch ran (:func:`batch_drift`). Replay caches take each
config's figure from :func:`drift_free`, and the records' answer to "which config is
fastest" (:meth:`~autosched.records.base.Database.best`, which compilers take) from
:func:`fastest`: the config with one lucky reading in a fast minute does not win.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from autosched.records.record import Record


def batch_drift(records: Sequence[Record]) -> dict[float, float]:
    """How much slower than usual each batch of ``records`` (one workload on one device)
    ran: the factor its latencies were multiplied by, per batch (``started_at``) of
    more than one record.

    Fitted by least squares on log latency = config + batch over the readings of the
    configs measured in more than one batch (a config read once says nothing of its
    batch's speed), each batch's term shrunk toward no drift by the ratio of the
    readings' own noise to the spread of the batches' drift, both estimated from the
    readings (empirical Bayes): a batch linked to the others by one noisy reading moves
    by what that reading says beyond its noise, one linked by many moves by what they
    agree on, and a batch that no such config links stays at 1. The factors' median
    over the linked batches is 1; no measurable drift gives no factors.
    """
    sizes = Counter(r.started_at for r in records)
    # A batch's factor matters for the other configs it measured: a batch of one config
    # (records of a runner that timed one config at a time) has none, and records
    # without a start time have no batch to speak of.
    ok = [
        r
        for r in records
        if r.ok and r.latency_s and r.started_at is not None and sizes[r.started_at] > 1
    ]
    batches: dict[str, set[float]] = {}
    for r in ok:
        batches.setdefault(r.config_key, set()).add(r.started_at)
    linked = [r for r in ok if len(batches[r.config_key]) > 1]
    if not linked:
        return {}
    configs = {k: i for i, k in enumerate(dict.fromkeys(r.config_key for r in linked))}
    starts = {b: i for i, b in enumerate(dict.fromkeys(r.started_at for r in linked))}
    n, m = len(configs), len(starts)
    design = np.zeros((len(linked), n + m))
    rows = np.arange(len(linked))
    design[rows, [configs[r.config_key] for r in linked]] = 1.0
    design[rows, [n + starts[r.started_at] for r in linked]] = 1.0
    target = np.log([r.latency_s for r in linked])

    def fit(shrink: float) -> np.ndarray:
        a = np.vstack([design, np.hstack([np.zeros((m, n)), math.sqrt(shrink) * np.eye(m)])])
        return np.linalg.lstsq(a, np.concatenate([target, np.zeros(m)]), rcond=None)[0]

    loose = fit(1e-9)  # the gauge only: configs and batches trade a constant
    residual = target - design @ loose
    dof = len(linked) - np.linalg.matrix_rank(design)
    if dof <= 0:
        return {}
    noise = float(residual @ residual) / dof
    per_batch = design[:, n:].sum(axis=0)
    drift = loose[n:] - np.median(loose[n:])
    spread = float(np.mean(drift**2)) - noise * float(np.mean(1.0 / per_batch))
    if spread <= 0.0:
        return {}
    solution = fit(max(noise / spread, 1e-9))
    drift = solution[n:] - np.median(solution[n:])
    return {b: math.exp(drift[i]) for b, i in starts.items()}


def drift_free(records: Sequence[Record]) -> dict[str, Record]:
    """Each config's record with the drift of its batches taken out (:func:`batch_drift`):
    its first ok record, with the geometric mean over its readings of latency / batch
    factor (latencies and throughput scaled to match); a config that never ran keeps its
    first record."""
    drift = batch_drift(records)
    readings: dict[str, list[float]] = {}
    first: dict[str, Record] = {}
    for r in records:
        held = first.setdefault(r.config_key, r)
        if r.ok and not held.ok:
            first[r.config_key] = r
        if r.ok and r.latency_s:
            readings.setdefault(r.config_key, []).append(
                math.log(r.latency_s / drift.get(r.started_at, 1.0))
            )
    out = {}
    for key, r in first.items():
        logs = readings.get(key)
        if not logs or not r.ok:
            out[key] = r
        elif len(logs) == 1:  # its one reading: as measured, its batch's drift out
            out[key] = r.scaled(drift.get(r.started_at, 1.0))
        else:
            out[key] = r.scaled(r.latency_s / math.exp(sum(logs) / len(logs)))
    return out


def fastest(records: Iterable[Record], k: int) -> list[Record]:
    """The ``k`` configs of ``records`` (one workload) that ran fastest, fastest first
    (ties by id): each config once, as its :func:`drift_free` record, the drift of each
    device's batches fitted on that device's records alone. A config measured on several
    devices (one family under several driver versions) counts at its fastest."""
    per_device: dict[str, list[Record]] = {}
    for r in records:
        per_device.setdefault(r.device_key, []).append(r)
    best: dict[str, Record] = {}
    for recs in per_device.values():
        for key, r in drift_free(recs).items():
            held = best.get(key)
            if not r.ok or not r.latency_s:
                continue
            if held is None or _order(r) < _order(held):
                best[key] = r
    return sorted(best.values(), key=_order)[:k]


def _order(r: Record) -> tuple[float, int]:
    return (r.latency_s or math.inf, r.id if r.id is not None else -1)
