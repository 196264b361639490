"""Operators as TVM TE computes with numpy references and stable workload keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autosched.errors import InvalidInputError
from autosched.ops.base import Stages, TensorSpec, Workload
from autosched.ops.batch_matmul import BatchMatmul
from autosched.ops.conv2d import Conv2d, DepthwiseConv2d
from autosched.ops.dense import Dense
from autosched.ops.elementwise import Elementwise
from autosched.ops.fused import FusedFunc
from autosched.ops.matmul import Matmul
from autosched.ops.rowwise import LayerNorm, Reduce, Softmax

# In the order `autosched ops` lists them; matmul, the first, is the reference operator.
OPS: dict[str, type[Workload]] = {
    cls.op: cls
    for cls in (
        Matmul,
        BatchMatmul,
        Dense,
        Conv2d,
        DepthwiseConv2d,
        Softmax,
        LayerNorm,
        Reduce,
        Elementwise,
    )
}


def workload(op: str, **params: Any) -> Workload:
    """Create a workload: ``workload("matmul", M=512, N=512, K=512, epilogue="bias_relu")``.

    Raises:
        InvalidInputError: an unknown op, an unknown or missing parameter, or a bad value;
            the message lists what is accepted.
    """
    cls = OPS.get(op)
    if cls is None:
        raise InvalidInputError(f"unknown op {op!r}; accepted: {', '.join(OPS)}")
    accepted = f"accepted: {cls.describe_params()}"
    unknown = [name for name in params if name not in cls.shape_params and name != "dtype"]
    if unknown:
        raise InvalidInputError(f"{op}: unknown parameter {unknown[0]!r}; {accepted}")
    missing = [n for n in cls.shape_params if n not in params and n not in cls.defaults]
    if missing:
        raise InvalidInputError(f"{op}: missing parameter {', '.join(missing)}; {accepted}")
    return cls(**params)


def params_text(data: Mapping[str, Any]) -> str | None:
    """A short text for the params of a workload's JSON (a record's ``workload``) where
    ``name=value`` pairs would not read: a fused function's script, in one line. None
    for every other op (their pairs read)."""
    cls = FusedFunc if data.get("op") == FusedFunc.op else OPS.get(str(data.get("op")))
    params = data.get("params")
    return cls.params_text(params) if cls is not None and isinstance(params, dict) else None


def workload_from_json(data: dict[str, Any]) -> Workload:
    """Inverse of ``Workload.to_json()``."""
    if data.get("op") == FusedFunc.op:
        params = data["params"]
        return FusedFunc(
            params["script"],
            dtype=data.get("dtype", "float32"),
            reused=bool(params.get("reused", False)),
        )
    return workload(data["op"], **data["params"], dtype=data.get("dtype", "float32"))


__all__ = [
    "OPS",
    "BatchMatmul",
    "Conv2d",
    "Dense",
    "DepthwiseConv2d",
    "Elementwise",
    "FusedFunc",
    "LayerNorm",
    "Matmul",
    "Reduce",
    "Softmax",
    "Stages",
    "TensorSpec",
    "Workload",
    "params_text",
    "workload",
    "workload_from_json",
]
