"""The row-wise family: stages that stream over the rows of a ``[rows, cols]`` matrix.

Softmax, layernorm, reductions over the last axis and elementwise chains. Each stage
either reduces a row to one value or maps over rows and columns (see
:class:`~autosched.space.loopnest.RowNest`); rows are independent, so the work is split
by rows, and the choices are how each row's work is parallelised and which stages
share a kernel.

Kernels. Every output, and every stage whose ``fuse.<stage>`` is False, is the root of
its own kernel; an unfused stage writes its result to a global intermediate (a scratch
argument, see :meth:`RowSpace.scratch`) that later kernels read. A fused map stage is
inlined into the stages that read it (recomputed in each). A fused reduction is
computed per row inside the kernel of the stages that read it (through any inlined
maps), so those readers must all be in one kernel, or the config is invalid.

Knobs for ``target="opencl"`` on a nest with reductions:

* ``reduce``: ``"item"``: each work-item owns whole rows and a work-group is ``threads``
  rows; a row's reductions run in the work-item, its values in private memory.
  ``"group"``: one work-group per row; its ``threads`` work-items split the columns and
  each reduction ends in a tree all-reduce through local memory (TVM's cross-thread
  reduction), with barriers.
* ``threads``: work-items per work-group (a power of two within the device's limit;
  item mode: dividing the rows; group mode: ``threads * vec`` dividing the columns).
* ``vec``: explicit vector width along the columns (``float16`` and friends). A
  reduction is split into ``vec`` partial results (``rfactor``), computed with vector
  instructions and reduced at the end; maps are vectorised directly. A stage that reads
  a per-row flag (a mask: :meth:`RowSpace.flagged`) has its ``vec`` lanes unrolled
  into scalar selects instead, as TVM's OpenCL vector select reads the flag wrong.
* ``unroll``: unroll factor of each work-item's loop over its vectors of columns (1, 2,
  4, 8, the small divisors of the columns, and the whole row when it has at most 64
  columns).
* ``fuse.<stage>`` for each stage that is not an output: True fuses it into the kernel
  that reads it (see above), False gives it its own kernel.
* ``keep.<stage>`` for each map stage that two stages read (softmax's ``exp``: the row
  sum and the output), optional (False where a config leaves it out): True computes
  the fused map once per row into the kernel's own memory, private to the work-item
  (item mode, llvm) or the work-group's local memory (group mode), where the stages
  that read it find it, instead of inlining it into each. Its readers must share a
  kernel, and a work-group's kept rows must fit the device's local memory. On the
  Xeon's PoCL a ViT's 2364x197 softmax ran 0.347 ms at the best config without it and
  0.299 ms at the best with it (48-trial tunes, re-timed interleaved); on its llvm
  0.156 / 0.134 ms (there the best without it had ``exp`` in a loop of its own).

In group mode every kernel of the config, map kernels included, is one work-group per
row with the columns split over its work-items.

Knobs for ``target="opencl"`` on an elementwise nest (no reduction): ``threads``
(work-items per group), ``per_item`` (consecutive columns each work-item computes),
``vec`` (dividing ``per_item``, or leaving a vector tail where ``per_item`` is the row)
and the ``fuse.<stage>`` knobs. The rows and the column chunks are flattened into one
range of work-items.

Knobs for ``target="llvm"`` (any nest): ``rows_per_task`` (the rows are split into
parallel tasks of this many rows, each row's stages computed together in the task),
``vec`` (LLVM vector instructions along the columns, reductions split into ``vec``
partial results as on OpenCL), ``unroll`` and the ``fuse.<stage>`` and ``keep.<stage>``
knobs (an unfused stage is its own parallel loop over a global intermediate).

Tiles need not divide: ``rows_per_task``, ``threads`` over the rows (item mode), the
work-items of an elementwise nest, ``per_item`` and ``unroll`` may leave a last tile
cut short by a guard, as in the contraction family, as long as they pad what they split
by at most :data:`~autosched.space.space.MAX_PAD_WASTE`. The guards sit above the
vector lanes, so each vector stays one vector instruction. Where a work-item (item mode)
or a task (llvm) walks a row alone, ``vec`` need not divide the columns either: the
row's last vector is a guarded tail, computed lane by lane, and the walk over the others
is partitioned from it, so that they stay unguarded vector instructions (a ViT softmax's
197 columns: 24 vectors of 8 and 5 columns; a reduction's tail lanes are unrolled, so
that its partial results stay one vector: ``rowwise_schedule._split_tail``). Group mode
splits the columns among work-items and takes widths that divide them; so does an
elementwise nest, except where ``per_item`` is the whole row (always a choice, past
``MAX_PER_ITEM`` too): one work-item walks the row alone and takes a tail as above.
Before, a 2304 x 197 bias add and GELU on a Xeon's PoCL ran scalar (per_item 197, vec
1: 3.6 ms); with a tail, vec 16 (0.63 ms).

The default (:meth:`RowSpace.default`) is what TVM's default schedules do: every stage
fused into one kernel (softmax's ``exp`` inlined into the row sum and the output, the
reductions computed per row), no vectors, no unrolling; OpenCL: one row per work-item
and up to 64 rows per work-group (elementwise: one element per work-item, 64 per group,
TVM's default injective schedule); llvm: one row per parallel task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import ScheduleError
from autosched.space.config import Config
from autosched.space.loopnest import RowNest, analyze_rows
from autosched.space.rowwise_features import describe_rows
from autosched.space.space import (
    MAX_PAD_WASTE,
    UNROLLS,
    VECTOR_WIDTHS,
    Knob,
    Space,
    fits,
    tile_sizes,
)
from autosched.space.space import divisors as _divisors

REDUCE_MODES = ("item", "group")
_PADS = f" and pads them by more than {MAX_PAD_WASTE - 1:.0%}"
MAX_THREADS = 256
MAX_PER_ITEM = 256
MAX_FULL_UNROLL = 64


@dataclass(frozen=True)
class Kernel:
    """One kernel of a config: its root stage and the stages fused into it."""

    root: str
    reductions: tuple[str, ...]  # fused reductions computed per row in it, compute order
    inlined: tuple[str, ...]  # fused map stages recomputed inside its stages
    kept: tuple[str, ...] = ()  # fused map stages computed once per row, kept in its memory

    @property
    def computed(self) -> tuple[str, ...]:
        """The stages it computes as stages of their own: the root, its reductions and
        its kept maps (inlined maps are recomputed inside these)."""
        return (self.root, *self.reductions, *self.kept)


class RowSpace(Space):
    """Schedules of a row-wise nest (see the module docstring for the knobs)."""

    nest: RowNest
    family = "rowwise"

    def _analyze(self) -> RowNest:
        return analyze_rows(self.workload)

    def apply(self, sch, config: Config) -> None:
        from autosched.space.rowwise_schedule import apply_rowwise

        apply_rowwise(sch, self, config)

    @property
    def elementwise(self) -> bool:
        """True when no stage reduces: the map knobs replace the reduction knobs."""
        return not self.nest.reductions

    # -- construction ---------------------------------------------------------------
    def _make_knobs(self) -> list[Knob]:
        nest = self.nest
        # Vector widths: those dividing the columns, and those leaving the row a vector
        # tail (at least one whole vector, padded by at most MAX_PAD_WASTE) where the
        # work-item or task walks the row alone: the last vector is guarded, the others
        # stay whole. A work-group's work-items (group mode) split the columns among
        # them and take dividing widths only; an elementwise kernel's take a tail only
        # where one work-item walks the whole row (``per_item`` = the columns; see
        # ``check``).
        vecs = tuple(
            v for v in VECTOR_WIDTHS if nest.cols % v == 0 or (nest.cols > v and fits(nest.cols, v))
        )
        limit = min(MAX_THREADS, self.limits.max_work_group_size, self.limits.max_work_item_size)
        threads = tuple(2**e for e in range(int(math.log2(max(limit, 1))) + 1))
        # Unroll factors: powers of two, small divisors of the columns, and the whole row
        # when it is short (a 49-column row unrolled 7 or 49 times runs twice as fast on
        # PoCL as the plain loop).
        unrolls = {*UNROLLS, *(d for d in _divisors(nest.cols) if d <= max(UNROLLS))}
        if nest.cols <= MAX_FULL_UNROLL:
            unrolls.add(nest.cols)
        unrolls = tuple(sorted(unrolls))
        knobs = []
        if self.target == "llvm":
            knobs.append(Knob("rows_per_task", tuple(tile_sizes(nest.rows, nest.rows))))
            knobs.append(Knob("vec", vecs))
            knobs.append(Knob("unroll", unrolls))
        elif self.elementwise:
            knobs.append(Knob("threads", threads))
            # A whole row per work-item is always a choice: past MAX_PER_ITEM too, it is
            # where a vector tail keeps the other vectors whole (odd column counts).
            per_item = tuple(sorted({*tile_sizes(nest.cols, MAX_PER_ITEM), nest.cols}))
            knobs.append(Knob("per_item", per_item))
            knobs.append(Knob("vec", vecs))
        else:
            knobs.append(Knob("reduce", REDUCE_MODES))
            knobs.append(Knob("threads", threads))
            knobs.append(Knob("vec", vecs))
            knobs.append(Knob("unroll", unrolls))
        for name in nest.stages:
            knobs.append(Knob(f"fuse.{name}", (True, False)))
        if not self.elementwise:
            # A map that two stages read (softmax's exp: the row sum and the output) may
            # be kept per row in fast memory instead of recomputed in each reader.
            for name in self._keepable():
                knobs.append(Knob(f"keep.{name}", (False, True), optional=True))
        return knobs

    def _keepable(self) -> tuple[str, ...]:
        """The map stages (not outputs) that more than one stage reads."""
        nest = self.nest
        return tuple(
            n for n in nest.stages if nest.block(n).kind == "map" and len(nest.readers(n)) > 1
        )

    # -- kernels --------------------------------------------------------------------
    def fused(self, config: Config, name: str) -> bool:
        return not self.nest.block(name).output and bool(config[f"fuse.{name}"])

    def kept(self, config: Config, name: str) -> bool:
        """Whether the fused map ``name`` is computed once per row into the kernel's own
        memory (``keep.<name>``), not inlined into each stage that reads it."""
        knob = f"keep.{name}"
        return knob in self._by_name and bool(self.value(config, knob)) and self.fused(config, name)

    def inlined(self, config: Config, name: str) -> bool:
        """Whether ``name`` is a fused map inlined (recomputed) into its readers."""
        block = self.nest.block(name)
        return block.kind == "map" and self.fused(config, name) and not self.kept(config, name)

    def kernels(self, config: Config) -> tuple[Kernel, ...]:
        """The kernels of ``config`` in launch order.

        Raises:
            ScheduleError: a fused reduction is read from two kernels (see ``check``).
        """
        kernels, reason = self._plan(config)
        if reason:
            raise ScheduleError(reason)
        return kernels

    def _plan(self, config: Config) -> tuple[tuple[Kernel, ...], str | None]:
        nest = self.nest
        # Where each fused reduction and each kept map is computed: the one kernel of
        # everything that reads it, seen through inlined maps. Later stages first, so a
        # stage read by another fused reduction finds that one's kernel.
        home: dict[str, str] = {}
        for block in reversed(nest.blocks):
            name = block.name
            if not self.fused(config, name):
                home[name] = name
                continue
            if self.inlined(config, name):
                continue
            readers = self._effective_readers(config, name)
            found = {home[r] for r in readers}
            kept = self.kept(config, name)
            knob = f"keep.{name}" if kept else f"fuse.{name}"
            if len(found) != 1:
                return (), (
                    f"{knob}=True but {name} is read from {len(found)} kernels "
                    f"({', '.join(sorted(found))}); fuse them too or give it its own kernel"
                )
            if kept and len(readers) < 2:
                return (), (
                    f"keep.{name}=True changes nothing: one stage ({', '.join(sorted(readers))}) "
                    f"computes {name}; keeping a row pays where two stages of a kernel read it"
                )
            home[name] = found.pop()
        kernels = []
        for block in nest.blocks:
            if self.fused(config, block.name):
                continue
            mine = [b.name for b in nest.blocks if home.get(b.name) == block.name]
            others = [n for n in mine if n != block.name]
            kernels.append(
                Kernel(
                    root=block.name,
                    reductions=tuple(n for n in others if nest.block(n).kind == "reduce"),
                    inlined=self.inlined_into(config, mine),
                    kept=tuple(n for n in others if nest.block(n).kind == "map"),
                )
            )
        return tuple(kernels), None

    def _effective_readers(self, config: Config, name: str) -> set[str]:
        """Stages that read ``name``, with each inlined map replaced by its readers."""
        out: set[str] = set()
        for reader in self.nest.readers(name):
            if self.inlined(config, reader):
                out |= self._effective_readers(config, reader)
            else:
                out.add(reader)
        return out

    def inlined_into(self, config: Config, stages: list[str]) -> tuple[str, ...]:
        """Inlined maps that the computed ``stages`` read, directly or through each other
        (a kept map is computed, not inlined: it stops the walk)."""
        seen: list[str] = []
        todo = list(stages)
        while todo:
            for buf in self.nest.block(todo.pop()).reads:
                if buf in seen or buf not in {b.name for b in self.nest.blocks}:
                    continue
                if self.inlined(config, buf):
                    seen.append(buf)
                    todo.append(buf)
        order = [b.name for b in self.nest.blocks]
        return tuple(sorted(seen, key=order.index))

    # -- queries --------------------------------------------------------------------
    def scratch(self, config: Config) -> tuple[str, ...]:
        """Intermediates ``config`` keeps in global memory between kernels."""
        return tuple(n for n in self.nest.stages if not config[f"fuse.{n}"])

    def flagged(self, config: Config, name: str) -> bool:
        """Whether stage ``name`` reads a row map (a per-row flag), itself or through a
        map inlined into it: on OpenCL its lanes are not vectorised (see
        :mod:`~autosched.space.rowwise_schedule`)."""
        flags = set(self.nest.row_map_inputs)
        stages = (name, *self.inlined_into(config, [name]))
        return any(flags & set(self.nest.block(s).reads) for s in stages)

    def threads(self, config: Config) -> int:
        """Work-items per work-group (OpenCL); 1 on llvm, where a task is one thread."""
        return 1 if self.target == "llvm" else int(config["threads"])

    def groups(self, config: Config) -> int:
        """Work-groups of each kernel (OpenCL) or parallel tasks (llvm)."""
        nest = self.nest
        if self.target == "llvm":
            return -(-nest.rows // config["rows_per_task"])
        if self.elementwise:
            return -(-nest.rows * -(-nest.cols // config["per_item"]) // config["threads"])
        if config["reduce"] == "group":
            return nest.rows
        return -(-nest.rows // config["threads"])

    def check(self, config: Config) -> str | None:
        """Why ``config`` is not valid here, or None if it is."""
        reason = self._check_knobs(config)
        if reason:
            return reason
        nest = self.nest
        for name in self._keepable():
            if self.value(config, f"keep.{name}") and not config[f"fuse.{name}"]:
                return (
                    f"keep.{name}=True needs fuse.{name}=True (unfused, {name} is a kernel's "
                    "output in global memory)"
                )
        vec = config["vec"]
        vectors = -(-nest.cols // vec)  # of a row, the last one cut short by a vector tail
        if self.target == "llvm":
            if not fits(vectors, config["unroll"]):
                return f"unroll={config['unroll']} does not divide the {vectors} vectors of a row{_PADS}"
        elif self.elementwise:
            per_item, threads = config["per_item"], config["threads"]
            if per_item % vec and per_item != nest.cols:
                return (
                    f"vec={vec} does not divide per_item={per_item}; a vector tail needs "
                    f"per_item={nest.cols} (a work-item walking its row alone)"
                )
            items = nest.rows * -(-nest.cols // per_item)
            if not fits(items, threads):
                return f"threads={threads} does not divide the {items} work-items{_PADS}"
        else:
            threads, unroll = config["threads"], config["unroll"]
            if config["reduce"] == "item":
                if not fits(nest.rows, threads):
                    return f"threads={threads} does not divide rows={nest.rows}{_PADS}"
                span = vectors
                # Kept rows are private to each work-item; a work-group's must fit the
                # fast memory the device gives a work-group (a GPU's would spill).
                kept = threads * self._kept_row_bytes(config)
                if kept > self.limits.local_mem_bytes:
                    return (
                        f"{kept} bytes of kept rows ({threads} work-items) exceed the "
                        f"device's {self.limits.local_mem_bytes} of local memory"
                    )
            else:
                if threads == 1:
                    return "reduce=group needs threads > 1 (one work-item is reduce=item)"
                if nest.cols % (threads * vec):
                    return f"threads={threads} x vec={vec} does not divide cols={nest.cols}"
                span = nest.cols // (threads * vec)
                local = threads * len(nest.reductions) * np.dtype(self.workload.dtype).itemsize
                local += self._kept_row_bytes(config)  # a kept row is the group's
                if local > self.limits.local_mem_bytes:
                    return f"{local} bytes of local memory exceed the device's {self.limits.local_mem_bytes}"
            if not fits(span, unroll):
                return f"unroll={unroll} does not divide the {span} vectors of a work-item's columns{_PADS}"
        _, reason = self._plan(config)
        return reason

    def _kept_row_bytes(self, config: Config) -> int:
        """Bytes of one row of every kept map of ``config``."""
        kept = sum(self.kept(config, n) for n in self._keepable())
        return kept * self.nest.cols * np.dtype(self.workload.dtype).itemsize

    def default(self) -> Config:
        """The untuned schedule: every stage fused into the output's kernel, no vectors.

        OpenCL: one row per work-item, up to 64 rows per work-group (an elementwise nest:
        one element per work-item, up to 64 per group: TVM's default injective schedule).
        llvm: the rows spread over the cores one row per task, scalar code.
        """
        nest = self.nest
        values: dict[str, Any] = {f"fuse.{n}": True for n in nest.stages}
        values["vec"] = 1
        if self.target == "llvm":
            values.update(rows_per_task=1, unroll=1)
            return Config(values)
        limit = min(64, self.limits.max_work_group_size, self.limits.max_work_item_size)
        work = nest.rows * nest.cols if self.elementwise else nest.rows
        threads = max(t for t in self.knob("threads").choices if t <= limit and work % t == 0)
        values["threads"] = threads
        if self.elementwise:
            values["per_item"] = 1
        else:
            values.update(reduce="item", unroll=1)
        return Config(values)

    def describe(self, config: Config) -> dict[str, float]:
        """The cost model's hand-made features of a config (see
        :mod:`autosched.space.rowwise_features`)."""
        return describe_rows(self, config)
