"""Dense matrix multiplication C = A @ B, with an optional fused epilogue."""

from __future__ import annotations

from typing import Any

import numpy as np

from autosched.ops._common import integer, one_of
from autosched.ops.base import Stages, Workload

EPILOGUES = ("none", "bias", "bias_relu")


class Matmul(Workload):
    """``C[M, N] = A[M, K] @ B[K, N]``, then ``+ bias[N]`` and ``relu`` per the epilogue."""

    op = "matmul"
    summary = "matrix multiplication C = A @ B, optional bias + relu"
    shape_params = ("M", "N", "K", "epilogue")
    positional = ("M", "N", "K")
    defaults = {"epilogue": "none"}
    choices = {"epilogue": EPILOGUES}
    example = "M=512,N=512,K=512"

    def __init__(self, M: int, N: int, K: int, *, epilogue: str = "none", dtype: str = "float32"):
        params: dict[str, Any] = {
            "M": integer("matmul", "M", M),
            "N": integer("matmul", "N", N),
            "K": integer("matmul", "K", K),
            "epilogue": one_of("matmul", "epilogue", epilogue, EPILOGUES),
        }
        super().__init__(params, dtype=dtype)

    def stages(self) -> Stages:
        from tvm import te

        A = te.placeholder((self.M, self.K), self.dtype, name="A")
        B = te.placeholder((self.K, self.N), self.dtype, name="B")
        k = te.reduce_axis((0, self.K), name="k")
        C = te.compute((self.M, self.N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        if self.epilogue == "none":
            return Stages(inputs=(A, B), outputs=(C,), main=C)
        bias = te.placeholder((self.N,), self.dtype, name="bias")
        if self.epilogue == "bias":
            D = te.compute((self.M, self.N), lambda i, j: C[i, j] + bias[j], name="D")
        else:
            D = te.compute(
                (self.M, self.N),
                lambda i, j: te.max(C[i, j] + bias[j], te.const(0.0, self.dtype)),
                name="D",
            )
        return Stages(inputs=(A, B, bias), outputs=(D,), intermediates=(C,), main=C)

    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {
            "A": rng.uniform(-1, 1, (self.M, self.K)).astype(self.dtype),
            "B": rng.uniform(-1, 1, (self.K, self.N)).astype(self.dtype),
        }
        if self.epilogue != "none":
            out["bias"] = rng.uniform(-1, 1, (self.N,)).astype(self.dtype)
        return out

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        c = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
        if self.epilogue == "none":
            return {"C": c.astype(self.dtype)}
        d = c + inputs["bias"].astype(np.float64)
        if self.epilogue == "bias_relu":
            d = np.maximum(d, 0.0)
        return {"D": d.astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        # float32 accumulation error grows like sqrt(K) for inputs in [-1, 1].
        return 1e-3, 1e-4 * max(1.0, float(np.sqrt(self.K))) * 4
