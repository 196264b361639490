"""A chain of elementwise operations over ``x[rows, cols]``, one stage per operation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.ops._common import gelu_ref, gelu_te, integer
from autosched.ops.base import Stages, Workload

if TYPE_CHECKING:
    from tvm import te

CHAIN_OPS = ("add", "mul", "relu", "gelu")
BINARY = ("add", "mul")
MAX_CHAIN = 8
# flops per element of each operation; gelu: divide, erf, add and two multiplies.
_FLOPS = {"add": 1, "mul": 1, "relu": 1, "gelu": 5}


def _chain(ops: str | Sequence[str]) -> tuple[str, ...]:
    accepted = f"1 to {MAX_CHAIN} of {', '.join(CHAIN_OPS)} joined by +, e.g. add+relu"
    if not isinstance(ops, (str, list, tuple)):
        raise InvalidInputError(f"elementwise ops={ops!r} is not valid; accepted: {accepted}")
    items = ops.split("+") if isinstance(ops, str) else list(ops)
    if not items or len(items) > MAX_CHAIN:
        raise InvalidInputError(
            f"elementwise ops={ops!r} has {len(items)} operations; accepted: {accepted}"
        )
    bad = [item for item in items if item not in CHAIN_OPS]
    if bad:
        raise InvalidInputError(
            f"elementwise ops={ops!r}: {bad[0]!r} is not an operation; accepted: {accepted}"
        )
    return tuple(items)


class Elementwise(Workload):
    """``t0 = op0(x)``, ``t1 = op1(t0)``, ...; the last stage is the output.

    ``ops`` is a chain such as ``"add+gelu"`` (a sequence of names is accepted and stored
    joined by ``+``). ``add`` and ``mul`` take an operand of their own, shape ``(cols,)``
    and broadcast over the rows, named by the operation and its position in the chain
    (``add0``, ``mul1``, ...); ``relu`` and ``gelu`` (exact, erf form) are unary. Each
    operation is its own stage ``t<i>`` so that fusing them is a schedule's choice.
    flops per element: 1 per add, mul or relu, 5 per gelu.
    """

    op = "elementwise"
    summary = "a chain of elementwise add, mul, relu, gelu with broadcast operands"
    shape_params = ("rows", "cols", "ops")
    choices = {"ops": CHAIN_OPS}
    chains = ("ops",)
    example = "rows=128,cols=3072,ops=add+gelu"  # BERT-base FFN bias + gelu

    def __init__(
        self, rows: int, cols: int, *, ops: str | Sequence[str], dtype: str = "float32"
    ) -> None:
        params: dict[str, Any] = {
            "rows": integer(self.op, "rows", rows),
            "cols": integer(self.op, "cols", cols),
            "ops": "+".join(_chain(ops)),
        }
        super().__init__(params, dtype=dtype)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(self.params["ops"].split("+"))

    def operand_names(self) -> list[str]:
        """Names of the broadcast operands, in chain order (after ``x`` among the inputs)."""
        return [f"{item}{i}" for i, item in enumerate(self.ops) if item in BINARY]

    def stages(self) -> Stages:
        from tvm import te

        R, C = self.rows, self.cols
        zero = te.const(0.0, self.dtype)

        def step(i: int, item: str, t: te.Tensor, v: te.Tensor | None) -> te.Tensor:
            if item == "add":
                body = lambda i, j: t[i, j] + v[j]  # noqa: E731
            elif item == "mul":
                body = lambda i, j: t[i, j] * v[j]  # noqa: E731
            elif item == "relu":
                body = lambda i, j: te.max(t[i, j], zero)  # noqa: E731
            else:
                body = lambda i, j: gelu_te(t[i, j], self.dtype)  # noqa: E731
            return te.compute((R, C), body, name=f"t{i}")

        x = te.placeholder((R, C), self.dtype, name="x")
        inputs, stages = [x], []
        for i, item in enumerate(self.ops):
            v = None
            if item in BINARY:
                v = te.placeholder((C,), self.dtype, name=f"{item}{i}")
                inputs.append(v)
            stages.append(step(i, item, stages[-1] if stages else x, v))
        return Stages(inputs=tuple(inputs), outputs=(stages[-1],), intermediates=tuple(stages[:-1]))

    def flops(self) -> float:
        return float(self.rows * self.cols * sum(_FLOPS[item] for item in self.ops))

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {"x": rng.uniform(-1, 1, (self.rows, self.cols)).astype(self.dtype)}
        for name in self.operand_names():
            out[name] = rng.uniform(-1, 1, (self.cols,)).astype(self.dtype)
        return out

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        y = inputs["x"].astype(np.float64)
        for i, item in enumerate(self.ops):
            if item == "add":
                y = y + inputs[f"add{i}"].astype(np.float64)
            elif item == "mul":
                y = y * inputs[f"mul{i}"].astype(np.float64)
            elif item == "relu":
                y = np.maximum(y, 0.0)
            else:
                y = gelu_ref(y)
        return {f"t{len(self.ops) - 1}": y.astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        return 1e-4, 1e-5
