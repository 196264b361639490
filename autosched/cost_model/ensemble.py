"""A bootstrap ensemble of cost models: a prediction and how sure it is.

Each member is a boosted model (:func:`autosched.cost_model.make_model`) fitted on a
bootstrap resample of the rows (drawn per workload group, so every shape keeps its
share). The members' mean is the prediction and their standard deviation its
uncertainty: where the members disagree the data says little, which is where an
upper-confidence-bound search explores (as Bayesian optimisation's acquisition
functions do with a Gaussian process's variance). Rows a member never drew give
out-of-bag predictions, an honest estimate of how well the ensemble ranks configs it
was not fitted on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autosched.cost_model.features import prior_score
from autosched.cost_model.model import DEFAULT_KIND, MIN_OK, _check_xy, make_model


class BootstrapEnsemble:
    """Args:
    kind: cost model kind of every member.
    members: number of bootstrap members.
    seed: seeds the resampling and the members; a seeded fit is reproducible.
    min_ok: fewer successful rows than this and nothing is learned (``is_fitted`` False).
    kwargs: passed to each member's constructor.
    """

    def __init__(
        self,
        kind: str = DEFAULT_KIND,
        *,
        members: int = 5,
        seed: int = 0,
        min_ok: int = MIN_OK,
        **kwargs: Any,
    ) -> None:
        self.kind = kind
        self.members = members
        self.seed = seed
        self.min_ok = min_ok
        self.kwargs = kwargs

    def fit(
        self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None
    ) -> BootstrapEnsemble:
        X, y, groups = _check_xy(X, y, groups)
        self.members_: list[Any] = []
        self.oob_prediction_ = np.full(len(y), np.nan)
        if int(np.sum(y > 0)) < self.min_ok or np.ptp(y) == 0:
            return self
        rng = np.random.default_rng(self.seed)
        sums = np.zeros(len(y))
        counts = np.zeros(len(y))
        for k in range(self.members):
            idx = np.concatenate([rng.choice(rows, size=len(rows)) for rows in _group_rows(groups)])
            model = make_model(self.kind, seed=self.seed + k, min_ok=2, **self.kwargs)
            model.fit(X[idx], y[idx], groups[idx])
            if not model.is_fitted:
                continue
            self.members_.append(model)
            out = np.ones(len(y), dtype=bool)
            out[idx] = False
            if out.any():
                sums[out] += model.predict(X[out])
                counts[out] += 1
        has = counts > 0
        self.oob_prediction_[has] = sums[has] / counts[has]
        return self

    @property
    def is_fitted(self) -> bool:
        return bool(getattr(self, "members_", None))

    def predict_dist(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the members' scores (the prior, 0 unfitted)."""
        X = np.asarray(X, dtype=np.float32)
        if not self.is_fitted:
            return prior_score(X), np.zeros(len(X))
        preds = np.stack([m.predict(X) for m in self.members_])
        return preds.mean(axis=0), preds.std(axis=0)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.predict_dist(X)[0]


def _group_rows(groups: np.ndarray) -> list[np.ndarray]:
    return [np.flatnonzero(groups == g) for g in np.unique(groups)]
