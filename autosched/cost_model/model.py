"""Learned cost models that rank candidate configs, so only promising ones are measured.

A cost model is a scikit-learn-style estimator over feature rows
(:func:`autosched.cost_model.features.featurize`): ``fit(X, y, groups) -> self`` and
``predict(X)``, higher = faster. ``y`` is, per workload, GFLOP/s over the best GFLOP/s
of that workload in the training set (failed candidates 0); ``groups`` names each
row's workload, so a ranking objective only compares configs of the same workload.

With fewer than ``min_ok`` successful records (default 8) nothing is learned: the
model scores by :func:`autosched.cost_model.features.prior_score` and ``is_fitted``
is False.

Default ``xgb-reg`` (XGBoost, squared error on the normalized throughput), chosen with
``bench/cost_model.py`` on 826 real PoCL records of 5 matmul shapes. Mean normalized
GFLOP/s of the model's top 8 / of 8 random picks, Spearman, NDCG@8 (5 shapes x 3 seeds):

    split                 xgb-reg                  xgb-pairwise   lgbm-lambdarank  prior
    held-out shape        0.675 / 0.160 .84 .89    0.659 .77 .86  0.682 .75 .88    0.588
    held-out + 32 of it   0.692 / 0.174 .83 .88    0.669 .77 .87  0.679 .76 .87    0.581
    random 75/25          0.597 / 0.212 .82 .94    0.599 .79 .94  0.576 .75 .91    0.532

The boosted kinds (lgbm-reg and hgb-reg too) are within about one standard error
(0.015) of each other on top-8 picks, xgb-ndcg trails (0.63/0.66/0.50). xgb-reg is best
or tied on every split with the best rank correlation, needs only xgboost, and fits
2,000 rows in 78 ms and predicts 5,000 in 9 ms on one thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from autosched.cost_model.features import feature_names, featurize, prior_score
from autosched.errors import InvalidInputError
from autosched.records.record import Record
from autosched.space.config import Config
from autosched.space.space import Space

log = logging.getLogger(__name__)

KINDS = ("xgb-reg", "xgb-pairwise", "xgb-ndcg", "lgbm-reg", "lgbm-lambdarank", "hgb-reg", "prior")
DEFAULT_KIND = "xgb-reg"
MIN_OK = 8
N_GRADES = 16  # relevance grades for objectives that need integer labels (NDCG, lambdarank)


@runtime_checkable
class CostModel(Protocol):
    """Scores configs from their features; only the order of the scores matters.

    Contract:

    * ``fit(X, y, groups)`` learns from rows ``X`` with targets ``y`` (higher = faster,
      comparable within a group) and ``groups`` (one integer per row naming its
      workload); it returns the model and refits from scratch each call.
    * ``predict(X)`` returns one float per row, higher = expected faster. It works
      before any fit (a prior score) and is deterministic.
    * ``is_fitted`` is True once a fit has learned from data, False while the model
      scores by its prior (never fitted, or too few successful records).
    """

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> CostModel: ...

    def predict(self, X: np.ndarray) -> np.ndarray: ...

    @property
    def is_fitted(self) -> bool: ...


def _check_xy(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise InvalidInputError(
            f"X must be 2-D and y one value per row; got X {X.shape}, y {y.shape}"
        )
    if groups is None:
        groups = np.zeros(len(y), dtype=np.int64)
    groups = np.asarray(groups)
    if groups.shape != y.shape:
        raise InvalidInputError(
            f"groups must have one value per row; got {groups.shape} for {len(y)} rows"
        )
    if not np.all(np.isfinite(X)) or not np.all(np.isfinite(y)):
        raise InvalidInputError("X and y must be finite")
    return X, y, groups


class PriorModel:
    """No learning: :func:`prior_score` of the features. ``is_fitted`` is always False."""

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> PriorModel:
        _check_xy(X, y, groups)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return prior_score(X)

    @property
    def is_fitted(self) -> bool:
        return False


class _BoostedModel:
    """Shared fit/predict logic: validation, the tiny-data fallback, thread limits.

    Args:
        seed: seeds the row and column subsampling; a seeded fit is reproducible.
        n_estimators, learning_rate, max_depth, subsample: the usual boosting knobs.
        n_jobs: threads (at most 2 on these machines). One by default: with both cores
            busy (a kernel being measured), OpenMP barriers of a 2-thread fit
            occasionally stall a fit from 0.1 s to 3-100 s; one thread never did, and
            is only ~10-40% slower on an idle machine.
        min_ok: fewer successful records than this and the model keeps its prior.
    """

    OBJECTIVES: tuple[str, ...] = ()  # accepted objectives, per library

    def __init__(
        self,
        *,
        seed: int = 0,
        n_estimators: int = 200,
        learning_rate: float = 0.1,
        max_depth: int = 6,
        subsample: float = 0.8,
        n_jobs: int = 1,
        min_ok: int = MIN_OK,
    ) -> None:
        self.seed = seed
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.subsample = subsample
        if n_jobs < 1:
            raise InvalidInputError(f"n_jobs={n_jobs!r} is not valid; accepted: 1 or more threads")
        self.n_jobs = n_jobs
        self.min_ok = min_ok

    def _checked_objective(self, objective: str) -> str:
        if objective not in self.OBJECTIVES:
            raise InvalidInputError(
                f"objective {objective!r} is not valid; accepted: {', '.join(self.OBJECTIVES)}"
            )
        return objective

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> _BoostedModel:
        X, y, groups = _check_xy(X, y, groups)
        self.n_features_in_ = X.shape[1]
        self.n_train_ = len(y)
        n_ok = int(np.sum(y > 0))
        self.booster_ = None
        if n_ok < self.min_ok or np.ptp(y) == 0:
            log.debug(
                "%d ok records (< %d) or constant target: scoring by the prior", n_ok, self.min_ok
            )
            return self
        # Rankers need each group's rows together; a stable sort keeps the fit deterministic.
        order = np.argsort(groups, kind="stable")
        self.booster_ = self._fit(X[order], y[order], groups[order])
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)
        if getattr(self, "booster_", None) is None:
            return prior_score(X)
        if X.shape[1] != self.n_features_in_:
            raise InvalidInputError(
                f"X has {X.shape[1]} features; the model was fitted on {self.n_features_in_}"
            )
        if len(X) == 0:
            return np.zeros(0)
        return np.asarray(self._predict(X), dtype=np.float64)

    @property
    def is_fitted(self) -> bool:
        return getattr(self, "booster_", None) is not None

    def _fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray) -> Any:
        """Fit on rows sorted by group; return the fitted booster or estimator."""
        raise NotImplementedError

    def _predict(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _grades(y: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(y, 0.0, 1.0) * (N_GRADES - 1)).astype(np.int32)


def _group_sizes(groups: np.ndarray) -> np.ndarray:
    # groups are sorted: sizes of consecutive runs.
    change = np.flatnonzero(np.diff(groups)) + 1
    return np.diff(np.concatenate([[0], change, [len(groups)]]))


class XGBoostModel(_BoostedModel):
    """XGBoost with objective ``reg:squarederror``, ``rank:pairwise`` or ``rank:ndcg``."""

    OBJECTIVES = ("reg:squarederror", "rank:pairwise", "rank:ndcg")

    def __init__(self, objective: str = "rank:pairwise", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.objective = self._checked_objective(objective)

    def _fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray) -> Any:
        import xgboost as xgb

        params = {
            "objective": self.objective,
            "eta": self.learning_rate,
            "max_depth": self.max_depth,
            "subsample": self.subsample,
            "colsample_bytree": 0.8,
            "min_child_weight": 1.0,
            "tree_method": "hist",
            "nthread": self.n_jobs,
            "seed": self.seed,
            "verbosity": 0,
        }
        if self.objective == "rank:ndcg":
            dtrain = xgb.DMatrix(X, label=_grades(y), qid=groups)
        elif self.objective == "rank:pairwise":
            dtrain = xgb.DMatrix(X, label=y, qid=groups)
        else:
            dtrain = xgb.DMatrix(X, label=y)
        # xgb.train's own loop, less what it adds for evaluation sets this fit has none
        # of (a callback container called twice a round) and the closing reset of the
        # training caches (6 ms a fit): the same rounds on the same data, the same trees.
        # A search fits some 65 boosters a batch, so that was a sixth of its proposal.
        booster = xgb.Booster(params, [dtrain])
        for i in range(self.n_estimators):
            booster.update(dtrain, iteration=i)
        return booster

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.booster_.inplace_predict(X)


class LightGBMModel(_BoostedModel):
    """LightGBM with objective ``regression`` or ``lambdarank``."""

    OBJECTIVES = ("regression", "lambdarank")

    def __init__(self, objective: str = "lambdarank", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.objective = self._checked_objective(objective)

    def _fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray) -> Any:
        import lightgbm as lgb

        params = {
            "objective": self.objective,
            "learning_rate": self.learning_rate,
            "num_leaves": 31,
            "max_depth": self.max_depth,
            "min_data_in_leaf": 5,
            "bagging_fraction": self.subsample,
            "bagging_freq": 1,
            "feature_fraction": 0.8,
            "num_threads": self.n_jobs,
            "seed": self.seed,
            "deterministic": True,
            "force_row_wise": True,
            "verbosity": -1,
        }
        if self.objective == "lambdarank":
            data = lgb.Dataset(X, label=_grades(y), group=_group_sizes(groups), free_raw_data=False)
        else:
            data = lgb.Dataset(X, label=y, free_raw_data=False)
        return lgb.train(params, data, num_boost_round=self.n_estimators)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        return self.booster_.predict(X, num_threads=self.n_jobs)


class HistGBModel(_BoostedModel):
    """scikit-learn's ``HistGradientBoostingRegressor`` on the normalized throughput."""

    def _fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray) -> Any:
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        model = HistGradientBoostingRegressor(
            learning_rate=self.learning_rate,
            max_iter=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=5,
            early_stopping=False,
            random_state=self.seed,
        )
        with threadpool_limits(self.n_jobs):
            return model.fit(X, y)

    def _predict(self, X: np.ndarray) -> np.ndarray:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(self.n_jobs):
            return self.booster_.predict(X)


def make_model(kind: str = DEFAULT_KIND, seed: int = 0, **kwargs: Any) -> CostModel:
    """A cost model by name; ``kwargs`` go to its constructor (``n_estimators``, ``n_jobs``...).

    Kinds: ``xgb-reg``, ``xgb-pairwise``, ``xgb-ndcg``, ``lgbm-reg``, ``lgbm-lambdarank``,
    ``hgb-reg``, ``prior``.
    """
    if kind == "xgb-reg":
        return XGBoostModel("reg:squarederror", seed=seed, **kwargs)
    if kind == "xgb-pairwise":
        return XGBoostModel("rank:pairwise", seed=seed, **kwargs)
    if kind == "xgb-ndcg":
        return XGBoostModel("rank:ndcg", seed=seed, **kwargs)
    if kind == "lgbm-reg":
        return LightGBMModel("regression", seed=seed, **kwargs)
    if kind == "lgbm-lambdarank":
        return LightGBMModel("lambdarank", seed=seed, **kwargs)
    if kind == "hgb-reg":
        return HistGBModel(seed=seed, **kwargs)
    if kind == "prior":
        return PriorModel()
    raise InvalidInputError(f"cost model kind {kind!r} is not known; accepted: {', '.join(KINDS)}")


def normalized_targets(records: Sequence[Record]) -> np.ndarray:
    """Per workload, GFLOP/s over the best GFLOP/s of that workload here; failures 0."""
    best: dict[str, float] = {}
    for r in records:
        if r.ok and r.gflops:
            best[r.workload_key] = max(best.get(r.workload_key, 0.0), r.gflops)
    return np.array(
        [(r.gflops or 0.0) / best[r.workload_key] if r.ok and r.gflops else 0.0 for r in records],
        dtype=np.float64,
    )


def training_set(
    records: Sequence[Record],
    space_for: Callable[[dict], Space],
    *,
    names: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training data from records of one operator on one device family.

    Records whose config is not valid in its workload's current space are skipped.
    Rows come grouped by workload, workloads in order of first appearance.

    Args:
        records: measurements of any status; failures become target 0.
        space_for: the space of a workload, given ``Record.workload`` (plain data).
        names: feature columns (e.g. ``feature_names(target_space)``, so that the rows
            match the candidates to be scored); default: those of the first workload.

    Returns:
        ``(X, y, groups)``: float32 features, normalized throughput (see
        :func:`normalized_targets`), and the workload index of each row.

    Raises:
        InvalidInputError: records of several operators or device families.
    """
    ops = sorted({r.op for r in records})
    families = sorted({r.device_family for r in records})
    if len(ops) > 1 or len(families) > 1:
        raise InvalidInputError(
            "records must be of one operator and one device family; "
            f"got ops {ops}, families {families}"
        )
    by_workload: dict[str, list[Record]] = {}
    for r in records:
        by_workload.setdefault(r.workload_key, []).append(r)
    xs, ys, gs = [], [], []
    skipped = 0
    for g, recs in enumerate(by_workload.values()):
        space = space_for(recs[0].workload)
        if names is None:
            names = feature_names(space)
        configs: list[Config] = []
        kept: list[Record] = []
        for r in recs:
            c = Config.from_json(r.config)
            if space.is_valid(c):
                configs.append(c)
                kept.append(r)
        skipped += len(recs) - len(kept)
        if not kept:
            continue
        xs.append(featurize(space, configs, names=names))
        ys.append(normalized_targets(kept))
        gs.append(np.full(len(kept), g, dtype=np.int64))
    if skipped:
        log.info("skipped %d records whose configs are not valid in the current space", skipped)
    if not xs:
        width = len(names) if names is not None else 0
        return np.zeros((0, width), np.float32), np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)
