"""Vector ``exp``, ``erf`` and ``tanh`` where TVM 0.27 lacks them.

Every schedule of every family goes through :func:`autosched.space.schedule.apply`,
which calls :func:`vector_math` first, so a kernel's code never depends on what else
the process built before it.
"""

from __future__ import annotations

_VECTOR_MATH_READY = False


def vector_math() -> None:
    """Vector ``exp``, ``erf`` and ``tanh`` where TVM 0.27 lacks them (once per process).

    * ``erf`` is not marked vectorisable, so TVM scalarises any vectorised loop that
      calls it (a GELU): on PoCL a scalar ``erf`` costs ~30 ns per element, one of a
      ``float16`` ~2 ns. OpenCL C has ``erf`` for every vector type, but a float32
      ``erf`` (vector or scalar) on OpenCL becomes the same arithmetic as on llvm
      (below): on a Xeon's PoCL (2026-12-05, interleaved) a 2364 x 197 bias add + GELU
      in ``float16`` ran 0.65 ms with the builtin ``erf`` and 0.11 ms with it (2364 x
      256: 0.68 and 0.18 ms). So does a float32 ``tanh`` (below): PoCL's builtin took
      0.39 ns per value in ``float16``, the arithmetic 0.18 (4M values, the memory
      floor ~0.18-0.28). ``exp`` keeps OpenCL's builtin (0.18 ns), which ran a softmax
      there 10-15 % faster than Cephes' arithmetic.
    * LLVM has no vector ``exp`` or ``erf``: it calls libm once per lane, so vectors
      bought nothing for softmax or GELU on the llvm target. A float32 vector ``exp``
      now becomes Cephes' ``expf`` (range reduction and a degree-6 polynomial, within
      1 ulp), a float32 vector ``erf`` Eigen's rational approximation (within 8 ulp,
      where OpenCL C allows 16); other types keep libm.
    * A scalar float32 ``exp`` becomes the same arithmetic, not a call: LLVM's loop
      vectorizer then vectorises a loop the schedule left scalar, such as a row of 197
      columns (a ViT's attention) that no vector width divides. On a Zen 5 a
      1182 x 197 softmax on llvm ran 0.61 ms at best with libm's ``expf``, 0.27 ms with
      this (the same configs, one process; float32 results within 2 ulp as before).
    * TVM's llvm ``tanh`` ran 0.32 ms on 393,216 float32 values in 16 lanes on 2 Zen 3
      cores, four times its ``exp``: GPT-2's tanh GELU took 0.35 ms tuned. A float32
      ``tanh`` (vector or scalar) now becomes Eigen's rational approximation (TVM's
      ``topi.fast_tanh``; within 5 ulp, as OpenCL C allows): 0.077 ms.

    This changes TVM's operator table for the process; ``apply`` calls it before every
    schedule, so every build in every process sees the same table.
    """
    global _VECTOR_MATH_READY
    if _VECTOR_MATH_READY:
        return
    import tvm
    from tvm import tirx

    erf = tvm.ir.Op.get("tirx.erf")
    if erf.get_attr("TVectorizable") is None:
        tvm.ir.register_op_attr("tirx.erf", "TVectorizable", True)
    scalar_erf = erf.get_attr("llvm.FLowerIntrinsic") or erf.get_attr("default.FLowerIntrinsic")

    def lower_erf(call):
        dtype = _dtype(call)
        (x,) = call.args
        if dtype.lanes > 1 and dtype.bits == 32:
            return _erf_rational(x, str(dtype))
        if dtype.lanes == 1:
            return scalar_erf(call)
        scalar = f"float{dtype.bits}"
        name = "erff" if dtype.bits == 32 else "erf"
        lanes = [
            tirx.call_pure_extern(scalar, name, tirx.Shuffle([x], [i])) for i in range(dtype.lanes)
        ]
        return tirx.Shuffle(lanes, list(range(dtype.lanes)))

    tvm.ir.register_op_attr("tirx.erf", "llvm.FLowerIntrinsic", lower_erf, level=20)
    _lower_float32("tirx.erf", _erf_rational, target="opencl")
    _lower_float32("tirx.tanh", _tanh_rational, target="opencl")
    _lower_float32("tirx.exp", _exp_cephes)
    _lower_float32("tirx.tanh", _tanh_rational)
    _VECTOR_MATH_READY = True


def _lower_float32(op_name: str, arithmetic, target: str = "llvm") -> None:
    """Lower ``op_name`` on ``target`` to ``arithmetic(x, dtype)`` for float32, vector or
    scalar; other types keep TVM's own rule."""
    import tvm

    original = tvm.ir.Op.get(op_name).get_attr(f"{target}.FLowerIntrinsic")
    if original is None:
        return

    def lower(call):
        dtype = _dtype(call)
        if dtype.bits == 32 and dtype.is_float:
            return arithmetic(call.args[0], str(dtype))
        return original(call)

    tvm.ir.register_op_attr(op_name, f"{target}.FLowerIntrinsic", lower, level=20)


def _dtype(call):
    import tvm

    return tvm.DataType(str(getattr(call, "dtype", None) or call.ty))


# Eigen's rational approximation of erf on [-4, 4] (TVM's ``topi.fast_erf``).
_ERF_NUM = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_DEN = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)
# Eigen's rational approximation of tanh on [-7.9, 7.9] (TVM's ``topi.fast_tanh``): an odd
# degree-13 numerator over an even degree-6 denominator, in x^2.
_TANH_NUM = (
    -2.76076847742355e-16,
    2.00018790482477e-13,
    -8.60467152213735e-11,
    5.12229709037114e-08,
    1.48572235717979e-05,
    6.37261928875436e-04,
    4.89352455891786e-03,
)
_TANH_DEN = (
    1.19825839466702e-06,
    1.18534705686654e-04,
    2.26843463243900e-03,
    4.89352518554385e-03,
)
_TANH_CLAMP = 7.90531110763549805  # tanh is 1 to float32 precision beyond
# Cephes' expf: exp(x) = 2^n * exp(r), r = x - n ln2 in two parts, exp(r) a polynomial.
_EXP_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
_EXP_MIN, _EXP_MAX = -87.33654, 88.72283  # the normal float32 range of exp


def _erf_rational(x, dtype: str):
    return _odd_rational(x, dtype, 4.0, _ERF_NUM, _ERF_DEN)


def _tanh_rational(x, dtype: str):
    return _odd_rational(x, dtype, _TANH_CLAMP, _TANH_NUM, _TANH_DEN)


def _odd_rational(x, dtype: str, clamp: float, num_coefs, den_coefs):
    """``x * num(x^2) / den(x^2)`` with ``x`` clamped to ``[-clamp, clamp]`` (Horner,
    highest power first); NaN stays NaN."""
    from tvm import tirx

    def c(v: float):
        return tirx.const(v, dtype)

    xc = tirx.max(tirx.min(x, c(clamp)), c(-clamp))
    x2 = xc * xc
    num = c(num_coefs[0])
    for coef in num_coefs[1:]:
        num = num * x2 + c(coef)
    den = c(den_coefs[0])
    for coef in den_coefs[1:]:
        den = den * x2 + c(coef)
    return tirx.Select(tirx.isnan(x), x, xc * num / den)


def _exp_cephes(x, dtype: str):
    import tvm
    from tvm import tirx

    def c(v: float):
        return tirx.const(v, dtype)

    lanes = tvm.DataType(dtype).lanes
    xc = tirx.max(tirx.min(x, c(_EXP_MAX)), c(_EXP_MIN))
    n = tirx.floor(xc * c(1.44269504088896341) + c(0.5))
    r = xc - n * c(0.693359375) - n * c(-2.12194440e-4)
    poly = c(_EXP_POLY[0])
    for coef in _EXP_POLY[1:]:
        poly = poly * r + c(coef)
    y = poly * r * r + r + c(1.0)
    ints = f"int32x{lanes}" if lanes > 1 else "int32"
    scale = tirx.reinterpret(dtype, (n.astype(ints) + 127) << 23)
    out = y * scale
    # Past the normal range: 0 below, infinity above, NaN stays NaN.
    out = tirx.Select(x < c(_EXP_MIN), c(0.0), out)
    out = tirx.Select(x > c(_EXP_MAX), c(float("inf")), out)
    return tirx.Select(tirx.isnan(x), x, out)
