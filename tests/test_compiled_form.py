"""Scalar llvm configs that LLVM vectorises itself are described as the vector code they
become (:func:`autosched.space.contraction_features.compiled_form`), and the premise is
checked on the host's own compiler: their assembly holds packed multiply-adds."""

from __future__ import annotations

import math
import re

import pytest

from autosched.cost_model.features import featurize, prior_score
from autosched.measure.cpu import host_cpu
from autosched.ops import workload
from autosched.space.contraction_features import UNROLLED_BODY, compiled_form
from autosched.space.schedule import schedule
from autosched.space.select import make_space


@pytest.fixture(scope="module")
def space():
    wl = workload("matmul", M=64, N=256, K=128, epilogue="none")
    return make_space(wl, target="llvm", limits=host_cpu().limits)


def _packed_lanes(space, config) -> int:
    """fp32 lanes of the multiply-adds of 8 or more lanes (ymm, zmm) in ``config``'s
    assembly."""
    import tvm

    executable = tvm.compile(
        schedule(space, config), target=tvm.target.Target(host_cpu().tvm_target())
    )
    modules = [executable.mod, *executable.mod.imports]
    asm = "\n".join(m.inspect_source("asm") for m in modules if m.kind in ("llvm", "library"))
    widths = re.findall(r"\bvfmadd\w*ps\s[^\n]*%([yz])mm", asm)
    return sum(16 if w == "z" else 8 for w in widths)


def _scalar(space, **tiles):
    config = space.default().replace(vec=1, **tiles)
    assert space.check(config) is None, space.check(config)
    return config


def test_a_tile_loop_llvm_vectorises_is_described_as_a_vector_per_tile(space):
    """Block order, no register tile along j and 32 j-tiles per block, the loops inside
    holding 16 multiply-adds: LLVM's loop vectoriser takes the j loop."""
    lanes = space.limits.vector_lanes
    config = _scalar(
        space,
        reduce_at="block",
        tile_inner="i",
        **{"tile.j": (32, 1), "tile.i": (2, 2), "tile.k": (4, 2)},
    )
    form = compiled_form(space, config)
    assert form["vec"] == lanes and form["tile.j"] == (-(-32 // lanes), lanes)
    feats, own = space.describe(config), space.describe(form)
    assert feats.pop("log_vec_auto") == math.log2(lanes) and own.pop("log_vec_auto") == 0.0
    assert feats == own
    # The premise, on this host's compiler: the scalar config's code is vector code, at
    # least half as wide in all as its form's (in the assembly the same, on a Zen 4).
    assert _packed_lanes(space, config) >= _packed_lanes(space, form) / 2 > 0

    # The same loops holding more than UNROLLED_BODY multiply-adds: the j loop is not
    # the innermost LLVM is left with, and the config is read as the scalar it is.
    big = config.replace(**{"tile.k": (UNROLLED_BODY * 2, 2)})
    if space.check(big) is None:
        assert compiled_form(space, big) == big and space.describe(big)["log_vec_auto"] == 0.0


def test_a_scalar_register_tile_along_the_contiguous_axis_is_read_at_its_width(space):
    """LLVM's SLP vectoriser packs a register tile's unrolled statements along j."""
    lanes = space.limits.vector_lanes
    config = _scalar(space, **{"tile.j": (2, 2 * lanes), "tile.i": (1, 4), "tile.k": (8, 1)})
    form = compiled_form(space, config)
    assert form == config.replace(vec=lanes)
    assert space.describe(config)["log_vec"] == math.log2(lanes)
    assert _packed_lanes(space, config) >= _packed_lanes(space, form) / 2 > 0
    odd = _scalar(space, **{"tile.j": (2, 1), "tile.i": (1, 4), "tile.k": (8, 1)})
    assert compiled_form(space, odd) == odd  # one output along j: nothing to pack


def test_the_prior_ranks_a_compiled_form_just_behind_its_explicit_twin(space):
    """What the compiler finds counts, less than the same width asked for."""
    lanes = space.limits.vector_lanes
    scalar = _scalar(space, **{"tile.j": (2, 2 * lanes), "tile.i": (1, 4), "tile.k": (8, 1)})
    twin = scalar.replace(vec=lanes)
    plain = scalar.replace(**{"tile.j": (2 * lanes, 2)})  # j tiles of 2: scalar code
    assert space.check(twin) is None and space.check(plain) is None
    assert compiled_form(space, plain) == plain.replace(vec=2)
    explicit, found, narrow = prior_score(featurize(space, [twin, scalar, plain]))
    assert explicit > found > narrow
