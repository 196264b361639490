"""OpenCL C from TVM, with a reduction's vector of partial results kept in a register.

TVM writes a reduction split over vector lanes (``rfactor``: the row-wise family's sums
and maxima, ``vec`` partial results per row) as a private array of scalars,
``float acc[16];``, read and written whole (``vload16(0, acc + 0)``,
``vstore16(v, 0, acc + 0)``) and lane by lane (``acc[3]`` in the final sum; ``acc[i]``
in a loop over the lanes of a row's last, partial vector, where the schedule leaves that
to TVM: the row-wise family's own unrolls it, ``rowwise_schedule._split_tail``). It
types a private array as vectors only where every access is a whole vector (a matmul's
register tile is ``float16 C_local[16]``), so the lane accesses keep this one scalar.
PoCL (3.1 on LLVM 15) then leaves the array in memory, a store and a load around every
step of the reduction's chain. Declared as one vector variable instead
(``float16 acc;``, whole: ``acc``, a constant lane: ``acc.s3``, a lane the code
computes: ``((float*)&acc)[i]``), the same kernels keep it in registers. On a Zen 5's
PoCL (``pthread-skylake-avx512``), each config's program timed both ways by autosched's
runner, three rounds interleaved: the best config of a 48-trial tune of the 197 x 768
layernorm 22-28 us against 51-56 us, of the 2364 x 197 softmax (16-wide vectors, a
five-lane tail) 131-132 us against 245-247 us; a conv2d config whose register tile is
walked by a computed lane, 11.4-11.7 ms both ways. (A hand-written layernorm kernel
with vector accumulators: 22-27 us.)

:func:`vector_accumulators` rewrites only arrays read or written whole at least once and
whose every use is one of those forms; any other use (an offset, the array passed on)
leaves the array as TVM wrote it, and so does an array used lane by lane only (a
contraction's register tile of 4 or 16 scalars, which compilers keep in registers as it
is).
"""

from __future__ import annotations

import re

LANES = (2, 3, 4, 8, 16)  # OpenCL C's vector widths (float3 has lanes s0-s2)

_DECLARATION = re.compile(r"^[ \t]*float (\w+)\[(\d+)\];[ \t]*$", re.M)
_KERNEL = re.compile(r"^(?=__kernel )", re.M)  # where each kernel's text begins


def vector_accumulators(source: str) -> str:
    """``source`` with each private ``float NAME[n]`` (n an OpenCL vector width) that is
    loaded or stored whole and otherwise read or written a lane at a time declared as a
    ``floatn`` variable instead, kernel by kernel (TVM gives each kernel's arrays the
    same names). Everything else is left as it is."""
    return "".join(_in_kernel(text) for text in _KERNEL.split(source))


def _in_kernel(text: str) -> str:
    for match in list(_DECLARATION.finditer(text)):
        name, lanes = match.group(1), int(match.group(2))
        if lanes in LANES:
            text = _as_vector(text, name, lanes)
    return text


def _as_vector(source: str, name: str, lanes: int) -> str:
    declaration = re.compile(rf"^([ \t]*)float {name}\[{lanes}\];", re.M)
    load = f"vload{lanes}(0, {name} + 0)"
    store = re.compile(rf"^([ \t]*)vstore{lanes}\((.*), 0, {name} \+ 0\);[ \t]*$", re.M)
    lane = re.compile(rf"\b{name}\[([^\[\]]+)\]")
    stores = [m for m in store.finditer(source) if _balanced(m.group(2))]
    lane_uses = [m for m in lane.finditer(source) if _lane(m.group(1), lanes)]
    whole = source.count(load) + len(stores)
    known = 1 + whole + len(lane_uses)
    if len(declaration.findall(source)) != 1 or known != len(re.findall(rf"\b{name}\b", source)):
        return source
    if not whole:  # scalars only (a register tile's accumulators): LLVM keeps them already
        return source
    out = declaration.sub(rf"\1float{lanes} {name};", source)
    out = out.replace(load, name)
    out = store.sub(lambda m: f"{m.group(1)}{name} = {m.group(2)};", out)
    return lane.sub(lambda m: _lane_of(name, m.group(1)), out)


def _lane(index: str, lanes: int) -> bool:
    """Whether ``index`` is a lane of the vector: a constant below ``lanes``, or an
    expression the code computes (TVM's loop over a partial vector's lanes, each one
    guarded; a constant past the end is not a lane)."""
    index = index.strip()
    return int(index) < lanes if index.isdigit() else _balanced(index)


def _lane_of(name: str, index: str) -> str:
    index = index.strip()
    if index.isdigit():
        return f"{name}.s{int(index):x}"
    return f"((float*)&{name})[{index}]"  # OpenCL C names no lane by a computed index


def _balanced(expression: str) -> bool:
    """Whether ``expression``'s parentheses pair up (the store's value is one expression)."""
    depth = 0
    for ch in expression:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return False
    return depth == 0
