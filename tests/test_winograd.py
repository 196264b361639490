"""Winograd F(4x4, 3x3) convolutions in a model: the transform, the Relax rewrite, its
stages as tasks with spaces, and the build's measured choice between the two forms.

Real parts: torch.export + TVM's Relax front end for small models with random weights,
TVM codegen for llvm, real tuning into SQLite records, the model timed on this CPU.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm

import autosched.tvm
from autosched.measure.runner import TimingOptions
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.select import make_space
from autosched.tuning.model import tune_tasks
from autosched.tuning.runner import LocalRunner
from autosched.tvm import forms, winograd
from autosched.tvm.tasks import call_counts, default_schedule, extract_tasks, fuse
from tests.relax_models import assert_matches
from tests.relax_models import relax_of as _relax

nn = torch.nn


def _direct(x: np.ndarray, w: np.ndarray, pad: tuple[int, int, int, int]) -> np.ndarray:
    """NHWC x HWIO cross-correlation, stride 1, in float64."""
    top, left, bottom, right = pad
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    oh, ow = xp.shape[1] - 2, xp.shape[2] - 2
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nhwc,ck->nhwk", xp[:, i : i + oh, j : j + ow], w[i, j])
    return out


@pytest.mark.parametrize(
    "shape,pad",
    [((1, 8, 8, 3), (1, 1, 1, 1)), ((2, 7, 10, 5), (0, 0, 0, 0)), ((1, 9, 6, 4), (1, 0, 2, 1))],
)
def test_the_transforms_compute_the_convolution(shape, pad):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((3, 3, shape[3], 6))
    want = _direct(x, w, pad)
    got = winograd.reference(x, w, pad)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


class Convs(nn.Module):
    """Two 3x3 stride-1 convolutions the rewrite takes (one with partial tiles: a 10x10
    output, one with padding on one axis only), and four it leaves: stride 2, 1x1,
    dilated, grouped."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(4, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=(1, 0))
        self.strided = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.point = nn.Conv2d(8, 8, 1)
        self.dilated = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.relu(self.b(y)) + y[:, :, :, 1:-1]
        y = self.grouped(self.dilated(self.point(y)))
        return self.strided(y)


@pytest.fixture(scope="module")
def convs():
    return _relax(Convs(), (1, 4, 10, 10))


def _forms_of(fused) -> list[tuple[str, str]]:
    from tvm import tirx

    counts = call_counts(fused)
    out = []
    for gv, func in fused.functions.items():
        if isinstance(func, tirx.PrimFunc) and gv.name_hint in counts:
            form = winograd.form_of(func)
            if form is not None:
                out += [form] * counts[gv.name_hint]
    return sorted(out)


def test_only_3x3_stride_1_convolutions_are_rewritten_and_each_stage_knows_its_conv(convs):
    mod, _, _ = convs
    a, b = "n1_h10_w10_c4_k8", "n1_h10_w8_c8_k8"
    # Direct: the two convolutions the rewrite takes are recognised by their loop nests.
    assert _forms_of(fuse(mod)) == [("direct", a), ("direct", b)]
    # Winograd: input transform, product and output transform of each; the others stay.
    assert (
        _forms_of(fuse(mod, winograd=winograd.takes))
        == [("winograd", a)] * 3 + [("winograd", b)] * 3
    )
    assert _forms_of(fuse(mod, winograd=lambda call: winograd.call_signature(call) == b)) == [
        ("direct", a), ("winograd", b), ("winograd", b), ("winograd", b),
    ]  # fmt: skip


@pytest.mark.parametrize("form", [True, False])
def test_a_build_in_either_form_matches_torch(convs, form):
    mod, x, module = convs
    built = autosched.tvm.build(mod, "llvm", untuned=True, records=False, winograd=form)
    stages = [a.function for a in built.applied if "winograd" in a.function]
    assert (len(stages) == 6) == form  # 2 convolutions x 3 stages
    (got,) = built(x)
    want = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_stages_are_tasks_and_their_schedules_compute_the_same(convs, host):
    from tvm.s_tir import Schedule

    from autosched.space.schedule import schedule

    mod, _, _ = convs
    tasks = extract_tasks(mod, limits=host.limits)
    stages = [t for t in tasks if t.form == "winograd"]
    kinds = sorted((_stage(t.workload), t.family) for t in stages)
    # The product is a contraction the space tunes; the transforms (the output one with
    # the relu and the residual fused in, the first input one with the model's input
    # transpose) are maps with a schedule of their own.
    assert kinds == [
        ("gemm", "contraction"), ("gemm", "contraction"), ("input", None), ("input", None),
        ("output", None), ("output", None),
    ]  # fmt: skip
    rng = np.random.default_rng(1)
    for task in (t for t in stages if t.family is None):  # tile by tile, and correct
        wl = task.workload
        sch = Schedule(wl.prim_func())
        default_schedule(sch, limits=host.limits)
        script = sch.mod.script()
        assert "T.unroll" in script and "T.parallel" in script, script
        _check(wl, tvm.compile(sch.mod, target="llvm"), rng)
    for task in (t for t in stages if t.family is not None):
        wl = task.workload
        space = make_space(wl, target="llvm", limits=host.limits)
        for config in [space.default(), *space.sample(rng, 2)]:
            _check(wl, tvm.compile(schedule(space, config), target="llvm"), rng)


def _check(wl, lib, rng) -> None:
    """``lib`` computes what ``wl``'s reference does on random inputs."""
    inputs = wl.make_inputs(rng)
    assert_matches(wl, lib, inputs, wl.reference(inputs))


def _stage(wl) -> str:
    """The Winograd stage a fused function computes, read off its blocks' annotations."""
    from tvm.s_tir import Schedule

    sch = Schedule(wl.prim_func())
    stages = set()
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        marked = winograd.stage_of(sch.get(rv))
        if marked is not None:
            stages.add(marked[0])
    (stage,) = stages - {"rows"}
    return stage


class OneConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


def _tune(tasks, host, db, trials: int) -> None:
    runner = LocalRunner(host, "llvm", timing=TimingOptions(min_time_s=0.005), keep=len(tasks))
    try:
        tune_tasks(tasks, runner, db, name="conv", target="llvm", trials=trials, batch=2)
    finally:
        runner.close()


def test_the_build_takes_the_form_measured_faster_once_both_are_tuned(host, tmp_path, caplog):
    mod, x, module = _relax(OneConv(), (1, 16, 12, 12))
    want = module(torch.from_numpy(x)).detach().numpy()
    tasks = [t for t in extract_tasks(mod, limits=host.limits) if t.family is not None]
    db = SQLiteDatabase(tmp_path / "conv.db")
    sig = "n1_h12_w12_c16_k16"
    # Only the direct form tuned: no candidate, the build stays direct, no model timed.
    _tune([t for t in tasks if t.form == "direct"], host, db, trials=2)
    built = autosched.tvm.build(mod, "llvm", db=db, shipped=False)
    assert not [a for a in built.applied if "winograd" in a.function]
    # Both tuned: the model is timed both ways and the build follows the measurement.
    _tune([t for t in tasks if t.form == "winograd"], host, db, trials=4)
    with caplog.at_level("INFO", logger="autosched.tvm.forms"):
        built = autosched.tvm.build(mod, "llvm", db=db, shipped=False)
    (line,) = [r.getMessage() for r in caplog.records if "inside the model" in r.getMessage()]
    found = re.fullmatch(
        rf"conv {sig} inside the model: direct ([\d.]+) ms, winograd ([\d.]+) ms -> (\w+)", line
    )
    assert found, line
    took = "winograd" if float(found[2]) < float(found[1]) else "direct"
    assert found[3] == took
    stages = {a.function: a.provenance for a in built.applied if "winograd" in a.function}
    if took == "winograd":  # the product from its record, the transforms' own schedule
        assert sorted(stages.values()) == ["default-schedule", "default-schedule", "exact"]
    else:
        assert not stages
    (got,) = built(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_candidates_need_records_of_both_forms_for_every_tunable_function(convs):
    mod, _, _ = convs
    both = {"n1_h10_w10_c4_k8", "n1_h10_w8_c8_k8"}

    def has_space(func, name):
        return "output" not in name  # the output transforms: the default schedule

    def winograd_only(func, name):
        return 1e-3 if "winograd" in name else None

    fused = (fuse(mod), fuse(mod, winograd=winograd.takes))
    assert forms.candidates(fused, lambda f, n: 1e-3, has_space) == both
    assert forms.candidates(fused, lambda f, n: None, has_space) == set()
    assert forms.candidates(fused, winograd_only, has_space) == set()


def test_a_model_that_cannot_be_timed_keeps_its_convolutions_direct(convs, host, caplog):
    mod, _, _ = convs
    target = tvm.target.Target(host.tvm_target())

    def cannot_run(fused):
        raise RuntimeError("no runtime for this module")

    with caplog.at_level("WARNING", logger="autosched.tvm.forms"):
        chosen, built = forms.choose(
            mod, direct=fuse(mod), every=fuse(mod, winograd=winograd.takes),
            schedule=cannot_run, target=target, sigs={"n1_h10_w10_c4_k8"},
        )  # fmt: skip
    assert (chosen, built) == (set(), {})
    assert "could not be timed (no runtime for this module)" in caplog.text
