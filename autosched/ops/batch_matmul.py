"""Batched matrix multiplication ``C[b] = A[b] @ B[b]`` (attention's QK^T and PV)."""

from __future__ import annotations

import numpy as np

from autosched.ops._common import contraction_tolerance, integer
from autosched.ops.base import Stages, Workload


class BatchMatmul(Workload):
    """``C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]``; no epilogue."""

    op = "batch_matmul"
    summary = "batched matrix multiplication C[b] = A[b] @ B[b]"
    shape_params = ("b", "m", "n", "k")
    positional = ("b", "m", "n", "k")
    example = "b=12,m=128,n=128,k=64"  # BERT-base attention scores, 12 heads

    def __init__(self, b: int, m: int, n: int, k: int, *, dtype: str = "float32") -> None:
        names = ("b", "m", "n", "k")
        params = {name: integer(self.op, name, v) for name, v in zip(names, (b, m, n, k))}
        super().__init__(params, dtype=dtype)

    def stages(self) -> Stages:
        from tvm import te

        A = te.placeholder((self.b, self.m, self.k), self.dtype, name="A")
        B = te.placeholder((self.b, self.k, self.n), self.dtype, name="B")
        rk = te.reduce_axis((0, self.k), name="k")
        C = te.compute(
            (self.b, self.m, self.n),
            lambda b, i, j: te.sum(A[b, i, rk] * B[b, rk, j], axis=rk),
            name="C",
        )
        return Stages(inputs=(A, B), outputs=(C,), main=C)

    def flops(self) -> float:
        return 2.0 * self.b * self.m * self.n * self.k

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {
            "A": rng.uniform(-1, 1, (self.b, self.m, self.k)).astype(self.dtype),
            "B": rng.uniform(-1, 1, (self.b, self.k, self.n)).astype(self.dtype),
        }

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        c = np.matmul(inputs["A"].astype(np.float64), inputs["B"].astype(np.float64))
        return {"C": c.astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        return contraction_tolerance(self.k)
