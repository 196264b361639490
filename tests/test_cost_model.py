"""The cost model, tested on real measurements replayed from tests/data.

``tests/data/matmul_pocl_records.jsonl`` holds ~830 measurements of random and
mutated-good configs of five matmul shapes on the PoCL CPU device, written by
``bench/collect_records.py``. Tests train on some shapes and rank another's records.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from autosched.cost_model import (
    CORE_FEATURES,
    DEFAULT_KIND,
    KINDS,
    CostModel,
    feature_names,
    featurize,
    make_model,
    normalized_targets,
    prior_score,
    training_set,
)
from autosched.errors import InvalidInputError
from autosched.ops import workload, workload_from_json
from autosched.records.record import Record
from autosched.space.config import Config
from autosched.space.device import device_limits
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits, Space

DATA = Path(__file__).parent / "data" / "matmul_pocl_records.jsonl"
TOP_K = 8
LIMITS = DeviceLimits(
    max_work_group_size=4096, max_work_item_size=4096, local_mem_bytes=4 << 20, is_cpu=True
)


@pytest.fixture(scope="module")
def records() -> list[Record]:
    with DATA.open() as f:
        return [Record.from_json(json.loads(line)) for line in f if line.strip()]


@pytest.fixture(scope="module")
def space_for(records):
    limits = device_limits(records[0].device, "opencl")
    spaces: dict[str, Space] = {}

    def make(wl: dict) -> Space:
        key = json.dumps(wl, sort_keys=True)
        if key not in spaces:
            spaces[key] = make_space(workload_from_json(wl), limits=limits)
        return spaces[key]

    return make


def _workload_keys(records) -> list[str]:
    return list(dict.fromkeys(r.workload_key for r in records))


def _split(records, space_for, held_key):
    train = [r for r in records if r.workload_key != held_key]
    test = [r for r in records if r.workload_key == held_key]
    names = feature_names(space_for(test[0].workload))
    X, y, g = training_set(train, space_for, names=names)
    Xt, yt, _ = training_set(test, space_for, names=names)
    return X, y, g, Xt, yt


def _top_mean(pred: np.ndarray, y: np.ndarray, k: int = TOP_K) -> float:
    return float(y[np.argsort(-pred, kind="stable")[:k]].mean())


# -- features -------------------------------------------------------------------------


def test_featurize_shape_dtype_and_finite_values():
    space = make_space(workload("matmul", M=256, N=128, K=64), limits=LIMITS)
    configs = space.sample(np.random.default_rng(0), 300)
    X = featurize(space, configs)
    names = feature_names(space)
    assert X.shape == (len(configs), len(names))
    assert X.dtype == np.float32
    assert np.isfinite(X).all()
    assert len(set(names)) == len(names)
    assert tuple(names[: len(CORE_FEATURES)]) == CORE_FEATURES
    # Columns carry the space's own description of each config, then the workload.
    described = space.describe(configs[7])
    for j, n in enumerate(names):
        if n in described:
            assert X[7, j] == pytest.approx(described[n], rel=1e-6)
    row = dict(zip(names, X[7], strict=True))
    assert row["w_log_s0"] == 8 and row["w_log_s1"] == 7 and row["w_log_r0"] == 6
    assert row["w_log_flops"] == pytest.approx(math.log2(2 * 256 * 128 * 64))


def test_featurize_cached_rows_equal_fresh_rows_and_empty_input():
    space = make_space(workload("matmul", M=64, N=64, K=64), limits=LIMITS)
    configs = space.sample(np.random.default_rng(1), 50)
    first = featurize(space, configs)
    again = featurize(space, configs[::-1])
    np.testing.assert_array_equal(first[::-1], again)
    fresh = featurize(make_space(space.workload, limits=LIMITS), configs)
    np.testing.assert_array_equal(first, fresh)
    assert featurize(space, []).shape == (0, len(feature_names(space)))


def test_the_feature_caches_stay_within_their_bound_in_all(monkeypatch):
    """Rows are cached per space, and the caches of every space together stay within
    their bound (a model job's tens of spaces): the largest starts afresh, and what it
    gave before is given again."""
    from autosched.cost_model import features

    monkeypatch.setattr(features, "_TOTAL_LIMIT", 100)
    rng = np.random.default_rng(3)
    spaces = [make_space(workload("matmul", M=m, N=64, K=64), limits=LIMITS) for m in (32, 48, 64)]
    first = {}
    for round_ in range(3):
        for space in spaces:
            configs = space.sample(rng, 30)
            X = featurize(space, configs)
            if round_ == 0:
                first[id(space)] = (configs, X)
            assert sum(len(c) for c in features._caches.values()) <= 100
    for space in spaces:
        configs, X = first[id(space)]
        assert np.array_equal(featurize(space, configs), X)


def test_featurize_lines_up_columns_across_shapes_and_epilogues():
    a = make_space(workload("matmul", M=128, N=128, K=128), limits=LIMITS)
    b = make_space(workload("matmul", M=512, N=256, K=64, epilogue="bias_relu"), limits=LIMITS)
    names = feature_names(a)
    Xb = featurize(b, b.sample(np.random.default_rng(2), 20), names=names)
    assert Xb.shape == (20, len(names))
    # Unknown names read 0, reordering follows the names given.
    picked = featurize(a, [a.default()], names=["w_log_r0", "no_such_feature", "log_vec"])
    assert picked.tolist() == [[7.0, 0.0, 0.0]]


def test_prior_prefers_what_runs_fast_on_pocl():
    space = make_space(workload("matmul", M=512, N=512, K=512), limits=LIMITS)
    good = Config(
        {
            "stage.A": "global",
            "stage.B": "global",
            "tile.i": (1, 8),
            "tile.j": (1, 32),
            "tile.k": (2, 2),
            "vec": 16,
        }
    )
    assert space.is_valid(good)
    scores = prior_score(featurize(space, [good, space.default()]))
    assert scores[0] > scores[1]


def test_prior_charges_padding_and_wants_tasks_only_to_fill_a_cpus_cores():
    cpu = DeviceLimits(is_cpu=True, cores=2, compute_units=2, vector_lanes=16, vector_registers=32)
    space = make_space(workload("matmul", M=127, N=1000, K=333), target="llvm", limits=cpu)
    names = feature_names(space)
    col = {n: names.index(n) for n in ("log_pad_waste", "log_groups", "dev_is_cpu")}
    rng = np.random.default_rng(0)
    padded = next(c for c in space.sample(rng, 2000) if space.pad_waste(c) > 1.05)
    row = featurize(space, [padded])[0]
    assert row[col["log_pad_waste"]] == pytest.approx(math.log2(space.pad_waste(padded)))
    unpadded = row.copy()
    unpadded[col["log_pad_waste"]] = 0.0
    gap = prior_score(np.stack([unpadded, row]))
    assert gap[0] - gap[1] == pytest.approx(math.log2(space.pad_waste(padded)), rel=1e-5)
    # Two tasks on two cores keep both busy; four change nothing on a CPU. A GPU
    # wants two work-groups per compute unit: the same rows read as a GPU's differ.
    two, four = unpadded.copy(), unpadded.copy()
    two[col["log_groups"]], four[col["log_groups"]] = 1.0, 2.0
    on_cpu = prior_score(np.stack([two, four]))
    assert on_cpu[0] == pytest.approx(on_cpu[1])
    two[col["dev_is_cpu"]] = four[col["dev_is_cpu"]] = 0.0
    on_gpu = prior_score(np.stack([two, four]))
    assert on_gpu[1] - on_gpu[0] == pytest.approx(0.5, rel=1e-5)


def test_prior_charges_accumulators_past_the_register_file_twice():
    """A register tile held through a reduction spills on every step past what the
    registers hold; a row-wise nest's values per step (no such tile) are charged once."""
    cpu = DeviceLimits(is_cpu=True, cores=2, compute_units=2, vector_lanes=16, vector_registers=32)
    matmul = make_space(workload("matmul", M=512, N=512, K=512), target="llvm", limits=cpu)
    names = feature_names(matmul)
    col = {n: names.index(n) for n in ("log_reg", "log_acc", "log_vec")}
    tile = Config(
        {
            "reduce_at": "tile",
            "stage.A": "global",
            "stage.B": "global",
            "tile.i": (8, 8),
            "tile.j": (4, 64),
            "tile.k": (16, 1),
            "tile_inner": "j",
            "vec": 16,
        }
    )
    assert matmul.is_valid(tile)
    row = featurize(matmul, [tile])[0]
    # 8 rows of 4 vectors of 16: 512 accumulators, all 32 registers, through the reduction.
    assert row[col["log_reg"]] == row[col["log_acc"]] == 9.0 and row[col["log_vec"]] == 4.0
    capacity = 4 + 5 + math.log2(0.75)  # 16 lanes x 32 registers, a quarter for operands
    fits = row.copy()
    fits[col["log_reg"]] = fits[col["log_acc"]] = capacity
    streamed = row.copy()
    streamed[col["log_acc"]] = 0.0
    over, at, once = prior_score(np.stack([row, fits, streamed]))
    excess = 9.0 - capacity
    assert at - over == pytest.approx(2 * excess, rel=1e-5)
    assert once - over == pytest.approx(excess, rel=1e-5)
    softmax = make_space(workload("softmax", rows=64, cols=128), target="llvm", limits=cpu)
    rows = featurize(softmax, softmax.sample(np.random.default_rng(0), 50), names=names)
    assert not rows[:, col["log_acc"]].any()


def test_prior_ranks_recorded_configs_better_than_random(records, space_for):
    tops, randoms = [], []
    for key in _workload_keys(records):
        recs = [r for r in records if r.workload_key == key]
        X, y, _ = training_set(recs, space_for)
        tops.append(_top_mean(prior_score(X), y))
        randoms.append(y.mean())
    assert np.mean(tops) > np.mean(randoms) + 0.2


# -- training data ----------------------------------------------------------------------


def test_training_set_targets_groups_and_skips_invalid(records, space_for):
    sample = records[:40] + records[-40:]
    bad = replace(sample[1], config={**sample[1].config, "vec": 3})
    failed = replace(sample[0], status="timeout", gflops=None, latency_s=None, latencies=())
    X, y, g = training_set([*sample, bad, failed], space_for)
    assert X.shape == (len(sample) + 1, len(feature_names(space_for(sample[0].workload))))
    assert np.all(np.diff(g) >= 0)  # grouped by workload
    for group in np.unique(g):
        assert y[g == group].max() == pytest.approx(1.0)
    assert ((y >= 0) & (y <= 1)).all()
    assert y[g == 0][-1] == 0.0  # the failed record, last of its workload
    assert normalized_targets([failed]).tolist() == [0.0]


def test_training_set_rejects_mixed_device_families(records, space_for):
    other = replace(records[0], device_family="elsewhere")
    with pytest.raises(InvalidInputError, match="device famil"):
        training_set([records[1], other], space_for)


# -- models -------------------------------------------------------------------------------


def test_every_kind_is_a_cost_model_and_unknown_kinds_are_refused():
    for kind in KINDS:
        assert isinstance(make_model(kind), CostModel)
    with pytest.raises(InvalidInputError, match="xgb-reg"):
        make_model("svm")


def test_model_top_picks_on_held_out_shapes_beat_random_and_shuffled_targets(records, space_for):
    model_tops, shuffled_tops, random_tops = [], [], []
    for key in _workload_keys(records):
        X, y, g, Xt, yt = _split(records, space_for, key)
        for seed in (0, 1):
            rng = np.random.default_rng(seed)
            model = make_model(seed=seed).fit(X, y, g)
            assert model.is_fitted
            model_tops.append(_top_mean(model.predict(Xt), yt))
            # The control: same features, targets shuffled within each workload.
            ys = y.copy()
            for group in np.unique(g):
                idx = np.flatnonzero(g == group)
                ys[idx] = rng.permutation(y[idx])
            shuffled_tops.append(_top_mean(make_model(seed=seed).fit(X, ys, g).predict(Xt), yt))
            random_tops.append(float(yt.mean()))

    def passes(tops: list[float]) -> bool:
        return np.mean(tops) > np.mean(random_tops) + 0.3

    assert passes(model_tops), (np.mean(model_tops), np.mean(random_tops))
    assert not passes(shuffled_tops), (np.mean(shuffled_tops), np.mean(random_tops))


def test_model_ranks_a_held_out_shape_better_than_the_prior(records, space_for):
    held = next(r.workload_key for r in records if r.workload["params"]["M"] == 512)
    X, y, g, Xt, yt = _split(records, space_for, held)
    pred = make_model(seed=0).fit(X, y, g).predict(Xt)
    rho = spearmanr(pred, yt).statistic
    rho_prior = spearmanr(prior_score(Xt), yt).statistic
    assert rho > 0.6
    assert rho > rho_prior
    assert _top_mean(pred, yt) > 3 * yt.mean()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "prior"])
def test_tiny_data_falls_back_to_the_prior(records, space_for, kind):
    X, y, g = training_set(records[:5], space_for)
    model = make_model(kind, seed=0).fit(X, y, g)
    assert not model.is_fitted
    np.testing.assert_array_equal(model.predict(X), prior_score(X))
    assert not make_model(kind).is_fitted
    X, y, g = training_set(records[:60], space_for)
    assert make_model(kind, seed=0).fit(X, y, g).is_fitted


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "prior"])
def test_fit_is_deterministic_for_a_seed(records, space_for, kind):
    X, y, g = training_set(records[::3], space_for)
    a = make_model(kind, seed=3, n_estimators=30).fit(X, y, g).predict(X)
    b = make_model(kind, seed=3, n_estimators=30).fit(X, y, g).predict(X)
    np.testing.assert_array_equal(a, b)
    assert np.ptp(a) > 0


@pytest.mark.parametrize("objective", ["rank:pairwise", "rank:ndcg", "reg:squarederror"])
def test_xgboost_fits_the_trees_xgb_train_fits(records, space_for, objective):
    """The XGBoost members boost round by round themselves (xgb.train's loop without its
    callbacks and closing reset, a sixth of a search's proposal): the same trees."""
    import xgboost as xgb

    from autosched.cost_model.model import XGBoostModel, _grades

    X, y, g = training_set(records[::2], space_for)
    model = XGBoostModel(objective, seed=5, n_estimators=40).fit(X, y, g)
    order = np.argsort(g, kind="stable")
    label = _grades(y[order]) if objective == "rank:ndcg" else y[order]
    qid = None if objective == "reg:squarederror" else g[order]
    params = {
        "objective": objective, "eta": 0.1, "max_depth": 6, "subsample": 0.8,
        "colsample_bytree": 0.8, "min_child_weight": 1.0, "tree_method": "hist",
        "nthread": 1, "seed": 5, "verbosity": 0,
    }  # fmt: skip
    booster = xgb.train(params, xgb.DMatrix(X[order], label=label, qid=qid), 40)
    np.testing.assert_array_equal(model.predict(X), booster.inplace_predict(X))


def test_default_kind_is_known():
    assert DEFAULT_KIND in KINDS
    assert type(make_model()) is type(make_model(DEFAULT_KIND))


def test_bad_inputs_are_refused_with_clear_errors():
    with pytest.raises(InvalidInputError, match="feature matrix"):
        prior_score(np.zeros((3, 2)))
    with pytest.raises(InvalidInputError, match="n_jobs"):
        make_model("xgb-reg", n_jobs=0)
    with pytest.raises(InvalidInputError, match="one value per row"):
        make_model().fit(np.zeros((4, 9)), np.zeros(3))
