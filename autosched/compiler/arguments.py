"""Binding a call's arguments to a program's tensors, as Python binds a function's.

A compiled kernel and a built Relax module are both called like functions on numpy
arrays: positional arguments in the program's input order, keyword arguments by input
name, mixed as in Python. Every mistake (too many arguments, an unknown or repeated
name, a missing input, a wrong shape or dtype, an unusable ``out=`` array) is one
:class:`~autosched.errors.InvalidInputError` naming what is wrong and listing the
accepted inputs with their shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.ops.base import TensorSpec

# A dimension a program does not fix (a Relax function's symbolic shape).
ANY = -1


def describe(specs: Sequence[TensorSpec]) -> str:
    """``A[64, 64] float32, B[64, 64] float32``: the tensors as a call accepts them."""
    return ", ".join(f"{s.name}{_shape_text(s.shape)} {s.dtype}" for s in specs)


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d == ANY else str(d) for d in shape) + "]"


def bind(
    specs: Sequence[TensorSpec],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    what: str,
) -> dict[str, np.ndarray]:
    """Match ``args`` and ``kwargs`` to the input ``specs``; return C-contiguous arrays by name.

    Args:
        specs: the inputs, in positional order.
        args: positional arguments (array-likes), bound in ``specs`` order.
        kwargs: keyword arguments, bound by name.
        what: the callee as the error messages name it, e.g. ``matmul(M=64, N=64, K=64)``.

    Returns:
        Every input by name, as an array of its spec's shape and dtype (a copy when the
        argument was of another dtype or not C-contiguous).

    Raises:
        InvalidInputError: too many positional arguments, an unknown name, an input given
            twice or not at all, a shape that differs, or a dtype that does not cast to the
            input's (``numpy.can_cast`` with ``same_kind``: float64 to float32 is accepted).
    """
    accepted = describe(specs)
    names = [s.name for s in specs]
    if len(args) > len(specs):
        raise InvalidInputError(
            f"{what}: takes {len(specs)} input(s), got {len(args)} positional arguments; "
            f"accepted: {accepted}"
        )
    given = dict(zip(names, args))
    unknown = [str(n) for n in kwargs if n not in names]
    repeated = [n for n in kwargs if n in given]
    given.update((n, v) for n, v in kwargs.items() if n in names)
    missing = [n for n in names if n not in given]
    problems = [
        f"{label} {', '.join(found)}"
        for label, found in (
            ("unknown input(s)", unknown),
            ("input(s) given both by position and by name:", repeated),
            ("missing input(s)", missing),
        )
        if found
    ]
    if problems:
        raise InvalidInputError(f"{what}: {'; '.join(problems)}; accepted: {accepted}")
    arrays = {}
    for spec in specs:
        arr = np.asarray(given[spec.name])
        if not _shape_matches(arr.shape, spec.shape):
            raise InvalidInputError(
                f"{what}: input {spec.name} has shape {list(arr.shape)}, expected "
                f"{_shape_text(spec.shape)}; accepted: {accepted}"
            )
        if not np.can_cast(arr.dtype, spec.dtype, casting="same_kind"):
            raise InvalidInputError(
                f"{what}: input {spec.name} has dtype {arr.dtype}, expected {spec.dtype} "
                f"(or a dtype that casts to it); accepted: {accepted}"
            )
        arrays[spec.name] = np.ascontiguousarray(arr, dtype=spec.dtype)
    return arrays


def _shape_matches(shape: tuple[int, ...], wanted: Sequence[int]) -> bool:
    return len(shape) == len(wanted) and all(w in (ANY, d) for d, w in zip(shape, wanted))


def check_out(specs: Sequence[TensorSpec], out: Any, *, what: str) -> dict[str, np.ndarray]:
    """The caller's ``out=`` arrays by output name, after checking that the program can
    write its outputs into them as they are.

    ``out`` is one array when there is one output, else a tuple (or list) of one array
    per output in order; a one-element tuple is accepted for one output, as numpy's
    ufuncs accept it.

    Raises:
        InvalidInputError: the wrong number of arrays, or an array that is not a numpy
            array of the output's exact shape and dtype, C-contiguous and writeable.
    """
    accepted = describe(specs)
    arrays = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(arrays) != len(specs):
        wanted = "one array" if len(specs) == 1 else f"a tuple of {len(specs)} arrays"
        raise InvalidInputError(
            f"{what}: out= has {len(arrays)} array(s), expected {wanted}; outputs: {accepted}"
        )
    checked = {}
    for spec, arr in zip(specs, arrays):
        if not isinstance(arr, np.ndarray):
            problem = f"is a {type(arr).__name__}, not a numpy array"
        elif arr.shape != spec.shape:
            problem = f"has shape {list(arr.shape)}, expected {_shape_text(spec.shape)}"
        elif arr.dtype != np.dtype(spec.dtype):
            problem = f"has dtype {arr.dtype}, expected {spec.dtype}"
        elif not arr.flags.c_contiguous:
            problem = "is not C-contiguous"
        elif not arr.flags.writeable:
            problem = "is read-only"
        else:
            checked[spec.name] = arr
            continue
        raise InvalidInputError(f"{what}: out= for {spec.name} {problem}; outputs: {accepted}")
    return checked
