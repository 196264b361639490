"""The contraction spaces' CPU seeds: the blocking an analytical model of the CPU picks
(llvm), and its register tile for one work-item per group (OpenCL on a CPU driver).

BLIS's analytical model (Low, Igual, Smith and Quintana-Orti, "Analytical Modeling Is
Enough for High-Performance BLIS", ACM TOMS 43(2), 2016) derives a GEMM's blocking from
the CPU alone, with no search:

* a register tile of ``mr`` rows of ``nr`` lanes whose accumulators fill the vector
  registers, leaving room for one row of operand vectors and a broadcast;
* the operand that runs along the lanes packed into a contiguous panel ``nr`` wide,
  which stays in L1 while the rows of the other operand stream past it;
* where the panel over the whole reduction overflows L1, the reduction cut into chunks
  ``kc`` long that fit;
* each task a block of ``mc`` rows that packs its panel once for all of them: as many
  as leave every core four tasks. (BLIS sizes ``mc`` to keep a block of the other
  operand in L2, for the next panel; here a task has one panel, and on the Zen 3 the
  512^3 matmul ran 175 GFLOP/s in blocks of all 512 rows, 151 in L2's 256.)

Written as the space's knobs from the device's fingerprint (vector lanes and registers,
cache sizes, cores), it is the space's seed (:meth:`ContractionSpace.seeds`): measured
right after the default, so that the search refines it instead of having to find the
combination. The searches on an AVX2 Zen 3 did not find it: on its 127x1000x333 matmul
they ended near 84 GFLOP/s where this blocking ran 169 (numpy 160); every one of its
parts alone left most of that on the table (the panel unpacked: 140; 4 panels per
task: 49). A dense layer's weights ([n, k]) are packed with the lanes innermost; its seed
ran 64x1000x512 at 137 GFLOP/s and 128x768x768 at 162 (numpy 115-131 and 123-162).
An NCHW convolution's lanes run along the image's columns, its register tile's rows
along the output channels, and its second column of vectors along the image's rows,
in vectors that fill whole registers: on the Zen 3 ResNet's 3x3 convs at 56, 28, 14 and
7 pixels ran 181, 123, 125 and 95 GFLOP/s so (numpy 74-136), where the earlier seeds
(one image row, in 14-lane vectors, two AVX2 registers with one of them 6 lanes, but
7 lanes at 7 pixels) had run 62, 64, 61 and 81. An NHWC convolution's lanes run along
the output channels and its rows along the image's columns; a task that holds a whole
row takes rows of the image too, and the padding runs as a loop of its own: ResNet's
7x7x512 and 56x56x64 convs ran 87 and 182 GFLOP/s so on the Zen 3, 36 and 113 one image
row per task with the padding fused (numpy 79 and 136); at 14x14x256 rows of the tile that
pad the image's 14 columns to 16 give way to 14 rows of one register (57 -> 141 GFLOP/s,
numpy 114-122). A strided conv's image, read
along the lanes at a stride, is packed like any other: ResNet's stride-2 convs (3x3 at
56 and 28 pixels, 1x1 at 56, the 7x7 stem) ran 72, 71, 68 and 75 GFLOP/s so (numpy
71-128), where 48-trial searches without a seed had ended at 21, 62 and 54.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from autosched.space.config import Config
from autosched.space.space import UNROLLS, padded

if TYPE_CHECKING:
    from autosched.space.contraction import ContractionSpace

MAX_UNROLL = 4  # reduction iterations the seed unrolls (the prior's "a little unrolling")
PAD = 1 / 16  # the most a seed's register tiles or blocks pad an axis, as a fraction of it


def cpu_seed(space: ContractionSpace) -> Config | None:
    """The analytical model's config of ``space`` (llvm, with a reduction), or None
    where the nest has no operand along the lanes and another along the rows, or the
    model's config is not valid in the space."""
    if space.target != "llvm":
        return None
    found = _operands(space, strided=True)
    if found is None:
        return None
    inner, lane_ops, row, col = found
    lanes = max(1, space.limits.vector_lanes)
    vecs = [v for v in space.knob("vec").choices if v <= 2 * lanes]
    # Vectors that fill whole registers first, widest first: an AVX2 CPU ran the 14-lane
    # vectors of ResNet's 56- and 28-wide convs (two registers, one of 6 lanes) at 63-64
    # GFLOP/s, where the same tiles in 8 or 7 lanes ran 126-180.
    first = None
    for vec in sorted(vecs, key=lambda v: (not _whole_registers(v, lanes), -v)):
        for columns in _column_options(space, inner, col, vec):
            config = _blocking(space, row, lane_ops, vec, columns)
            if config is None:
                continue
            if first is None:
                first = config
            # Rows that pad their axis by more than a sixteenth give way to a tile of as
            # many accumulators that does not: ResNet's 14x14x256 NHWC conv ran 57 GFLOP/s
            # on the Zen 3 in 4 rows of 16 lanes (14 rows padded to 16) and 136 in 14
            # rows of 8 (numpy 128-157).
            unpadded = _row_waste(row, config) <= PAD
            if unpadded and _accumulators(space, config) >= _accumulators(space, first):
                return config
    return first


def _row_waste(row, config: Config) -> float:
    """How much the register tile's rows pad their axis, as a fraction of it."""
    mr = config[f"tile.{row.name}"][1]
    return padded(row.extent, mr) / row.extent - 1


def _accumulators(space: ContractionSpace, config: Config) -> int:
    """The vector registers the register tile's accumulators take."""
    vec = config["vec"]
    elems = math.prod(config[f"tile.{a.name}"][1] for a in space.nest.spatial)
    return elems // vec * space.vector_registers(vec)


def opencl_cpu_seed(space: ContractionSpace) -> Config | None:
    """The same register tile for OpenCL on a CPU driver (PoCL): one work-item per
    group computes ``mr`` rows by the columns of whole vectors, reading its inputs in
    place, with a produced input (a conv's padding) computed by a kernel of its own.

    Where the search had not found it, on an AVX2 Zen 3's PoCL: the 127x1000x333
    matmul's 8 rows by one 8-lane vector ran 120-125 GFLOP/s (numpy 124-158) where its
    48-trial searches ended at 76-104; ResNet's 56x56x64 conv, 4 channels by 2 rows by
    8 lanes, 97 (numpy 78-104), the best of the 360 configs sampled there (105) took the
    search 32 trials. Unlike llvm's, the columns avoid a vector tail first: OpenCL pads
    one with kernels of their own (a padded copy of the input; until 2026-12-04 also the
    outputs copied out), and 4 rows of 16 lanes ran that 127x1000x333 at 75. The
    padding's producer runs apart because inlined into the reads every read is guarded:
    60 fused, 97 apart.
    """
    if space.target != "opencl" or not space.limits.is_cpu:
        return None
    found = _operands(space)
    if found is None:
        return None
    inner, _, row, col = found
    lanes = max(1, space.limits.vector_lanes)
    best, key = None, None
    for vec in space.knob("vec").choices:
        if vec > 2 * lanes or not _whole_registers(vec, lanes):
            continue
        columns = _columns(space, inner, col, vec, tail_first=True)
        if columns is None:
            continue
        regs = _column_registers(space, columns, vec)
        k = (-min(vec, lanes), _column_waste(space, columns), -regs, -vec)
        if key is None or k < key:
            best, key = (vec, columns, regs), k
    if best is None:
        return None
    vec, columns, per_row = best
    default = space.default()
    values = {k.name: space.value(default, k.name) for k in space.knobs}
    values.update({f"tile.{a.name}": (1, 1) for a in space.nest.spatial})
    values.update({f"tile.{name}": (1, r) for name, r in columns.items()})
    values["vec"] = vec
    values.update({f"fuse.{name}": False for name in space.nest.produced})
    # The most rows the registers hold, fewer where the space caps the accumulators.
    mr_max = _rows(space, row, per_row)
    for mr in sorted({r for _, r in _choices(space, row.name) if r <= mr_max}, reverse=True):
        config = space.make({**values, f"tile.{row.name}": (1, mr)})
        if space.check(config) is None:
            return config
    return None


def packed_twin(space: ContractionSpace, config: Config) -> list[Config]:
    """``config`` with every input that can be packed into panels (OpenCL's
    ``stage=pack``) packed, where that is valid; [] where no input can be."""
    values = {k.name: space.value(config, k.name) for k in space.knobs}
    for acc in space.nest.inputs:
        if "pack" in space.knob(f"stage.{acc.buffer}").choices:
            values[f"stage.{acc.buffer}"] = "pack"
    twin = space.make(values)
    return [twin] if twin != config and space.check(twin) is None else []


def _operands(space: ContractionSpace, strided: bool = False):
    """``(inner, lane_ops, row, col)`` of a nest with a reduction: the innermost spatial
    axis (the lanes), the inputs read along it, the longest axis they do not index (the
    register tile's rows) and the longest one only they index (its second column), or
    None where there is no such row. ``strided`` (llvm, which packs them) takes inputs
    read along the lanes at a stride too (a strided conv's image)."""
    nest = space.nest
    if not nest.reduction:
        return None
    inner = nest.spatial[-1]

    def along(terms) -> bool:
        return (inner.name, 1) in terms or (strided and any(n == inner.name for n, _ in terms))

    # Operands along the lanes: read at them innermost, or at a plain axis that the
    # packed copy moves innermost (a dense layer's weights, laid out [n, k]).
    lane_ops = [
        a for a in nest.inputs if a.dims and (along(a.dims[-1]) or ((inner.name, 1),) in a.dims)
    ]
    lane_axes = _axes(lane_ops)
    rows = [a for a in nest.spatial[:-1] if a.name not in lane_axes]
    if not lane_ops or not rows:
        return None
    # Of equal extents the inner one (an NHWC conv's columns q, not its rows p): on the
    # Zen 3's PoCL the 56x56x64 conv ran 175 GFLOP/s in 4 of q by 16 channels, 146 in p.
    row = max(rows, key=lambda a: (a.extent, nest.spatial.index(a)))
    # An axis the lane operands index and the broadcast ones do not (an NCHW conv's
    # output rows): tiling it adds vectors to the register tile, as a wider ``nr`` would.
    other_axes = _axes(acc for acc in nest.inputs if acc not in lane_ops)
    cols = [
        a
        for a in nest.spatial[:-1]
        if a.name in lane_axes and a.name not in other_axes and a.extent > 1
    ]
    return inner, lane_ops, row, max(cols, key=lambda a: a.extent, default=None)


def _axes(accesses) -> set[str]:
    """The loop axes that index any of ``accesses``."""
    return set().union(*(acc.axes for acc in accesses))


def _rows(space: ContractionSpace, row, per_row: int) -> int:
    """The register tile's rows: as many as leave room in the vector registers for one
    row of operand vectors and a broadcast (0 where not even one row fits)."""
    mr_max = max(1, (space.limits.vector_registers - per_row - 1) // per_row)
    return max((r for _, r in _choices(space, row.name) if r <= mr_max), default=0)


def _choices(space: ContractionSpace, axis: str) -> list[tuple[int, int]]:
    return list(space.knob(f"tile.{axis}").choices)


def _whole_registers(vec: int, lanes: int) -> bool:
    """A vector of ``vec`` lanes fills whole registers, or sits in one register."""
    return vec <= lanes or vec % lanes == 0


def _columns(space: ContractionSpace, inner, col, vec: int, tail_first=False) -> dict | None:
    options = _column_options(space, inner, col, vec, tail_first)
    return options[0] if options else None


def _column_options(space: ContractionSpace, inner, col, vec: int, tail_first=False) -> list:
    """The register tile's columns: ``nr`` lanes along the inner axis (a multiple of
    ``vec``) times ``b`` along ``col``, together two registers of vectors where the axes
    allow (BLIS's 6x16 on AVX2), then the least padding, then the most along ``col``.

    ``tail_first`` puts the least padding first (OpenCL, where a vector tail costs
    kernels of its own). Ties go to ``col``: on an AVX2 Zen 3 ResNet's 28x28x128 conv
    ran 126 GFLOP/s in one 7-lane vector by 2 rows of the image and 112 in two 7-lane
    vectors along one row.
    """
    nrs = [r for m, r in _choices(space, inner.name) if m == 1 and r % vec == 0]
    bs = [r for m, r in _choices(space, col.name) if m == 1] if col is not None else [1]
    options = []
    for nr in nrs:
        for b in bs:
            columns = {inner.name: nr} | ({col.name: b} if col is not None else {})
            regs = _column_registers(space, columns, vec)
            if regs > 2:
                continue
            waste = _column_waste(space, columns)
            k = (waste, -regs, -b) if tail_first else (-regs, waste, -b)
            options.append((k, columns))
    return [columns for _, columns in sorted(options, key=lambda o: o[0])]


def _column_registers(space: ContractionSpace, columns: dict, vec: int) -> int:
    """The vector registers one row of the register tile takes: its ``vec``-lane vectors
    along the inner axis and ``col``."""
    return math.prod(columns.values()) // vec * space.vector_registers(vec)


def _column_waste(space: ContractionSpace, columns: dict) -> float:
    """How many times over the columns' tiles pad their axes (1.0: not at all)."""
    extent = {a.name: a.extent for a in space.nest.spatial}
    return math.prod(padded(extent[n], r) / extent[n] for n, r in columns.items())


def _blocking(space: ContractionSpace, row, lane_ops, vec: int, columns: dict) -> Config | None:
    nest = space.nest
    lim = space.limits
    per_row = _column_registers(space, columns, vec)
    mr = _rows(space, row, per_row)
    row_pairs = _choices(space, row.name)
    if not mr:
        return None
    default = space.default()
    values = {k.name: space.value(default, k.name) for k in space.knobs}
    values.update({f"tile.{a.name}": (1, 1) for a in nest.spatial})
    for name, r in columns.items():
        values[f"tile.{name}"] = (1, r)
    values["vec"] = vec
    values["tile_inner"] = row.name
    for acc in nest.inputs:
        values[f"stage.{acc.buffer}"] = "pack" if acc in lane_ops else "global"
    # A produced input (a conv's padding) is computed into its packed copy, or else by a
    # loop of its own: inlined into the reads of an input read in place, every read is
    # guarded.
    for name in nest.produced:
        values[f"fuse.{name}"] = values.get(f"stage.{name}") == "pack"
    chunk = _reduction_chunks(space, lane_ops, columns)
    values["reduce_at"] = "tile" if all(c == a.extent for a, c in chunk.items()) else "block"
    last = nest.reduction[-1]
    for ax, c in chunk.items():
        u = max(u for u in UNROLLS if u <= MAX_UNROLL and c % u == 0) if ax is last else 1
        values[f"tile.{ax.name}"] = (c, u)
    # Rows per task: as many register tiles as leave at least four tasks per core (each
    # task packs its panel once for all of them), in blocks that add at most a sixteenth
    # to the rows the register tiles walk.
    want = 4 * max(1, lim.cores)
    least = padded(row.extent, mr) * (1 + PAD)
    best = None
    for m in sorted({m for m, r in row_pairs if r == mr and padded(row.extent, m * r) <= least}):
        trial = {**values, f"tile.{row.name}": (m, mr)}
        if best is not None and space.groups(Config(trial)) < want:
            break
        best = trial
    # A task that holds the whole row axis takes the other rows too, while the tasks last
    # (an NHWC conv's image rows p once its columns q are done), so that each packs its
    # panel once for all of them.
    lane_axes = _axes(lane_ops)
    if best[f"tile.{row.name}"][0] * mr >= row.extent:
        others = [a for a in nest.spatial[:-1] if a is not row and a.name not in lane_axes]
        for ax in sorted(others, key=lambda a: -a.extent):
            mids = {m for m, r in _choices(space, ax.name) if r == 1}
            for m in sorted(m for m in mids if padded(ax.extent, m) <= ax.extent * (1 + PAD)):
                trial = {**best, f"tile.{ax.name}": (m, 1)}
                if space.groups(Config(trial)) < want:
                    break
                best = trial
    config = space.make(best)
    return config if space.check(config) is None else None


def _reduction_chunks(space: ContractionSpace, lane_ops, columns: dict) -> dict:
    """Each reduction axis' chunk: the whole reduction where the packed panel (the
    register tile's columns over it) fits L1, else chunks of the longest axes first
    that fit (BLIS's kc).

    On the Zen 3 the whole 512-long reduction of a 16-lane panel (32 KiB, all of L1)
    ran 175 GFLOP/s where chunks of 256 in block order ran 143: L1 is the bound, the
    streaming operand's share of it is not counted.
    """
    nest = space.nest
    itemsize = np.dtype(space.workload.dtype).itemsize
    l1 = space.limits.cache_bytes[0] if space.limits.cache_bytes else 0
    chunk = {a: a.extent for a in nest.reduction}

    def panel(tile: dict) -> int:
        dims = {a.name: c for a, c in tile.items()} | columns
        return sum(acc.footprint(dims) for acc in lane_ops) * itemsize

    if not l1 or panel(chunk) <= l1:
        return chunk
    for ax in sorted(nest.reduction, key=lambda a: -a.extent):
        sizes = [c for c, u in _choices(space, ax.name) if u == 1 and ax.extent % c == 0]
        chunk[ax] = max((c for c in sizes if panel({**chunk, ax: c}) <= l1), default=1)
        if panel(chunk) <= l1:
            break
    return chunk
