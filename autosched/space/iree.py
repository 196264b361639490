"""The space of IREE lowering configs for one workload: tile sizes per level, vector
sizes, pipeline and workgroup size, read off the root Linalg op's loops.

Knobs are named after the op's loops (:func:`autosched.iree.linalg.domain`), so a
config is plain data: ``{"pipeline": "DoubleTilingExpert", "dist.m": 64, "vec.m": 8,
...}``. :mod:`autosched.iree.render` turns it into a ``compilation_info`` attribute
only when it is written into MLIR.

``iree-llvm-cpu``: a distribution tile per parallel loop (one task of IREE's thread
pool), a cache tile per parallel loop inside it (0: none; on this Zen 3 a 64x32 cache
tile halved a 512^3 matmul's time), a vector tile per parallel loop, a vector tile per reduction loop, and loop
peeling for tiles that do not divide their extent (IREE's own way of padding). The
host's vector width bounds the accumulator tile; distribution tiles must give every
core a task where the shape allows.

``iree-vulkan``: a workgroup tile and a thread tile per parallel loop (their ratio on
the innermost three parallel loops is the workgroup size, x innermost), a reduction
tile, and the pipeline (``BaseVectorize``, or ``MatmulPromoteVectorize`` staging the
operands' tiles in shared memory for contractions, in ``stages`` buffers). Tiles divide their extents (the
SPIR-V pipelines do not pad); the device's maximum invocations, shared memory and
subgroup size prune the rest, since ``iree-compile`` does not check them.

The pipeline ``auto`` is IREE's own heuristic config: no ``compilation_info`` at all.
It is the default schedule, measured beside the tuned one.
"""

from __future__ import annotations

import math
from typing import Any

from autosched.iree.linalg import Domain, Loop, config_dropped, domain
from autosched.space.config import Config
from autosched.space.space import DeviceLimits, Knob, Space

AUTO = "auto"
CPU_PIPELINES = {
    "contraction": "DoubleTilingExpert",
    "reduction": "DoubleTilingExpert",
    "conv": "ConvTileAndDecomposeExpert",
}
MAX_CPU_VECTOR_TILE = 2048  # elements of one vector tile; IREE refuses 16 KiB vectors
MAX_THREAD_TILE = 64  # outputs one GPU invocation computes
_VEC = (1, 2, 4, 8, 16, 32)
_RED = (1, 2, 4, 8, 16, 32, 64)


def _tiles(extent: int, *, divide: bool, low: int = 1) -> tuple[int, ...]:
    """Powers of two up to ``extent`` (and ``extent`` itself), or only those dividing it."""
    out = [1 << i for i in range(extent.bit_length()) if (1 << i) >= low and (1 << i) <= extent]
    if extent not in out:
        out.append(extent)
    if divide:
        out = [t for t in out if extent % t == 0]
    return tuple(out) or (extent,)


def _dist_tiles(extent: int) -> tuple[int, ...]:
    """llvm-cpu distribution tiles: powers of two up to the extent, the extent, and its
    divisors that are multiples of 8 (IREE's own config cuts a 96-wide loop in 48s)."""
    tiles = set(_tiles(extent, divide=False))
    tiles |= {d for d in range(8, extent, 8) if extent % d == 0}
    return tuple(sorted(tiles))


def _vec_tiles(extent: int) -> tuple[int, ...]:
    """Vector tiles of a parallel loop: powers of two up to 32, and where no power of
    two from 8 up divides the extent, its other divisors up to 32 (IREE's own config
    tiles a 28-wide output row by 7). Only there: each such tile divides no power-of-two
    distribution tile, so elsewhere it would mostly add configs the space refuses."""
    tiles = {v for v in _VEC if v <= extent}
    if not any(extent % v == 0 for v in _VEC if v >= 8):
        tiles |= {d for d in range(3, max(_VEC) + 1) if extent % d == 0}
    return tuple(sorted(tiles))


class IreeSpace(Space):
    """Lowering configs of IREE's llvm-cpu or SPIR-V backend for one workload."""

    family = "iree"
    # IREE's own heuristic config, measured first as the seeds are (the compiler's own
    # choice): on the eight IREE llvm-cpu replay samples it runs at 1.1-3.1x the best's
    # latency, a random config's expected 2.3-7.1x; on the five Vulkan ones (H100,
    # lavapipe) 1.2-18.8x against 1.7-6.8x.
    heuristic_default = True

    def __init__(self, workload, *, target: str = "iree-llvm-cpu", limits: DeviceLimits) -> None:
        super().__init__(workload, target=target, limits=limits)

    @property
    def cpu(self) -> bool:
        return self.target == "iree-llvm-cpu"

    def _analyze(self) -> Domain:
        return domain(self.workload)

    # -- knobs ------------------------------------------------------------------------
    def _fixed_one(self, loop: Loop) -> bool:
        """Loops a convolution pipeline needs at a vector tile of 1: the batch, the
        output row and the filter window (ConvTileAndDecompose turns the 2-D conv
        into 1-D convs along the output row)."""
        return self.nest.kind == "conv" and loop.name in ("n", "oh", "kh", "kw")

    def _make_knobs(self) -> list[Knob]:
        knobs = self._knobs()
        if config_dropped(self.workload):  # IREE's own config is all there is to build
            return [Knob(k.name, k.choices[:1], k.optional) for k in knobs]
        return knobs

    def _knobs(self) -> list[Knob]:
        d: Domain = self.nest
        if self.cpu:
            knobs = [Knob("pipeline", (AUTO, CPU_PIPELINES[d.kind]))]
            cache = CPU_PIPELINES[d.kind] == "DoubleTilingExpert"
            for lp in d.spatial:
                knobs.append(Knob(f"dist.{lp.name}", _dist_tiles(lp.extent)))
                if cache:  # 0: no cache level on this loop
                    tiles = tuple(t for t in (8, 16, 32, 64, 128) if t < lp.extent)
                    knobs.append(Knob(f"cache.{lp.name}", (0, *tiles)))
                vec = (1,) if self._fixed_one(lp) else _vec_tiles(lp.extent)
                knobs.append(Knob(f"vec.{lp.name}", vec))
            for lp in d.reduction:
                red = (1,) if self._fixed_one(lp) else tuple(v for v in _RED if v <= lp.extent)
                knobs.append(Knob(f"red.{lp.name}", red))
            if CPU_PIPELINES[d.kind] == "DoubleTilingExpert":
                knobs.append(Knob("peel", (False, True)))
            return knobs
        pipelines = [AUTO, "BaseVectorize"]
        if d.kind == "contraction":
            pipelines.append("MatmulPromoteVectorize")
        knobs = [Knob("pipeline", tuple(pipelines))]
        mapped = self._mapped()
        for lp in d.spatial:
            wg = _tiles(lp.extent, divide=True) if lp in mapped else (1,)
            thr = tuple(t for t in wg if t <= 16)
            knobs.append(Knob(f"wg.{lp.name}", wg))
            knobs.append(Knob(f"thr.{lp.name}", thr))
        for lp in d.reduction:
            red = tuple(t for t in _tiles(lp.extent, divide=True) if t <= 64)
            knobs.append(Knob(f"red.{lp.name}", (1,) if self._fixed_one(lp) else red))
        if d.kind == "contraction":
            # MatmulPromoteVectorize: shared-memory buffers per operand (software
            # pipelining depth + 1); 1 for the other pipelines.
            knobs.append(Knob("stages", (1, 2, 3)))
        return knobs

    def _mapped(self) -> tuple[Loop, ...]:
        """The parallel loops that map to workgroup dimensions: the innermost three (x
        innermost); outer ones are tiled by 1 and spread over the workgroup grid."""
        return tuple(self.nest.spatial[-3:])

    # -- derived ------------------------------------------------------------------------
    def register_tile(self, config: Config) -> tuple[int, ...] | None:
        """The outputs one task (llvm-cpu: its vector tile) or one invocation (Vulkan: its
        thread tile) computes per parallel loop; None for IREE's own config."""
        if config.get("pipeline") == AUTO:
            return None
        knob = "vec" if self.cpu else "thr"
        return tuple(self.value(config, f"{knob}.{lp.name}") for lp in self.nest.spatial)

    def workgroup_size(self, config: Config) -> tuple[int, int, int]:
        """Vulkan: invocations per workgroup in x, y, z."""
        sizes = [config[f"wg.{lp.name}"] // config[f"thr.{lp.name}"] for lp in self._mapped()]
        sizes = list(reversed(sizes)) + [1] * (3 - len(sizes))
        return sizes[0], sizes[1], sizes[2]

    def tasks(self, config: Config) -> int:
        """Workgroups (Vulkan) or thread-pool tasks (llvm-cpu) the output is cut into."""
        tile = "dist" if self.cpu else "wg"
        return math.prod(-(-lp.extent // config[f"{tile}.{lp.name}"]) for lp in self.nest.spatial)

    def shared_bytes(self, config: Config) -> int:
        """Vulkan, MatmulPromoteVectorize: the operands' tiles staged in shared memory."""
        if self.cpu or config["pipeline"] != "MatmulPromoteVectorize":
            return 0
        m, n = self.nest.spatial[-2:]
        (k,) = self.nest.reduction
        wm, wn, rk = config[f"wg.{m.name}"], config[f"wg.{n.name}"], config[f"red.{k.name}"]
        # Measured with iree-compile 3.13: one stage already takes two buffers.
        return (wm * rk + rk * wn) * 4 * (config["stages"] + 1)

    # -- validity -------------------------------------------------------------------------
    def check(self, config: Config) -> str | None:
        reason = self._check_knobs(config)
        if reason:
            return reason
        if config["pipeline"] == AUTO:
            # IREE's own config: the tile knobs mean nothing, so only one such config.
            for knob in self.knobs[1:]:
                if config[knob.name] != knob.choices[0]:
                    return "pipeline=auto takes every other knob at its first choice"
            return None
        return self._check_cpu(config) if self.cpu else self._check_vulkan(config)

    def _check_cpu(self, config: Config) -> str | None:
        d: Domain = self.nest
        lanes = max(1, self.limits.vector_bits // 32) if self.limits.vector_bits else 8
        for lp in d.spatial:
            dist, vec = config[f"dist.{lp.name}"], config[f"vec.{lp.name}"]
            if dist % vec:
                return f"vec.{lp.name}={vec} does not divide dist.{lp.name}={dist}"
            cache = config.get(f"cache.{lp.name}", 0)
            if cache and (cache >= dist or dist % cache or cache % vec):
                return (
                    f"cache.{lp.name}={cache} must lie strictly between vec.{lp.name}={vec} "
                    f"and dist.{lp.name}={dist}, dividing one and divided by the other"
                )
        acc = math.prod(config[f"vec.{lp.name}"] for lp in d.spatial)
        regs = self.limits.vector_registers  # the CPU's own: 32 on AVX-512, 16 on AVX2
        if acc > regs * lanes:
            return f"vector tile of {acc} accumulators exceeds {regs} registers of {lanes} lanes"
        red = math.prod(config[f"red.{lp.name}"] for lp in d.reduction)
        if acc * red > MAX_CPU_VECTOR_TILE:
            return f"vector tile of {acc * red} elements exceeds {MAX_CPU_VECTOR_TILE}"
        inner = d.spatial[-1] if d.kind != "reduction" else d.reduction[-1]
        knob = f"vec.{inner.name}" if d.kind != "reduction" else f"red.{inner.name}"
        # An inner tile of half a native vector still runs at full width on AVX-512 parts
        # (Zen 4 splits a 512-bit op in two), and IREE itself picks 4-wide inner tiles for
        # an NHWC conv on AVX2: only an inner tile narrower than half the lanes is refused.
        narrowest = min(max(1, lanes // 2), inner.extent)
        if config[knob] < narrowest:
            return f"{knob}={config[knob]} leaves {narrowest}-lane vectors part empty"
        most = math.prod(-(-lp.extent // max(1, config[f"vec.{lp.name}"])) for lp in d.spatial)
        if self.tasks(config) < min(self.limits.cores, most):
            return f"{self.tasks(config)} tasks leave some of the {self.limits.cores} cores idle"
        if "peel" in config:
            ragged = any(lp.extent % config[f"dist.{lp.name}"] for lp in d.spatial)
            if config["peel"] and not ragged:
                return "peel=True changes nothing when every tile divides its extent"
        return None

    def _check_vulkan(self, config: Config) -> str | None:
        lim = self.limits
        for lp in self.nest.spatial:
            wg, thr = config[f"wg.{lp.name}"], config[f"thr.{lp.name}"]
            if wg % thr:
                return f"thr.{lp.name}={thr} does not divide wg.{lp.name}={wg}"
        size = self.workgroup_size(config)
        invocations = math.prod(size)
        if invocations > lim.max_work_group_size:
            return f"{invocations} invocations exceed the device's {lim.max_work_group_size}"
        if size[2] > 64:
            return f"workgroup z size {size[2]} exceeds 64"
        sub = lim.subgroup_size or 1
        if invocations % sub:
            return f"{invocations} invocations are not a multiple of the subgroup size {sub}"
        per_thread = math.prod(config[f"thr.{lp.name}"] for lp in self.nest.spatial)
        if per_thread > MAX_THREAD_TILE:
            return f"{per_thread} outputs per invocation exceed {MAX_THREAD_TILE}"
        shared = self.shared_bytes(config)
        if shared > lim.local_mem_bytes:
            return f"{shared} bytes of shared memory exceed the device's {lim.local_mem_bytes}"
        if "stages" in config and config["stages"] != 1:
            if config["pipeline"] != "MatmulPromoteVectorize":
                return "stages > 1 only for MatmulPromoteVectorize"
        if config["pipeline"] == "MatmulPromoteVectorize":
            inner = self.nest.spatial[-1]
            if config[f"thr.{inner.name}"] != 4:
                return "MatmulPromoteVectorize needs thr 4 on the innermost loop (vec4 loads)"
        return None

    @property
    def cpu_pipeline(self) -> str:
        """llvm-cpu: the pipeline this op's explicit configs use."""
        return CPU_PIPELINES[self.nest.kind]

    # -- the rest of the Space contract ---------------------------------------------------
    def default(self) -> Config:
        """IREE's own heuristic config (pipeline ``auto``)."""
        return Config({k.name: k.choices[0] for k in self.knobs})

    def seeds(self) -> list[Config]:
        """IREE's own config written out as knobs (measured early, so the search learns
        it as a point of the space and steps from it), where it is one. Vulkan: for the
        SPIR-V target builds use."""
        if config_dropped(self.workload):
            return []
        if not hasattr(self, "_seeds"):
            from autosched.iree.heuristic import iree_default_config

            found = iree_default_config(self)
            self._seeds = [found] if found is not None else []
        return list(self._seeds)

    def scratch(self, config: Config) -> tuple[str, ...]:
        return ()

    def apply(self, sch: Any, config: Config) -> None:
        raise NotImplementedError("IREE configs are rendered to MLIR (autosched.iree.render)")

    def describe(self, config: Config) -> dict[str, float]:
        d: Domain = self.nest
        auto = config["pipeline"] == AUTO
        if self.cpu:
            reg = math.prod(config[f"vec.{lp.name}"] for lp in d.spatial)
            tile = {lp.name: config[f"dist.{lp.name}"] for lp in d.spatial}
            threads, inner = 1, config[f"vec.{d.spatial[-1].name}"]
        else:
            reg = math.prod(config[f"thr.{lp.name}"] for lp in d.spatial)
            tile = {lp.name: config[f"wg.{lp.name}"] for lp in d.spatial}
            threads, inner = (
                math.prod(self.workgroup_size(config)),
                config[f"thr.{d.spatial[-1].name}"],
            )
        red = math.prod(config[f"red.{lp.name}"] for lp in d.reduction) if d.reduction else 1
        outputs = math.prod(tile.values())
        # Loads per reduction step for a tile: the sum of the tile's sides (a
        # contraction's A and B panels); outputs over loads is its reuse.
        loads = sum(tile.values())
        staged = float(config["pipeline"] == "MatmulPromoteVectorize")
        feats = {
            "log_threads": math.log2(threads),
            "log_groups": math.log2(self.tasks(config)),
            "log_reg": math.log2(reg),
            "log_acc": math.log2(reg) if d.reduction else 0.0,
            "log_vec_auto": 0.0,
            "log_vec": math.log2(inner),
            "intensity": outputs / max(1, loads),
            "staged": staged,
            "log_work_items": math.log2(threads * self.tasks(config)),
            "log_unroll": math.log2(red),
            "log_pad_waste": 0.0,  # IREE pads or peels in its own pipeline: not modelled
            "auto": float(auto),
            "peel": float(bool(config.get("peel", False))),
            "log_tile_outputs": math.log2(outputs),
        }
        feats.update(self._per_axis(config))
        return feats

    def _per_axis(self, config: Config) -> dict[str, float]:
        """Each loop's own tiles (log2), by position, as the contraction spaces describe
        theirs: which axis a tile cuts decides where the products above cannot (on
        lavapipe's NHWC convs the channel tile per workgroup alone moves the median
        config 0.04 -> 0.23 of the best, whatever the other axes do). Replayed on the 14
        IREE samples (2026-12-06): the lavapipe 28x28 conv's model search, locked at 91 %
        of the best from trial 32 without them, reaches 100 % by 64; the H100's 28x28
        conv takes 52 trials to 95 % against 33 (two of its 161 configs get there); the
        model search's scores summed 10.24 -> 10.41."""
        d: Domain = self.nest
        out: dict[str, float] = {}  # IREE's own config: every knob at its first choice
        for i, lp in enumerate(d.spatial):
            if self.cpu:
                dist, vec = config[f"dist.{lp.name}"], config[f"vec.{lp.name}"]
                out[f"s{i}_log_tile"] = math.log2(dist)
                out[f"s{i}_log_reg"] = math.log2(vec)
                out[f"s{i}_log_cache"] = math.log2(max(1, config.get(f"cache.{lp.name}", 0)))
            else:
                wg, thr = config[f"wg.{lp.name}"], config[f"thr.{lp.name}"]
                out[f"s{i}_log_tile"] = math.log2(wg)
                out[f"s{i}_log_reg"] = math.log2(thr)
                out[f"s{i}_log_threads"] = math.log2(wg // thr)
        for j, lp in enumerate(d.reduction):
            out[f"r{j}_log_tile"] = math.log2(config[f"red.{lp.name}"])
        if "stages" in config:
            out["stages"] = float(config["stages"])
        return out
