"""Reports a person reads: one self-contained HTML page about what the records hold.

:func:`build_report` turns the records of a database into one HTML page with a
section per workload and device (exact fingerprint): a header (operator, shapes,
device, driver, target, trials, time span), the best GFLOP/s so far against trial
number and against time, the fastest configs, failures by kind, which features the
cost model learned to rely on, the default schedule against the tuned one and a
vendor library, and how the finalists re-measured at the end of a run compare with
their search-phase measurement. The page has no scripts and loads nothing: CSS is
inline and charts are inline SVG.

How records are read (the tuner writes them so, see :mod:`autosched.tuner`):

* The search never measures a config twice on one device, so a record whose config
  was already recorded for that workload and device is a re-measurement. The
  records that end a run and are all re-measurements are that run's finalists,
  measured side by side with the default schedule.
* The default schedule is ``Space.default()`` of the workload for the device limits
  in the record's fingerprint; when the space cannot be rebuilt, the first config of
  the earliest run (the tuner always measures the default first).

Example::

    from autosched.report import write_report
    write_report("records.db", "report.html", op="matmul")
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autosched.cost_model import DEFAULT_KIND, KINDS, feature_names, make_model, training_set
from autosched.cost_model.model import MIN_OK
from autosched.errors import AutoschedError, InvalidInputError
from autosched.records.base import Database
from autosched.records.files import write_atomically
from autosched.records.record import OK, STATUSES, Record
from autosched.report.vendor import VENDOR_OPS
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits, Space

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

TOP_CONFIGS = 10
TOP_FEATURES = 10
# Fewer training rows than this and feature importances say more about noise than about
# the device; the model itself also needs MIN_OK ok records before it learns anything.
MIN_IMPORTANCE_ROWS = 20
# More records than this and the model is fitted on a seeded random sample of them: the
# ranking of features settles long before, and a report should take seconds.
MAX_IMPORTANCE_RECORDS = 20_000


# -- what a section holds ----------------------------------------------------------------
@dataclass(frozen=True)
class RunInfo:
    """One tuning run (``Record.run_id``) of a workload on a device."""

    run_id: str
    start: float  # timestamp of its first record
    end: float  # timestamp of its last record
    trials: int  # search-phase records
    finalists: int  # records re-measured at the end of the run
    best_gflops: float | None  # best search-phase GFLOP/s of this run


@dataclass(frozen=True)
class ConfigRow:
    """One config among the fastest: its fastest measurement and how often it was measured."""

    rank: int
    record: Record  # the fastest ok measurement of this config
    measured: int  # records of this config, any status
    gflops_min: float
    gflops_max: float
    is_default: bool


@dataclass(frozen=True)
class ErrorKind:
    """How many records failed with ``status`` and the message of the first of them."""

    status: str
    count: int
    example: str


@dataclass(frozen=True)
class Importance:
    """Feature importances of a cost model fitted on an operator's records on a device family.

    ``features`` is empty when there were too few records; ``reason`` then says so.
    """

    op: str
    target: str
    device_family: str
    model: str  # cost model kind, see autosched.cost_model.KINDS
    method: str  # how the importances were computed
    n_records: int  # training rows (records whose config is valid in its space)
    n_ok: int
    n_workloads: int
    features: tuple[tuple[str, float], ...]  # (feature, share of the total), largest first
    reason: str = ""


@dataclass(frozen=True)
class Finalist:
    """A config re-measured at the end of a run, with its search-phase measurement."""

    final: Record
    search: Record | None  # its first measurement (None if that one failed)
    # Rank of ``search`` among the search-phase configs measured before the round, 1 = fastest:
    # the ranking the run picked its finalists from.
    search_rank: int | None
    final_rank: int  # rank among this run's finalists, 1 = fastest
    is_default: bool


@dataclass(frozen=True)
class FinalRound:
    """The finalists one run re-measured side by side, fastest first."""

    run_id: str
    finalists: tuple[Finalist, ...]
    kendall_tau: float | None  # search-phase order vs re-measured order (>= 3 with both)


@dataclass(frozen=True)
class VendorFigure:
    """A reference throughput from outside autosched and where it comes from."""

    gflops: float
    source: str
    label: str = "vendor"


@dataclass(frozen=True)
class Section:
    """Everything the report shows about one workload on one device."""

    workload: dict[str, Any]
    workload_key: str
    target: str
    device: dict[str, Any]
    device_key: str
    device_family: str
    records: tuple[Record, ...]  # by time
    search: tuple[Record, ...]  # search-phase records, in trial order
    runs: tuple[RunInfo, ...]
    default_config_key: str | None
    default_search: Record | None  # the default schedule's search-phase measurement
    best: Record | None  # fastest ok record (``Database.best``)
    top: tuple[ConfigRow, ...]
    errors: tuple[ErrorKind, ...]  # one per error kind, zero counts included
    final_rounds: tuple[FinalRound, ...]
    importance: Importance
    vendor: tuple[VendorFigure, ...]

    @property
    def op(self) -> str:
        return str(self.workload.get("op", ""))

    @property
    def trials(self) -> int:
        """Distinct configs measured: what ``tune(trials=...)`` counts."""
        return len({r.config_key for r in self.records})

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.records)

    @property
    def default_final(self) -> Record | None:
        """The default re-measured side by side in the latest run that did so."""
        for rnd in reversed(self.final_rounds):
            for f in rnd.finalists:
                if f.is_default:
                    return f.final
        return None


# -- reading the records -----------------------------------------------------------------
def device_limits(device: Mapping[str, Any], target: str) -> DeviceLimits:
    """The limits a device's fingerprint (``Record.device``) implies for ``target``.

    Raises:
        KeyError, TypeError, ValueError: the fingerprint lacks a field the target needs.
    """
    if target == "llvm":
        return DeviceLimits(
            max_work_group_size=1,
            max_work_item_size=1,
            local_mem_bytes=0,
            is_cpu=True,
            cores=max(1, int(device.get("compute_units") or 1)),
        )
    sizes = device.get("max_work_item_sizes") or [device["max_work_group_size"]]
    return DeviceLimits(
        max_work_group_size=int(device["max_work_group_size"]),
        max_work_item_size=int(sizes[0]),
        local_mem_bytes=int(device["local_mem_bytes"]),
        is_cpu=device.get("type") == "cpu",
    )


class _Spaces:
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


def _default_key(first: Record, records: Sequence[Record], spaces: _Spaces) -> str | None:
    try:
        limits = device_limits(first.device, first.target)
        return spaces.get(first.workload, first.target, limits).default().key
    except (AutoschedError, KeyError, TypeError, ValueError) as exc:
        log.info("cannot rebuild the space of %s (%s); default = first config", first.op, exc)
    earliest = min(records, key=lambda r: (r.timestamp, r.id or 0))
    first_of_run = [r for r in records if r.run_id == earliest.run_id]
    return first_of_run[0].config_key if first_of_run else None


def _split_final(records: Sequence[Record]) -> list[bool]:
    """Mark each record (in time order) that a run's final re-measurement produced."""
    first_seen: dict[str, int] = {}
    for i, r in enumerate(records):
        first_seen.setdefault(r.config_key, i)
    by_run: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_run[r.run_id].append(i)
    final = [False] * len(records)
    for indices in by_run.values():
        # The tail of a run whose configs were all recorded before: the finalists.
        for i in reversed(indices):
            r = records[i]
            if not (r.ok and first_seen[r.config_key] < i):
                break
            final[i] = True
    return final


def _kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    if len(a) < 3:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau(a, b).statistic
    return None if tau is None or not math.isfinite(tau) else float(tau)


def _section(
    db: Database,
    records: list[Record],
    *,
    spaces: _Spaces,
    importance: Importance,
    vendor: tuple[VendorFigure, ...],
) -> Section:
    records = sorted(records, key=lambda r: (r.timestamp, r.id or 0))
    first = records[0]
    final_mask = _split_final(records)
    search = [r for r, f in zip(records, final_mask) if not f]
    default_key = _default_key(first, records, spaces)

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
        tau = _kendall_tau(
            [f.search.gflops for f in both if f.search],  # type: ignore[misc]
            [f.final.gflops or 0.0 for f in both],
        )
        rounds.append(FinalRound(run_id=run_id, finalists=tuple(finalists), kendall_tau=tau))

    default_search = next(
        (r for r in search if r.config_key == default_key and r.ok),
        None,
    )
    best = db.best(first.workload_key, target=first.target, device_key=first.device_key, k=1)
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
        best=best[0] if best else None,
        top=top,
        errors=errors,
        final_rounds=tuple(rounds),
        importance=importance,
        vendor=vendor,
    )


# -- knob importance ---------------------------------------------------------------------
def knob_importance(
    records: Sequence[Record],
    *,
    device: Mapping[str, Any] | None = None,
    kind: str = DEFAULT_KIND,
    seed: int = 0,
    spaces: _Spaces | None = None,
) -> Importance:
    """Fit a cost model on records of one operator and device family; rank its features.

    The features are what the cost model sees of a config (``Space.describe``: work-items,
    register tile, vector width, staging, ... derived from the knobs, plus the shape).
    XGBoost and LightGBM models report their built-in total gain per feature, fitted on
    every record; other models get scikit-learn's permutation importance on a held-out
    quarter of the records (drop of the Spearman correlation between prediction and
    throughput when a feature is shuffled).

    Args:
        records: records of one operator on one device family (any status).
        device: fingerprint whose limits rebuild the spaces (default: the first record's).
        kind: cost model kind, one of :data:`autosched.cost_model.KINDS`.
        seed: seeds the model and the held-out split.

    Returns:
        Importance with the shares of the features (summing to 1 over all features),
        largest first, at most :data:`TOP_FEATURES`; none, with the reason, when there
        are too few records.

    Raises:
        InvalidInputError: ``kind`` is not known, or records of several operators or
            device families.
    """
    if kind not in KINDS:
        raise InvalidInputError(
            f"cost model kind {kind!r} is not known; accepted: {', '.join(KINDS)}"
        )
    if not records:
        raise InvalidInputError("knob importance needs records; got none")
    first = records[0]
    spaces = spaces or _Spaces()
    fingerprint = device if device is not None else first.device
    base = Importance(
        op=first.op,
        target=first.target,
        device_family=first.device_family,
        model=kind,
        method="",
        n_records=0,
        n_ok=0,
        n_workloads=len({r.workload_key for r in records}),
        features=(),
    )
    ops = sorted({r.op for r in records})
    families = sorted({r.device_family for r in records})
    targets = sorted({r.target for r in records})
    if len(ops) > 1 or len(families) > 1 or len(targets) > 1:
        raise InvalidInputError(
            "knob importance needs records of one operator, device family and target; "
            f"got ops {ops}, families {families}, targets {targets}"
        )
    sampled = ""
    if len(records) > MAX_IMPORTANCE_RECORDS:
        rng = np.random.default_rng(seed)
        keep = np.sort(rng.choice(len(records), MAX_IMPORTANCE_RECORDS, replace=False))
        sampled = f" (a random sample of the {len(records)} records)"
        records = [records[i] for i in keep]
    try:
        limits = device_limits(fingerprint, first.target)

        def space_for(wl: dict) -> Space:
            return spaces.get(wl, first.target, limits)

        names = feature_names(space_for(first.workload))
        X, y, groups = training_set(records, space_for, names=names)
    except (AutoschedError, KeyError, TypeError, ValueError) as exc:
        # Records of an operator or knob this version no longer knows: say so, go on.
        return _replace(base, reason=f"the spaces of these records cannot be rebuilt: {exc}")
    n_ok = int(np.sum(y > 0))
    base = _replace(base, n_records=len(y), n_ok=n_ok)
    if kind == "prior":
        return _replace(base, reason="the prior model learns nothing; choose a learned kind")
    if len(y) < MIN_IMPORTANCE_ROWS or n_ok < MIN_OK:
        return _replace(
            base,
            reason=(
                f"too few records to learn from: {len(y)} usable, {n_ok} ok "
                f"(needs at least {MIN_IMPORTANCE_ROWS} usable and {MIN_OK} ok)"
            ),
        )
    # One thread: the fit is small, and OpenMP threads that spin on a busy machine make
    # it many times slower, never faster.
    model = make_model(kind, seed=seed, n_jobs=1)
    booster_kind = kind.split("-")[0]
    if booster_kind in ("xgb", "lgbm"):
        model.fit(X, y, groups)
        if not model.is_fitted:
            return _replace(base, reason="the model learned nothing (all targets equal)")
        gains = _gains(model, booster_kind, len(names))
        objective = getattr(model, "objective", "")
        library = "XGBoost" if booster_kind == "xgb" else "LightGBM"
        method = (
            f"{library} built-in total gain per feature ({objective}), fitted on all "
            f"{len(y)} records{sampled}; shown as the share of the total gain"
        )
    else:
        gains, method = _permutation(kind, X, y, groups, seed=seed)
        method += sampled
        if gains is None:
            return _replace(base, reason=method)
    total = float(np.sum(gains))
    if not total > 0:
        return _replace(base, method=method, reason="no feature carried any importance")
    order = np.argsort(-gains, kind="stable")[:TOP_FEATURES]
    features = tuple((names[j], float(gains[j] / total)) for j in order if gains[j] > 0)
    return _replace(base, method=method, features=features)


def _replace(imp: Importance, **changes: Any) -> Importance:
    from dataclasses import replace

    return replace(imp, **changes)


def _gains(model: Any, booster_kind: str, n: int) -> np.ndarray:
    booster = model.booster_
    if booster_kind == "xgb":
        scores = booster.get_score(importance_type="total_gain")
        gains = np.zeros(n)
        for name, value in scores.items():  # "f<index>": columns of a bare matrix
            gains[int(name[1:])] = float(value)
        return gains
    return np.asarray(booster.feature_importance(importance_type="gain"), dtype=float)


def _permutation(
    kind: str, X: np.ndarray, y: np.ndarray, groups: np.ndarray, *, seed: int
) -> tuple[np.ndarray | None, str]:
    from scipy.stats import spearmanr
    from sklearn.inspection import permutation_importance
    from sklearn.model_selection import train_test_split

    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.25, random_state=seed)
    model = make_model(kind, seed=seed, n_jobs=1).fit(X[idx_train], y[idx_train], groups[idx_train])
    if not model.is_fitted:
        return None, "too few ok records in the training split for the model to learn"

    def spearman(estimator: Any, X_: np.ndarray, y_: np.ndarray) -> float:
        rho = spearmanr(estimator.predict(X_), y_).statistic
        return float(rho) if math.isfinite(rho) else 0.0

    result = permutation_importance(
        model,
        X[idx_test],
        y[idx_test],
        scoring=spearman,
        n_repeats=5,
        random_state=seed,
        n_jobs=1,
    )
    method = (
        f"scikit-learn permutation importance on a held-out 25% ({len(idx_test)} records; "
        f"model fitted on the other {len(idx_train)}): mean drop of the Spearman correlation "
        "of prediction and throughput when the feature is shuffled, 5 repeats; "
        "shown as the share of the total drop"
    )
    return np.clip(result.importances_mean, 0.0, None), method


# -- vendor reference --------------------------------------------------------------------
def measure_numpy(
    workload: Mapping[str, Any], *, min_time_s: float = 0.2, seed: int = 0
) -> VendorFigure:
    """Time the numpy baseline of a workload (:mod:`autosched.report.vendor`) on this CPU.

    Contractions call numpy's BLAS (e.g. OpenBLAS): matmul, dense and batch matmul
    directly, conv2d through im2col; the row-wise operators are plain numpy. See
    :func:`autosched.report.vendor.time_vendor` for how it is timed.

    Raises:
        InvalidInputError: an op or dtype without a baseline.
    """
    from autosched.report.vendor import time_vendor

    t = time_vendor(workload, min_time_s=min_time_s, seed=seed)
    blas = f" with {t.blas}, {t.threads}" if t.blas else ""
    return VendorFigure(
        gflops=t.gflops,
        source=f"numpy {np.__version__} {t.method}{blas}, on the host CPU when this report "
        f"was made; median of {t.repeats} repeats",
        label=f"numpy ({t.blas.split()[0]})" if t.blas else "numpy",
    )


# -- the report --------------------------------------------------------------------------
def _open(db: Database | PathLike) -> tuple[Database, str, bool]:
    if not isinstance(db, (str, os.PathLike)):
        return db, repr(db), False
    from autosched.records.sqlite import SQLiteDatabase

    path = Path(db).expanduser()
    if not path.is_file():
        raise InvalidInputError(
            f"records database {path} does not exist; pass --db with an existing records database"
        )
    return SQLiteDatabase(path, create=False), str(path), True


def _check_vendor(value: Any, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise InvalidInputError(f"{name}={value!r} is not valid; accepted: a number > 0 (GFLOP/s)")
    return float(value)


def collect(
    db: Database | PathLike,
    *,
    op: str | None = None,
    device_key: str | None = None,
    target: str | None = None,
    vendor_gflops: float | Mapping[str, float] | None = None,
    measure_vendor: bool = False,
    model_kind: str = DEFAULT_KIND,
    seed: int = 0,
) -> list[Section]:
    """The report's sections, one per (workload, target, device key); see :func:`build_report`."""
    if model_kind not in KINDS:
        raise InvalidInputError(
            f"cost model kind {model_kind!r} is not known; accepted: {', '.join(KINDS)}"
        )
    vendors: dict[str | None, float] = {}
    if isinstance(vendor_gflops, Mapping):
        for key, value in vendor_gflops.items():
            vendors[str(key)] = _check_vendor(value, f"vendor_gflops[{key!r}]")
    elif vendor_gflops is not None:
        vendors[None] = _check_vendor(vendor_gflops, "vendor_gflops")
    database, label, owned = _open(db)
    try:
        records = database.query(op=op, device_key=device_key, target=target)
        if not records:
            everything = database.query()
            if not everything:
                raise InvalidInputError(
                    f"records database {label} holds no records; run `autosched tune` first"
                )
            asked = ", ".join(
                f"{name} {value!r}"
                for name, value in (("op", op), ("device key", device_key), ("target", target))
                if value is not None
            )
            held = "; ".join(
                f"{name}: {', '.join(sorted({str(getattr(r, attr)) for r in everything}))}"
                for name, attr in (
                    ("ops", "op"),
                    ("device keys", "device_key"),
                    ("targets", "target"),
                )
            )
            raise InvalidInputError(f"no records in {label} match {asked}; it holds {held}")
        groups: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
        for r in records:
            groups[(r.workload_key, r.target, r.device_key)].append(r)
        spaces = _Spaces()
        importances: dict[tuple[str, str, str], Importance] = {}
        measured: dict[str, VendorFigure] = {}
        sections = []
        for (_, tgt, _), recs in groups.items():
            first = recs[0]
            family_key = (first.op, first.device_family, tgt)
            if family_key not in importances:
                family = database.query(op=first.op, device_family=first.device_family, target=tgt)
                importances[family_key] = knob_importance(
                    family, device=first.device, kind=model_kind, seed=seed, spaces=spaces
                )
            vendor: list[VendorFigure] = []
            given = vendors.get(first.workload_key, vendors.get(None))
            if given is not None:
                vendor.append(VendorFigure(given, "given (--vendor-gflops)", "vendor (given)"))
            if measure_vendor and first.op in VENDOR_OPS:
                if first.workload_key not in measured:
                    measured[first.workload_key] = measure_numpy(first.workload, seed=seed)
                vendor.append(measured[first.workload_key])
            sections.append(
                _section(
                    database,
                    recs,
                    spaces=spaces,
                    importance=importances[family_key],
                    vendor=tuple(vendor),
                )
            )
    finally:
        if owned:
            database.close()
    sections.sort(key=_section_order)
    return sections


def _section_order(s: Section) -> tuple:
    from autosched.report.html import option_params, shape_params

    shape = tuple(v if isinstance(v, (int, float)) else 0 for _, v in shape_params(s.workload))
    options = tuple(str(v) for _, v in option_params(s.workload))
    return (s.op, shape, options, s.target, str(s.device.get("name", "")), s.device_key)


def build_report(
    db: Database | PathLike,
    *,
    op: str | None = None,
    device_key: str | None = None,
    target: str | None = None,
    vendor_gflops: float | Mapping[str, float] | None = None,
    measure_vendor: bool = False,
    model_kind: str = DEFAULT_KIND,
    seed: int = 0,
) -> str:
    """One self-contained HTML page about the matching records (no scripts, no network).

    Args:
        db: a records database, or the path of an existing SQLite records file (never
            created).
        op, device_key, target: keep only records of this operator, exact device
            fingerprint key and code generation target (None: any).
        vendor_gflops: a vendor library's GFLOP/s to compare with: one number for every
            workload, or a mapping from workload key to GFLOP/s.
        measure_vendor: also time the numpy baseline of each workload (its BLAS for
            contractions, see :mod:`autosched.report.vendor`) on this machine's CPU, now.
        model_kind: cost model whose feature importances are shown (``make_model`` kind).
        seed: seeds the cost model and any held-out split.

    Returns:
        The HTML text.

    Raises:
        InvalidInputError: the database file does not exist, holds no records, or none
            match the filters; a bad vendor figure or model kind.
        RecordsError: the database cannot be opened or read.
    """
    from autosched.report.html import render

    sections = collect(
        db,
        op=op,
        device_key=device_key,
        target=target,
        vendor_gflops=vendor_gflops,
        measure_vendor=measure_vendor,
        model_kind=model_kind,
        seed=seed,
    )
    label = os.fspath(db) if isinstance(db, (str, os.PathLike)) else repr(db)
    filters = {"op": op, "device key": device_key, "target": target}
    return render(sections, source=label, filters={k: v for k, v in filters.items() if v})


def write_report(db: Database | PathLike, out: PathLike, **options: Any) -> Path:
    """Write :func:`build_report` to ``out`` (atomically: a temporary file renamed into place).

    Args:
        db: as for :func:`build_report`.
        out: the HTML file to write; its folder is created.
        options: keyword options of :func:`build_report`.

    Returns:
        The path written.

    Raises:
        RecordsError: ``out`` cannot be written; and whatever :func:`build_report` raises.
    """
    text = build_report(db, **options)
    path = write_atomically(out, [text], what="report", hint="pass a writable -o path")
    log.info("wrote report of %d bytes to %s", len(text), path)
    return path


__all__ = [
    "ConfigRow",
    "ErrorKind",
    "FinalRound",
    "Finalist",
    "Importance",
    "RunInfo",
    "Section",
    "VendorFigure",
    "build_report",
    "collect",
    "device_limits",
    "knob_importance",
    "measure_numpy",
    "write_report",
]
