"""The machine's drift, taken out of a workload's records: what each config measures at
its own speed, not at the speed of the minute it was measured in.

A shared machine runs batch after batch at different speeds (a replay sample's 32-config
batches ran 0.93-1.52x apart on a 2-core Zen 4 VM). Each batch of a tuning run also
times the config held best so far (the batch control, :mod:`autosched.tuning.control`)
and the finalists are timed again side by side, so the configs measured in several
batches say how fast each batch ran (:func:`batch_drift`). Replay caches take each
config's figure from :func:`drift_free`.

The records' readers (:mod:`autosched.records.choice`, which compilers take) do not: a
tuning run links most of its batches to the others by one reading, the batch control's,
so one outlier reading of a control moves its batch's factor and every config of that
batch with it (in a quickstart run on a 2-core Zen 4, a control read 114 GFLOP/s beside its
213 and the batch's configs came out 11 % faster than measured, ahead of the finalists
timed side by side); and a plain mean of a config's readings mixes search readings with
the final round's side-by-side ones, which on the same machine read 2-5 % slower, so
the finalists fall behind configs read once. They let the final side-by-side round
decide. A replayed search sees figures; it hands nothing to a compiler.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from autosched.records.record import Record

if TYPE_CHECKING:
    from scipy import sparse


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
    from scipy import sparse  # here: opening a database does not load SciPy
    from scipy.sparse import csgraph

    n, m = len(configs), len(starts)
    cols = [configs[r.config_key] for r in linked] + [n + starts[r.started_at] for r in linked]
    rows = list(range(len(linked))) * 2
    design = sparse.csr_matrix((np.ones(len(cols)), (rows, cols)), shape=(len(linked), n + m))
    target = np.log([r.latency_s for r in linked])
    fit = _small_fit if n + m <= _DENSE_UP_TO else _large_fit

    loose = fit(design, target, n, 1e-9)  # the gauge only: configs and batches trade a constant
    residual = target - design @ loose
    # Each connected set of configs and batches leaves one constant free.
    components = csgraph.connected_components(design.T @ design, directed=False)[0]
    dof = len(linked) - (n + m - components)
    if dof <= 0:
        return {}
    noise = float(residual @ residual) / dof
    per_batch = np.asarray(design[:, n:].sum(axis=0)).ravel()
    drift = loose[n:] - np.median(loose[n:])
    spread = float(np.mean(drift**2)) - noise * float(np.mean(1.0 / per_batch))
    if spread <= 0.0:
        return {}
    solution = fit(design, target, n, max(noise / spread, 1e-9))
    drift = solution[n:] - np.median(solution[n:])
    return {b: math.exp(drift[i]) for b, i in starts.items()}


# Up to this many configs and batches the fit is solved dense and exactly (every replay
# sample so far: at most 114); beyond it, by sparse least squares (a farm's records of
# one workload: thousands of batches, each with its control).
_DENSE_UP_TO = 512


def _small_fit(design: sparse.csr_matrix, target: np.ndarray, n: int, shrink: float) -> np.ndarray:
    """Least squares of ``design @ x = target`` with ``shrink * |batch terms|^2`` added."""
    dense = design.toarray()
    m = dense.shape[1] - n
    a = np.vstack([dense, np.hstack([np.zeros((m, n)), math.sqrt(shrink) * np.eye(m)])])
    return np.linalg.lstsq(a, np.concatenate([target, np.zeros(m)]), rcond=None)[0]


def _large_fit(design: sparse.csr_matrix, target: np.ndarray, n: int, shrink: float) -> np.ndarray:
    """:func:`_small_fit` by LSQR on the sparse system."""
    from scipy import sparse
    from scipy.sparse.linalg import lsqr

    m = design.shape[1] - n
    penalty = sparse.hstack([sparse.csr_matrix((m, n)), math.sqrt(shrink) * sparse.eye(m)])
    a = sparse.vstack([design, penalty]).tocsr()
    b = np.concatenate([target, np.zeros(m)])
    return lsqr(a, b, atol=1e-14, btol=1e-14, iter_lim=50 * (n + m))[0]


def drift_free(records: Sequence[Record]) -> dict[str, Record]:
    """Each config's record with the drift of its batches taken out (:func:`batch_drift`):
    its first ok record, with the geometric mean over its readings of latency / batch
    factor (latencies and throughput scaled to match); a config that never ran keeps its
    first record."""
    drift = batch_drift(records)
    logs: dict[str, list[float]] = {}
    out: dict[str, Record] = {}
    first: dict[str, Record] = {}
    for r in records:
        out.setdefault(r.config_key, r)
        if r.ok and r.latency_s:
            first.setdefault(r.config_key, r)
            logs.setdefault(r.config_key, []).append(
                math.log(r.latency_s / drift.get(r.started_at, 1.0))
            )
    for key, r in first.items():
        values = logs[key]
        if len(values) == 1:  # its one reading: as measured, its batch's drift out
            out[key] = r.scaled(drift.get(r.started_at, 1.0))
        else:
            out[key] = r.scaled(r.latency_s / math.exp(sum(values) / len(values)))  # type: ignore[operator]
    return out
