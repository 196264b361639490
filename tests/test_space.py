from __future__ import annotations

import json

import numpy as np
import pytest

from autosched.errors import InvalidInputError
from autosched.ops import workload
from autosched.search import make_strategy
from autosched.search.evolutionary import diverse
from autosched.space.config import Config
from autosched.space.loopnest import analyze
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits

LIMITS = DeviceLimits(max_work_group_size=256, max_work_item_size=256, local_mem_bytes=32 * 1024)
# A random sample of the 512^3 matmul space measured on an NVIDIA H200 (bench/replay).
H200_SAMPLE = "bench/replay/matmul-512-opencl-h200.jsonl.gz"


def test_loop_nest_is_read_from_the_compute():
    nest = analyze(workload("matmul", M=64, N=32, K=16, epilogue="bias_relu"))
    assert [(a.name, a.extent, a.kind) for a in nest.axes] == [
        ("i", 64, "S"),
        ("j", 32, "S"),
        ("k", 16, "R"),
    ]
    assert [a.buffer for a in nest.inputs] == ["A", "B"]
    assert nest.epilogue == ("D",)
    a, b = nest.inputs
    assert a.footprint({"i": 8, "k": 4}) == 32 and b.footprint({"k": 4, "j": 16}) == 64


def test_knobs_cover_tiling_parallelism_caching_and_fusion():
    space = make_space(workload("matmul", M=64, N=64, K=64, epilogue="bias"), limits=LIMITS)
    names = {k.name for k in space.knobs}
    assert names == {"tile.i", "tile.j", "tile.k", "vec", "stage.A", "stage.B", "fuse"}
    assert (1, 8) in space.knob("tile.i").choices  # one work-item per group, 8-row register tile
    assert 16 in space.knob("vec").choices
    # No epilogue, no fusion knob.
    assert "fuse" not in {
        k.name for k in make_space(workload("matmul", M=8, N=8, K=8), limits=LIMITS).knobs
    }


def test_sampled_configs_respect_device_limits():
    space = make_space(workload("matmul", M=256, N=256, K=256), limits=LIMITS)
    configs = space.sample(np.random.default_rng(0), 500)
    assert len(configs) == 500
    for c in configs:
        assert space.threads(c) <= LIMITS.max_work_group_size
        assert space.local_mem_bytes(c) <= LIMITS.local_mem_bytes
        assert c["tile.j"][1] % c["vec"] == 0


def test_configs_over_the_limits_are_pruned_with_a_reason():
    space = make_space(workload("matmul", M=256, N=256, K=256), limits=LIMITS)
    base = space.default()
    too_many = base.replace(**{"tile.i": (32, 1), "tile.j": (16, 1)})
    assert "exceeds the device limit 256" in space.check(too_many)
    big_stage = base.replace(
        **{
            "tile.i": (8, 16),
            "tile.j": (4, 16),
            "tile.k": (64, 1),
            "stage.A": "local",
            "stage.B": "local",
        }
    )
    assert "local memory" in space.check(big_stage)
    bad_vec = base.replace(vec=16)
    assert "vec=16" in space.check(bad_vec)


def test_mutation_and_crossover_stay_valid():
    space = make_space(workload("matmul", M=128, N=128, K=128, epilogue="bias_relu"), limits=LIMITS)
    rng = np.random.default_rng(1)
    a, b = space.sample(rng, 2)
    for _ in range(50):
        m = space.mutate(a, rng)
        assert m is not None and space.is_valid(m)
        assert sum(m[k] != a[k] for k in a) == 1
        c = space.crossover(a, b, rng)
        assert c is not None and space.is_valid(c)


def test_config_is_plain_hashable_json_data():
    space = make_space(workload("matmul", M=64, N=64, K=64), limits=LIMITS)
    c = space.sample(np.random.default_rng(2), 1)[0]
    text = json.dumps(c.to_json())
    back = Config.from_json(json.loads(text))
    assert back == c and hash(back) == hash(c) and back.key == c.key
    assert {c: 1}[back] == 1


def test_workload_key_is_stable_and_names_everything():
    a = workload("matmul", M=64, N=64, K=64, epilogue="bias")
    assert a.key == workload("matmul", M=64, N=64, K=64, epilogue="bias").key
    assert a.key != workload("matmul", M=64, N=64, K=64).key
    assert a.key != workload("matmul", M=64, N=64, K=32, epilogue="bias").key
    assert a.key.startswith("matmul-")


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"M": 0, "N": 1, "K": 1}, "positive integer"),
        ({"M": 1, "N": 1, "K": 1, "epilogue": "gelu"}, "bias_relu"),
    ],
)
def test_bad_workloads_name_what_is_accepted(params, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        workload("matmul", **params)


def test_a_gpu_s_register_file_bounds_work_items_times_accumulators():
    """The H200 replay sample: every config that failed to launch (OUT_OF_RESOURCES) is
    rejected once the fingerprint carries the registers per work-group, and every one
    that ran is still accepted."""
    from pathlib import Path

    from autosched.space.device import device_limits
    from autosched.tuning.replay import read_records

    records = read_records(Path(__file__).parent.parent / H200_SAMPLE)
    fingerprint = records[0].device
    wl = workload("matmul", M=512, N=512, K=512)
    plain = make_space(wl, limits=device_limits(fingerprint, "opencl"))
    nv = make_space(
        wl, limits=device_limits({**fingerprint, "registers_per_group": 65536}, "opencl")
    )
    failed = [Config(r.config) for r in records if "OUT_OF_RESOURCES" in r.error]
    ran = [Config(r.config) for r in records if r.ok]
    assert len(failed) >= 5 and len(ran) >= 100
    assert all(plain.is_valid(c) for c in failed)  # what the driver alone said before
    assert not any(nv.is_valid(c) for c in failed)
    assert "registers exceed the device's 65536 per work-group" in nv.check(failed[0])
    assert all(nv.is_valid(c) for c in ran)


def test_a_kernel_s_own_group_limit_is_said_before_its_launch():
    from autosched.measure.runner import over_group_limit

    assert over_group_limit([1024, 256], [(256,), (128, 2)]) == ""
    assert over_group_limit([], [(1024,)]) == ""  # the driver could not say
    problem = over_group_limit([1024, 384], [(256,), (512,)])
    assert problem.startswith("kernel 1 runs 512 work-items per group")
    assert "at most 384" in problem


def test_an_optional_knob_leaves_the_configs_recorded_before_it_as_they_were():
    """On AVX-512, an NCHW conv whose rows of 7 fill 7 of 16 lanes gains ``vec_axis``
    (lanes along the output channels). The same conv on an 8-lane CPU has no such knob:
    its configs, as recorded, are valid in the wider space with the same keys, the knob's
    first choice is written by leaving it out, and every config the search makes is in
    that one form."""
    conv = workload("conv2d", n=1, c=32, h=7, w=7, k=64, r=3, s=3, stride=1, pad=1)
    cpu = dict(is_cpu=True, cores=2, vector_registers=32)
    narrow = make_space(conv, target="llvm", limits=DeviceLimits(**cpu, vector_lanes=8))
    wide = make_space(conv, target="llvm", limits=DeviceLimits(**cpu, vector_lanes=16))
    assert "vec_axis" not in {k.name for k in narrow.knobs}
    pocl = make_space(conv, target="opencl", limits=DeviceLimits(**cpu, vector_lanes=16))
    assert "vec_axis" not in {k.name for k in pocl.knobs}  # measured slower there
    assert wide.knob("vec_axis").choices == ("q", "k") and wide.knob("vec_axis").optional
    rng = np.random.default_rng(0)
    recorded = narrow.sample(rng, 40)
    assert all(wide.check(c) is None for c in recorded)
    assert all(wide.value(c, "vec_axis") == "q" for c in recorded)
    explicit = recorded[0].replace(vec_axis="q")
    assert "leaving vec_axis out" in wide.check(explicit)
    assert wide.make(explicit) == recorded[0] and wide.make(explicit).key == recorded[0].key
    made = wide.sample(rng, 200)
    made += [m for c in made[:100] if (m := wide.mutate(c, rng)) is not None]
    made += [x for a, b in zip(made[:50], made[50:100]) if (x := wide.crossover(a, b, rng))]
    assert all(wide.check(c) is None and c.get("vec_axis") != "q" for c in made)
    lanes_k = [c for c in made if "vec_axis" in c]
    assert lanes_k and all(c["stage.weight"] == "pack" for c in lanes_k)
    # A mutation crosses from a recorded config to lanes along k: the weights' packing
    # and the width move with the axis (each alone leaves the config invalid).
    rng = np.random.default_rng(4)
    crossed = [m for c in recorded for _ in range(20) if (m := wide.mutate(c, rng))]
    crossed = [m for m in crossed if "vec_axis" in m]
    assert crossed and all(m["stage.weight"] == "pack" and m["vec"] > 1 for m in crossed)
    # Each strategy proposes in that form, batches mixing configs with and without it.
    for name in ("model", "tpe", "random"):
        search = make_strategy(name, wide, rng=np.random.default_rng(3))
        batches = [search.propose(16) or [] for _ in range(3)]
        assert all(wide.check(c) is None for b in batches for c in b), name
    assert len(diverse([*recorded[:1], *lanes_k], 4)) == 4
    # Lanes along k need the weights packed with k innermost, and whole tiles.
    along_k = wide.make({**lanes_k[0], "stage.weight": "global"})
    assert "stage.weight=pack" in wide.check(along_k)
    assert "do not match" in wide.check(Config({**recorded[0], "vec_axs": "k"}))
