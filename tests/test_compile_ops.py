"""Compiling every operator from the records, on both targets (real device, real TVM, SQLite)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

import autosched
from autosched.compiler import compile, find_config
from autosched.compiler.lookup import shape_and_options, shape_distance
from autosched.measure.device import select_device
from autosched.measure.runner import TimingOptions
from autosched.records.choice import chosen
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.select import make_space
from autosched.space.space import TARGETS, Space
from tests.tuned_records import record_for

# Tiny shapes of each contraction operator (the row-wise ones need their own space).
WORKLOADS = {
    "dense_bias_gelu": autosched.workload("dense", m=16, n=32, k=24, epilogue="bias_gelu"),
    "conv2d_pad1": autosched.workload("conv2d", n=1, c=4, h=8, w=8, k=8, r=3, s=3, pad=1),
    "conv2d_nhwc_stride2": autosched.workload(
        "conv2d", n=1, c=4, h=9, w=9, k=8, r=3, s=3, stride=2, layout="NHWC"
    ),
    "depthwise_pad1": autosched.workload("depthwise_conv2d", n=1, c=8, h=8, w=8, r=3, s=3, pad=1),
    "batch_matmul": autosched.workload("batch_matmul", b=2, m=16, n=16, k=8),
}


def _device(target: str):
    return select_device(target=target)


def _db(path, records=()) -> SQLiteDatabase:
    with SQLiteDatabase(path) as db:
        if records:
            db.add(list(records))
    return path


def _check_outputs(kernel, seed: int = 0) -> None:
    wl = kernel.workload
    inputs = wl.make_inputs(np.random.default_rng(seed))
    expected = wl.reference(inputs)
    got = kernel(**inputs)
    assert [s.name for s in kernel.outputs] == list(expected)
    rtol, atol = wl.tolerance()
    for got_one, want in zip(got if isinstance(got, tuple) else (got,), expected.values()):
        np.testing.assert_allclose(got_one, want, rtol=rtol, atol=atol)


def _sampled(space: Space, seed: int):
    """A valid config other than the default (seeded)."""
    default = space.default()
    rng = np.random.default_rng(seed)
    for config in space.sample(rng, 8):
        if config != default:
            return config
    raise AssertionError(f"no config other than the default in {space.workload}'s space")


# -- every op, both targets --------------------------------------------------------------------


def _compiles_untuned_and_from_a_record(tmp_path, wl, target: str) -> None:
    dev = _device(target)
    space = make_space(wl, target=target, limits=dev.limits)

    untuned = compile(wl, target=target, db=_db(tmp_path / "empty.db"), shipped=False)
    assert untuned.provenance == "untuned" and untuned.config == space.untuned()
    _check_outputs(untuned)

    config = _sampled(space, seed=len(wl.key))
    db = _db(tmp_path / "one.db", [record_for(wl, dev, config, target=target)])
    kernel = compile(wl, target=target, db=db, shipped=False)
    assert kernel.provenance == "exact" and kernel.config == config
    assert kernel.record.workload_key == wl.key
    _check_outputs(kernel, seed=1)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_op_compiles_untuned_and_from_its_record(tmp_path, name, target):
    _compiles_untuned_and_from_a_record(tmp_path, WORKLOADS[name], target)


@pytest.fixture(scope="module")
def tuned_conv(tmp_path_factory):
    """A conv2d (pad 1) tuned for a few trials on both targets into one database."""
    db = tmp_path_factory.mktemp("conv") / "tuned.db"
    wl = WORKLOADS["conv2d_pad1"]
    quick = TimingOptions(min_time_s=0.01)
    for target in TARGETS:
        autosched.tune(wl, trials=4, batch=4, strategy="random", target=target, db=db, timing=quick)
    return db


@pytest.mark.parametrize("target", TARGETS)
def test_compile_after_tuning_a_conv2d_uses_the_best_record(tuned_conv, target):
    wl = WORKLOADS["conv2d_pad1"]
    dev = _device(target)
    with SQLiteDatabase(tuned_conv, create=False) as db:
        best = chosen(db, wl.key, device_key=dev.key(target), target=target)
    kernel = compile(wl, target=target, db=tuned_conv, shipped=False)
    assert best is not None and best.rounds == 3  # the leader of the tune's final round
    assert kernel.provenance == "exact" and kernel.record.id == best.id
    _check_outputs(kernel, seed=2)


# -- nearest tuned shape -----------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pad", [0, 1])
def test_nearest_shape_serves_a_conv2d_of_another_size(tmp_path, pad, target, caplog):
    tuned = autosched.workload("conv2d", n=1, c=4, h=8, w=8, k=8, r=3, s=3, pad=pad)
    wanted = autosched.workload("conv2d", n=1, c=8, h=12, w=12, k=16, r=3, s=3, pad=pad)
    dev = _device(target)
    config = _sampled(make_space(tuned, target=target, limits=dev.limits), seed=pad)
    db = _db(tmp_path / "c.db", [record_for(tuned, dev, config, target=target)])
    with caplog.at_level(logging.WARNING, logger="autosched.compiler"):
        kernel = compile(wanted, target=target, db=db, shipped=False)
    assert kernel.provenance == "nearest_shape"
    assert kernel.record.workload_key == tuned.key
    assert make_space(wanted, target=target, limits=dev.limits).check(kernel.config) is None
    assert any("never tuned" in r.getMessage() for r in caplog.records)
    _check_outputs(kernel, seed=3)


def test_nearest_shape_never_crosses_an_option(tmp_path, device):
    base = {"n": 1, "c": 4, "h": 8, "w": 8, "k": 8, "r": 3, "s": 3, "pad": 1}
    wanted = autosched.workload("conv2d", **dict(base, c=8, h=16, w=16))
    # Same op, same dimensions or near ones: each differs from the wanted one in one option.
    others = [
        autosched.workload("conv2d", **dict(base, layout="NHWC")),
        autosched.workload("conv2d", **dict(base, stride=2)),
        autosched.workload("conv2d", **dict(base, groups=2)),
        autosched.workload("conv2d", **dict(base, pad=0)),
        autosched.workload("conv2d", **dict(base, pad=2)),
        autosched.workload("conv2d", **dict(base, dilation=2)),
        autosched.workload("depthwise_conv2d", **{k: v for k, v in base.items() if k != "k"}),
    ]
    records = [
        record_for(wl, device, make_space(wl, limits=device.limits).default()) for wl in others
    ]
    db = _db(tmp_path / "o.db", records)
    assert find_config(wanted, db=db, shipped=False).provenance == "untuned"

    # The epilogue is an option of dense: a bias record never serves bias_gelu.
    bias = autosched.workload("dense", m=16, n=32, k=24, epilogue="bias")
    gelu = autosched.workload("dense", m=32, n=32, k=24, epilogue="bias_gelu")
    with SQLiteDatabase(db) as store:
        store.add([record_for(bias, device, make_space(bias, limits=device.limits).default())])
    assert find_config(gelu, db=db, shipped=False).provenance == "untuned"

    # A conv2d with every option equal serves, however far its dimensions are.
    same = autosched.workload("conv2d", **dict(base, c=2, h=32, w=32, k=4))
    with SQLiteDatabase(db) as store:
        store.add([record_for(same, device, make_space(same, limits=device.limits).default())])
    found = find_config(wanted, db=db, shipped=False)
    assert found.provenance == "nearest_shape" and found.record.workload_key == same.key


def test_shape_dimensions_and_options_come_from_the_op():
    conv = autosched.workload("conv2d", n=1, c=4, h=8, w=8, k=8, r=1, s=1).to_json()
    shape, options = shape_and_options(conv)
    assert shape == {"n": 1, "c": 4, "h": 8, "w": 8, "k": 8, "r": 1, "s": 1}
    assert options == {
        "stride": 1,
        "pad": 0,
        "dilation": 1,
        "groups": 1,
        "layout": "NCHW",
        "__dtype": "float32",
    }
    # pad=0 is an option, not a dimension: no log of zero anywhere.
    assert shape_distance(shape, dict(shape, h=16)) == pytest.approx(math.log(2))
    # An option a record's JSON leaves out takes its default.
    older = dict(conv, params={k: v for k, v in conv["params"].items() if k != "dilation"})
    assert shape_and_options(older) == (shape, options)

    rows = [autosched.workload("softmax", rows=r, cols=64).to_json() for r in (128, 512)]
    (a, opt_a), (b, opt_b) = (shape_and_options(w) for w in rows)
    assert a == {"rows": 128, "cols": 64} and opt_a == opt_b
    assert shape_distance(a, b) == pytest.approx(math.log(4))
    chains = [
        autosched.workload("elementwise", rows=r, cols=64, ops=ops).to_json()
        for r, ops in ((128, "add+gelu"), (256, "add+gelu"), (128, "add+relu"))
    ]
    split = [shape_and_options(w) for w in chains]
    assert split[0][0] == {"rows": 128, "cols": 64}
    assert split[0][1] == split[1][1] == {"ops": "add+gelu", "__dtype": "float32"}
    assert split[2][1] != split[0][1]
    reduce = autosched.workload("reduce", rows=8, cols=8, kind="max").to_json()
    assert shape_and_options(reduce)[1]["kind"] == "max"


# -- row-wise operators (their space: autosched.space.rowwise) ---------------------------------

ROWWISE = {
    "softmax": autosched.workload("softmax", rows=16, cols=64),
    "layernorm": autosched.workload("layernorm", rows=16, cols=64),
    "reduce_sum": autosched.workload("reduce", rows=16, cols=64, kind="sum"),
    "reduce_max": autosched.workload("reduce", rows=16, cols=64, kind="max"),
    "elementwise": autosched.workload("elementwise", rows=16, cols=64, ops="add+gelu+mul"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(ROWWISE))
def test_rowwise_ops_compile_untuned_and_from_their_record(tmp_path, name, target):
    _compiles_untuned_and_from_a_record(tmp_path, ROWWISE[name], target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["softmax", "elementwise"])
def test_nearest_shape_serves_a_rowwise_op_with_other_rows(tmp_path, name, target):
    tuned = ROWWISE[name]
    wanted = autosched.workload(tuned.op, **dict(tuned.params, rows=48))
    dev = _device(target)
    config = _sampled(make_space(tuned, target=target, limits=dev.limits), seed=5)
    db = _db(tmp_path / "r.db", [record_for(tuned, dev, config, target=target)])
    kernel = compile(wanted, target=target, db=db, shipped=False)
    assert kernel.provenance == "nearest_shape" and kernel.record.workload_key == tuned.key
    _check_outputs(kernel, seed=6)
    if name == "elementwise":  # another chain is another option: never served
        other = autosched.workload("elementwise", rows=48, cols=64, ops="add+relu+mul")
        assert find_config(other, target=target, db=db, shipped=False).provenance == "untuned"
