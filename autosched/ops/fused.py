"""A fused PrimFunc of a model as a workload: what a Relax module's fusion produced.

A :class:`FusedFunc` holds the function's normalised TVMScript, so a record carries all a
farm worker needs to rebuild it (``tvm.script.from_source``), and its key (a hash of the
text) is the same on every machine for the same computation. Normalising
(:func:`normalize`) renames the function to ``main``, its parameters to ``p0, p1, ...``
(and the buffers and blocks topi named after them), and drops the attributes that do
not change the computation (``global_symbol``, ``op_pattern``): two calls of one
operator on tensors that Relax happened to name differently are one workload. It also
inlines the stages a space family does not need to see: a contraction's chain of
elementwise epilogue blocks becomes one block, and a per-row value computed from a
reduction (layer norm's mean) is recomputed where it is read.

The reference is the untuned function itself, built by TVM for llvm: a model's fused
function has no numpy twin, and what a schedule must preserve is what TVM computes
without one. A FusedFunc has no scratch intermediates: whatever a schedule leaves
unfused stays a buffer the function allocates.
"""

from __future__ import annotations

import logging
import math
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from autosched.errors import InvalidInputError, ScheduleError
from autosched.ops._common import contraction_tolerance
from autosched.ops.base import TensorSpec, Workload

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

_KEPT_ATTRS = ("tirx.noalias", "s_tir")
# A fused function that one model run calls several times on the same constant weights
# (autosched.tvm.tasks.mark_reused_operands).
REUSED_ATTR = "autosched.reused_operands"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def normalize(func: tvm.tirx.PrimFunc) -> str:
    """The normalised TVMScript of ``func`` (see the module docstring)."""
    import tvm

    bare = _inline_epilogue(_inline_row_values(func))
    for key in list(func.attrs.keys() if func.attrs else ()):
        if key not in _KEPT_ATTRS:
            bare = bare.without_attr(key)
    text = tvm.IRModule({"main": bare}).script()
    params = [str(p.name) for p in func.params]
    rename = {name: f"p{i}" for i, name in enumerate(params)}
    prefixes = sorted(params, key=len, reverse=True)

    def renamed(match: re.Match) -> str:
        word = match.group(0)
        if word in rename:
            return rename[word]
        for p in prefixes:
            if word.startswith(p + "_"):
                return rename[p] + word[len(p) :]
        return word

    body = _IDENT.sub(renamed, text.split("class Module:", 1)[1])
    return text.split("class Module:", 1)[0] + "class Module:" + body


def _inline_row_values(func):
    """``func`` with every per-row value computed from a reduction's result inlined into its
    readers (layer norm's ``mean = sum / n``): a map over fewer axes than the function's
    largest block, reading only what reductions wrote, into an intermediate buffer. It
    costs a division per use and leaves the stages a row-wise space knows: reductions and
    maps over the whole rows and columns."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    root = sch.get_sblock("root")
    allocated = {buf.name for buf in sch.get(root).alloc_buffers}
    blocks = [sch.get(b) for b in sch.get_child_blocks(root)]
    rank = max((len(b.iter_vars) for b in blocks), default=0)
    reduced = {
        w.source.name
        for b in blocks
        if any(int(iv.iter_type) == 2 for iv in b.iter_vars)
        for w in b.writes
    }
    row_values = [
        block
        for block in blocks
        if all(int(iv.iter_type) == 0 for iv in block.iter_vars)
        and len(block.iter_vars) < rank
        and len(block.writes) == 1
        and block.writes[0].source.name in allocated
        and block.reads
        and all(r.source.name in reduced for r in block.reads)
    ]
    return sch.mod["main"] if inline(sch, row_values) else func


def _inline_epilogue(func):
    """``func`` with the intermediate elementwise blocks after its one reduction inlined
    into their readers, so the epilogue is one block per output (a GELU's six blocks, a
    batch norm's four, one of which two blocks read, become one), as a TE workload's."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    root = sch.get_sblock("root")
    allocated = {buf.name for buf in sch.get(root).alloc_buffers}
    blocks = [sch.get(b) for b in sch.get_child_blocks(root)]
    reductions = [
        i for i, b in enumerate(blocks) if any(int(iv.iter_type) == 2 for iv in b.iter_vars)
    ]
    if len(reductions) != 1:
        return func
    epilogue = [
        block
        for block in blocks[reductions[0] + 1 :]
        if all(int(iv.iter_type) == 0 for iv in block.iter_vars)
        and len(block.writes) == 1
        and block.writes[0].source.name in allocated
    ]
    return sch.mod["main"] if inline(sch, epilogue) else func


def inline(sch, blocks) -> bool:
    """Inline each of ``blocks`` into its readers where TVM allows it; whether any was."""
    changed = False
    for block in blocks:
        try:
            sch.compute_inline(sch.get_sblock(block.name_hint))
            changed = True
        except Exception as exc:  # TVM refuses: keep the block
            log.debug("not inlined: %s (%s)", block.name_hint, exc)
    return changed


TASKS_PER_CORE = 16  # parallel tasks per core in a default schedule, for balance


def parallel_leading(sch, loops, *, cores: int):
    """Fuse as many of ``loops`` (leading spatial loops, outermost first) as give each of
    ``cores`` :data:`TASKS_PER_CORE` tasks into one parallel loop, the rest left plain
    inside it (fusing all of them re-derives every index by division and modulo per
    element); the parallel loop."""
    take, tasks = 0, 1
    while take < len(loops) and tasks < TASKS_PER_CORE * max(1, cores):
        tasks *= int(sch.get(loops[take]).extent)
        take += 1
    outer = sch.fuse(*loops[:take]) if take > 1 else loops[0]
    sch.parallel(outer)
    return outer


class FusedFunc(Workload):
    """A model's fused PrimFunc (op ``"fused"``): ``script`` is :func:`normalize`'s text;
    ``name`` is only shown (it is not part of the key or of the records)."""

    op = "fused"
    summary = "a fused PrimFunc of a model (made by autosched.tvm.tasks, not by hand)"
    # In a model run its first argument is the activation the previous function just
    # wrote; its weights (the arguments after it, by Relax's calling order) come from
    # memory: timed with warm caches, a weight-heavy function looks up to 1.5x faster
    # than it runs, and the search ranks its configs by the wrong cost. Unless the run
    # calls it again and again on the same weights (``reused``, see flush_operands).
    cold_operands = True
    shape_params = ("name", "script")

    def __init__(
        self, script: str, *, name: str = "fused", dtype: str = "float32", reused: bool = False
    ) -> None:
        if not isinstance(name, str) or not isinstance(script, str) or "def main" not in script:
            raise InvalidInputError(
                "a fused workload needs a script (normalised TVMScript with a main) and a name"
            )
        params = {"name": name, "script": script}
        if reused:
            params["reused"] = True
        super().__init__(params, dtype=dtype)

    @property
    def reused(self) -> bool:
        """Whether one model run calls it on the same weights several times (a recurrent
        layer's step: :func:`autosched.tvm.tasks.mark_reused_operands`)."""
        return bool(self.params.get("reused"))

    @classmethod
    def of(cls, func: tvm.tirx.PrimFunc, name: str) -> FusedFunc:
        """The workload of ``func`` (any fused PrimFunc), shown as ``name``."""
        reused = bool(func.attrs and func.attrs.get(REUSED_ATTR))
        return cls(normalize(func), name=name, reused=reused)

    def to_json(self) -> dict[str, Any]:
        # The display name is not part of the computation: the key must not depend on it.
        # Nor does "reused" change it where it is not set (the keys from before it stand).
        params: dict[str, Any] = {"script": self.script}
        if self.reused:
            params["reused"] = True
        return {"op": self.op, "params": params, "dtype": self.dtype}

    def flush_operands(self, limits: Any) -> bool:
        """Cold, as a model run reads its weights, except where the run calls it on the
        same weights again and again and they fit in the device's largest cache (a
        recurrent layer's step and its recurrence weights, read once per step: timed
        cold, the LSTM step's best config ran 3.2x slower warm than the best warm one)."""
        caches = getattr(limits, "cache_bytes", ()) or ()
        if not self.reused or not caches:
            return True
        weights = sum(t.nbytes for t in self.tensor_specs()[1:] if t.role == "input")
        return weights > max(caches)

    def __repr__(self) -> str:
        return f"fused({self.params['name']})"

    @classmethod
    def params_text(cls, params: dict[str, Any]) -> str | None:
        script = params.get("script")
        return script_summary(script) if isinstance(script, str) else None

    # -- the function ---------------------------------------------------------------
    def prim_func(self, *, scratch: Any = ()) -> tvm.tirx.PrimFunc:
        """The normalised function, exported as ``main`` as TE's functions are (there are
        no scratch arguments)."""
        return _parse(self.script).with_attr("global_symbol", "main")

    def tensor_specs(self, *, scratch: Any = ()) -> list[TensorSpec]:
        return list(_specs(self.script))

    def main_stage(self) -> str | None:
        return None

    # -- measurement ------------------------------------------------------------------
    def flops(self) -> float:
        """2 x the iterations of the reduction block for one reduction (a contraction);
        otherwise the elements of every block's iteration space, summed (a row-wise or
        elementwise function moves data more than it computes; this counts its work)."""
        return _flops(self.script)

    def make_inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Floats uniform in [-1, 1); integers and bools 0 or 1 at random (a mask with
        both values, an index in range of any axis longer than 1: uniform floats cast
        to an integer were all 0, and a masked softmax's test data masked every row, so
        a kernel that got the softmax wrong passed)."""
        return {
            t.name: (
                rng.uniform(-1.0, 1.0, t.shape).astype(t.dtype)
                if np.dtype(t.dtype).kind in "fc"
                else rng.integers(0, 2, t.shape).astype(t.dtype)
            )
            for t in self.tensor_specs()
            if t.role == "input"
        }

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of the untuned function built by TVM for llvm (single-threaded)."""
        import tvm

        lib = _untuned(self.script)
        dev = tvm.cpu()
        args, outputs = [], {}
        for t in self.tensor_specs():
            if t.role == "input":
                args.append(tvm.runtime.tensor(inputs[t.name], dev))
            else:
                out = tvm.runtime.tensor(np.zeros(t.shape, t.dtype), dev)
                outputs[t.name] = out
                args.append(out)
        lib["main"](*args)
        return {name: out.numpy() for name, out in outputs.items()}

    def tolerance(self) -> tuple[float, float]:
        """From the longest reduction: float32 error grows with its length."""
        length = 1
        for block in _blocks(self.prim_func()):
            red = [int(iv.dom.extent) for iv in block.iter_vars if int(iv.iter_type) == 2]
            length = max(length, math.prod(red))
        return contraction_tolerance(length)


def _parse(script: str):
    """A fresh copy of the function each call: a ``tvm.s_tir.Schedule`` changes nodes of
    the function it is given in place (a cached function scheduled once came back wrong).
    The script is parsed once; copying through TVM's JSON costs a tenth of parsing."""
    import tvm

    return tvm.ir.load_json(tvm.ir.save_json(_pristine(script)))


@lru_cache(maxsize=64)
def _pristine(script: str):
    import tvm

    try:
        mod = tvm.script.from_source(script)
    except Exception as exc:  # TVM's parser raises its own diagnostics
        raise InvalidInputError(f"the fused workload's script does not parse: {exc}") from None
    return mod["main"]


@lru_cache(maxsize=64)
def _specs(script: str) -> tuple[TensorSpec, ...]:
    func = _parse(script)
    written = _written(func)
    return tuple(
        TensorSpec(str(b.name), tuple(int(d) for d in b.shape), str(b.dtype), role)
        for b in func.params
        for role in ["output" if b.name in written else "input"]
    )


@lru_cache(maxsize=64)
def _flops(script: str) -> float:
    func = _parse(script)
    blocks = _blocks(func)
    reductions = [b for b in blocks if any(int(iv.iter_type) == 2 for iv in b.iter_vars)]
    if len(reductions) == 1:
        try:
            from autosched.space.loopnest import analyze_prim_func

            analyze_prim_func(func)
            return 2.0 * _iterations(reductions[0])
        except ScheduleError:
            pass
    return float(sum(_iterations(b) for b in blocks))


@lru_cache(maxsize=16)
def _untuned(script: str):
    import tvm

    func = _parse(script).with_attr("global_symbol", "main")
    return tvm.compile(tvm.IRModule({"main": func}), target="llvm")


def _blocks(func) -> list:
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    out = []

    def walk(block_rv) -> None:
        for child in sch.get_child_blocks(block_rv):
            out.append(sch.get(child))
            walk(child)

    walk(sch.get_sblock("root"))
    return out


def _written(func) -> set[str]:
    return {w.source.name for b in _blocks(func) for w in b.writes}


def _iterations(block) -> int:
    return math.prod(int(iv.dom.extent) for iv in block.iter_vars)


# -- a script in one line, read from its text (a records table must not need TVM) ----------
_MAIN = re.compile(r"def main\((.*?)\):\s*$", re.M)
_BUFFER = re.compile(r"(\w+): T\.Buffer\(\(((?:[^()]|\([^()]*\))*)\),\s*\"(\w+)\"")
_DIM = re.compile(r"T\.int(?:32|64)\((\w+)\)|(\w+)")
_BLOCK = re.compile(r"^\s*with T\.sblock\(\"([^\"]+)\"\)", re.M)
_WRITE = re.compile(r"T\.writes\((\w+)\[")


def script_summary(script: str, *, blocks: int = 3) -> str:
    """A fused function's script in one line: its first blocks (by name) and the shapes
    of its arguments, the written ones after the arrow, e.g. ``matmul, T_add1:
    16x64, 64x32, 32 -> 16x32``; ``float32`` is left unsaid."""
    main = _MAIN.search(script)
    args = _BUFFER.findall(main.group(1)) if main else []
    if not args:
        return f"a script of {script.count(chr(10)) + 1} lines"
    written = set(_WRITE.findall(script))

    def shape(name: str, dims: str, dtype: str) -> str:
        text = "x".join(a or b for a, b in _DIM.findall(dims)) or "scalar"
        return text if dtype == "float32" else f"{text} {dtype}"

    ins = [shape(*a) for a in args if a[0] not in written]
    outs = [shape(*a) for a in args if a[0] in written]
    names = _BLOCK.findall(script)
    shown = ", ".join(names[:blocks]) + (f" +{len(names) - blocks}" if len(names) > blocks else "")
    return f"{shown}: {', '.join(ins)} -> {', '.join(outs)}"
