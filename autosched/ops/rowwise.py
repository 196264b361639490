"""Row-wise operators over a ``[rows, cols]`` matrix: ``softmax``, ``layernorm``, ``reduce``.

Each works along the last axis (``cols``), row by row. They have no single contraction,
so :attr:`Stages.main` is None; their stages are listed in compute order.

``flops()`` counts one operation per element for each arithmetic step (a compare, an
add, a multiply, a divide, an ``exp`` alike), so their GFLOP/s is a throughput figure
and comparable between schedules of one workload, not with a matmul's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autosched.ops._common import contraction_tolerance, integer, one_of
from autosched.ops.base import Stages, Workload

KINDS = ("sum", "max")


class _Rowwise(Workload):
    """``rows`` and ``cols``, checked, plus any options."""

    def __init__(self, rows: int, cols: int, *, dtype: str, **options: Any) -> None:
        params: dict[str, Any] = {
            "rows": integer(self.op, "rows", rows),
            "cols": integer(self.op, "cols", cols),
        }
        super().__init__({**params, **options}, dtype=dtype)

    def _uniform(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.uniform(-1, 1, shape).astype(self.dtype)


class Softmax(_Rowwise):
    """Numerically stable softmax of each row.

    Stages: ``row_max[rows]`` (max over cols), ``exp[rows, cols] = exp(x - row_max)``,
    ``row_sum[rows]`` (sum of ``exp``), and the output ``softmax = exp / row_sum``.
    flops: 5 per element (compare, subtract, exp, add, divide).
    """

    op = "softmax"
    summary = "softmax over the last axis (max, exp and sum, divide)"
    shape_params = ("rows", "cols")
    positional = ("rows", "cols")
    example = "rows=1536,cols=128"  # BERT-base attention: 12 heads x 128 queries, 128 keys

    def __init__(self, rows: int, cols: int, *, dtype: str = "float32") -> None:
        super().__init__(rows, cols, dtype=dtype)

    def stages(self) -> Stages:
        from tvm import te

        R, C = self.rows, self.cols
        x = te.placeholder((R, C), self.dtype, name="x")
        k = te.reduce_axis((0, C), name="k")
        row_max = te.compute((R,), lambda i: te.max(x[i, k], axis=k), name="row_max")
        exp = te.compute((R, C), lambda i, j: te.exp(x[i, j] - row_max[i]), name="exp")
        k2 = te.reduce_axis((0, C), name="k2")
        row_sum = te.compute((R,), lambda i: te.sum(exp[i, k2], axis=k2), name="row_sum")
        out = te.compute((R, C), lambda i, j: exp[i, j] / row_sum[i], name="softmax")
        return Stages(inputs=(x,), outputs=(out,), intermediates=(row_max, exp, row_sum))

    def flops(self) -> float:
        return 5.0 * self.rows * self.cols

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"x": self._uniform(rng, (self.rows, self.cols))}

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"].astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return {"softmax": (e / e.sum(axis=1, keepdims=True)).astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        return 1e-4, 1e-5


class LayerNorm(_Rowwise):
    """Layer normalisation of each row, two-pass, with scale ``gamma`` and shift ``beta``.

    Inputs ``x[rows, cols]``, ``gamma[cols]``, ``beta[cols]``. Stages: ``row_sum[rows]``
    (sum of x), ``var_sum[rows]`` (sum of ``(x - row_sum/cols)^2``), and the output
    ``layernorm = (x - row_sum/cols) * rsqrt(var_sum/cols + 1e-5) * gamma + beta``.
    flops: 8 per element (1 for the sum; subtract, square, add for the variance;
    subtract, normalise, scale, shift), per-row terms left out.
    """

    op = "layernorm"
    summary = "layer normalisation over the last axis (mean, variance, scale, shift)"
    shape_params = ("rows", "cols")
    positional = ("rows", "cols")
    example = "rows=128,cols=768"  # BERT-base hidden states of one 128-token sequence
    eps = 1e-5

    def __init__(self, rows: int, cols: int, *, dtype: str = "float32") -> None:
        super().__init__(rows, cols, dtype=dtype)

    def stages(self) -> Stages:
        import tvm
        from tvm import te

        R, C = self.rows, self.cols
        x = te.placeholder((R, C), self.dtype, name="x")
        gamma = te.placeholder((C,), self.dtype, name="gamma")
        beta = te.placeholder((C,), self.dtype, name="beta")
        n = tvm.tirx.const(float(C), self.dtype)
        eps = tvm.tirx.const(self.eps, self.dtype)
        k = te.reduce_axis((0, C), name="k")
        row_sum = te.compute((R,), lambda i: te.sum(x[i, k], axis=k), name="row_sum")
        k2 = te.reduce_axis((0, C), name="k2")

        def centred_square(i):
            d = x[i, k2] - row_sum[i] / n
            return te.sum(d * d, axis=k2)

        var_sum = te.compute((R,), centred_square, name="var_sum")

        def normalised(i, j):
            inv_std = tvm.tirx.rsqrt(var_sum[i] / n + eps)
            return (x[i, j] - row_sum[i] / n) * inv_std * gamma[j] + beta[j]

        out = te.compute((R, C), normalised, name="layernorm")
        return Stages(inputs=(x, gamma, beta), outputs=(out,), intermediates=(row_sum, var_sum))

    def flops(self) -> float:
        return 8.0 * self.rows * self.cols

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {
            "x": self._uniform(rng, (self.rows, self.cols)),
            "gamma": self._uniform(rng, (self.cols,)),
            "beta": self._uniform(rng, (self.cols,)),
        }

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"].astype(np.float64)
        d = x - x.mean(axis=1, keepdims=True)
        y = d / np.sqrt((d * d).mean(axis=1, keepdims=True) + self.eps)
        y = y * inputs["gamma"].astype(np.float64) + inputs["beta"].astype(np.float64)
        return {"layernorm": y.astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        return 1e-4, 1e-4


class Reduce(_Rowwise):
    """``reduce[rows] = sum`` or ``max`` of ``x[rows, cols]`` over cols; one stage, the output.

    flops: 1 per element.
    """

    op = "reduce"
    summary = "sum or max over the last axis"
    shape_params = ("rows", "cols", "kind")
    choices = {"kind": KINDS}
    example = "rows=2048,cols=49,kind=sum"  # ResNet-50 global average pool, 7x7 per channel

    def __init__(self, rows: int, cols: int, *, kind: str, dtype: str = "float32") -> None:
        super().__init__(rows, cols, dtype=dtype, kind=one_of("reduce", "kind", kind, KINDS))

    def stages(self) -> Stages:
        from tvm import te

        x = te.placeholder((self.rows, self.cols), self.dtype, name="x")
        k = te.reduce_axis((0, self.cols), name="k")
        reducer = te.sum if self.kind == "sum" else te.max
        out = te.compute((self.rows,), lambda i: reducer(x[i, k], axis=k), name="reduce")
        return Stages(inputs=(x,), outputs=(out,))

    def flops(self) -> float:
        return float(self.rows * self.cols)

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"x": self._uniform(rng, (self.rows, self.cols))}

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"].astype(np.float64)
        y = x.sum(axis=1) if self.kind == "sum" else x.max(axis=1)
        return {"reduce": y.astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        if self.kind == "max":
            return 0.0, 1e-7  # a maximum is one of the inputs, exactly
        return contraction_tolerance(self.cols)
