"""Vendor baselines: every operator computed the way a numpy user would, to time against.

One baseline per operator, on the host CPU, in float32, writing into buffers allocated
once (as a library call with ``out=`` would):

* ``matmul``, ``dense``, ``batch_matmul``: ``numpy.matmul`` (its BLAS, e.g. OpenBLAS;
  dense reads ``W.T``, which BLAS takes as a transposed operand, no copy), then the
  epilogue in place;
* ``conv2d``: im2col (``numpy.lib.stride_tricks.sliding_window_view``, one copy into
  a column matrix) and one BLAS matmul per group and image;
* ``depthwise_conv2d``: a multiply-add of shifted views per window position (one
  channel per filter leaves nothing for a matmul);
* ``softmax``, ``layernorm``, ``reduce``, ``elementwise``: plain numpy ufuncs and
  reductions.

    >>> fn, inputs = vendor_callable(autosched.workload("matmul", M=64, N=64, K=64))
    >>> fn(**inputs)["C"].shape
    (64, 64)
    >>> measure_vendor(autosched.workload("softmax", rows=128, cols=128))  # doctest: +SKIP
    3.1

``fn(**inputs)`` takes the inputs by name, like a compiled kernel, and returns the
outputs by the names :meth:`Workload.reference` uses; the arrays it returns are reused
by the next call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.ops.base import Workload

Fn = Callable[..., dict[str, np.ndarray]]
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@dataclass(frozen=True)
class VendorTiming:
    """A baseline timed on the host CPU.

    Attributes:
        gflops: the workload's useful flops / ``median_s``.
        median_s: median seconds of one call over the timed repeats.
        repeats: timed calls (after two warm-up calls).
        method: what the baseline does, e.g. ``"im2col (sliding_window_view) + matmul"``.
        blas: numpy's BLAS and its version when the baseline calls it, else ``""``.
        threads: the BLAS threads of the faster setting (``"1 thread"``, ``"2 threads"``),
            or ``""`` when the baseline does not call BLAS.
    """

    gflops: float
    median_s: float
    repeats: int
    method: str
    blas: str
    threads: str


@dataclass(frozen=True)
class _Baseline:
    fn: Fn
    method: str
    blas: bool  # calls BLAS, whose thread count matters


def _as_workload(workload: Workload | Mapping[str, Any]) -> Workload:
    if isinstance(workload, Workload):
        return workload
    from autosched.ops import workload_from_json

    return workload_from_json(dict(workload))


# -- epilogues ------------------------------------------------------------------------------------


def _gelu(src: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> None:
    """``out = 0.5 * src * (1 + erf(src / sqrt(2)))``, exact (erf) GELU as the ops use."""
    from scipy.special import erf

    np.multiply(src, _INV_SQRT2, out=tmp)
    erf(tmp, out=tmp)
    tmp += 1.0
    np.multiply(src, tmp, out=out)
    out *= 0.5


def _epilogue(out: np.ndarray, bias: np.ndarray | None, epilogue: str, tmp: np.ndarray) -> None:
    if epilogue == "none":
        return
    out += bias
    if epilogue == "bias_relu":
        np.maximum(out, 0.0, out=out)
    elif epilogue == "bias_gelu":
        _gelu(out, out, tmp)


# -- contractions ---------------------------------------------------------------------------------


def _matmul(wl: Workload) -> _Baseline:
    p = wl.params
    out = np.empty((p["M"], p["N"]), np.float32)
    tmp = np.empty_like(out) if p["epilogue"] == "bias_gelu" else out
    name = "C" if p["epilogue"] == "none" else "D"

    def fn(A: np.ndarray, B: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        np.matmul(A, B, out=out)
        _epilogue(out, bias, p["epilogue"], tmp)
        return {name: out}

    return _Baseline(fn, "matmul" + ("" if p["epilogue"] == "none" else " + epilogue"), True)


def _dense(wl: Workload) -> _Baseline:
    p = wl.params
    out = np.empty((p["m"], p["n"]), np.float32)
    tmp = np.empty_like(out) if p["epilogue"] == "bias_gelu" else out
    name = "Y" if p["epilogue"] == "none" else "Z"

    def fn(x: np.ndarray, W: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        np.matmul(x, W.T, out=out)
        _epilogue(out, bias, p["epilogue"], tmp)
        return {name: out}

    return _Baseline(
        fn, "matmul x @ W.T" + ("" if p["epilogue"] == "none" else " + epilogue"), True
    )


def _batch_matmul(wl: Workload) -> _Baseline:
    p = wl.params
    out = np.empty((p["b"], p["m"], p["n"]), np.float32)

    def fn(A: np.ndarray, B: np.ndarray) -> dict[str, np.ndarray]:
        np.matmul(A, B, out=out)
        return {"C": out}

    return _Baseline(fn, "batched matmul", True)


def _windows(src: np.ndarray, axes: tuple[int, int], r: int, s: int, stride: int, dil: int):
    """View of every (dilated, strided) window: the H and W axes become (p, q), and two
    trailing axes (r, s) run over each window."""
    from numpy.lib.stride_tricks import sliding_window_view

    win = sliding_window_view(src, ((r - 1) * dil + 1, (s - 1) * dil + 1), axis=axes)
    index = [slice(None)] * win.ndim
    index[axes[0]] = index[axes[1]] = slice(None, None, stride)
    index[-2] = index[-1] = slice(None, None, dil)
    return win[tuple(index)]


def _padder(shape: tuple[int, ...], axes: tuple[int, int], pad: int) -> Callable:
    """A function copying data into the middle of a zero buffer allocated once."""
    if pad == 0:
        return lambda data: data
    padded = list(shape)
    for a in axes:
        padded[a] += 2 * pad
    buf = np.zeros(padded, np.float32)
    inner = [slice(None)] * len(shape)
    for a in axes:
        inner[a] = slice(pad, pad + shape[a])
    view = buf[tuple(inner)]

    def fill(data: np.ndarray) -> np.ndarray:
        view[...] = data
        return buf

    return fill


def _conv2d(wl: Any) -> _Baseline:
    p = wl.params
    n, c, k, r, s, g = (p[x] for x in ("n", "c", "k", "r", "s", "groups"))
    st, pad, dil = p["stride"], p["pad"], p["dilation"]
    cg, kg = c // g, k // g
    ph, qw = wl.out_h, wl.out_w
    nchw = p["layout"] == "NCHW"
    axes = (2, 3) if nchw else (1, 2)
    fill = _padder(wl.data_shape, axes, pad)
    out_shape = wl.out_shape
    if nchw:
        out = np.empty((n, g, kg, ph * qw), np.float32)

        def fn(data: np.ndarray, weight: np.ndarray) -> dict[str, np.ndarray]:
            win = _windows(fill(data), axes, r, s, st, dil)  # (n, c, p, q, r, s)
            cols = win.reshape(n, g, cg, ph, qw, r, s).transpose(0, 1, 2, 5, 6, 3, 4)
            cols = cols.reshape(n, g, cg * r * s, ph * qw)  # the im2col copy
            np.matmul(weight.reshape(g, kg, cg * r * s), cols, out=out)
            return {"conv2d": out.reshape(out_shape)}

    elif g == 1:
        out = np.empty((n * ph * qw, k), np.float32)

        def fn(data: np.ndarray, weight: np.ndarray) -> dict[str, np.ndarray]:
            win = _windows(fill(data), axes, r, s, st, dil)  # (n, p, q, c, r, s)
            cols = win.transpose(0, 1, 2, 4, 5, 3).reshape(n * ph * qw, r * s * c)
            np.matmul(cols, weight.reshape(r * s * c, k), out=out)
            return {"conv2d": out.reshape(out_shape)}

    else:
        grouped = np.empty((g, n * ph * qw, kg), np.float32)
        out = np.empty(out_shape, np.float32)

        def fn(data: np.ndarray, weight: np.ndarray) -> dict[str, np.ndarray]:
            win = _windows(fill(data), axes, r, s, st, dil)  # (n, p, q, c, r, s)
            cols = win.reshape(n, ph, qw, g, cg, r, s).transpose(3, 0, 1, 2, 5, 6, 4)
            cols = cols.reshape(g, n * ph * qw, r * s * cg)
            w = weight.transpose(3, 0, 1, 2, 4).reshape(g, r * s * cg, kg)
            np.matmul(cols, w, out=grouped)
            out[...] = grouped.reshape(g, n, ph, qw, kg).transpose(1, 2, 3, 0, 4)
            return {"conv2d": out}

    return _Baseline(fn, "im2col (sliding_window_view) + matmul", True)


def _depthwise(wl: Any) -> _Baseline:
    p = wl.params
    r, s, st = p["r"], p["s"], p["stride"]
    ph, qw = wl.out_h, wl.out_w
    nchw = p["layout"] == "NCHW"
    axes = (2, 3) if nchw else (1, 2)
    fill = _padder(wl.data_shape, axes, p["pad"])
    out = np.empty(wl.out_shape, np.float32)
    tmp = np.empty_like(out)

    def fn(data: np.ndarray, weight: np.ndarray) -> dict[str, np.ndarray]:
        src = fill(data)
        for ry in range(r):
            for rx in range(s):
                rows = slice(ry, ry + st * (ph - 1) + 1, st)
                cols = slice(rx, rx + st * (qw - 1) + 1, st)
                if nchw:
                    x, wv = src[:, :, rows, cols], weight[:, ry, rx][None, :, None, None]
                else:
                    x, wv = src[:, rows, cols, :], weight[ry, rx, :]
                np.multiply(x, wv, out=out if ry == rx == 0 else tmp)
                if ry or rx:
                    np.add(out, tmp, out=out)
        return {"depthwise_conv2d": out}

    return _Baseline(fn, "multiply-add of shifted views", False)


# -- row-wise -------------------------------------------------------------------------------------


def _softmax(wl: Workload) -> _Baseline:
    rows, cols = wl.params["rows"], wl.params["cols"]
    row = np.empty((rows, 1), np.float32)
    out = np.empty((rows, cols), np.float32)

    def fn(x: np.ndarray) -> dict[str, np.ndarray]:
        np.max(x, axis=1, keepdims=True, out=row)
        np.subtract(x, row, out=out)
        np.exp(out, out=out)
        np.sum(out, axis=1, keepdims=True, out=row)
        np.divide(out, row, out=out)
        return {"softmax": out}

    return _Baseline(fn, "max, exp, sum, divide", False)


def _layernorm(wl: Any) -> _Baseline:
    rows, cols = wl.params["rows"], wl.params["cols"]
    row = np.empty((rows, 1), np.float32)
    out = np.empty((rows, cols), np.float32)
    sq = np.empty_like(out)

    def fn(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> dict[str, np.ndarray]:
        np.mean(x, axis=1, keepdims=True, out=row)
        np.subtract(x, row, out=out)
        np.multiply(out, out, out=sq)
        np.mean(sq, axis=1, keepdims=True, out=row)
        np.add(row, wl.eps, out=row)
        np.sqrt(row, out=row)
        np.divide(out, row, out=out)
        np.multiply(out, gamma, out=out)
        np.add(out, beta, out=out)
        return {"layernorm": out}

    return _Baseline(fn, "mean, variance, normalise, scale, shift", False)


def _reduce(wl: Workload) -> _Baseline:
    out = np.empty((wl.params["rows"],), np.float32)
    reducer = np.sum if wl.params["kind"] == "sum" else np.max

    def fn(x: np.ndarray) -> dict[str, np.ndarray]:
        reducer(x, axis=1, out=out)
        return {"reduce": out}

    return _Baseline(fn, f"numpy {reducer.__name__} over the last axis", False)


def _elementwise(wl: Any) -> _Baseline:
    ops = wl.ops
    out = np.empty((wl.params["rows"], wl.params["cols"]), np.float32)
    tmp = np.empty_like(out) if "gelu" in ops else out
    name = f"t{len(ops) - 1}"

    def fn(x: np.ndarray, **operands: np.ndarray) -> dict[str, np.ndarray]:
        src = x
        for i, item in enumerate(ops):
            if item == "add":
                np.add(src, operands[f"add{i}"], out=out)
            elif item == "mul":
                np.multiply(src, operands[f"mul{i}"], out=out)
            elif item == "relu":
                np.maximum(src, 0.0, out=out)
            else:
                _gelu(src, out, tmp)
            src = out
        return {name: out}

    return _Baseline(fn, "numpy ufuncs in place, one per operation", False)


_BASELINES: dict[str, Callable[[Any], _Baseline]] = {
    "matmul": _matmul,
    "dense": _dense,
    "batch_matmul": _batch_matmul,
    "conv2d": _conv2d,
    "depthwise_conv2d": _depthwise,
    "softmax": _softmax,
    "layernorm": _layernorm,
    "reduce": _reduce,
    "elementwise": _elementwise,
}


VENDOR_OPS = tuple(_BASELINES)  # the operators with a baseline


def _baseline(wl: Workload) -> _Baseline:
    make = _BASELINES.get(wl.op)
    if make is None:
        raise InvalidInputError(
            f"no vendor baseline for op {wl.op!r}; accepted: {', '.join(_BASELINES)}"
        )
    if wl.dtype != "float32":
        raise InvalidInputError(f"no vendor baseline for dtype {wl.dtype!r}; accepted: float32")
    return make(wl)


# -- the API --------------------------------------------------------------------------------------


def vendor_callable(
    workload: Workload | Mapping[str, Any], *, seed: int = 0
) -> tuple[Fn, dict[str, np.ndarray]]:
    """The numpy baseline of ``workload`` and inputs for it.

    Args:
        workload: a workload, or its JSON form (``Workload.to_json()``, ``Record.workload``).
        seed: seeds ``workload.make_inputs``.

    Returns:
        ``(fn, inputs)``: ``fn(**inputs)`` returns the outputs by name, as
        ``workload.reference(inputs)`` does (the arrays are reused by the next call).

    Raises:
        InvalidInputError: an op or dtype without a baseline.
    """
    wl = _as_workload(workload)
    baseline = _baseline(wl)
    return baseline.fn, wl.make_inputs(np.random.default_rng(seed))


def time_vendor(
    workload: Workload | Mapping[str, Any], *, min_time_s: float = 0.2, seed: int = 0
) -> VendorTiming:
    """Time the numpy baseline of ``workload`` on this CPU.

    Two warm-up calls, then calls until ``min_time_s`` of work and at least 5 of them;
    the median counts. A baseline that calls BLAS is timed with the BLAS's own thread
    count and with one thread, and the faster counts: on a machine whose cores are busy
    a BLAS that spins its threads can be far slower than one thread, and a vendor figure
    should be the best the library offers.

    Raises:
        InvalidInputError: an op or dtype without a baseline, or ``min_time_s < 0``.
    """
    if not isinstance(min_time_s, (int, float)) or min_time_s < 0:
        raise InvalidInputError(f"min_time_s={min_time_s!r} is not valid; accepted: a number >= 0")
    wl = _as_workload(workload)
    baseline = _baseline(wl)
    inputs = wl.make_inputs(np.random.default_rng(seed))

    def median_s() -> tuple[float, int]:
        baseline.fn(**inputs)
        baseline.fn(**inputs)
        times: list[float] = []
        spent = 0.0
        while (spent < min_time_s or len(times) < 5) and len(times) < 10_000:
            t0 = time.perf_counter()
            baseline.fn(**inputs)
            dt = time.perf_counter() - t0
            times.append(dt)
            spent += dt
        return float(np.median(times)), len(times)

    blas = threads = ""
    best, repeats = median_s()
    if baseline.blas:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            single, single_n = median_s()
        blas, count = blas_name()
        threads = f"{count} threads" if count and count > 1 else "its default threads"
        if single < best:
            best, repeats, threads = single, single_n, "1 thread"
    return VendorTiming(
        gflops=wl.flops() / best / 1e9,
        median_s=best,
        repeats=repeats,
        method=baseline.method,
        blas=blas,
        threads=threads,
    )


def measure_vendor(
    workload: Workload | Mapping[str, Any], *, min_time_s: float = 0.2, seed: int = 0
) -> float:
    """GFLOP/s of the numpy baseline of ``workload`` on this CPU (see :func:`time_vendor`)."""
    return time_vendor(workload, min_time_s=min_time_s, seed=seed).gflops


def blas_name() -> tuple[str, int | None]:
    """(name and version of numpy's BLAS, its thread count) as far as threadpoolctl knows."""
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            if lib.get("user_api") == "blas":
                api = str(lib.get("internal_api", ""))
                name = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS"}.get(
                    api, api or "BLAS"
                )
                version = lib.get("version")
                threads = lib.get("num_threads")
                return (f"{name} {version}" if version else name), threads
    except Exception:  # threadpoolctl failing: the name is a courtesy
        pass
    return "its BLAS", None


__all__ = [
    "VENDOR_OPS",
    "VendorTiming",
    "blas_name",
    "measure_vendor",
    "time_vendor",
    "vendor_callable",
]
