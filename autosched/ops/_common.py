"""Helpers shared by the operators: parameter checks, GELU, contraction tolerances."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError


def integer(op: str, name: str, value: Any, *, low: int = 1) -> int:
    """``value`` as an int >= ``low`` (1 or 0); bools and floats are refused."""
    accepted = "a positive integer" if low == 1 else f"an integer >= {low}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(f"{op} {name}={value!r} is not an integer; accepted: {accepted}")
    if value < low:
        what = "not positive" if low == 1 else "negative"
        raise InvalidInputError(f"{op} {name}={value!r} is {what}; accepted: {accepted}")
    return int(value)


def one_of(op: str, name: str, value: Any, accepted: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in accepted:
        raise InvalidInputError(
            f"{op} {name}={value!r} is not valid; accepted: {', '.join(accepted)}"
        )
    return value


def gelu_ref(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU in float64."""
    from scipy.special import erf

    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_te(x: Any, dtype: str) -> Any:
    """Exact (erf) GELU of a TE expression: ``0.5 * x * (1 + erf(x / sqrt(2)))``."""
    import tvm

    half = tvm.tirx.const(0.5, dtype)
    one = tvm.tirx.const(1.0, dtype)
    return half * x * (one + tvm.tirx.erf(x * tvm.tirx.const(1.0 / math.sqrt(2.0), dtype)))


def contraction_tolerance(length: int) -> tuple[float, float]:
    # float32 accumulation error grows like sqrt(length) for inputs in [-1, 1] (as matmul).
    return 1e-3, 1e-4 * max(1.0, math.sqrt(length)) * 4
