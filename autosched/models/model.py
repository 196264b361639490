"""An imported model: its Relax module with weights bound, its inputs, and a host reference."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from autosched.errors import InvalidInputError
from autosched.ops.base import TensorSpec

if TYPE_CHECKING:
    from tvm.ir import IRModule


class Reference(Protocol):
    """Runs the model in its own framework on the host (onnxruntime, torch eager).

    ``arrays`` are keyed by the names of :attr:`Model.inputs`; the outputs come back in
    the order of the Relax function's results.
    """

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]: ...


@dataclass(frozen=True)
class InputRange:
    """The values random inputs take: normal floats, or integers in ``[low, high)``."""

    low: int = 0
    high: int = 2


@dataclass(frozen=True, eq=False)
class Model:
    """A model imported from ONNX or PyTorch, ready for Relax legalisation and fusion.

    Attributes:
        name: the model's name (the file's stem, or the factory's name).
        framework: ``"onnx"`` or ``"torch"``, whose runtime :meth:`reference` runs.
        mod: the Relax IRModule; ``main`` takes the inputs in order, weights are bound
            constants, inference batch-norm after a convolution is folded into its weights
            and the rest decomposed (``DecomposeOpsForInference``, ``CanonicalizeBindings``).
        inputs: the arguments of ``main``, in order (role ``"input"``).
    """

    name: str
    framework: str
    mod: IRModule
    inputs: tuple[TensorSpec, ...]
    _reference: Reference = field(repr=False)
    _runtimes: Callable[[int | None], dict[str, Reference]] = field(repr=False)
    _int_ranges: Mapping[str, InputRange] = field(default_factory=dict, repr=False)

    def example_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Random inputs of the right shapes and dtypes: standard normal floats; integers
        in the range the model's example took (``[0, 2)`` where there was none)."""
        arrays: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            dtype = np.dtype(spec.dtype)
            if dtype.kind == "f":
                arrays[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
            elif dtype.kind == "b":
                arrays[spec.name] = rng.integers(0, 2, spec.shape).astype(dtype)
            else:
                span = self._int_ranges.get(spec.name, InputRange())
                arrays[spec.name] = rng.integers(span.low, span.high, spec.shape).astype(dtype)
        return arrays

    def reference(self, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The model's outputs on ``arrays`` computed by its own framework on the host.

        Raises:
            InvalidInputError: an input is missing or has the wrong shape.
        """
        for spec in self.inputs:
            if spec.name not in arrays:
                raise InvalidInputError(
                    f"no array for model input {spec.name!r}; accepted: {self.input_names()}"
                )
            shape = tuple(np.shape(arrays[spec.name]))
            if shape != spec.shape:
                raise InvalidInputError(
                    f"model input {spec.name!r} has shape {_dims(shape)}; "
                    f"accepted: {_dims(spec.shape)}"
                )
        return self._reference(arrays)

    def runtimes(self, threads: int | None = None) -> dict[str, Reference]:
        """Fresh host runtimes that compute this model, by name, each on ``threads``
        threads (None: the runtime's own default): ``onnxruntime`` for every model, and
        ``torch`` (eager) for a PyTorch one, whose module onnxruntime runs exported to
        ONNX. They take arrays as :meth:`reference` does; a runtime that cannot take the
        model raises :class:`InvalidInputError` on its first call."""
        return self._runtimes(threads)

    def input_names(self) -> str:
        return ", ".join(spec.name for spec in self.inputs)

    def num_ops(self, op_name: str) -> int:
        """How many calls of a Relax operator (``"relax.nn.batch_norm"``) ``main`` makes."""
        return count_ops(self.mod, op_name)


def count_ops(mod: IRModule, op_name: str) -> int:
    """How many calls of the Relax operator ``op_name`` the functions of ``mod`` make."""
    import tvm
    from tvm import relax

    found = [0]

    def visit(expr: object) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            if expr.op.name == op_name:
                found[0] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found[0]


_DIMS = re.compile(r"^\d+([x,]\d+)*$")


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "(scalar)"


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse one ``--input`` value, ``name=1x3x224x224`` (or ``name=1,3,224,224``), into
    ``(name, shape)``.

    Raises:
        InvalidInputError: the text is not ``name=DxDx...`` with positive dimensions.
    """
    name, sep, dims = text.partition("=")
    dims = dims.strip().lower().replace(" ", "")
    if not sep or not name.strip() or not _DIMS.match(dims):
        raise InvalidInputError(
            f"--input {text!r} is malformed; accepted: NAME=DIMS such as input=1x3x224x224"
        )
    shape = tuple(int(d) for d in re.split("[x,]", dims))
    if any(d <= 0 for d in shape):
        raise InvalidInputError(f"--input {text!r} has a dimension <= 0; accepted: positive sizes")
    return name.strip(), shape


def check_overrides(
    overrides: Mapping[str, tuple[int, ...]], known: list[str], *, source: str
) -> None:
    """Every overridden input must exist in the model."""
    for name in overrides:
        if name not in known:
            raise InvalidInputError(
                f"--input names {name!r}, which {source} has no input of; "
                f"accepted: {', '.join(known) or '(none)'}"
            )


def prepare(mod: IRModule) -> IRModule:
    """Fold batch-norm into convolutions, write constant negative indices as
    non-negative and in-range ones in clip mode
    (:mod:`autosched.models.take_indices`), then decompose what is left
    for inference."""
    from tvm import relax

    from autosched.models.fold_batch_norm import fold_batch_norm
    from autosched.models.take_indices import settle_take_indices

    mod = settle_take_indices(fold_batch_norm(mod))
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)
    return relax.transform.DeadCodeElimination(["main"])(mod)


def main_inputs(mod: IRModule) -> tuple[TensorSpec, ...]:
    """The parameters of ``main`` as input specs (all shapes static)."""
    from tvm import relax

    specs = []
    for param in mod["main"].params:
        sinfo = param.ty
        if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None:
            raise InvalidInputError(
                f"model input {param.name!r} is not a tensor of known shape; "
                "accepted: tensor inputs (give shapes with --input NAME=DIMS)"
            )
        dims = []
        for d in sinfo.shape.values:
            if not hasattr(d, "value"):
                raise InvalidInputError(
                    f"model input {param.name!r} has a symbolic dimension {d}; "
                    f"give its shape with --input {param.name}=DIMS"
                )
            dims.append(int(d.value))
        specs.append(TensorSpec(param.name, tuple(dims), str(sinfo.dtype), "input"))
    return tuple(specs)
