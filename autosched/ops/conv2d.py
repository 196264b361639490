"""2-D convolutions: ``conv2d`` (stride, padding, dilation, groups) and ``depthwise_conv2d``.

Both come in the NCHW and NHWC layouts. Zero padding, when ``pad > 0``, is its own
stage named ``pad`` (an injective producer the schedule may inline or keep), and the
single reduction stage reads it. Every index is affine in the loop variables, which is
why grouped convolutions carry an explicit group axis (see :class:`Conv2d`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.ops._common import contraction_tolerance, integer, one_of
from autosched.ops.base import Stages, Workload

if TYPE_CHECKING:
    from tvm import te

LAYOUTS = ("NCHW", "NHWC")


def _out_size(op: str, dim: str, params: dict[str, Any], *, dilation: int) -> int:
    """Output height (``dim="h"``, window ``r``) or width (``"w"``, window ``s``)."""
    win = "r" if dim == "h" else "s"
    size, window, stride, pad = params[dim], params[win], params["stride"], params["pad"]
    out = (size + 2 * pad - dilation * (window - 1) - 1) // stride + 1
    if out < 1:
        raise InvalidInputError(
            f"{op}: the output would have {dim}-size {out} ({dim}={size}, {win}={window}, "
            f"pad={pad}, dilation={dilation}); accepted: {dim} + 2*pad >= "
            f"dilation*({win}-1) + 1"
        )
    return out


def _pad(data: te.Tensor, pad: int, layout: str) -> te.Tensor:
    """Zero-padded copy of ``data`` (4-D, ``layout``), ``pad`` on each side of H and W."""
    import tvm
    from tvm import te

    zero = tvm.tirx.const(0.0, data.dtype)
    shape = [int(d) for d in data.shape]
    hi, wi = (2, 3) if layout == "NCHW" else (1, 2)
    height, width = shape[hi], shape[wi]

    def inside(h, w):
        return tvm.tirx.all(h >= pad, h < height + pad, w >= pad, w < width + pad)

    if layout == "NCHW":

        def padded(n, c, h, w):
            return tvm.tirx.if_then_else(inside(h, w), data[n, c, h - pad, w - pad], zero)

    else:

        def padded(n, h, w, c):
            return tvm.tirx.if_then_else(inside(h, w), data[n, h - pad, w - pad, c], zero)

    shape[hi] += 2 * pad
    shape[wi] += 2 * pad
    return te.compute(tuple(shape), padded, name="pad")


def conv_reference(
    data: np.ndarray, weight: np.ndarray, *, stride: int, pad: int, dilation: int
) -> np.ndarray:
    """Grouped NCHW convolution in float64.

    Args:
        data: ``(n, c, h, w)``.
        weight: ``(groups, k/groups, c/groups, r, s)``.

    Returns:
        ``(n, groups, k/groups, p, q)``.
    """
    g, kg, cg, r, s = weight.shape
    n, c, h, w = data.shape
    x = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    x = x.reshape(n, g, cg, h + 2 * pad, w + 2 * pad)
    p = (h + 2 * pad - dilation * (r - 1) - 1) // stride + 1
    q = (w + 2 * pad - dilation * (s - 1) - 1) // stride + 1
    wt = weight.astype(np.float64)
    out = np.zeros((n, g, kg, p, q))
    for ry in range(r):
        for rx in range(s):
            y0, x0 = ry * dilation, rx * dilation
            rows = slice(y0, y0 + stride * (p - 1) + 1, stride)
            cols = slice(x0, x0 + stride * (q - 1) + 1, stride)
            window = x[:, :, :, rows, cols]
            out += np.einsum("ngcpq,gkc->ngkpq", window, wt[:, :, :, ry, rx])
    return out


class Conv2d(Workload):
    """2-D convolution with stride, symmetric zero padding, dilation and groups.

    Tensors, with ``p = (h + 2*pad - dilation*(r-1) - 1) // stride + 1`` (``q`` likewise
    from ``w`` and ``s``):

    * NCHW: ``data[n, c, h, w]``, ``weight[k, c/groups, r, s]`` -> ``conv2d[n, k, p, q]``;
    * NHWC: ``data[n, h, w, c]``, ``weight[r, s, c/groups, k]`` (HWIO) -> ``conv2d[n, p, q, k]``.

    With ``groups > 1`` the group is an axis of its own, so that every index stays
    affine (the data channel read is ``g * c/groups + c``), and the output and weight are
    5-D with the same memory layout as above: NCHW ``weight[groups, k/groups, c/groups,
    r, s]`` -> ``conv2d[n, groups, k/groups, p, q]``; NHWC ``weight[r, s, c/groups,
    groups, k/groups]`` -> ``conv2d[n, p, q, groups, k/groups]``. The data stays 4-D.

    Stages: ``pad`` (only when ``pad > 0``), then the reduction ``conv2d``, which is the
    output. Its axes are named after the parameters: ``n, (g,) k, p, q`` (NCHW) or
    ``n, p, q, (g,) k`` (NHWC) spatial, then ``c, r, s`` (NCHW) or ``r, s, c`` (NHWC)
    reduced, ``c`` running over the ``c/groups`` channels of a group.
    """

    op = "conv2d"
    summary = "2-D convolution, NCHW or NHWC, with stride, padding, dilation and groups"
    shape_params = (
        *("n", "c", "h", "w", "k", "r", "s"),
        *("stride", "pad", "dilation", "groups", "layout"),
    )
    defaults = {"stride": 1, "pad": 0, "dilation": 1, "groups": 1, "layout": "NCHW"}
    choices = {"layout": LAYOUTS}
    example = "n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1"  # ResNet-50 conv2_x 3x3

    def __init__(
        self,
        *,
        n: int,
        c: int,
        h: int,
        w: int,
        k: int,
        r: int,
        s: int,
        stride: int = 1,
        pad: int = 0,
        dilation: int = 1,
        groups: int = 1,
        layout: str = "NCHW",
        dtype: str = "float32",
    ) -> None:
        op = "conv2d"
        sizes = {"n": n, "c": c, "h": h, "w": w, "k": k, "r": r, "s": s, "stride": stride}
        params: dict[str, Any] = {name: integer(op, name, v) for name, v in sizes.items()}
        params["pad"] = integer(op, "pad", pad, low=0)
        params["dilation"] = integer(op, "dilation", dilation)
        params["groups"] = integer(op, "groups", groups)
        params["layout"] = one_of(op, "layout", layout, LAYOUTS)
        g = params["groups"]
        for name in ("c", "k"):
            if params[name] % g:
                raise InvalidInputError(
                    f"conv2d {name}={params[name]} is not divisible by groups={g}; "
                    "accepted: groups dividing both c and k"
                )
        self.out_h = _out_size(op, "h", params, dilation=params["dilation"])
        self.out_w = _out_size(op, "w", params, dilation=params["dilation"])
        super().__init__(params, dtype=dtype)

    # -- shapes -------------------------------------------------------------------------
    @property
    def data_shape(self) -> tuple[int, ...]:
        n, c, h, w = (self.params[x] for x in ("n", "c", "h", "w"))
        return (n, c, h, w) if self.params["layout"] == "NCHW" else (n, h, w, c)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        k, c, r, s, g = (self.params[x] for x in ("k", "c", "r", "s", "groups"))
        if self.params["layout"] == "NCHW":
            return (k, c, r, s) if g == 1 else (g, k // g, c // g, r, s)
        return (r, s, c, k) if g == 1 else (r, s, c // g, g, k // g)

    @property
    def out_shape(self) -> tuple[int, ...]:
        n, k, g = self.params["n"], self.params["k"], self.params["groups"]
        p, q = self.out_h, self.out_w
        if self.params["layout"] == "NCHW":
            return (n, k, p, q) if g == 1 else (n, g, k // g, p, q)
        return (n, p, q, k) if g == 1 else (n, p, q, g, k // g)

    # -- compute ------------------------------------------------------------------------
    def stages(self) -> Stages:
        from tvm import te

        prm = self.params
        st, d, pad, layout = (prm[x] for x in ("stride", "dilation", "pad", "layout"))
        groups = prm["groups"]
        cg = prm["c"] // groups
        data = te.placeholder(self.data_shape, self.dtype, name="data")
        weight = te.placeholder(self.weight_shape, self.dtype, name="weight")
        src = _pad(data, pad, layout) if pad > 0 else data
        # Axis names (they name the schedule's knobs): n, g, k, p, q spatial; c, r, s reduced.
        rc = te.reduce_axis((0, cg), name="c")
        ry = te.reduce_axis((0, prm["r"]), name="r")
        rx = te.reduce_axis((0, prm["s"]), name="s")
        if layout == "NCHW" and groups == 1:

            def body(n, k, p, q):
                x = src[n, rc, p * st + ry * d, q * st + rx * d]
                return te.sum(x * weight[k, rc, ry, rx], axis=[rc, ry, rx])

        elif layout == "NCHW":

            def body(n, g, k, p, q):
                x = src[n, g * cg + rc, p * st + ry * d, q * st + rx * d]
                return te.sum(x * weight[g, k, rc, ry, rx], axis=[rc, ry, rx])

        elif groups == 1:

            def body(n, p, q, k):
                x = src[n, p * st + ry * d, q * st + rx * d, rc]
                return te.sum(x * weight[ry, rx, rc, k], axis=[ry, rx, rc])

        else:

            def body(n, p, q, g, k):
                x = src[n, p * st + ry * d, q * st + rx * d, g * cg + rc]
                return te.sum(x * weight[ry, rx, rc, g, k], axis=[ry, rx, rc])

        out = te.compute(self.out_shape, body, name="conv2d")
        intermediates = (src,) if pad > 0 else ()
        return Stages(inputs=(data, weight), outputs=(out,), intermediates=intermediates, main=out)

    def flops(self) -> float:
        prm = self.params
        return 2.0 * prm["n"] * prm["k"] * self.out_h * self.out_w * self._reduction_length()

    def _reduction_length(self) -> int:
        prm = self.params
        return prm["c"] // prm["groups"] * prm["r"] * prm["s"]

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {
            "data": rng.uniform(-1, 1, self.data_shape).astype(self.dtype),
            "weight": rng.uniform(-1, 1, self.weight_shape).astype(self.dtype),
        }

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prm = self.params
        g, r, s = prm["groups"], prm["r"], prm["s"]
        kg, cg = prm["k"] // g, prm["c"] // g
        data, weight = inputs["data"], inputs["weight"]
        if prm["layout"] == "NCHW":
            wt = weight.reshape(g, kg, cg, r, s)
        else:
            data = data.transpose(0, 3, 1, 2)
            wt = weight.reshape(r, s, cg, g, kg).transpose(3, 4, 2, 0, 1)
        out = conv_reference(
            data, wt, stride=prm["stride"], pad=prm["pad"], dilation=prm["dilation"]
        )
        if prm["layout"] == "NHWC":
            out = out.transpose(0, 3, 4, 1, 2)
        return {"conv2d": out.reshape(self.out_shape).astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        return contraction_tolerance(self._reduction_length())


class DepthwiseConv2d(Workload):
    """Depthwise 2-D convolution (channel multiplier 1) with stride and zero padding.

    * NCHW: ``data[n, c, h, w]``, ``weight[c, r, s]`` -> ``depthwise_conv2d[n, c, p, q]``;
    * NHWC: ``data[n, h, w, c]``, ``weight[r, s, c]`` -> ``depthwise_conv2d[n, p, q, c]``;

    with ``p = (h + 2*pad - r) // stride + 1``. Stages: ``pad`` (only when ``pad > 0``),
    then the reduction ``depthwise_conv2d``, which is the output; axes ``n, c, p, q``
    (NCHW) or ``n, p, q, c`` (NHWC) spatial, then ``r, s`` reduced.
    """

    op = "depthwise_conv2d"
    summary = "depthwise 2-D convolution (channel multiplier 1), NCHW or NHWC"
    shape_params = ("n", "c", "h", "w", "r", "s", "stride", "pad", "layout")
    defaults = {"stride": 1, "pad": 0, "layout": "NCHW"}
    choices = {"layout": LAYOUTS}
    example = "n=1,c=144,h=56,w=56,r=3,s=3,stride=1,pad=1"  # MobileNetV2 block 2

    def __init__(
        self,
        *,
        n: int,
        c: int,
        h: int,
        w: int,
        r: int,
        s: int,
        stride: int = 1,
        pad: int = 0,
        layout: str = "NCHW",
        dtype: str = "float32",
    ) -> None:
        op = "depthwise_conv2d"
        sizes = {"n": n, "c": c, "h": h, "w": w, "r": r, "s": s, "stride": stride}
        params: dict[str, Any] = {name: integer(op, name, v) for name, v in sizes.items()}
        params["pad"] = integer(op, "pad", pad, low=0)
        params["layout"] = one_of(op, "layout", layout, LAYOUTS)
        self.out_h = _out_size(op, "h", params, dilation=1)
        self.out_w = _out_size(op, "w", params, dilation=1)
        super().__init__(params, dtype=dtype)

    @property
    def data_shape(self) -> tuple[int, ...]:
        n, c, h, w = (self.params[x] for x in ("n", "c", "h", "w"))
        return (n, c, h, w) if self.params["layout"] == "NCHW" else (n, h, w, c)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        c, r, s = self.params["c"], self.params["r"], self.params["s"]
        return (c, r, s) if self.params["layout"] == "NCHW" else (r, s, c)

    @property
    def out_shape(self) -> tuple[int, ...]:
        n, c, p, q = self.params["n"], self.params["c"], self.out_h, self.out_w
        return (n, c, p, q) if self.params["layout"] == "NCHW" else (n, p, q, c)

    def stages(self) -> Stages:
        from tvm import te

        prm = self.params
        st, pad, layout = prm["stride"], prm["pad"], prm["layout"]
        data = te.placeholder(self.data_shape, self.dtype, name="data")
        weight = te.placeholder(self.weight_shape, self.dtype, name="weight")
        src = _pad(data, pad, layout) if pad > 0 else data
        ry = te.reduce_axis((0, prm["r"]), name="r")
        rx = te.reduce_axis((0, prm["s"]), name="s")
        if layout == "NCHW":

            def body(n, c, p, q):
                x = src[n, c, p * st + ry, q * st + rx]
                return te.sum(x * weight[c, ry, rx], axis=[ry, rx])

        else:

            def body(n, p, q, c):
                x = src[n, p * st + ry, q * st + rx, c]
                return te.sum(x * weight[ry, rx, c], axis=[ry, rx])

        out = te.compute(self.out_shape, body, name="depthwise_conv2d")
        intermediates = (src,) if pad > 0 else ()
        return Stages(inputs=(data, weight), outputs=(out,), intermediates=intermediates, main=out)

    def flops(self) -> float:
        prm = self.params
        return 2.0 * prm["n"] * prm["c"] * self.out_h * self.out_w * prm["r"] * prm["s"]

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {
            "data": rng.uniform(-1, 1, self.data_shape).astype(self.dtype),
            "weight": rng.uniform(-1, 1, self.weight_shape).astype(self.dtype),
        }

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prm = self.params
        data, weight = inputs["data"], inputs["weight"]
        if prm["layout"] == "NHWC":
            data, weight = data.transpose(0, 3, 1, 2), weight.transpose(2, 0, 1)
        wt = weight.reshape(prm["c"], 1, 1, prm["r"], prm["s"])  # c groups of one channel
        out = conv_reference(data, wt, stride=prm["stride"], pad=prm["pad"], dilation=1)
        out = out.reshape(prm["n"], prm["c"], self.out_h, self.out_w)
        if prm["layout"] == "NHWC":
            out = out.transpose(0, 2, 3, 1)
        return {"depthwise_conv2d": out.astype(self.dtype)}

    def tolerance(self) -> tuple[float, float]:
        return contraction_tolerance(self.params["r"] * self.params["s"])
