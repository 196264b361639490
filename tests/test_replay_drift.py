"""Replay caches without the machine's drift: each batch's speed fitted from the configs
measured in several batches (autosched.records.drift.batch_drift, drift_free), and the
replay's score where random search ends at an optimum that is a mean of readings."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from autosched.records import drift as drift_module
from autosched.records.drift import batch_drift
from autosched.tuning.replay import caches_from_records, read_records

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.replay_metrics import seed_scores  # noqa: E402

ZEN4 = ROOT / "bench" / "replay" / "matmul-512-opencl-zen4.jsonl.gz"


@pytest.fixture(scope="module")
def records():
    return read_records(ZEN4)


def _batches(template, speeds, drift, *, noise, seed=0):
    """Records of configs ``c0..`` whose true latencies are ``speeds``, measured in
    batches of eight new configs plus ``c0`` and ``c1`` again (the control, a finalist),
    each batch ``drift[b]`` times slower, each reading off by ``noise`` (log sd)."""
    rng = np.random.default_rng(seed)
    out = []
    fresh = iter(range(2, len(speeds)))
    for b, factor in enumerate(drift):
        keys = [0, 1] + [next(fresh) for _ in range(8)]
        for i in keys:
            latency = speeds[i] * factor * math.exp(rng.normal(0.0, noise))
            out.append(
                dataclasses.replace(
                    template,
                    config_key=f"c{i}",
                    latencies=(latency,),
                    latency_s=latency,
                    gflops=1.0 / latency,
                    started_at=1000.0 + b,
                )
            )
    return out


def test_the_batch_drift_of_a_sample_is_taken_out(records):
    """A batch that ran slower as a whole (a neighbour on the machine) is scaled back
    by what the configs measured in several batches say, so a replayed search sees each
    config at its own speed: with drift up to 1.6x and 1 % reading noise, every config's
    figure lands within 3 % of its true speed, where the raw readings are up to 45 %
    off."""
    template = next(r for r in records if r.ok)
    rng = np.random.default_rng(1)
    speeds = list(rng.uniform(1.0, 4.0, size=2 + 8 * 6))
    drift = [1.0, 1.6, 0.8, 1.25, 1.0, 0.9]
    recs = _batches(template, speeds, drift, noise=0.01)
    (cache,) = caches_from_records(recs)
    truth = {f"c{i}": 1.0 / s for i, s in enumerate(speeds)}
    ratio = {k: cache.records[k].gflops / truth[k] for k in truth}
    centre = float(np.median(list(ratio.values())))
    assert max(abs(r / centre - 1.0) for r in ratio.values()) < 0.03
    raw = {}
    for r in recs:
        raw.setdefault(r.config_key, r.gflops / truth[r.config_key])
    assert max(abs(r / centre - 1.0) for r in raw.values()) > 0.3
    # Nothing repeated, nothing to fit: the first readings stand.
    single = [r for r in recs if r.config_key not in ("c0", "c1")]
    (plain,) = caches_from_records(single)
    assert all(plain.records[r.config_key].gflops == pytest.approx(r.gflops) for r in single)


def test_a_farm_sized_fit_is_solved_sparse_as_the_dense_solve_would(records, monkeypatch):
    """A workload tuned for hours has thousands of batches: past a few hundred configs
    and batches the fit runs as sparse least squares (the dense one took 7.5 s for 1500
    batches), and gives the dense fit's factors."""
    template = next(r for r in records if r.ok)
    rng = np.random.default_rng(4)
    drift = list(rng.choice([1.0, 1.0, 0.8, 1.3], size=600))
    recs = _batches(template, list(rng.uniform(1.0, 4.0, size=2 + 8 * 600)), drift, noise=0.01)
    assert 2 + 600 > drift_module._DENSE_UP_TO  # this one is solved sparse
    sparse_fit = batch_drift(recs)
    monkeypatch.setattr(drift_module, "_DENSE_UP_TO", 10**6)
    dense_fit = batch_drift(recs)
    assert len(sparse_fit) == len(dense_fit) == 600
    assert all(sparse_fit[b] == pytest.approx(dense_fit[b], rel=1e-9) for b in dense_fit)
    truth = np.array(drift) / np.median(drift)
    assert np.allclose([sparse_fit[1000.0 + b] for b in range(600)], truth, rtol=0.03)


def test_readings_without_drift_are_left_as_measured(records):
    """Noise alone (no batch ran slower) is not mistaken for drift: the factors stay
    within the noise of the readings that link the batches."""
    template = next(r for r in records if r.ok)
    speeds = list(np.random.default_rng(2).uniform(1.0, 4.0, size=2 + 8 * 6))
    recs = _batches(template, speeds, [1.0] * 6, noise=0.03, seed=3)
    factors = batch_drift(recs)
    assert all(abs(f - 1.0) < 0.05 for f in factors.values())


def test_the_drift_of_a_measured_sample_explains_its_repeated_readings():
    """On the Zen 4 llvm sample of the 127x1000x333 matmul of 2026-12-01 (48 batches of
    32 configs and the control; kept in bench/replay/aside/ since the sample was measured
    again on a steadier day), the configs measured in several batches scatter around
    their means by less than half as much once each batch's drift is taken out: the
    drift is the machine's, not the configs'."""
    path = ROOT / "bench/replay/aside/matmul-127x1000x333-llvm-zen4-dec01.jsonl.gz"
    recs = [r for r in read_records(path) if r.ok]
    factors = batch_drift(recs)
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.config_key] = counts.get(r.config_key, 0) + 1

    def scatter(scaled: bool) -> float:
        logs: dict[str, list[float]] = {}
        for r in recs:
            if counts[r.config_key] > 2:
                f = factors.get(r.started_at, 1.0) if scaled else 1.0
                logs.setdefault(r.config_key, []).append(math.log(r.latency_s / f))
        return float(np.sqrt(np.mean([(x - np.mean(v)) ** 2 for v in logs.values() for x in v])))

    assert len(factors) == 48  # every batch but the first, the default alone
    assert scatter(True) < 0.5 * scatter(False)


def test_the_score_is_finite_where_random_search_ends_at_a_mean_of_readings():
    """On a small drift-free cache the random baseline's curve can end a rounding error
    above the optimum (the geometric mean of two readings): the score stops there as it
    does where it ends on it, rather than dividing by 1e-21 s (the IREE Vulkan ResNet
    conv's score read -3.4e11 for every strategy)."""
    (cache,) = caches_from_records(
        read_records(ROOT / "bench/replay/conv2d-resnet3x3-iree-vulkan-h100.jsonl.gz")
    )
    latencies = sorted(r.latency_s for r in cache.records.values() if r.ok)
    runs = [[latencies[1]] * 64, [latencies[0]] * 64, latencies[40:104]]
    scores = seed_scores(runs, latencies, 64)
    assert np.all(np.isfinite(scores)) and np.all(scores > -100.0)
    assert scores[1] == pytest.approx(1.0)
    assert scores[2] < scores[0] < 1.0
