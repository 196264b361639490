"""Learned cost models: rank candidate configs so only promising ones are measured."""

from autosched.cost_model.features import (
    CORE_FEATURES,
    DEVICE_FEATURES,
    feature_names,
    featurize,
    prior_score,
)
from autosched.cost_model.model import (
    DEFAULT_KIND,
    KINDS,
    CostModel,
    HistGBModel,
    LightGBMModel,
    PriorModel,
    XGBoostModel,
    make_model,
    normalized_targets,
    training_set,
)

__all__ = [
    "CORE_FEATURES",
    "DEFAULT_KIND",
    "DEVICE_FEATURES",
    "KINDS",
    "CostModel",
    "HistGBModel",
    "LightGBMModel",
    "PriorModel",
    "XGBoostModel",
    "feature_names",
    "featurize",
    "make_model",
    "normalized_targets",
    "prior_score",
    "training_set",
]
