"""The schedule space of a workload on a target and device: the shared machinery.

A space is a set of knobs, each with a finite tuple of choices, and a validity check
that couples them (device limits, divisibility). Which knobs exist is decided by the
structure of the workload's loop nest, never by the operator's name; each structure
has its family, a subclass of :class:`Space`:

* :class:`~autosched.space.contraction.ContractionSpace`: one reduction whose inputs
  are reused across outputs (matmul, batch matmul, dense, convolutions): multi-level
  tiles, register accumulators, vectors, staging, fused producers and epilogues.
* :class:`~autosched.space.rowwise.RowSpace`: stages that stream over the rows of a
  matrix, with per-row reductions and elementwise maps and no reuse across rows
  (softmax, layernorm, reductions, elementwise chains): row/column parallelism, how
  each reduction is parallelised, and which stages share a kernel.

:func:`autosched.space.select.make_space` picks the family that fits a workload. Sampling,
mutation and crossover work on any family through the knobs and ``check``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.iree import IREE_TARGETS
from autosched.ops.base import Workload
from autosched.space.config import Config

# TVM's code generation: the targets autosched.compile builds kernels for and jobs tune.
TARGETS = ("opencl", "llvm")
# Every target a space, a device and ``autosched tune`` take: TVM's and IREE's backends.
ALL_TARGETS = (*TARGETS, *IREE_TARGETS)
VECTOR_WIDTHS = (1, 2, 4, 8, 16)
UNROLLS = (1, 2, 4, 8)


@dataclass(frozen=True)
class DeviceLimits:
    """What the device allows; configs outside it are pruned before any build."""

    max_work_group_size: int = 1024
    max_work_item_size: int = 1024  # first dimension: we launch 1-D work-groups
    local_mem_bytes: int = 48 * 1024
    is_cpu: bool = False
    cores: int = 1  # parallel workers the device runs at once (llvm: host CPU cores)
    # What the cost model's prior knows of the device before any measurement (see
    # autosched.space.device): compute units, fp32 lanes of one native vector, and how
    # many vector registers one thread has. Defaults: a generic 128-bit SIMD core.
    compute_units: int = 1
    vector_lanes: int = 4
    vector_registers: int = 16
    # Local memory that is ordinary memory under another name (OpenCL CPU drivers):
    # staging through it copies without bringing data closer.
    local_mem_emulated: bool = False
    vector_bits: int = 0  # widest SIMD register of a CPU (0: not known)
    subgroup_size: int = 0  # invocations of a GPU subgroup (0: not known)
    # The register file one work-group may use, where the driver says (NVIDIA's
    # cl_nv_device_attribute_query); 0: not known, and the device's own per-kernel
    # work-group limit is checked after the build instead (measure.runner).
    registers_per_group: int = 0
    # iree-vulkan: IREE's SPIR-V target (``--iree-vulkan-target``) the device's code is
    # built for; "" elsewhere, or where unknown (builds then take the default device's).
    spirv_target: str = ""
    # iree-llvm-cpu: LLVM's name of the CPU the device's code is built for ('': the CPU
    # of the machine that builds it, ``--iree-llvmcpu-target-cpu=host``).
    llvm_cpu: str = ""
    # llvm: bytes of the data caches one core has, L1 first (from the fingerprint's
    # ``cache_bytes``); () where not known.
    cache_bytes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Knob:
    """A decision of the schedule and the values it may take.

    An ``optional`` knob is one a space may gain after configs of it were recorded: a
    config that leaves it out means its first choice, and a config at its first choice
    leaves it out (:meth:`Space.make`), so the configs and record keys from before it
    stay valid and unchanged.
    """

    name: str
    choices: tuple[Any, ...]
    optional: bool = False


# A tile need not divide its axis: the last tile is cut short by a guard (TVM's split
# with a non-dividing factor predicates the body). What the guard skips is still walked,
# so a tile is offered only while it pads the axis by at most this factor.
MAX_PAD_WASTE = 1.25


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def padded(extent: int, tile: int) -> int:
    """``extent`` rounded up to a whole number of ``tile``s."""
    return -(-extent // tile) * tile


def fits(extent: int, tile: int) -> bool:
    """Whether tiles of ``tile`` cover ``extent`` within :data:`MAX_PAD_WASTE`."""
    return padded(extent, tile) <= MAX_PAD_WASTE * extent


def row_width(extent: int, vec: int) -> int:
    """The widest power of two up to ``vec`` that divides ``extent``: the vectors that
    read or write rows of ``extent`` whole without crossing a row (a padded row's real
    part, written a vector at a time with a guard per vector, not per lane)."""
    w = 1
    while 2 * w <= vec and extent % (2 * w) == 0:
        w *= 2
    return w


def widened_vector_widths(extent: int) -> list[int]:
    """Vector widths besides :data:`VECTOR_WIDTHS` for TVM's llvm target: the divisors of
    ``extent`` below the widest that are not powers of two and fill at least three
    quarters of the power of two LLVM widens them to (a 14-lane vector is one 16-lane
    register with two lanes idle).

    An axis of 56 (ResNet's first stage) otherwise stops at 8 lanes: half an AVX-512
    register, where LLVM's 14-lane vectors ran MetaSchedule's fastest ResNet conv on a
    Zen 5. OpenCL C has no such vector types.
    """
    widest = max(VECTOR_WIDTHS)
    return [
        v
        for v in range(3, widest)
        if extent % v == 0 and v & (v - 1) and 4 * v >= 3 * (1 << v.bit_length())
    ]


def tile_sizes(extent: int, cap: int) -> list[int]:
    """Tile sizes of an axis of ``extent``, up to ``cap``: its divisors, and the powers of
    two whose guarded tail pads it by at most :data:`MAX_PAD_WASTE`.

    On a power-of-two extent these are its divisors, as before tails existed; on a prime
    one they add the wide tiles its divisors lack.
    """
    sizes = {d for d in divisors(extent) if d <= cap}
    p = 2
    while p <= cap:
        if fits(extent, p):
            sizes.add(p)
        p *= 2
    return sorted(sizes)


class Space:
    """All schedules of one workload for one target and device: the base of the families.

    :func:`autosched.space.select.make_space` builds the family that fits a workload's
    loop nest (see the module docstring).

    Args:
        workload: the operator instance.
        target: code generation target; one of :data:`ALL_TARGETS`.
        limits: the device's limits.
    """

    nest: Any
    family: str = ""
    # Work-groups of more work-items than this are not proposed (0: no cap). Learned from
    # the device, not its limits: where its driver keeps refusing compiled kernels'
    # larger groups (:func:`autosched.tuning.pair.learn_group_cap`).
    group_cap: int = 0
    # Whether default() is the compiler's own heuristic choice, a guess at a fast config
    # that a tuning run measures first (IREE's), rather than the plainest schedule,
    # measured last in the first batch as the report's baseline (TVM's: 27-335x slower
    # than the best of the llvm contraction replay samples; see
    # :func:`autosched.tuning.pair.propose`).
    heuristic_default: bool = False

    def __init__(self, workload: Workload, *, target: str = "opencl", limits: DeviceLimits) -> None:
        if target not in ALL_TARGETS:
            raise InvalidInputError(
                f"target {target!r} is not supported; accepted: {', '.join(ALL_TARGETS)}"
            )
        self.workload = workload
        self.target = target
        self.limits = limits
        self.nest = self._analyze()
        self._set_knobs()

    def _set_knobs(self) -> None:
        self.knobs: tuple[Knob, ...] = tuple(self._make_knobs())
        self._by_name = {k.name: k for k in self.knobs}
        # What every check and every made config reads: the knobs a config must write,
        # and the first choice of each optional one (meant where a config leaves it out).
        self._required = frozenset(k.name for k in self.knobs if not k.optional)
        self._defaults = {k.name: k.choices[0] for k in self.knobs if k.optional}

    # -- what a family provides -------------------------------------------------------
    def _analyze(self) -> Any:
        raise NotImplementedError

    def _make_knobs(self) -> list[Knob]:
        raise NotImplementedError

    def check(self, config: Config) -> str | None:
        """Why ``config`` is not valid here, or None if it is."""
        raise NotImplementedError

    def default(self) -> Config:
        """The plainest schedule (or the compiler's own choice, where
        :attr:`heuristic_default`): the baseline of a tuning run's speedups."""
        raise NotImplementedError

    def untuned(self) -> Config:
        """The config a build takes where no record of the workload is at hand: the
        default, unless a family knows better from the device alone."""
        return self.default()

    def describe(self, config: Config) -> dict[str, float]:
        """Derived quantities of a config: the cost model's hand-made features."""
        raise NotImplementedError

    def scratch(self, config: Config) -> tuple[str, ...]:
        """Intermediates ``config`` keeps in global memory between kernels."""
        raise NotImplementedError

    def apply(self, sch, config: Config) -> None:
        """Apply ``config`` to the ``tvm.s_tir.Schedule`` of a function with ``nest``'s blocks."""
        raise NotImplementedError

    # -- queries --------------------------------------------------------------------
    def is_twin(self, other: Space) -> bool:
        """Whether ``other`` is of this family with exactly these knobs and choices: the
        same loop nest under another epilogue (a convolution with and without a residual
        add), whose configs are each other's and tend to rank alike."""
        return type(other) is type(self) and other.knobs == self.knobs

    def register_tile(self, config: Config) -> tuple | None:
        """The register tile of ``config`` (the outputs one work-item or task keeps in
        registers, per axis: its micro-kernel), in families that have one; else None."""
        return None

    def knob(self, name: str) -> Knob:
        return self._by_name[name]

    def value(self, config: Config, name: str) -> Any:
        """``config``'s value of knob ``name``: an optional knob it leaves out is at its
        first choice."""
        if name in config or name not in self._defaults:
            return config[name]
        return self._defaults[name]

    def make(self, values: Mapping[str, Any]) -> Config:
        """The config of ``values`` in its one written form: optional knobs at their first
        choice left out."""
        defaults = self._defaults
        return Config({n: v for n, v in values.items() if n not in defaults or v != defaults[n]})

    @property
    def size(self) -> int:
        """Upper bound on the number of configs (before joint constraints)."""
        return math.prod(len(k.choices) for k in self.knobs)

    def _check_knobs(self, config: Config) -> str | None:
        """The part of ``check`` every family shares: the right knobs, known choices, and
        optional knobs at their first choice left out (one written form per schedule)."""
        names = set(config)
        if not self._required <= names or not names <= self._by_name.keys():
            return f"knobs {sorted(config)} do not match the space's {sorted(self._by_name)}"
        for name, value in config.items():
            if value not in self._by_name[name].choices:
                return f"{name}={value!r} is not one of the space's choices"
            if name in self._defaults and value == self._defaults[name]:
                return f"{name}={value!r} is its default, written by leaving {name} out"
        return None

    def is_valid(self, config: Config) -> bool:
        """Whether the search may propose ``config``: valid here, and its work-group
        within what the device has been seen to run (:attr:`group_cap`)."""
        if self.check(config) is not None:
            return False
        return not self.group_cap or self.threads(config) <= self.group_cap

    def seeds(self) -> list[Config]:
        """Configs worth measuring first: the compiler's own choice written out as knobs
        where the default leaves it to the compiler (none here)."""
        return []

    def threads(self, config: Config) -> int:
        """Work-items per work-group (1 where the target has no work-groups)."""
        return 1

    # -- generation -----------------------------------------------------------------
    def sample(self, rng: np.random.Generator, n: int = 1, *, max_tries: int = 100) -> list[Config]:
        """Up to ``n`` distinct valid configs drawn uniformly per knob (rejection sampling)."""
        out: dict[str, Config] = {}
        tries = 0
        while len(out) < n and tries < max_tries * n:
            tries += 1
            c = self.make({k.name: k.choices[rng.integers(len(k.choices))] for k in self.knobs})
            if self.is_valid(c):
                out.setdefault(c.key, c)
        return list(out.values())

    def mutate(
        self, config: Config, rng: np.random.Generator, *, max_tries: int = 50
    ) -> Config | None:
        """A valid config that differs from ``config`` in one knob (and in the knobs that
        change requires, where the family says: :meth:`changed`), or None."""
        for _ in range(max_tries):
            knob = self.knobs[rng.integers(len(self.knobs))]
            if len(knob.choices) < 2:
                continue
            value = knob.choices[rng.integers(len(knob.choices))]
            if value == self.value(config, knob.name):
                continue
            c = self.changed(config, knob.name, value)
            if self.is_valid(c):
                return c
        return None

    def changed(self, config: Config, name: str, value: Any) -> Config:
        """``config`` with knob ``name`` set to ``value``; a family whose knobs are coupled
        also moves the ones that value requires, so a mutation can cross to it."""
        return self.make({**config, name: value})

    def crossover(
        self, a: Config, b: Config, rng: np.random.Generator, *, max_tries: int = 20
    ) -> Config | None:
        """A valid config taking each knob from ``a`` or ``b`` at random, or None."""
        for _ in range(max_tries):
            c = self.make(
                {k.name: self.value(a if rng.random() < 0.5 else b, k.name) for k in self.knobs}
            )
            if self.is_valid(c):
                return c
        return None
