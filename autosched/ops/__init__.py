"""Operators as TVM TE computes with numpy references and stable workload keys."""

from __future__ import annotations

from typing import Any

from autosched.errors import InvalidInputError
from autosched.ops.base import Stages, TensorSpec, Workload
from autosched.ops.matmul import Matmul

OPS: dict[str, type[Workload]] = {"matmul": Matmul}


def workload(op: str, **params: Any) -> Workload:
    """Create a workload: ``workload("matmul", M=512, N=512, K=512, epilogue="bias_relu")``."""
    cls = OPS.get(op)
    if cls is None:
        raise InvalidInputError(f"unknown op {op!r}; accepted: {', '.join(sorted(OPS))}")
    try:
        return cls(**params)
    except TypeError as exc:  # wrong or missing parameter names
        raise InvalidInputError(f"{op}: {exc}") from None


def workload_from_json(data: dict[str, Any]) -> Workload:
    """Inverse of ``Workload.to_json()``."""
    return workload(data["op"], **data["params"], dtype=data.get("dtype", "float32"))


__all__ = ["OPS", "Matmul", "Stages", "TensorSpec", "Workload", "workload", "workload_from_json"]
