"""Features of schedule configs for the cost model.

A feature row is the space's hand-made description of a config
(:meth:`autosched.space.space.Space.describe`), the device's own properties (from its
fingerprint, see :mod:`autosched.space.device`: fp32 lanes of a native vector, vector
registers, compute units, local memory) and workload-level features (log2 of every
spatial and reduction extent, log2 of the flops and of the output size), so that one
model can rank configs of different shapes of the same operator, and of other devices.

Column order is fixed: :data:`CORE_FEATURES` and :data:`DEVICE_FEATURES` come first,
at the same positions for every space (a name the space does not describe reads 0),
which lets :func:`prior_score` work on a bare matrix. Then the rest of ``describe``'s
names in the order it gives them, then the workload features.

Rows are cached per space and config: a search loop that re-scores its population
pays for each config once.

Measured on this 2-core machine: 5,000 fresh configs in about 0.15 s, cached ones in
about 0.002 s. TVM's ``PerStoreFeature`` (164 program features per store, the
MetaSchedule default) is not used: it needs a scheduled module and a TuneContext per
config, about 40 ms each (200 s for 5,000 candidates), and ranked no better
(``bench/cost_model.py --per-store``: sum and max over stores, held-out shapes, xgb-reg
NDCG@8 0.82 against 0.89 with these features; top-8 0.65 against 0.68).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from autosched.errors import InvalidInputError
from autosched.space.config import Config
from autosched.space.space import Space

# Describe-features that every operator's space provides, at fixed column positions.
CORE_FEATURES: tuple[str, ...] = (
    "log_threads",
    "log_groups",
    "log_reg",
    "log_vec",
    "intensity",
    "staged",
    "log_work_items",
    "log_unroll",
    "log_pad_waste",
    "log_acc",  # log2 of the accumulators a register tile keeps through a reduction (else 0)
    "log_vec_auto",  # log2 of the vector width a compiler gave a config beyond its own
)
# The device's own properties, the same for every config of a space.
DEVICE_FEATURES: tuple[str, ...] = (
    "dev_log_lanes",
    "dev_log_registers",
    "dev_log_units",
    "dev_is_cpu",
    "dev_log_local_kb",
    "dev_local_emulated",
    "dev_log_group",
)
# Workload features every space has, at fixed positions after the device's.
FIXED_WORKLOAD: tuple[str, ...] = ("w_log_flops",)

# log2 of the flops a parallel task's fixed cost is worth where one thread runs each task
# alone (a target without work-groups): see prior_score.
LOG_TASK_COST = 10.0

# What vectors a compiler found in scalar code lose against a config's own of the same
# width, on a log2 throughput scale (see prior_score).
AUTO_VECTOR_COST = 0.5

# Rows kept per space, and in all: a search over millions of configs starts afresh, and
# a night's model job (tens of tasks, each scoring ~370 configs per batch of 8: a 256^3
# matmul on llvm, 2,986 rows in 64 trials) keeps its client's memory bounded (a row
# with its config costs ~1.1 KiB: ~550 MiB in all at most).
_CACHE_LIMIT = 200_000
_TOTAL_LIMIT = 500_000
_caches: weakref.WeakKeyDictionary[Space, dict[Config, np.ndarray]] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()
_names: weakref.WeakKeyDictionary[Space, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _device_features(space: Space) -> dict[str, float]:
    lim = space.limits
    return {
        "dev_log_lanes": math.log2(max(1, lim.vector_lanes)),
        "dev_log_registers": math.log2(max(1, lim.vector_registers)),
        "dev_log_units": math.log2(max(1, lim.compute_units, lim.cores)),
        "dev_is_cpu": float(lim.is_cpu),
        "dev_log_local_kb": math.log2(1 + lim.local_mem_bytes / 1024),
        "dev_local_emulated": float(lim.local_mem_emulated),
        "dev_log_group": math.log2(max(1, lim.max_work_group_size)),
    }


def _workload_features(space: Space) -> dict[str, float]:
    nest = space.nest
    feats = {f"w_log_s{i}": math.log2(a.extent) for i, a in enumerate(nest.spatial)}
    feats.update({f"w_log_r{i}": math.log2(a.extent) for i, a in enumerate(nest.reduction)})
    feats["w_log_outputs"] = sum(math.log2(a.extent) for a in nest.spatial)
    feats["w_log_flops"] = math.log2(space.workload.flops())
    return feats


def feature_names(space: Space) -> list[str]:
    """Column names of :func:`featurize` for ``space``: core, other described, workload."""
    names = _names.get(space)
    if names is None:
        described = list(space.describe(space.default()))
        rest = [n for n in described if n not in CORE_FEATURES]
        workload = [n for n in _workload_features(space) if n not in FIXED_WORKLOAD]
        names = (*CORE_FEATURES, *DEVICE_FEATURES, *FIXED_WORKLOAD, *rest, *workload)
        _names[space] = names
    return list(names)


def featurize(
    space: Space, configs: Sequence[Config], *, names: Sequence[str] | None = None
) -> np.ndarray:
    """Feature matrix of ``configs`` (float32, one row per config).

    Args:
        space: the space the configs belong to (they must be valid in it).
        configs: the configs to describe.
        names: column names to produce, e.g. another space's :func:`feature_names` so
            that rows of several workloads line up; a name ``space`` does not know
            reads 0. Default: ``feature_names(space)``.

    Returns:
        Array of shape ``(len(configs), len(names))``.
    """
    own = feature_names(space)
    with _CACHES_LOCK:  # a job proposes for several spaces at once (its threads)
        cache = _caches.get(space)
        if cache is None:
            cache = _caches[space] = {}
        while sum(len(c) for c in _caches.values()) + len(configs) > _TOTAL_LIMIT:
            largest = max(_caches.values(), key=len)
            if not largest:
                break
            largest.clear()  # the largest starts afresh
    rows = np.empty((len(configs), len(own)), dtype=np.float32)
    workload = _workload_features(space)
    workload.update(_device_features(space))
    for i, config in enumerate(configs):
        row = cache.get(config)
        if row is None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            feats = space.describe(config)
            feats.update(workload)
            row = np.array([feats.get(n, 0.0) for n in own], dtype=np.float32)
            cache[config] = row
        rows[i] = row
    if names is None or list(names) == own:
        return rows
    index = {n: j for j, n in enumerate(own)}
    out = np.zeros((len(configs), len(names)), dtype=np.float32)
    for j, n in enumerate(names):
        if n in index:
            out[:, j] = rows[:, index[n]]
    return out


def prior_score(X: np.ndarray, *, vectors: bool = True) -> np.ndarray:
    """A score without any measurement (higher = expected faster), from core features;
    ``vectors=False`` leaves out the term for the config's own vector width (the reading
    that a search on a CPU weighs against the whole prior, :mod:`autosched.search.sources`).

    Everything device-specific comes from the device's columns, never from a constant
    tuned on one machine: on a CPU, vectors up to twice the device's native vector (two
    registers per operation; the replay caches of PoCL on an AVX2 Zen 3 and an AVX-512
    Zen 4 both rank that width first; wider is penalised); on a GPU, whose work-items
    are the lanes of its vectors and whose instruction-level parallelism comes from the
    register tile, up to the native width it reports (1 on NVIDIA's driver: in the H100
    and H200 samples the best scalar config beat the best float2 one by 3 to 61 %), a
    register tile up to what the vector registers hold (three quarters of them at any
    width, the rest for operands; past that it spills; on a CPU, in vectors narrower
    than its own, the file holds registers x the config's width, as the llvm space
    counts it: on PoCL (Zen 5) the im2col 7x7x512 conv ran 8-wide 32x8 tiles at 92-103
    GFLOP/s and 16x8 ones at 164-169, interleaved, though the replay samples of the
    Zen 5 ran 129-256 as fast as 65-128; scalar code the compiler vectorises to the
    full width; a width
    that is not a power of two, 14 say, counts its lanes), operand reuse (intensity), a
    little unrolling, and enough work-groups to fill the compute units; on a GPU,
    enough work-items in all to give every compute unit a full work-group's worth in
    flight (a GPU hides memory latency by switching between
    resident work-items: a register tile that leaves too few of them starves it; on an
    H200's 512^3 matmul sample this term raised the prior's Kendall tau from 0.21 to
    0.41; CPU devices are unaffected). Staging an operand through local memory is
    penalised where the device says its local memory is emulated in ordinary memory
    (OpenCL CPU drivers) and credited, half as much, where it is dedicated: there a
    staged tile is read from global memory once per work-group instead of once per
    work-item. On the three GPU samples (H100 and H200 matmul, H100 conv2d; every best
    config stages both operands) these two GPU terms moved the best config from the
    prior's 25th / 129th / 73rd place to 2nd / 12th / 7th, and the replayed search's
    median trials to 95 % of the best from 36.5 / 27 / 48 to 4 / 21 / 11. They were
    read off those samples, of one vendor's GPUs: another GPU's measurements overrule
    them as any device's do.
    Accumulators that a register tile keeps through a reduction (``log_acc``; a row-wise
    nest's values per step are not such: 0) cost twice past that capacity: they spill
    on every step of the reduction, while the tile's intensity keeps rising past it.
    On 14 of the 15 CPU replay samples of contractions the configs whose tile is past
    capacity by up to half a power of two ran at a 90th percentile 0.63-0.93 of those
    within it (1.43 on the Zen 5 OpenCL 127x1000x333 matmul), and on the Zen 4 llvm
    512^3 matmul the prior's first picks were 8x64 tiles taking all 32 registers
    (0.28-0.92 of the best). With the term its top 8 average 0.72 of the best, not 0.53,
    and the replayed search (20 seeds) gets to 95 % in 4.5 trials, not 18; over all 26
    samples the model search's scores summed 20.46 -> 20.61 (replayed on a Zen 4,
    2026-12-01). The softmax samples, whose best configs on the Zen 3 hold per step
    more values than that capacity, read as before.
    Tiles that do not divide their axis walk padding, which costs its share of the time
    on any device: log2 of walked over needed iterations comes off the score (a log2
    throughput scale). On a CPU the parallel tasks need only fill the cores (each core
    runs one at a time); a GPU wants two work-groups per compute unit to hide latency.
    On ResNet-18's 7x7x512 conv (Zen 4), without these two terms the prior ranked a
    4-vector x 4 register tile that pads 7 to 8 (8 tasks) first and the unpadded
    2-vector x 7 tile in 2 tasks 275th of 20,000 drawn configs; with them it is 52nd,
    0.02 below the padded one.
    Remeasured side by side, those two tiles' best configs ran 1.50 and 1.23 ms.
    Where the target has no work-groups (TVM's llvm, IREE's llvm-cpu: one thread runs
    each parallel task alone), every task pays a fixed cost (its loops' set-up, a
    reduction's vector partial results set and summed across the lanes) worth about
    2^:data:`LOG_TASK_COST` flops: ``log2(1 + 2^10 / flops per task)`` comes off the
    score. On the llvm softmax samples one config at 1, 2 and 8 rows per task ran at
    0.41 / 0.60 / 0.87 of its best rows per task on the Xeon, 0.33 / 0.52 / 0.77 on the
    Zen 5 and 0.32 / 0.65 / 0.78 on the Zen 3: a cost of 2^9.6 to 2^10.6 flops on every
    one of them, AVX2 or AVX-512. On OpenCL the work-items of a group share it (PoCL
    runs them as one loop): the Zen 3's OpenCL softmax ran best with a row per group.
    And a CPU splits its tasks evenly over its cores, so g tasks on u cores take
    ``ceil(g / u)`` rounds where ``g / u`` would do; that share comes off too (3 tasks
    on 2 cores: the softmax config above ran at 0.79 / 0.84 / 0.81 of its best).
    Replayed on a Xeon (20 seeds, every sample, 2026-12-04), these two terms took the
    model search's median trials to 95 % summed over the 46 samples from 669.5 to 566
    (the Xeon's and Zen 5's llvm softmax 19 -> 7 and 30 -> 7, the Zen 3's OpenCL 3x3
    conv2d never -> 39.5) and its scores summed from 35.95 to 36.43; with transfer
    389.5 -> 394.5 and 35.18 -> 35.17.
    A scalar config that LLVM vectorises itself is described as the vector code it
    becomes (``log_vec``, :func:`autosched.space.contraction_features.compiled_form`),
    less :data:`AUTO_VECTOR_COST`: what the compiler's heuristics find runs, on the
    whole, behind the same width asked for. On the 16 llvm contraction samples of four
    CPUs (Xeon 6, Zen 3, 4 and 5), the best of the five whose best config is scalar
    ranked 27th-149th by the prior without the cost and 61st-236th with it (333rd-924th
    read as scalar), while the prior's top 8 held 0.50 of the best on average without
    the cost and 0.56 with it, as when read as scalar (the compiler's vectors of the
    SLP kind, scalar register tiles along the output's contiguous axis, crowded it);
    Kendall's tau 0.457 read as scalar, 0.468 now.
    The search weighs this prior by how well it ranks the device's own measurements
    (:mod:`autosched.search.evolutionary`), so a wrong prior fades.
    A GPU that does not say how many compute units it has (a Vulkan driver: vulkaninfo
    prints no SM count) gets no prior at all, every config scored 0, so the first
    batch is spread by the search's diversity rule: without the fill terms the rest
    ranked an H100's IREE Vulkan samples at a Kendall tau of 0.00 / -0.19 / -0.21
    (512^3 matmul, two conv2d), and the replayed search's score went from 0.31 /
    -1.21 / -1.75 with it to 0.44 / 0.31 / 0.05 without it.
    """
    X = np.asarray(X, dtype=np.float64)
    fixed = CORE_FEATURES + DEVICE_FEATURES + FIXED_WORKLOAD
    width = len(fixed)
    if X.ndim != 2 or X.shape[1] < width:
        raise InvalidInputError(
            f"X of shape {X.shape} is not a feature matrix; accepted: featurize() output, "
            f"whose first {width} columns are {', '.join(fixed)}"
        )
    c = {n: X[:, j] for j, n in enumerate(fixed)}
    lanes = c["dev_log_lanes"]
    explicit = c["dev_is_cpu"] * (c["log_vec"] > 0)  # a CPU config's own vectors
    held = np.where(explicit > 0, np.minimum(c["log_vec"], lanes), lanes)
    regs = c["dev_log_registers"]
    capacity = np.minimum(lanes, held) + regs + np.log2(0.75)
    gpu = 1.0 - c["dev_is_cpu"]
    best_vec = lanes + c["dev_is_cpu"]
    dedicated = 1.0 - c["dev_local_emulated"]
    known = 1.0 - gpu * (c["dev_log_units"] == 0)  # a GPU of unknown compute units
    vector = float(vectors)
    tasks = c["dev_is_cpu"] * (c["dev_log_group"] == 0)
    units = np.exp2(np.round(c["dev_log_units"], 6))
    groups = np.maximum(np.exp2(c["log_groups"]), units)
    return known * (
        vector * np.minimum(c["log_vec"], best_vec)
        - vector * AUTO_VECTOR_COST * (c["log_vec_auto"] > 0)
        - vector * np.maximum(0.0, c["log_vec"] - best_vec)
        + 0.5 * np.minimum(c["log_reg"], capacity)
        - 1.0 * np.maximum(0.0, c["log_reg"] - capacity)
        - 1.0 * np.maximum(0.0, c["log_acc"] - capacity)
        + 0.5 * np.log2(1.0 + np.maximum(c["intensity"], 0.0))
        + 0.25 * np.minimum(c["log_unroll"], 1.0)
        - 0.5 * np.maximum(0.0, c["dev_log_units"] + gpu - c["log_groups"])
        + 0.25 * gpu * np.minimum(c["log_threads"], 8.0)
        - 0.5 * gpu * np.maximum(0.0, c["dev_log_units"] + c["dev_log_group"] - c["log_work_items"])
        - 1.0 * c["staged"] * c["dev_local_emulated"]
        + 0.5 * c["staged"] * dedicated
        - c["log_pad_waste"]
        - tasks * np.log2(1.0 + np.exp2(LOG_TASK_COST - (c["w_log_flops"] - c["log_groups"])))
        + c["dev_is_cpu"] * np.log2(groups / (np.ceil(groups / units - 1e-9) * units))
    )
