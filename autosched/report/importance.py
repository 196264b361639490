"""Which features of a config a cost model learned to rely on, per operator and device family."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from autosched.cost_model import DEFAULT_KIND, KINDS, feature_names, make_model, training_set
from autosched.cost_model.model import MIN_OK
from autosched.errors import AutoschedError, InvalidInputError
from autosched.records.record import Record
from autosched.report.aggregate import SpaceCache, device_limits
from autosched.report.sections import Importance
from autosched.space.space import Space

TOP_FEATURES = 10
# Fewer training rows than this and feature importances say more about noise than about
# the device; the model itself also needs MIN_OK ok records before it learns anything.
MIN_IMPORTANCE_ROWS = 20
# More records than this and the model is fitted on a seeded random sample of them: the
# ranking of features settles long before, and a report should take seconds.
MAX_IMPORTANCE_RECORDS = 20_000


def knob_importance(
    records: Sequence[Record],
    *,
    device: Mapping[str, Any] | None = None,
    kind: str = DEFAULT_KIND,
    seed: int = 0,
    spaces: SpaceCache | None = None,
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
    spaces = spaces or SpaceCache()
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
