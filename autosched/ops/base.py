"""Workloads: an operator with concrete shapes, as a TVM TE compute and a numpy reference."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
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
    """The TE tensors of a workload.

    ``intermediates`` are the computed tensors that are not outputs, in compute order
    (a convolution's padded input, a matmul's result before its epilogue, a softmax's
    row maxima). The schedule decides whether each lives in registers or local memory
    inside one kernel, or in global memory between two kernels (then it is a scratch
    argument of the program). ``main``, when given, names the stage a contraction space
    tiles, and is checked against what the loop-nest analysis finds.
    """

    inputs: tuple[te.Tensor, ...]
    outputs: tuple[te.Tensor, ...]
    intermediates: tuple[te.Tensor, ...] = ()
    main: te.Tensor | None = None


class Workload:
    """An operator with concrete shapes. Subclasses define the compute and reference.

    Attributes:
        op: operator name (``"matmul"``).
        params: the shape parameters and options, plain data.
        dtype: element type (``"float32"``).
    """

    op: str = ""
    # What the CLI and ``autosched ops`` show; plain data, the same names the constructor takes.
    summary: str = ""  # one line
    shape_params: tuple[str, ...] = ()  # every parameter, in the order people write them
    positional: tuple[str, ...] = ()  # accepted as a bare ``--shape 1,2,3`` (empty: named only)
    defaults: dict[str, Any] = {}  # parameters that may be left out
    choices: dict[str, tuple[str, ...]] = {}  # string parameters and their accepted values
    chains: tuple[str, ...] = ()  # string parameters that are a ``+``-joined chain of choices
    example: str = ""  # a ``--shape`` text
    # Whether its arguments after the first come from memory when it runs for real (a
    # model's weights), so a timing flushes them from the CPU caches first (llvm).
    cold_operands: bool = False

    def flush_operands(self, limits: Any) -> bool:
        """Whether a timing on a device of ``limits`` flushes the arguments after the
        first from the CPU caches (:attr:`cold_operands`; a fused function of a model
        may say otherwise for its device)."""
        return self.cold_operands

    def __init__(self, params: dict[str, Any], *, dtype: str = "float32") -> None:
        if dtype != "float32":
            raise InvalidInputError(f"dtype {dtype!r} is not supported; accepted: float32")
        self.params = dict(params)
        self.dtype = dtype

    @classmethod
    def describe_params(cls) -> str:
        """The accepted parameters in one line, e.g. ``r, s, pad=0, layout=NCHW (NCHW|NHWC)``."""
        shown = []
        for name in cls.shape_params:
            text = name if name not in cls.defaults else f"{name}={cls.defaults[name]}"
            if name in cls.choices:
                values = "|".join(cls.choices[name])
                text += f" ({values} joined by +)" if name in cls.chains else f" ({values})"
            shown.append(text)
        return ", ".join(shown)

    @classmethod
    def params_text(cls, params: dict[str, Any]) -> str | None:
        """A short text for a record's stored ``params`` where ``name=value`` pairs would
        not read (a fused function's script), else None."""
        return None

    def __getattr__(self, name: str) -> Any:
        """Parameters read as attributes: ``workload("matmul", ...).K``."""
        params = self.__dict__.get("params")
        if params is not None and name in params:
            return params[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

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
    def test_data(
        self, rng: np.random.Generator
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Inputs and their expected outputs, to check a kernel against: the inputs of
        :meth:`make_inputs`, or, where the outputs are not all finite with those, the same
        draw with its floats moved to [0.5, 1.5). A model's function may take the square
        root of an input that is a variance in the model (an ONNX layer norm's ``Sqrt``
        after ``ReduceMean``): on inputs in [-1, 1) half its reference was NaN, and every
        config read as a wrong result, NaN against NaN."""
        inputs = self.make_inputs(rng)
        expected = self.reference(inputs)
        if _finite(expected):
            return inputs, expected
        moved = {
            name: (a * 0.5 + 1.0).astype(a.dtype) if a.dtype.kind == "f" else a
            for name, a in inputs.items()
        }
        again = self.reference(moved)
        return (moved, again) if _finite(again) else (inputs, expected)

    def prim_func(self, *, scratch: Iterable[str] = ()) -> Any:
        """The unscheduled ``tvm.tirx.PrimFunc`` the spaces read and schedule: TE's
        ``create_prim_func`` of :meth:`stages` (inputs, outputs, then the intermediates
        named in ``scratch`` as extra parameters, as :meth:`tensor_specs` lists them)."""
        from tvm import te

        st = self.stages()
        wanted = set(scratch)
        extra = [t for t in st.intermediates if t.op.name in wanted]
        return te.create_prim_func([*st.inputs, *st.outputs, *extra])

    def main_stage(self) -> str | None:
        """The name of the stage a contraction space tiles, when the workload says."""
        main = self.stages().main
        return main.op.name if main is not None else None

    def tensor_specs(self, *, scratch: Iterable[str] = ()) -> list[TensorSpec]:
        """Kernel arguments in PrimFunc order: inputs, outputs, then the intermediates
        named in ``scratch`` (those a schedule keeps in global memory), in compute order."""
        st = self.stages()
        specs = [_spec(t, "input") for t in st.inputs] + [_spec(t, "output") for t in st.outputs]
        wanted = set(scratch)
        specs += [_spec(t, "scratch") for t in st.intermediates if t.op.name in wanted]
        return specs


def _spec(t: te.Tensor, role: str) -> TensorSpec:
    return TensorSpec(t.op.name, tuple(int(d) for d in t.shape), str(t.dtype), role)


def _finite(outputs: dict[str, np.ndarray]) -> bool:
    return all(np.isfinite(a).all() for a in outputs.values() if a.dtype.kind in "fc")
