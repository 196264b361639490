"""Workloads: an operator with concrete shapes, as a TVM TE compute and a numpy reference."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.records.record import canonical_json

if TYPE_CHECKING:
    from tvm import te


@dataclass(frozen=True)
class TensorSpec:
    """A kernel argument: name, shape and dtype, and whether the kernel writes it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str  # "input", "output" or "scratch" (an intermediate of an unfused stage)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Stages:
    """The TE tensors of a workload, as the schedule space sees them.

    ``main`` is the stage whose loop nest is tiled (the reduction of a matmul or a
    convolution); ``producers`` are injective stages before it that may be inlined
    (padding); ``epilogue`` are elementwise stages after it that may be fused.
    """

    inputs: tuple[te.Tensor, ...]
    outputs: tuple[te.Tensor, ...]
    main: te.Tensor
    producers: tuple[te.Tensor, ...] = ()
    epilogue: tuple[te.Tensor, ...] = ()


class Workload:
    """An operator with concrete shapes. Subclasses define the compute and reference.

    Attributes:
        op: operator name (``"matmul"``).
        params: the shape parameters and options, plain data.
        dtype: element type (``"float32"``).
    """

    op: str = ""

    def __init__(self, params: dict[str, Any], *, dtype: str = "float32") -> None:
        if dtype != "float32":
            raise InvalidInputError(f"dtype {dtype!r} is not supported; accepted: float32")
        self.params = dict(params)
        self.dtype = dtype

    # -- identity --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "params": self.params, "dtype": self.dtype}

    @property
    def key(self) -> str:
        """Stable key: op, shapes, dtype and epilogue; the same text on every machine."""
        digest = hashlib.sha1(canonical_json(self.to_json()).encode()).hexdigest()[:16]
        return f"{self.op}-{digest}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workload) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.op}({shown})"

    # -- what subclasses provide -----------------------------------------------------
    def stages(self) -> Stages:
        """Build the TE compute (a fresh set of tensors each call)."""
        raise NotImplementedError

    def flops(self) -> float:
        """Useful floating point operations of one run (for GFLOP/s)."""
        raise NotImplementedError

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The expected outputs, computed by numpy in float64 then cast."""
        raise NotImplementedError

    def tolerance(self) -> tuple[float, float]:
        """(rtol, atol) for comparing a kernel's output with :meth:`reference`."""
        return 1e-4, 1e-4

    # -- derived ----------------------------------------------------------------------
    def tensor_specs(self, *, with_intermediates: bool = False) -> list[TensorSpec]:
        """Kernel arguments in PrimFunc order: inputs, outputs, then intermediates."""
        st = self.stages()
        specs = [_spec(t, "input") for t in st.inputs] + [_spec(t, "output") for t in st.outputs]
        if with_intermediates and st.epilogue:
            specs.append(_spec(st.main, "scratch"))
        return specs


def _spec(t: te.Tensor, role: str) -> TensorSpec:
    return TensorSpec(t.op.name, tuple(int(d) for d in t.shape), str(t.dtype), role)
