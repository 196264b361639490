"""ATen ops that TVM's Relax torch frontend (0.27) has no converter for, or converts
wrongly, rewritten into ops it converts before the import.

``torch.export``'s core decompositions leave some ops whole that the frontend lacks:
``amax`` (also what ``logsumexp`` becomes), ``amin``, ``min.dim``, ``var_mean`` and
``hypot``; and its ``native_group_norm`` converter fails on a group norm without an
affine weight and bias (``GroupNorm(affine=False)``: "Found null pointer node"). Each is
rewritten here in ops the frontend converts (``max.dim``, ``argmax``, ``var``,
``mean``), with torch's own semantics; a program without them is left as it is.
"""

from __future__ import annotations

from typing import Any


def rewrite(program: Any) -> Any:
    """``program`` (a ``torch.export`` program, core-decomposed) with every op of this
    module's table that it calls rewritten; the same program where it calls none."""
    table = _table()
    needed = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in table:
            continue
        rule, applies = table[node.target]
        if applies(node):
            needed[node.target] = rule
    return program.run_decompositions(needed) if needed else program


def _table() -> dict[Any, tuple[Any, Any]]:
    import torch

    aten = torch.ops.aten
    always = _always
    return {
        aten.amax.default: (_amax, always),
        aten.amin.default: (_amin, always),
        aten.min.dim: (_min_dim, always),
        aten.var_mean.correction: (_var_mean, always),
        aten.hypot.default: (_hypot, always),
        aten.native_group_norm.default: (_group_norm, _without_affine),
    }


def _always(node: Any) -> bool:
    return True


def _without_affine(node: Any) -> bool:
    weight, bias = node.args[1], node.args[2]
    return weight is None or bias is None


def _dims(x: Any, dim: Any) -> list[int]:
    """The dimensions a reduction's ``dim`` names (all where it names none), ascending."""
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % max(1, x.dim()) for d in dims})


def _amax(x: Any, dim: Any = (), keepdim: bool = False) -> Any:
    import torch

    for d in reversed(_dims(x, dim)):  # the highest first: the lower ones keep their place
        x = torch.ops.aten.max.dim(x, d, keepdim)[0]
    return x


def _amin(x: Any, dim: Any = (), keepdim: bool = False) -> Any:
    return -_amax(-x, dim, keepdim)


def _min_dim(x: Any, dim: int, keepdim: bool = False) -> tuple[Any, Any]:
    import torch

    values = -torch.ops.aten.max.dim(-x, dim, keepdim)[0]
    # argmin: the first index of the minimum, as torch.min returns it.
    return values, torch.ops.aten.argmin.default(x, dim, keepdim)


def _var_mean(
    x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> tuple[Any, Any]:
    import torch

    aten = torch.ops.aten
    dims = _dims(x, dim)
    var = aten.var.correction(x, dims, correction=correction, keepdim=keepdim)
    return var, aten.mean.dim(x, dims, keepdim)


def _hypot(x: Any, y: Any) -> Any:
    import torch

    return torch.sqrt(x * x + y * y)


def _group_norm(
    x: Any, weight: Any, bias: Any, n: int, c: int, hxw: int, group: int, eps: float
) -> tuple[Any, Any, Any]:
    import torch

    aten = torch.ops.aten
    grouped = aten.reshape.default(x, [n, group, -1])
    mean = aten.mean.dim(grouped, [2], True)
    var = aten.var.correction(grouped, [2], correction=0, keepdim=True)
    rstd = aten.rsqrt.default(var + eps)
    y = aten.reshape.default((grouped - mean) * rstd, list(x.shape))
    per_channel = [1, c] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * aten.reshape.default(weight, per_channel)
    if bias is not None:
        y = y + aten.reshape.default(bias, per_channel)
    return y, aten.reshape.default(mean, [n, group]), aten.reshape.default(rstd, [n, group])
