"""The contraction family: one reduction whose inputs are reused across outputs.

Matmul, batch matmul, dense and convolutions.

Knobs for ``target="opencl"`` (all derived from the loop nest, see
:mod:`autosched.space.loopnest`):

* ``tile.<axis>`` for each spatial axis: ``(threads, reg)``. The axis is split into
  ``[groups, threads, reg]``: work-groups, work-items per group, and a register tile
  each work-item computes. ``threads == 1`` everywhere gives one work-item per group,
  which is what PoCL's CPU device runs best.
* ``tile.<axis>`` for each reduction axis: ``(chunk, unroll)``: the axis is split into
  ``[outer, chunk / unroll, unroll]``; operands staged in local memory are loaded per
  chunk, and the innermost ``unroll`` iterations are unrolled.
* ``vec``: explicit vector width on the innermost spatial axis (``float16`` and
  friends in the OpenCL C). Must divide that axis' register tile.
* ``stage.<input>``: ``"global"`` (read directly) or ``"local"`` (staged per chunk in
  local memory by the whole work-group); on a CPU driver also ``"pack"`` for an input
  indexed by the innermost axis (a matmul's B, a dense layer's or an NHWC conv's
  weights): a kernel of its own copies it into panels of one register tile's columns,
  each contiguous along the other axes, so a work-item streams its operand as llvm's
  packed tasks do (:func:`~autosched.space.contraction_knobs.panel_input`). The panels
  take register tiles that divide the innermost axis (after a vector tail's padding). A
  produced input (the im2col matrix below) is written as panels by its producer, in a
  kernel of its own (``fuse.<input>=False``).
* ``fuse``: present when the workload has an epilogue; ``True`` computes it in the
  main kernel from the register accumulators, ``False`` runs it as its own kernel.
* ``fuse.<input>`` for each input of the main stage that a producer computes (a
  convolution's zero padding): ``True`` fuses the producer into the main kernel
  (inlined into the reads when the input is read from global memory; computed while
  staging when it is staged in local memory, so the padded tile is built in local
  memory straight from the unpadded data); ``False`` runs it as its own kernel that
  writes the padded tensor to global memory.
* Where an NCHW conv's rows take vectors of a quarter of the device's or less, the nest is
  its im2col product (:mod:`autosched.space.im2col`): rows and columns are one axis
  (``tile.pq``), and the image's im2col copy a produced input (``fuse.pad_reindex``).

Tiles need not divide their axes. Each knob offers, besides the divisors of the axis,
the powers of two that pad it by at most :data:`~autosched.space.space.MAX_PAD_WASTE` (a
prime axis of 127 gets register tiles of 8 and 16, a reduction of 333 chunks of 64); the
last tile along the axis is cut short by a guard (TVM's split with a non-dividing factor
predicates the block). On llvm, where the nest reads its inputs at plain axes, the
spatial axes are padded to whole register tiles instead, as for a vector tail below: a
guard inside the register tile kept LLVM from holding its accumulators in registers
(:func:`autosched.space.contraction_schedule._pad_blocks`). A block of register tiles
that does not divide its axis is cut short by a guard on whole tiles, which TVM lifts
above the reduction, so such an axis also takes blocks of any tile size of its tiles (a
257-row matmul: one block of 65 tiles of 4 rows). The vector lanes are split
off the innermost axis first, so its guard is on whole vectors and the lanes stay one
vector instruction (a guard on the lanes would make TVM scalarise them). ``vec`` divides
the innermost axis, or, where the nest reads its inputs at plain axes (matmul, dense,
batch matmul: TVM's ``pad_einsum`` applies), the axis is padded to whole vectors (a
vector tail): the inputs it indexes are zero-padded where they are staged or packed, and
the others are copied once into a zero-padded buffer by a loop of their own (OpenCL: a
kernel of its own, writing a scratch argument; padded inline, every read would be
guarded per lane, which TVM scalarises), the accumulators cover the padded tile, and the
write-back stores only the real outputs. Never guarded per lane on the accumulators
themselves: that is scalarised, which left PoCL's accumulators in memory, 5x slower, and
cost llvm up to 40% on a 2-row register tile. Each vector of accumulators is stored
whole into a private vector, out of which the real outputs are written in the widest
vectors that divide a row
(:func:`autosched.space.contraction_schedule._write_real_outputs`; llvm's block order
keeps a block's accumulators in its padded output, copied out per task). A prime N of
509 gets ``vec=16``.

Register accumulators are always used (``cache_write`` to local scope): there is no
device on which accumulating through global memory wins.

Knobs for ``target="llvm"`` (TVM's LLVM code generation for the host CPU), from the
same loop nest:

* ``tile.<axis>`` for each spatial axis: ``(mid, reg)``. The axis is split into
  ``[outer, mid, reg]``; the outer loops of all spatial axes are fused into one
  parallel loop (one task per block of ``mid * reg`` outputs per axis), the mid loops
  walk the register tiles of a block, and each ``reg`` tile is held in registers.
* ``tile.<axis>`` for each reduction axis: ``(chunk, unroll)``, as for OpenCL; the
  chunk is the cache block of the reduction when ``reduce_at="block"``.
* ``vec``: vector width of the innermost spatial axis (LLVM vector instructions); besides
  powers of two, the divisors of the axis that LLVM widens to a register with at most a
  quarter of its lanes idle (``space.widened_vector_widths``: 7 and 14 on an axis of 56).
* ``vec_axis`` (optional: present where the innermost axis leaves more than a quarter of
  the CPU's lanes idle, as an NCHW conv's rows of 7 on AVX-512): the spatial axis whose
  register tile is vectorised, the innermost (its first choice, written by leaving the
  knob out, so configs recorded before it keep their keys) or another axis that holds
  whole native vectors (the output channels). Lanes off the innermost axis take packed
  inputs, laid out with that axis innermost, and register tiles that divide their axes;
  the accumulators are laid out with it innermost too (else every lane is inserted and
  extracted apart: 11 GFLOP/s where 205 ran in a prototype).
* ``reduce_at``: ``"tile"`` runs the whole reduction inside each register tile
  (accumulators stay in registers, written once); ``"block"`` puts the reduction's
  outer loop above the mid loops, so each chunk of the block's operands is reused by
  every register tile while it is in cache (the accumulators of the block are kept in
  a per-task buffer).
* ``tile_inner``: the spatial axis whose mid loop is innermost; it decides which
  operand panel stays in L1 while the other streams.
* ``stage.<input>``: ``"global"`` (read in place) or ``"pack"`` (copied per task,
  per chunk when ``reduce_at="block"``, into a contiguous buffer: the classic CPU
  packing that turns strided rows into one stream and avoids cache-set conflicts). An
  input the vector lanes index at a plain axis other than its last is packed with that
  axis innermost: a dense layer's weights, laid out ``[n, k]``, are packed ``[k, n]``, so
  the lanes read whole vectors (on the Zen 3, 64x1000x512: 137 GFLOP/s, where the same
  config packed in ``[n, k]`` ran 46 and unpacked 63).
* ``fuse``: as for OpenCL; ``True`` applies the epilogue in the write-back of the
  accumulators, ``False`` runs it as its own parallel loop.
* ``fuse.<input>``: as for OpenCL; a fused producer of a packed input is computed
  into the packed buffer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autosched.space.config import Config
from autosched.space.contraction_checks import MAX_REG_ELEMS, check
from autosched.space.contraction_features import describe_cpu, describe_gpu
from autosched.space.contraction_knobs import inner_widths, make_knobs, whole_tiles
from autosched.space.cpu_seed import cpu_seed, opencl_cpu_seed, packed_twin
from autosched.space.im2col import rewritten_nest, window_rows
from autosched.space.loopnest import LoopNest, analyze
from autosched.space.space import (
    VECTOR_WIDTHS,
    Knob,
    Space,
    padded,
)
from autosched.space.space import divisors as _divisors


class ContractionSpace(Space):
    """Schedules of a contraction (see the module docstring for the knobs)."""

    nest: LoopNest
    family = "contraction"

    # The rows an OpenCL im2col product fuses (autosched.space.im2col); None elsewhere.
    rows: tuple[str, str] | None = None

    def _analyze(self) -> LoopNest:
        nest = analyze(self.workload)
        if self.target == "opencl":
            self.rows = window_rows(nest, self.limits.vector_lanes)
        return nest if self.rows is None else rewritten_nest(self.workload, nest, self.rows)

    def _set_knobs(self) -> None:
        self._inner_vecs = inner_widths(self)  # read by the knobs and by every check
        super()._set_knobs()

    def apply(self, sch, config: Config) -> None:
        from autosched.space.contraction_schedule import apply_contraction

        apply_contraction(sch, self, config)

    # -- construction ---------------------------------------------------------------
    def _make_knobs(self) -> list[Knob]:
        return make_knobs(self)

    def vector_axes(self) -> tuple[str, ...]:
        """The spatial axes that may carry the vector lanes: the innermost; on llvm, where
        its widest vector leaves more than a quarter of the CPU's lanes idle, also every
        other spatial axis that holds whole native vectors (the output channels of an NCHW
        conv whose rows of 7 fill 7 of 16 lanes on AVX-512). Such configs pack the inputs
        that axis indexes with it innermost, and lay the accumulators out likewise.

        Not on OpenCL: on PoCL (Zen 5, the 512x7x7 conv) lanes along the output channels
        ran at 26-29 GFLOP/s with the weights staged channel-innermost and 31-44 read in
        place, against 53 for the best config without them. A work-item's register tile
        has no loops over several tiles to share its staged weights, so each work-group
        copies the weights of its channels again for one row of 7 outputs."""
        inner = self.nest.spatial[-1]
        lanes = self.limits.vector_lanes
        if self.target != "llvm" or not self.nest.reduction or lanes < 2:
            return (inner.name,)
        if 4 * max(self._inner_vecs) >= 3 * lanes:  # idle lanes as widened_vector_widths
            return (inner.name,)
        others = [a.name for a in self.nest.spatial[:-1] if a.extent % lanes == 0]
        return (inner.name, *others)

    def changed(self, config: Config, name: str, value: Any) -> Config:
        """As :meth:`Space.changed`; moving the lanes to another axis also packs the
        inputs that axis indexes and takes the widest vector of it (at most the CPU's)
        that divides its register tile: one knob alone seldom crosses, as every one of
        them is required."""
        values = {**config, name: value}
        if name == "vec_axis":
            inner = self.nest.spatial[-1].name
            reg = config[f"tile.{value}"][1]
            if value == inner:
                widths = [v for v in self._inner_vecs if reg % v == 0]
            else:
                extent = next(a.extent for a in self.nest.spatial if a.name == value)
                widths = [v for v in VECTOR_WIDTHS if v > 1 and extent % v == 0 == reg % v]
                for acc in self.nest.inputs:
                    if ((value, 1),) in acc.dims:
                        values[f"stage.{acc.buffer}"] = "pack"
            fitting = [v for v in widths if v <= self.limits.vector_lanes] or widths
            if fitting:
                values["vec"] = max(fitting)
        return self.make(values)

    def vector_tail(self, config: Config) -> bool:
        """Whether ``vec`` leaves the innermost axis a tail, padded to whole vectors."""
        return int(config["vec"]) > 1 and self.nest.spatial[-1].extent % int(config["vec"]) != 0

    def vec_axis(self, config: Config) -> str:
        """The spatial axis whose register tile ``config`` vectorises."""
        return (
            self.value(config, "vec_axis")
            if "vec_axis" in self._by_name
            else self.nest.spatial[-1].name
        )

    # -- queries --------------------------------------------------------------------
    def scratch(self, config: Config) -> tuple[str, ...]:
        """Intermediates ``config`` keeps in global memory between kernels."""
        out = self.unfused_producers(config)
        if self.nest.epilogue and not config.get("fuse", True):
            out.append(self.nest.output)
        return tuple(out)

    def unfused_producers(self, config: Config) -> list[str]:
        """Produced inputs whose producer ``config`` runs as its own kernel."""
        return [name for name in self.nest.produced if not config[f"fuse.{name}"]]

    def inlined_producers(self, config: Config) -> list[str]:
        """Produced inputs whose producer ``config`` computes in the main loop's reads: fused,
        but neither packed (llvm) nor staged in local memory (OpenCL), so every read of the
        input evaluates it (a padding's bounds check per element)."""
        kept = "pack" if self.target == "llvm" else "local"
        return [
            name
            for name in self.nest.produced
            if config[f"fuse.{name}"] and config.get(f"stage.{name}") != kept
        ]

    def threads(self, config: Config) -> int:
        """Work-items per work-group (OpenCL); 1 on llvm, where a task is one thread."""
        if self.target == "llvm":
            return 1
        return math.prod(config[f"tile.{a.name}"][0] for a in self.nest.spatial)

    def register_tile(self, config: Config) -> tuple[int, ...]:
        return tuple(config[f"tile.{a.name}"][1] for a in self.nest.spatial)

    def reg_elems(self, config: Config) -> int:
        return math.prod(self.register_tile(config))

    def unrolled_body(self, config: Config) -> int:
        """Vector statements in one fully unrolled reduction step of a work-item or task."""
        unroll = math.prod(config[f"tile.{a.name}"][1] for a in self.nest.reduction)
        return self.reg_elems(config) // config["vec"] * unroll

    def groups(self, config: Config) -> int:
        """Work-groups (OpenCL) or parallel tasks (llvm): the blocks the output is cut into
        (the last along an axis cut short where the tile does not divide it)."""
        return math.prod(
            -(-a.extent // (config[f"tile.{a.name}"][0] * config[f"tile.{a.name}"][1]))
            for a in self.nest.spatial
        )

    def pad_waste(self, config: Config) -> float:
        """Iterations walked over iterations needed: 1.0 when every tile divides its axis.

        A spatial axis is walked in whole tiles of ``threads * reg`` (llvm: ``mid * reg``),
        a reduction axis in whole chunks; the guards skip the padding's work but not its
        loop trips. On llvm, an axis walked in whole register tiles (:func:`whole_tiles`)
        is walked to whole register tiles only: its last block's guard skips whole tiles,
        above their reduction loops.
        """
        walked = needed = 1
        for a in self.nest.spatial:
            t, r = config[f"tile.{a.name}"]
            walked *= padded(a.extent, r if whole_tiles(self, a.extent, r) else t * r)
            needed *= a.extent
        for a in self.nest.reduction:
            walked *= padded(a.extent, config[f"tile.{a.name}"][0])
            needed *= a.extent
        return walked / needed

    def group_tile(self, config: Config) -> dict[str, int]:
        """Extent of each axis covered by one work-group (llvm: one task) per chunk of the
        reduction."""
        tile = {
            a.name: config[f"tile.{a.name}"][0] * config[f"tile.{a.name}"][1]
            for a in self.nest.spatial
        }
        tile.update({a.name: config[f"tile.{a.name}"][0] for a in self.nest.reduction})
        return tile

    def local_mem_bytes(self, config: Config) -> int:
        tile = self.group_tile(config)
        itemsize = np.dtype(self.workload.dtype).itemsize
        return sum(
            acc.footprint(tile) * itemsize
            for acc in self.nest.inputs
            if config[f"stage.{acc.buffer}"] == "local"
        )

    def pack_bytes(self, config: Config) -> int:
        """Bytes one llvm task copies into packed buffers each time it packs (0 on OpenCL)."""
        if self.target != "llvm" or not self.nest.reduction:
            return 0
        tile = self.group_tile(config)
        if config["reduce_at"] == "tile":  # packed once per task, for the whole reduction
            tile.update({a.name: a.extent for a in self.nest.reduction})
        itemsize = np.dtype(self.workload.dtype).itemsize
        return sum(
            acc.footprint(tile) * itemsize
            for acc in self.nest.inputs
            if config[f"stage.{acc.buffer}"] == "pack"
        )

    def check(self, config: Config) -> str | None:
        """Why ``config`` is not valid here, or None if it is
        (:func:`autosched.space.contraction_checks.check`)."""
        return self._check_knobs(config) or check(self, config)

    def max_reg_elems(self, vec: int) -> int:
        """:data:`MAX_REG_ELEMS`, or on llvm the CPU's register file in ``vec``-lane
        vectors where it holds more (AVX-512: 32 x 16 at 16, a 7x64 tile of ResNet's
        7x7x512 conv 1.57x the best under 256 on a Zen 5; 32 x 8 at 8, where 448 spill)."""
        file = self.limits.vector_registers // self.vector_registers(vec) * vec
        return max(MAX_REG_ELEMS, file) if self.target == "llvm" else MAX_REG_ELEMS

    def vector_registers(self, vec: int) -> int:
        """The CPU's vector registers one ``vec``-lane vector takes (14 lanes: two on AVX2)."""
        return -(-vec // max(1, self.limits.vector_lanes))

    def default(self) -> Config:
        """The untuned schedule.

        OpenCL: one output per work-item, 8x8-ish work-groups, no vectors. llvm: the
        plain loop nest with its outputs spread over the cores, no tiles, no vectors.
        """
        if self.target == "llvm":
            return self._default_cpu()
        values: dict[str, Any] = {}
        budget = 64
        for ax in reversed(self.nest.spatial):
            t = max(d for d in _divisors(ax.extent) if d <= min(8, budget))
            budget //= t
            values[f"tile.{ax.name}"] = (t, 1)
        for ax in self.nest.reduction:
            values[f"tile.{ax.name}"] = (1, 1)
        values["vec"] = 1
        for acc in self.nest.inputs:
            values[f"stage.{acc.buffer}"] = "global"
        if self.nest.epilogue:
            values["fuse"] = True
        for name in self.nest.produced:
            values[f"fuse.{name}"] = True
        config = Config(values)
        reason = self.check(config)
        if reason:  # only on a device with tiny limits
            values.update({f"tile.{a.name}": (1, 1) for a in self.nest.spatial})
            config = Config(values)
        return config

    def _default_cpu(self) -> Config:
        values: dict[str, Any] = {f"tile.{a.name}": (1, 1) for a in self.nest.axes}
        values["vec"] = 1
        if self.nest.reduction:
            values["reduce_at"] = "tile"
            for acc in self.nest.inputs:
                values[f"stage.{acc.buffer}"] = "global"
        values["tile_inner"] = self.nest.spatial[-1].name
        if self.nest.epilogue:
            values["fuse"] = True
        for name in self.nest.produced:
            values[f"fuse.{name}"] = True
        return Config(values)

    def seeds(self) -> list[Config]:
        """llvm: the blocking BLIS's analytical model picks from the CPU's fingerprint;
        OpenCL on a CPU driver: its register tile for one work-item per group
        (:mod:`autosched.space.cpu_seed`), read in place and, where an input can be,
        packed into panels; none on a GPU.

        Both OpenCL seeds are measured, as which one pays depends on the device and the
        shape. On the AVX2 Zen 3's PoCL (5 interleaved rounds each, GFLOP/s in place
        against packed): 251x509x127 96 and 122, 257x512x129 116 and 148, a dense layer
        of 64x768x768 72 and 136 (its weights are read across their rows in place); a
        dense layer of 16x1000x512, each panel read by 2 work-items, 84 and 58; ResNet's
        56x56x64 NHWC conv, whose weights stay in the caches, 176 and 166; its 7x7x512
        NCHW conv, whose im2col matrix is packed, 84 and 129 (numpy 115-117).
        """
        if not hasattr(self, "_seeds"):
            seed = cpu_seed(self) if self.target == "llvm" else opencl_cpu_seed(self)
            self._seeds = [seed] if seed is not None else []
            if seed is not None and self.target == "opencl":
                self._seeds += packed_twin(self, seed)
        return list(self._seeds)

    def untuned(self) -> Config:
        """The first seed (:meth:`seeds`: on llvm BLIS's blocking for the CPU's caches
        and registers, on a CPU's OpenCL driver its register tile) where there is one:
        every tuning run measures it second, and it runs far ahead of the default's
        scalar loops (the zoo LSTM's 32 x 256 x 1024 input projection on a Zen 5: 8 ms
        at the default); else the default (a GPU)."""
        for seed in self.seeds():
            if self.is_valid(seed):
                return seed
        return self.default()

    def describe(self, config: Config) -> dict[str, float]:
        """The cost model's hand-made features of a config (see
        :mod:`autosched.space.contraction_features`)."""
        if self.target == "llvm":
            return describe_cpu(self, config)
        return describe_gpu(self, config)
