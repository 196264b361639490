"""Dense (linear) layer ``x @ W^T``, with an optional bias and activation epilogue."""

from __future__ import annotations

from typing import Any

import numpy as np

from autosched.ops._common import contraction_tolerance, gelu_ref, gelu_te, integer, one_of
from autosched.ops.base import Stages, Workload

EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu")


class Dense(Workload):
    """``Y[m, n] = sum_k x[m, k] * W[n, k]``, then ``Z = act(Y + bias[n])`` per the epilogue.

    ``W`` is stored as PyTorch's ``nn.Linear`` stores it, ``(out_features, in_features)``.
    The epilogue is one stage ``Z`` after the reduction ``Y``: ``bias`` adds the bias,
    ``bias_relu`` and ``bias_gelu`` then apply relu or the exact (erf) GELU.
    """

    op = "dense"
    summary = "linear layer x @ W^T (W as nn.Linear stores it), optional bias + relu/gelu"
    shape_params = ("m", "n", "k", "epilogue")
    defaults = {"epilogue": "none"}
    choices = {"epilogue": EPILOGUES}
    example = "m=128,n=3072,k=768,epilogue=bias_gelu"  # BERT-base FFN up-projection

    def __init__(
        self, m: int, n: int, k: int, *, epilogue: str = "none", dtype: str = "float32"
    ) -> None:
        params: dict[str, Any] = {
            "m": integer("dense", "m", m),
            "n": integer("dense", "n", n),
            "k": integer("dense", "k", k),
            "epilogue": one_of("dense", "epilogue", epilogue, EPILOGUES),
        }
        super().__init__(params, dtype=dtype)

    def stages(self) -> Stages:
        from tvm import te

        x = te.placeholder((self.m, self.k), self.dtype, name="x")
        W = te.placeholder((self.n, self.k), self.dtype, name="W")
        rk = te.reduce_axis((0, self.k), name="k")
        Y = te.compute(
            (self.m, self.n), lambda i, j: te.sum(x[i, rk] * W[j, rk], axis=rk), name="Y"
        )
        if self.epilogue == "none":
            return Stages(inputs=(x, W), outputs=(Y,), main=Y)
        bias = te.placeholder((self.n,), self.dtype, name="bias")
        if self.epilogue == "bias":
            Z = te.compute((self.m, self.n), lambda i, j: Y[i, j] + bias[j], name="Z")
        elif self.epilogue == "bias_relu":
            zero = te.const(0.0, self.dtype)
            Z = te.compute((self.m, self.n), lambda i, j: te.max(Y[i, j] + bias[j], zero), name="Z")
        else:
            Z = te.compute(
                (self.m, self.n), lambda i, j: gelu_te(Y[i, j] + bias[j], self.dtype), name="Z"
            )
        return Stages(inputs=(x, W, bias), outputs=(Z,), intermediates=(Y,), main=Y)

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {
            "x": rng.uniform(-1, 1, (self.m, self.k)).astype(self.dtype),
            "W": rng.uniform(-1, 1, (self.n, self.k)).astype(self.dtype),
        }
        if self.epilogue != "none":
            out["bias"] = rng.uniform(-1, 1, (self.n,)).astype(self.dtype)
        return out

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        y = inputs["x"].astype(np.float64) @ inputs["W"].astype(np.float64).T
        if self.epilogue == "none":
            return {"Y": y.astype(self.dtype)}
        z = y + inputs["bias"].astype(np.float64)
        if self.epilogue == "bias_relu":
            z = np.maximum(z, 0.0)
        elif self.epilogue == "bias_gelu":
            z = gelu_ref(z)
        return {"Z": z.astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        return contraction_tolerance(self.k)
