"""The model search's sources: device prior, own ensemble, transfer, and their weights.

Real PoCL records (tests/data, 5 matmul shapes on an AVX-512 Xeon), real spaces and
real XGBoost fits; no device needed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from autosched.cost_model import (
    CORE_FEATURES,
    feature_names,
    featurize,
    prior_score,
    training_set,
)
from autosched.cost_model.ensemble import BootstrapEnsemble
from autosched.ops import workload, workload_from_json
from autosched.records.record import Record
from autosched.search import make_strategy
from autosched.search.base import score
from autosched.search.evolutionary import EvolutionarySearch, diverse
from autosched.search.sources import (
    BEST_RANKER_AFTER,
    FIRST_PICKS,
    TIE_DECIMALS,
    Blend,
    grouped_kendall,
    kendall,
    ranks,
    tau_noise,
)
from autosched.space.config import Config
from autosched.space.device import device_limits, similarity, vector_shape
from autosched.space.select import make_space

DATA = Path(__file__).parent / "data" / "matmul_pocl_records.jsonl"


@pytest.fixture(scope="module")
def records() -> list[Record]:
    with DATA.open() as f:
        return [Record.from_json(json.loads(line)) for line in f if line.strip()]


@pytest.fixture(scope="module")
def limits(records):
    return device_limits(records[0].device, "opencl")


def _one_shape(records):
    key = records[0].workload_key
    return [r for r in records if r.workload_key == key]


def _space_for(limits):
    spaces = {}

    def make(wl):
        k = json.dumps(wl, sort_keys=True)
        if k not in spaces:
            spaces[k] = make_space(workload_from_json(wl), limits=limits)
        return spaces[k]

    return make


# -- what the device says before anything is measured ---------------------------------


@pytest.mark.parametrize(
    ("fingerprint", "shape"),
    [
        ({"target": "llvm", "isa": ["sse4_2", "avx", "avx2", "fma", "avx512f"]}, (16, 32)),
        ({"target": "llvm", "isa": ["sse4_2", "avx", "avx2", "fma"]}, (8, 16)),
        ({"target": "llvm", "isa": ["asimd"]}, (4, 32)),
        (
            {"type": "cpu", "name": "pthread-haswell-AMD EPYC", "native_vector_width_float": 8},
            (8, 16),
        ),
        # A PoCL fingerprint recorded before the native width was kept: its name says.
        ({"type": "cpu", "name": "pthread-skylake-avx512-Intel(R) Xeon(R)"}, (16, 32)),
        ({"type": "gpu", "name": "NVIDIA H100", "native_vector_width_float": 1}, (1, 64)),
    ],
)
def test_vector_shape_comes_from_the_fingerprint(fingerprint, shape):
    assert vector_shape(fingerprint) == shape


def test_prior_follows_the_device_vector_width(limits):
    wl = workload("matmul", M=512, N=512, K=512)
    wide = dataclasses.replace(limits, vector_lanes=16, vector_registers=32)
    narrow = dataclasses.replace(limits, vector_lanes=4, vector_registers=16)
    base = {"stage.A": "global", "stage.B": "global", "tile.i": (1, 4), "tile.k": (2, 2)}
    v16 = Config({**base, "tile.j": (1, 64), "vec": 16})
    v4 = Config({**base, "tile.j": (1, 16), "vec": 4})
    for lim, better in ((wide, 0), (narrow, 1)):
        space = make_space(wl, limits=lim)
        assert space.is_valid(v16) and space.is_valid(v4)
        scores = prior_score(featurize(space, [v16, v4]))
        assert np.argmax(scores) == better, (lim.vector_lanes, scores)


def test_on_a_gpu_the_prior_wants_work_items_to_fill_the_device():
    """The H200 sample (bench/replay): a register tile that leaves too few work-items in
    flight starves a GPU, so the prior's ranking of the measured configs follows them
    (Kendall tau 0.21 without the occupancy term, 0.41 with it)."""
    from autosched.tuning.replay import read_records

    path = Path(__file__).parent.parent / "bench/replay/matmul-512-opencl-h200.jsonl.gz"
    ok = [r for r in read_records(path) if r.ok]
    space = make_space(
        workload("matmul", M=512, N=512, K=512), limits=device_limits(ok[0].device, "opencl")
    )
    scores = prior_score(featurize(space, [Config(r.config) for r in ok]))
    assert kendall(scores, np.array([r.gflops for r in ok])) > 0.35


@pytest.mark.parametrize(
    "sample", ["matmul-512-opencl-h200", "matmul-512-opencl-h100", "conv2d-resnet3x3-opencl-h100"]
)
def test_on_a_gpu_the_prior_credits_dedicated_local_memory_and_scalar_work_items(sample):
    """On NVIDIA's driver (native vector width 1, dedicated local memory) every sample's
    best config stages both operands with scalar work-items: the prior puts it in its
    top 3 % (it was 19 %, 29 % and 28 % with a CPU's vector preference and no credit
    for staging), and the same rows read as an emulated local memory's do not."""
    from autosched.tuning.replay import read_records

    path = Path(__file__).parent.parent / f"bench/replay/{sample}.jsonl.gz"
    ok = [r for r in read_records(path) if r.ok]
    space = make_space(
        workload_from_json(ok[0].workload), limits=device_limits(ok[0].device, "opencl")
    )
    X = featurize(space, [Config(r.config) for r in ok])
    best = int(np.argmax([r.gflops for r in ok]))

    def place_of_best(rows: np.ndarray) -> int:
        scores = prior_score(rows)
        return int((scores > scores[best]).sum())

    place = place_of_best(X)
    assert place <= 0.03 * len(ok), place
    emulated = X.copy()
    emulated[:, feature_names(space).index("dev_local_emulated")] = 1.0
    assert place_of_best(emulated) > place


@pytest.mark.parametrize("cpu", ["xeon6", "zen3", "zen4", "zen5"])
def test_on_llvm_the_prior_counts_each_parallel_task_s_fixed_cost(cpu):
    """Where one thread runs each parallel task alone (llvm), a task's fixed cost must be
    amortised over its work, and tasks that do not split evenly over the cores leave
    some idle: on every CPU's llvm softmax sample the best config under its 20 choices
    of rows per task (1 to 1,536) runs from about a third of its best at one row per
    task to its best at a few hundred, and the prior now orders them so (Kendall's tau
    0.18 to 0.28 before, the fill term alone; 0.49 to 0.72 with these terms)."""
    from scipy.stats import kendalltau

    from autosched.tuning.replay import load_caches

    path = Path(__file__).parent.parent / f"bench/replay/softmax-1536x128-llvm-{cpu}.jsonl.gz"
    (cache,) = load_caches(path)
    space = make_space(cache.workload, target="llvm", limits=cache.slot.limits)
    ok = [r for r in cache.records.values() if r.ok]
    best = max(ok, key=lambda r: r.gflops)
    rows = [
        r
        for r in ok
        if all(r.config.get(k) == v for k, v in best.config.items() if k != "rows_per_task")
    ]
    assert len({r.config["rows_per_task"] for r in rows}) == 20
    scores = prior_score(featurize(space, [Config(r.config) for r in rows]))
    assert kendalltau(scores, [r.gflops for r in rows])[0] > 0.45


def test_a_gpu_that_does_not_say_its_compute_units_gets_no_prior():
    """IREE's Vulkan devices carry no compute-unit count (vulkaninfo prints none): on the
    H100's IREE Vulkan sample the prior without its fill terms ranked the measured
    configs below chance, so it scores every config alike there; the same rows with the
    H100's 132 compute units get the GPU prior."""
    from autosched.tuning.replay import read_records

    path = Path(__file__).parent.parent / "bench/replay/conv2d-resnet3x3-iree-vulkan-h100.jsonl.gz"
    ok = [r for r in read_records(path) if r.ok]
    assert ok[0].device["type"] == "gpu" and ok[0].device["compute_units"] == 1
    space = make_space(
        workload_from_json(ok[0].workload),
        target="iree-vulkan",
        limits=device_limits(ok[0].device, "iree-vulkan"),
    )
    X = featurize(space, [Config(r.config) for r in ok])
    assert not prior_score(X).any()
    known = X.copy()
    known[:, feature_names(space).index("dev_log_units")] = np.log2(132)
    assert np.ptp(prior_score(known)) > 1.0


# -- the own ensemble --------------------------------------------------------------------


def test_ensemble_spread_out_of_bag_and_seed(records, limits):
    X, y, g = training_set(records, _space_for(limits))
    a = BootstrapEnsemble(members=4, seed=3).fit(X, y, g)
    b = BootstrapEnsemble(members=4, seed=3).fit(X, y, g)
    assert a.is_fitted and len(a.members_) == 4
    mean, spread = a.predict_dist(X)
    np.testing.assert_array_equal(mean, b.predict_dist(X)[0])
    assert (spread > 0).mean() > 0.9
    oob = a.oob_prediction_
    has = np.isfinite(oob)
    assert has.mean() > 0.8  # most rows were left out by some member
    assert kendall(oob[has], y[has]) > 0.4  # and are ranked well by the others
    assert not BootstrapEnsemble().fit(X[:5], y[:5], g[:5]).is_fitted


# -- weighing the sources by how they rank this device ---------------------------------


def _relabel(recs, gflops, family="this-device"):
    return [
        dataclasses.replace(r, gflops=float(v), device_family=family, status="ok")
        for r, v in zip(recs, gflops, strict=True)
    ]


def _labelled(records, limits):
    """One shape's records that ran, its space and their feature rows."""
    mine = [r for r in _one_shape(records) if r.ok]
    space_for = _space_for(limits)
    space = space_for(mine[0].workload)
    return mine, space_for, space, featurize(space, [Config(r.config) for r in mine])


def test_a_prior_that_ranks_this_device_wrongly_fades(records, limits):
    mine, space_for, space, X = _labelled(records, limits)
    # A device on which everything the prior likes is slow.
    upside_down = _relabel(mine, 1.0 + ranks_of(-prior_score(X)))
    blend = Blend(space, seed=0, members=3)
    blend.refit(upside_down[:32], upside_down[:32], space_for)
    w = blend.weights()
    assert w["prior"] == 0.0 and w["own"] > 0.2
    rest = upside_down[32:]
    pred = blend.score([Config(r.config) for r in rest])
    assert kendall(pred, np.array([r.gflops for r in rest])) > 0.3


def test_a_prior_that_ranks_this_device_well_keeps_its_say(records, limits):
    mine, space_for, space, X = _labelled(records, limits)
    agreeing = _relabel(mine, 1.0 + ranks_of(prior_score(X)))
    blend = Blend(space, seed=0, members=3)
    blend.refit(agreeing[:16], agreeing[:16], space_for)
    assert blend.weights()["prior"] > 0.9


@pytest.mark.parametrize("vectors", [True, False])
def test_on_a_cpu_the_measurements_say_whether_the_vector_width_counts(records, limits, vectors):
    # PoCL on an AVX2 Zen 3 runs scalar work-items as vector lanes; on the AVX-512 Zens
    # a config's own vectors pay. The prior with and without its vector term are both
    # read; the one that ranks the measurements' top better takes the prior's weight.
    assert limits.is_cpu
    mine, space_for, space, X = _labelled(records, limits)
    assert len(set(X[:, CORE_FEATURES.index("log_vec")])) > 1  # their widths differ
    device = _relabel(mine, 1.0 + ranks_of(prior_score(X, vectors=vectors)))[:24]
    blend = Blend(space, seed=0, members=3)
    blend.refit(device, device, space_for)
    w = blend.weights()
    (chosen, other) = ("prior", "prior:no-vectors") if vectors else ("prior:no-vectors", "prior")
    assert w[chosen] > 0.5 and w[other] == 0.0, w
    # A GPU's driver reports its native width: the vector term stays.
    gpu = dataclasses.replace(limits, is_cpu=False)
    gpu_space = make_space(space.workload, limits=gpu)
    gpu_blend = Blend(gpu_space, seed=0, members=3)
    gpu_blend.refit(device, device, lambda _w: gpu_space)
    assert "prior:no-vectors" not in gpu_blend.weights()


def _other_device_records(records, target):
    """The operator's other shapes, as another device family measured them."""
    return [
        dataclasses.replace(r, device_family="other-device")
        for r in records
        if r.workload_key != target[0].workload_key
    ]


def test_transfer_from_another_device_family(records, limits):
    target = _one_shape(records)
    theirs = _other_device_records(records, target)
    space = _space_for(limits)(target[0].workload)
    search = EvolutionarySearch(
        space, rng=np.random.default_rng(0), space_for=_space_for(limits), family="mine"
    )
    search.observe(theirs)
    assert not search.seen and not search.own  # nothing measured on this device yet
    assert len(search.propose(8)) == 8
    assert "transfer:other-device" in search.blend.weights()
    # Cold, the blend already ranks this shape's configs by what the other device saw.
    ok = [r for r in target if r.ok]
    cold = search.blend.score([Config(r.config) for r in ok])
    assert kendall(cold, np.array([r.gflops for r in ok])) > 0.3
    # Once this device disagrees with the other one, the transfer source fades.
    upside_down = _relabel(ok[:24], [1.0 / r.gflops for r in ok[:24]], family="mine")
    search.observe(upside_down)
    search.propose(8)
    assert search.blend.weights()["transfer:other-device"] == 0.0


def test_a_transfer_source_steers_only_by_what_it_ranks_beyond_chance(records, limits):
    target = [r for r in _one_shape(records) if r.ok]
    theirs = _other_device_records(records, target)
    space_for = _space_for(limits)
    space = space_for(target[0].workload)
    blend = Blend(space, seed=0, members=3)
    blend.add_transfer("other-device", theirs, space_for)
    model = blend.transfer["other-device"].predict
    theirs_pred = model(featurize(space, [Config(r.config) for r in target]))
    # This device agrees with the other one's model in part: a noisy copy of its ranking.
    rng = np.random.default_rng(1)
    noisy = theirs_pred + rng.normal(0, 2 * np.std(theirs_pred), len(theirs_pred))
    mine = _relabel(target, 1.0 + ranks_of(noisy))
    for n in (9, BEST_RANKER_AFTER - 1):
        blend.refit(mine[:n], mine[:n], space_for)
        tau = kendall(theirs_pred[:n], np.array([r.gflops for r in mine[:n]]))
        assert tau > 0
        w = blend.weights()
        assert w["transfer:other-device"] == pytest.approx(max(0.0, tau - tau_noise(n)))
        assert w["transfer:other-device"] < tau
    assert tau_noise(9) == pytest.approx(0.2665, abs=1e-3)
    assert tau_noise(40) == pytest.approx(0.1100, abs=1e-3)


def test_once_measured_enough_a_source_weighs_its_chance_of_ranking_best(records, limits):
    # A transfer source that ranks this device's measurements beyond chance, but worse
    # than the prior does, keeps a say while they are few and loses it once they are
    # enough to tell the two apart: its weight is the share of bootstrap resamples in
    # which it ranks them best (none), not its clipped tau.
    target, space_for, space, X = _labelled(records, limits)
    mine = _relabel(target, 1.0 + ranks_of(prior_score(X)))
    blend = Blend(space, seed=0, members=3)
    blend.add_transfer("other-device", _other_device_records(records, target), space_for)
    theirs = blend.transfer["other-device"].predict(X)
    n = BEST_RANKER_AFTER + 16
    assert len(mine) >= n
    y = np.array([r.gflops for r in mine])
    for m in (BEST_RANKER_AFTER - 1, n):
        assert kendall(theirs[:m], y[:m]) - tau_noise(m) > 0.05  # beyond chance
    blend.refit(mine[: BEST_RANKER_AFTER - 1], mine[: BEST_RANKER_AFTER - 1], space_for)
    assert blend.weights()["transfer:other-device"] > 0.05
    blend.refit(mine[:n], mine[:n], space_for)
    w = blend.weights()
    assert w["transfer:other-device"] == 0.0, w
    assert w["prior"] > 0.9 and w["own"] < 0.5, w
    # The blend then ranks what is left as the prior does.
    rest = [Config(r.config) for r in mine[n:]]
    assert kendall(blend.score(rest), y[n:]) > 0.5


def test_before_any_measurement_each_source_s_top_picks_come_first(records, limits):
    target = _one_shape(records)
    theirs = _other_device_records(records, target)
    space = _space_for(limits)(target[0].workload)
    blend = Blend(space, seed=0, members=3)
    blend.add_transfer("other-device", theirs, _space_for(limits))
    blend.refit([], [], _space_for(limits))
    assert not blend.weighed and len(blend.sources) == 2
    configs = space.sample(np.random.default_rng(1), 300)
    X = featurize(space, configs)
    # Mean ranks would put compromises first; each source's own best leads instead, a
    # source of similarity s from position FIRST_PICKS * (1 / s - 1) on.
    order = np.argsort(-blend.score(configs), kind="stable").tolist()
    for s in blend.sources:
        top = order.index(int(np.argmax(s.predict(X))))
        assert top <= FIRST_PICKS * (1 / s.similar - 1) + len(blend.sources), (s.name, top)
    assert order[0] == int(np.argmax(prior_score(X)))
    # Once the workload has measurements, the sources are weighed by them.
    ok = [dataclasses.replace(r, device_family="mine") for r in target if r.ok][:8]
    blend.refit(ok, ok, _space_for(limits))
    assert blend.weighed


def test_a_less_alike_device_s_top_picks_come_later(records, limits):
    target = _one_shape(records)
    theirs = _other_device_records(records, target)
    space = _space_for(limits)(target[0].workload)
    configs = space.sample(np.random.default_rng(1), 300)
    blend = Blend(space, seed=0, members=3)
    blend.add_transfer("other-device", theirs, _space_for(limits))
    transfer = blend.transfer["other-device"].predict
    # Leave out the configs both rank in their first ten, the transfer's favourites the
    # prior ranks in its first 40 (past both paces below), and the prior's ties (the
    # transfer orders those, see below): the two orders then differ.
    prior = np.round(prior_score(featurize(space, configs)), TIE_DECIMALS)
    _, first = np.unique(prior, return_index=True)
    configs = [configs[i] for i in sorted(first)]
    while True:
        X = featurize(space, configs)
        prior_first = np.argsort(-prior_score(X), kind="stable")
        both = set(prior_first[:10]) & set(np.argsort(-transfer(X))[:10])
        favourite = int(np.argmax(transfer(X)))
        both |= {favourite} & set(prior_first[:40].tolist())
        if not both:
            break
        configs = [c for i, c in enumerate(configs) if i not in both]
    prior_order = np.argsort(-prior_score(X), kind="stable")
    ahead = []
    for similar in (1.0, 0.55):
        blend = Blend(space, seed=0, members=3)
        blend.add_transfer("other-device", theirs, _space_for(limits), similar=similar)
        blend.refit([], [], _space_for(limits))
        top = int(np.argmax(blend.sources[1].predict(X)))
        assert top not in prior_order[:8]
        order = np.argsort(-blend.score(configs), kind="stable").tolist()
        # Its first pick comes after the prior's picks that outscore it:
        # 1 / (FIRST_PICKS + j) > pace / FIRST_PICKS.
        pace = blend.transfer["other-device"].similar
        n = int(np.floor(FIRST_PICKS / pace - FIRST_PICKS + 1e-9)) + 1
        n = min(n, prior_order.tolist().index(top))  # unless the prior ranks it sooner
        assert order[:n] == prior_order[:n].tolist() and order[n] == top
        ahead.append(n)
    assert ahead[0] < ahead[1]  # a less alike device's picks come later


def test_where_the_prior_ties_the_other_sources_order_the_tied_configs(records, limits):
    target = _one_shape(records)
    space = _space_for(limits)(target[0].workload)
    configs = space.sample(np.random.default_rng(1), 300)
    X = featurize(space, configs)
    prior = np.round(prior_score(X), TIE_DECIMALS)
    groups = [np.flatnonzero(prior == v) for v in np.unique(prior)]
    groups = [g for g in groups if len(g) >= 2]
    assert sum(len(g) for g in groups) >= 10  # configs the device's properties cannot part
    # Before measurements: the prior's turns take its tied configs in the order another
    # device's model ranks them (the draw's order said nothing).
    blend = Blend(space, seed=0, members=3)
    blend.add_transfer("other-device", _other_device_records(records, target), _space_for(limits))
    blend.refit([], [], _space_for(limits))
    transfer = blend.transfer["other-device"].predict(X)
    place = np.empty(len(configs), dtype=int)
    place[np.argsort(-blend.score(configs), kind="stable")] = np.arange(len(configs))
    for g in groups:
        assert place[g[np.argsort(-transfer[g])]].tolist() == sorted(place[g].tolist())
    # Once weighed, a tie counts as one: the tied configs share their mean rank.
    assert ranks(np.array([3.0, 1.0, 3.0, 2.0])) == pytest.approx([5 / 6, 0, 5 / 6, 1 / 3])
    assert ranks(np.array([1.0, 1.0 + 1e-9])) == pytest.approx([0.5, 0.5])


def test_a_source_the_prior_already_explains_has_less_say_before_measurements(records, limits):
    """Before this device has measured anything, a transfer source's pace is its device's
    similarity times the share of its records' ranking that the prior does not already
    give (1 - the prior's Kendall tau on them): on the replay samples where the prior
    ranks the other devices' records well (llvm, tau ~0.5) their models only delayed the
    prior's picks (18.5 trials to 95 % with transfer against 10 cold)."""
    target = _one_shape(records)
    space_for = _space_for(limits)
    theirs = [
        r
        for r in _other_device_records(records, target)
        if r.ok and space_for(r.workload).is_valid(Config(r.config))
    ]
    space = space_for(target[0].workload)
    X, y, g = training_set(theirs, space_for, names=feature_names(space))
    explained = grouped_kendall(prior_score(X), y, g)
    assert 0 < explained < 1
    blend = Blend(space, seed=0, members=3)
    blend.add_transfer("other-device", theirs, space_for, similar=0.8)
    assert blend.transfer["other-device"].similar == pytest.approx(0.8 * (1 - explained))
    # Records that rank as the prior does leave the source no say; reversed, all of it.
    names = feature_names(space)
    scores = np.array(
        [prior_score(featurize(space_for(r.workload), [Config(r.config)], names=names))[0]
         for r in theirs]
    )  # fmt: skip
    agree = _relabel(theirs, 1.0 + ranks_of(scores), family="other")
    blend.add_transfer("agree", agree, space_for, similar=0.8)
    assert blend.transfer["agree"].similar == pytest.approx(0.0, abs=0.01)  # ties: tau < 1
    disagree = _relabel(theirs, 1.0 + ranks_of(-scores), family="other")
    blend.add_transfer("disagree", disagree, space_for, similar=0.8)
    assert blend.transfer["disagree"].similar == pytest.approx(0.8)


def test_device_similarity():
    def cpu(**extra):
        fp = {"type": "cpu", "compute_units": 2, "max_work_group_size": 4096}
        return device_limits({**fp, "local_mem_bytes": 1 << 20, **extra}, "opencl")

    avx512 = cpu(native_vector_width_float=16)
    avx2 = cpu(native_vector_width_float=8)
    gpu = device_limits(
        {
            "type": "gpu",
            "compute_units": 108,
            "max_work_group_size": 1024,
            "local_mem_bytes": 48 << 10,
            "native_vector_width_float": 1,
        },
        "opencl",
    )
    assert similarity(avx512, avx512) == 1.0
    assert 0.4 < similarity(avx512, avx2) == similarity(avx2, avx512) < 0.7
    assert similarity(avx512, gpu) == 0.0


def test_batches_are_diverse():
    space = make_space(
        workload("matmul", M=256, N=256, K=256),
        limits=device_limits(
            {
                "type": "cpu",
                "max_work_group_size": 4096,
                "local_mem_bytes": 1 << 20,
                "native_vector_width_float": 8,
                "compute_units": 2,
            },
            "opencl",
        ),
    )
    ranked = space.sample(np.random.default_rng(0), 200)
    # The best-ranked config and all its one-knob neighbours come first.
    head = [ranked[0]] + [
        c for c in (space.mutate(ranked[0], np.random.default_rng(i)) for i in range(20)) if c
    ]
    picked = diverse(head + ranked, 8)
    assert len(picked) == 8
    for i, a in enumerate(picked):
        for b in picked[i + 1 :]:
            assert sum(a.get(k) != b.get(k) for k in {*a, *b}) >= 2


def test_a_batch_s_picks_are_scored_as_if_the_picks_before_them_were_measured(records, limits):
    """Within a batch the own ensemble is refitted as if each pick had been measured at
    its predicted mean (a kriging believer), so the next pick is scored with that: a
    batch of 8 searches like a search refitted after every measurement. After the batch
    the blend scores with the measurements alone again."""
    mine = [r for r in _one_shape(records) if r.ok]
    space_for = _space_for(limits)
    space = space_for(mine[0].workload)
    blend = Blend(space, seed=0, members=3)
    blend.refit(mine[:24], mine[:24], space_for)
    rest = [Config(r.config) for r in mine[24:]]
    before = blend.score(rest)
    X = featurize(space, rest[:40], names=blend.names)
    measured_mean = blend.own.predict_dist(X)[0]
    top = rest[int(np.argmax(before))]
    blend.believe(top)
    believed = blend.score(rest)
    assert not np.array_equal(before, believed)
    assert blend._believed is not None and len(blend._believed_rows[1]) == len(blend._rows[1]) + 1
    blend.forget()
    assert np.array_equal(blend.score(rest), before)
    # The ensemble fitted on measurements is never touched by a belief.
    assert np.array_equal(blend.own.predict_dist(X)[0], measured_mean)

    search = EvolutionarySearch(space, rng=np.random.default_rng(0), population=128)
    search.observe(mine[:24])
    calls = []
    real = search.blend.believe

    def believe(config):
        calls.append(config.key)
        real(config)

    search.blend.believe = believe
    picked = search.propose(8)
    assert len({c.key for c in picked}) == 8
    # The blend's picks (all but the random share's one) each believed before the next.
    assert len(calls) == len(picked) - 2 and calls == [c.key for c in picked[: len(calls)]]
    assert search.blend._believed is None


def test_a_believer_refit_trains_on_a_bounded_share_of_many_records(records, limits, monkeypatch):
    """Each pick of a batch after the first refits the own ensemble (the believer): past
    BELIEVER_ROWS records it trains on that many of them, the better half by score and a
    seeded draw of the rest, so a long tune's proposals stop growing with its records.
    Below the bound every row counts, as before; the batch's own fit always takes all."""
    import autosched.search.sources as sources

    mine = [r for r in _one_shape(records) if r.ok][:24]
    space_for = _space_for(limits)
    space = space_for(mine[0].workload)
    config = Config(mine[-1].config)

    def believed_rows(cap: int, seed: int = 0):
        monkeypatch.setattr(sources, "BELIEVER_ROWS", cap)
        blend = Blend(space, seed=seed, members=3)
        blend.refit(mine, mine, space_for)
        blend.believe(config)
        return blend._rows, blend._believed_rows

    (X, y, _), (bx, by, _) = believed_rows(24)
    assert len(by) == len(y) + 1 and np.array_equal(bx[:-1], X)  # every row, and the belief
    (X, y, _), (bx, by, _) = believed_rows(16)
    assert len(y) == 24 and len(by) == 16 + 1
    kept = {tuple(row) for row in bx[:-1]}
    assert all(tuple(X[i]) in kept for i in np.argsort(-y, kind="stable")[:8])  # the best 8
    assert np.array_equal(believed_rows(16)[1][0], bx)  # seeded: the same rows again


def test_configs_the_blend_scores_alike_go_latest_bred_first(limits):
    space = make_space(workload("matmul", M=256, N=256, K=256), limits=limits)
    search = EvolutionarySearch(
        space, rng=np.random.default_rng(0), population=64, generations=1, epsilon=0.0
    )
    pool: dict[str, Config] = {}  # the search's pool, in the order configs enter it
    calls = {n: getattr(space, n) for n in ("sample", "mutate", "crossover")}

    def recorded(name):
        def call(*args):
            out = calls[name](*args)
            for c in out if isinstance(out, list) else [out]:
                if c is not None:  # a mutation or crossover that found no valid config
                    pool.setdefault(c.key, c)
            return out

        return call

    for name in calls:
        setattr(space, name, recorded(name))
    search.blend.score = lambda configs: np.zeros(len(configs))  # a blend that knows nothing
    try:
        picked = search.propose(4)
    finally:
        for name in calls:
            delattr(space, name)
    assert len(pool) > 64  # draws, then offspring
    assert picked[0].key == list(pool)[-1]


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_other_families_records_are_not_this_devices(records, limits, name):
    shape = _one_shape(records)
    space = _space_for(limits)(shape[0].workload)
    fam = shape[0].device_family
    s = make_strategy(name, space, rng=np.random.default_rng(0), family="another")
    s.observe(shape)
    assert not s.seen
    s = make_strategy(name, space, rng=np.random.default_rng(0), family=fam)
    s.observe(shape)
    keys = {r.config_key for r in shape}
    assert s.seen <= keys and len(s.seen) > len(keys) // 2


def ranks_of(values) -> np.ndarray:
    return np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(float)


def test_staging_is_penalised_where_local_memory_is_emulated_and_credited_where_dedicated():
    base = {"type": "cpu", "max_work_group_size": 1024, "local_mem_bytes": 65536}
    wl = workload("matmul", M=256, N=256, K=256)
    cfg = {"tile.i": (4, 4), "tile.j": (4, 8), "tile.k": (8, 2), "vec": 8}
    staged = Config({**cfg, "stage.A": "local", "stage.B": "local"})
    direct = Config({**cfg, "stage.A": "global", "stage.B": "global"})
    gaps = {}
    for kind in ("global", "local"):
        limits = device_limits({**base, "local_mem_type": kind}, "opencl")
        assert limits.local_mem_emulated == (kind == "global")
        space = make_space(wl, limits=limits)
        s = prior_score(featurize(space, [staged, direct]))
        gaps[kind] = s[1] - s[0]
    assert gaps["global"] > 0.5 and gaps["local"] < -0.5
    # A CPU fingerprint recorded before the type was kept counts as emulated.
    assert device_limits(base, "opencl").local_mem_emulated


def _epilogue(records, epilogue):
    """``records`` relabelled as the matmul under ``epilogue`` (its ``fuse`` knob set),
    measured on this device."""
    out = []
    for r in records:
        wl = dict(r.workload, params=dict(r.workload["params"], epilogue=epilogue))
        config = Config({**r.config, "fuse": True})
        out.append(
            dataclasses.replace(
                r,
                workload=wl,
                workload_key=workload_from_json(wl).key,
                config=config.to_json(),
                config_key=config.key,
                device_family="mine",
            )
        )
    return out


def _best_per_workload(records) -> dict[str, Record]:
    best: dict[str, Record] = {}
    for r in records:
        if r.ok and (r.workload_key not in best or score(r) > score(best[r.workload_key])):
            best[r.workload_key] = r
    return best


def test_the_best_configs_of_twin_and_kin_workloads_on_this_device_are_parents(records, limits):
    # The same matmul with a bias (a twin: the same knobs) measured on this device:
    # its best configs seed the population as this workload's own best would. Other
    # shapes (kin) teach the model, and the best config of each, where valid here,
    # is a parent too.
    target = _one_shape(records)
    twin = _epilogue(target, "bias")
    kin = _epilogue([r for r in records if r.workload_key != target[0].workload_key], "bias")
    space = _space_for(limits)(_epilogue(target[:1], "bias_relu")[0].workload)
    search = EvolutionarySearch(
        space, rng=np.random.default_rng(0), space_for=_space_for(limits), family="mine"
    )
    search.observe(kin)
    search._fit()
    kin_best = [Config(r.config) for r in _best_per_workload(kin).values()]
    valid_kin = {c.key for c in kin_best if space.is_valid(c)}
    assert len(_best_per_workload(kin)) >= 2 and valid_kin
    assert {c.key for c in search._parents()} == valid_kin
    search.observe(twin)
    parents = {c.key for c in search._parents()}
    ranked = sorted((r for r in twin if r.ok), key=score, reverse=True)
    assert parents - valid_kin and parents - valid_kin <= {r.config_key for r in ranked}
    assert ranked[0].config_key in parents
    # The twin's best configs are measured here as they are, first, once; so is one
    # best config of a kin workload per batch, each once.
    batch = search.propose(8)
    assert batch[0].key == ranked[0].config_key
    assert len({c.key for c in batch} & valid_kin) >= 1
    later = search.propose(8)
    assert ranked[0].config_key not in {c.key for c in later}
    assert not {c.key for c in later} & {c.key for c in batch}


def test_an_alike_devices_best_config_is_measured_first_and_a_gpu_says_nothing_to_a_cpu(
    records, limits
):
    target = [r for r in _one_shape(records) if r.ok]
    space_for = _space_for(limits)
    space = space_for(target[0].workload)
    best = max(target, key=score)

    def search_after(theirs, seed=3):
        s = EvolutionarySearch(
            space, rng=np.random.default_rng(seed), space_for=space_for, family="mine"
        )
        s.observe(theirs)
        return s, [c.key for c in s.propose(8)]

    # Another family on a device whose fingerprint is this one's: its best is measured
    # first (here one the prior ranks last), whatever the draws.
    X = featurize(space, [Config(r.config) for r in target])
    upside_down = _relabel(target, 1.0 + ranks_of(-prior_score(X)), family="alike")
    theirs_best = max(upside_down, key=score).config_key
    for seed in range(4):
        alike, first = search_after(upside_down, seed)
        assert first[0] == theirs_best
    assert "transfer:alike" in alike.blend.weights()
    # The same records measured on a GPU: not a transfer source, not a parent.
    gpu = {**target[0].device, "type": "gpu", "name": "a GPU"}
    on_gpu = [dataclasses.replace(r, device_family="gpu", device=gpu) for r in target]
    far, first = search_after(on_gpu)
    assert similarity(space.limits, device_limits(gpu, "opencl")) == 0.0
    assert "transfer:gpu" not in far.blend.weights()
    assert best.config_key not in first
    assert all(Config(r.config) not in far._parents() for r in on_gpu)


@pytest.mark.parametrize(
    ("sample", "target", "tau_at_least"),
    [
        ("matmul-512-opencl-zen5", "opencl", 0.40),
        ("conv2d-resnet7x7-llvm-zen5", "llvm", 0.56),
        ("matmul-512-llvm-zen4", "llvm", 0.52),
    ],
)
def test_on_a_cpu_the_prior_counts_registers_in_the_configs_vector_width(
    sample, target, tau_at_least
):
    """A 32-register AVX-512 file holds 256 accumulators of 8-wide vectors, not 512 (the
    compiler vectorises scalar code to the full width): counted so, the prior ranks the
    Zen 5 samples and the Zen 4 llvm matmul at Kendall tau 0.44 / 0.57 / 0.57 against
    0.38 / 0.55 / 0.47 in native lanes (the Zen 5 matmul sample measured again with B's
    panels, 2026-12-05: 0.52)."""
    from autosched.tuning.replay import read_records

    path = Path(__file__).parent.parent / f"bench/replay/{sample}.jsonl.gz"
    ok = [r for r in read_records(path) if r.ok]
    limits = device_limits(ok[0].device, target)
    space = make_space(workload_from_json(ok[0].workload), target=target, limits=limits)
    scores = prior_score(featurize(space, [Config(r.config) for r in ok]))
    assert kendall(scores, np.array([r.gflops for r in ok])) >= tau_at_least


def test_random_search_resumed_with_its_seed_keeps_proposing(limits):
    # A run resumed with the same seed draws what the runs before it drew: once those
    # draws are all measured the search must draw on, not call the space exhausted
    # (bench/replay_measure.py's sixth chunk stopped at 994 of 1000 configs so).
    space = make_space(workload("matmul", M=256, N=256, K=256), limits=limits)
    measured: set[str] = set()
    for _chunk in range(8):  # each chunk a new run: the same seed, the records so far
        search = make_strategy("random", space, rng=np.random.default_rng(1))
        search.seen.update(measured)
        batch = search.propose(64)
        assert batch is not None and len(batch) == 64
        keys = {c.key for c in batch}
        assert len(keys) == 64 and not keys & measured
        measured |= keys


def test_random_search_says_when_a_small_space_is_exhausted(limits):
    space = make_space(workload("softmax", rows=64, cols=128), limits=limits)
    search = make_strategy("random", space, rng=np.random.default_rng(0))
    proposed = []
    while (batch := search.propose(64)) is not None:
        proposed += batch
    keys = {c.key for c in proposed}
    assert len(keys) == len(proposed)
    assert all(space.is_valid(c) for c in proposed)
    # Nothing valid is left out: every draw after the end is one of them.
    assert {c.key for c in space.sample(np.random.default_rng(5), 200)} <= keys


def test_each_batch_tries_the_best_measured_register_tile(records, limits):
    # The micro-kernel that won so far is tried under other work-group shapes, staging
    # and vectors in every batch: where none of the blend's picks keeps it, a random
    # pick's place (in a batch too small for one, the blend's last pick) goes to the
    # blend's best unseen config that keeps it.
    mine = _one_shape(records)
    space = _space_for(limits)(mine[0].workload)
    search = EvolutionarySearch(space, rng=np.random.default_rng(0), family="mine")
    search.observe([dataclasses.replace(r, device_family="mine") for r in mine[:16]])
    best = max((r for r in mine[:16] if r.ok), key=score)
    tile = space.register_tile(Config(best.config))
    assert search._best_own().key == best.config_key
    search._fit()
    others = space.sample(np.random.default_rng(1), 400)
    picked = [c for c in others if space.register_tile(c) != tile][:8]
    pick = search._tile_pick(picked, others)
    assert pick is not None and space.register_tile(pick) == tile and space.is_valid(pick)
    assert pick.key not in search.seen and pick.key not in {c.key for c in picked}
    # A batch that has the tile already needs none.
    assert search._tile_pick([*picked[:-1], pick], others) is None
    # Whole proposals: every batch holds the tile of the best measured so far.
    measured = {r.config_key: r for r in mine}
    for n in (8, 8, 4, 4):
        batch = search.propose(n)
        assert len(batch) == n and len({c.key for c in batch}) == n
        assert any(space.register_tile(c) == space.register_tile(search._best_own()) for c in batch)
        search.observe(
            [
                dataclasses.replace(measured[c.key], device_family="mine")
                for c in batch
                if c.key in measured
            ]
        )


def test_register_tiles_of_each_family(limits):
    # A softmax has none; a contraction's is its spatial axes' register factors.
    softmax = make_space(workload("softmax", rows=64, cols=128), limits=limits)
    (config,) = softmax.sample(np.random.default_rng(0), 1)
    assert softmax.register_tile(config) is None
    matmul = make_space(workload("matmul", M=256, N=256, K=256), limits=limits)
    for c in matmul.sample(np.random.default_rng(0), 20):
        assert matmul.register_tile(c) == (c["tile.i"][1], c["tile.j"][1])
