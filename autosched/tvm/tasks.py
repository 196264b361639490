"""A model's tuning tasks: every fused PrimFunc with its weight, and the space that fits it.

One pass pipeline (:func:`fuse`) serves extraction and build, so the function a record
was tuned for and the one a build looks up have the same :class:`FusedFunc` key.

Each fused function gets the space family its loop nest fits, read off the nest and
never off its name (:func:`autosched.space.select.make_space`): a contraction (one
reduction reused across outputs, with the producers and epilogue fusion put around it)
or a row-wise nest (per-row reductions and maps, over one or several leading row axes).
A function no family covers (pooling windows, reshapes and transposes, a mean over two
axes) gets :func:`default_schedule`: parallel and vectorised loops, no tuning.
"""

from __future__ import annotations

import logging
import math
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autosched.errors import AutoschedError, ScheduleError
from autosched.ops.fused import FusedFunc, inline, parallel_leading
from autosched.space.space import DeviceLimits, Space

log = logging.getLogger(__name__)

SPACES_KEPT = 256  # spaces space_of keeps per process (a model has tens of tasks)
_SPACES: OrderedDict[tuple[str, str, DeviceLimits], Space | None] = OrderedDict()


@dataclass(frozen=True)
class ModelTask:
    """One distinct fused function of a model.

    Attributes:
        name: the first Relax function name it was found under (``fused_conv2d_add_relu``).
        workload: the function as a workload (its key is the same on every machine).
        weight: how many times one run of ``main`` calls it (all its copies together).
        family: ``"contraction"``, ``"rowwise"``, or None (only the default schedule).
        functions: every Relax function name that computes it.
        form: ``"winograd"`` for a stage of a convolution's Winograd form (an
            alternative: a build runs it only where the model, timed both ways, ran
            faster with it; :mod:`autosched.tvm.forms`), else ``"direct"``.
    """

    name: str
    workload: FusedFunc
    weight: int
    family: str | None
    functions: tuple[str, ...]
    form: str = "direct"


def fuse(mod: Any, *, winograd: Callable[[Any], bool] | None = None) -> Any:
    """The passes shared by extraction and build: inference decompositions (batch norm),
    canonical bindings, channels-last convolutions, constant folding of the weights'
    layout, the Winograd form of the convolutions ``winograd`` picks (a predicate over
    conv2d calls, :mod:`autosched.tvm.winograd`; None: none), FuseTransposeMatmul,
    legalisation, pattern annotation, constant folding, FuseOps and FuseTIR.

    Every 2-D convolution runs channels-last (:mod:`autosched.tvm.layout`): data NHWC,
    weight HWIO, whatever the model's own layout.

    The first FoldConstant transposes a linear layer's constant weight once, at build
    time (``permute_dims(W)`` becomes a constant ``W^T``), so its matmul reads ``[K, N]``
    rows along the output's contiguous axis, as a plain matmul does, instead of striding
    through ``W``'s rows (an ``NT_matmul``). FuseTransposeMatmul then reads in place what
    transposes remain (of values computed at run time), rather than transposing them in a
    kernel of their own."""
    import tvm
    from tvm import relax

    from autosched.tvm.layout import channels_last

    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = channels_last(relax.transform.CanonicalizeBindings()(mod))
    mod = relax.transform.FoldConstant()(mod)
    if winograd is not None:
        from autosched.tvm.winograd import rewrite

        mod = rewrite(mod, select=winograd)
    fused = tvm.transform.Sequential(
        [
            relax.transform.FuseTransposeMatmul(),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)
    return mark_reused_operands(fused)


def mark_reused_operands(mod: Any) -> Any:
    """``mod`` with :data:`~autosched.ops.fused.REUSED_ATTR` set on each PrimFunc that
    ``main`` calls at least twice per distinct tuple of constant arguments (its weights):
    a recurrent layer unrolled into steps calls its step on the same recurrence weights
    once per step, where a transformer calls each layer's matmul once on that layer's
    weights. Such a function's weights are warm in the caches when it runs (where they
    fit: :meth:`~autosched.ops.fused.FusedFunc.flush_operands`), and it is timed so."""
    from tvm.ir.expr import Constant

    from autosched.ops.fused import REUSED_ATTR

    calls: dict[Any, list[tuple]] = {}
    for callee, call in _prim_func_calls(mod):
        args = call.args[1].fields if len(call.args) > 1 and hasattr(call.args[1], "fields") else ()
        # By object: one initializer is one Constant, however often it is used.
        weights = tuple(hash(a) for a in args if isinstance(a, Constant))
        if weights:
            calls.setdefault(callee, []).append(weights)
    for gv, seen in calls.items():  # ``mod`` is the fresh module fuse made
        if len(seen) >= 2 * len(set(seen)):
            mod[gv] = mod[gv].with_attr(REUSED_ATTR, True)
    return mod


def call_counts(mod: Any) -> dict[str, int]:
    """How many times ``main`` calls each PrimFunc (``call_tir`` and its variants)."""
    counts: dict[str, int] = {}
    for callee, _ in _prim_func_calls(mod):
        counts[callee.name_hint] = counts.get(callee.name_hint, 0) + 1
    return counts


def _prim_func_calls(mod: Any) -> list[tuple[Any, Any]]:
    """Every call in ``main`` of one of ``mod``'s PrimFuncs: (its GlobalVar, the call)."""
    from tvm import relax, tirx

    calls = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.args:
            callee = expr.args[0]
            if isinstance(callee, relax.GlobalVar) and isinstance(mod[callee], tirx.PrimFunc):
                calls.append((callee, expr))

    relax.analysis.post_order_visit(mod["main"], visit)
    return calls


def space_of(workload: FusedFunc, *, target: str, limits: DeviceLimits) -> Space | None:
    """The space whose family fits ``workload``'s loop nest, or None when none does (or
    the family cannot schedule even its default config: the task is built as TVM would,
    untuned, rather than failing the model). Kept for the process (the last
    :data:`SPACES_KEPT`): listing a model's tasks, timing their defaults and building
    the model each ask for the same spaces."""
    key = (workload.key, target, limits)
    if key in _SPACES:
        _SPACES.move_to_end(key)
        return _SPACES[key]
    space = _space_of(workload, target=target, limits=limits)
    _SPACES[key] = space
    while len(_SPACES) > SPACES_KEPT:
        _SPACES.popitem(last=False)
    return space


def _space_of(workload: FusedFunc, *, target: str, limits: DeviceLimits) -> Space | None:
    from autosched.space.schedule import schedule
    from autosched.space.select import make_space

    try:
        space = make_space(workload, target=target, limits=limits)
    except (ScheduleError, AutoschedError) as exc:
        log.debug("%s: no space family (%s)", workload, exc)
        return None
    try:
        schedule(space, space.default())
    except (ScheduleError, AutoschedError) as exc:
        log.warning(
            "%s: its %s family cannot schedule it (%s); left untuned",
            workload,
            type(space).__name__,
            exc,
        )
        return None
    return space


def extract_tasks(
    mod: Any,
    *,
    target: str = "llvm",
    limits: DeviceLimits | None = None,
    fused: bool = False,
    winograd: bool = True,
) -> list[ModelTask]:
    """The tasks of a Relax module, heaviest first (by weight, then name).

    Args:
        mod: the model's Relax IRModule (weights bound as constants).
        target: the target the spaces are made for.
        limits: the device's limits (default: this host's CPU for llvm).
        fused: ``mod`` already went through :func:`fuse` (its functions are the tasks).
        winograd: on llvm, also the stages of every 3x3 stride-1 convolution's Winograd
            form (tasks with ``form="winograd"``), so that a build can measure which
            form is faster on this device.
    """
    if limits is None:
        from autosched.measure.device import select_device

        limits = select_device(None, target=target).limits
    by_key = _functions(mod if fused else fuse(mod), only_winograd=False)
    if winograd and not fused and target == "llvm":
        from autosched.tvm.winograd import takes

        every = fuse(mod, winograd=takes)
        for key, entry in _functions(every, only_winograd=True).items():
            by_key.setdefault(key, entry)
    tasks = []
    for entry in by_key.values():
        wl = entry["workload"]
        space = space_of(wl, target=target, limits=limits)
        tasks.append(
            ModelTask(
                name=entry["functions"][0],
                workload=wl,
                weight=entry["weight"],
                family=space.family if space is not None else None,
                functions=tuple(entry["functions"]),
                form=entry["form"],
            )
        )
    return sorted(tasks, key=lambda t: (-t.weight, t.name))


def _functions(mod: Any, *, only_winograd: bool) -> dict[str, dict[str, Any]]:
    """The distinct fused PrimFuncs ``main`` calls, by workload key: workload, weight
    (calls), function names and form; with ``only_winograd``, the Winograd stages only."""
    from tvm import tirx

    from autosched.tvm.winograd import form_of

    counts = call_counts(mod)
    by_key: dict[str, dict[str, Any]] = {}
    for gv, func in sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tirx.PrimFunc) or gv.name_hint not in counts:
            continue
        form = form_of(func)
        is_winograd = form is not None and form[0] == "winograd"
        if only_winograd and not is_winograd:
            continue
        wl = FusedFunc.of(func, gv.name_hint)
        entry = by_key.setdefault(
            wl.key,
            {
                "workload": wl,
                "weight": 0,
                "functions": [],
                "form": "winograd" if is_winograd else "direct",
            },
        )
        entry["weight"] += counts[gv.name_hint]
        entry["functions"].append(gv.name_hint)
    return by_key


def default_schedule(sch: Any, *, limits: DeviceLimits) -> None:
    """The schedule of a function no family covers, for llvm, block by block at the top
    level: as many leading spatial loops as give each of the device's cores
    :data:`autosched.ops.fused.TASKS_PER_CORE` tasks are fused into one parallel loop
    (the rest stay plain loops inside it: fusing all of them re-derived every index by division and modulo
    per element, and ResNet-18's input transpose ran 1.7x slower from memory, 5x from
    cache, on a Zen 5), and the innermost spatial loop is vectorised at the device's
    native width where its extent allows. A function whose arguments fit in one core's L1
    cache runs on one thread, and so does each block that touches no more than that (a
    split's outputs, one block each).

    In a reduction block (a pooling window, a mean over the image) the reduction loops
    are moved outside that innermost spatial loop first, so its lanes accumulate side by
    side (channels, in a channels-last pool) instead of the block running scalar. A step
    TVM refuses is skipped (the block keeps TVM's plain loops).

    First, every injective producer whose result stays inside the function (a pooling
    window's padding, a transpose feeding a reshape) is inlined into its readers, as
    TVM's auto-inline rule does: ResNet-18's max-pool wrote and re-read a padded copy
    of its input, 3x its time."""
    from autosched.tvm import winograd

    blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    inline(sch, [b for b in blocks if winograd.stage_of(b) is None])  # a stage has its own
    lanes = max(1, limits.vector_lanes)
    # A function whose arguments fit in one core's L1 runs in well under a microsecond;
    # waking the runtime's threads for it costs more (an LSTM step's gates: 2.6 us
    # parallel, 0.08 us serial on a Zen 5; 62 such calls per run).
    # So does each block that touches as little: a split into an LSTM's 32 steps is 32
    # blocks of 4 KiB, each made a parallel loop of its own, 32 wakes of the threads per
    # call (41 us on a Xeon 6, 81 us of an LSTM run's 650).

    def fits(size: int) -> bool:
        return bool(limits.cache_bytes) and size <= limits.cache_bytes[0]

    serial = fits(argument_bytes(sch.mod["main"]))
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        if (winograd.stage_of(block) or ("",))[0] in ("input", "output"):  # tile by tile
            if winograd.schedule(sch, rv, lanes=lanes, cores=limits.cores):
                break  # its epilogue went into its tiles
            continue
        kinds = [int(iv.iter_type) for iv in block.iter_vars]
        loops = sch.get_loops(rv)
        if not loops or len(loops) != len(kinds):
            continue
        lead = 0
        while lead < len(kinds) and kinds[lead] == 0:
            lead += 1
        trailing = kinds[lead:]
        try:
            if lanes > 1 and lead >= 1 and len(loops) > 1 and all(k == 2 for k in trailing):
                extent = int(sch.get(loops[lead - 1]).extent)
                if extent >= lanes and extent % lanes == 0:
                    _, inner = sch.split(loops[lead - 1], [None, lanes])
                    if trailing:  # the window's loops go outside the lanes
                        sch.reorder(*loops[lead:], inner)
                    sch.vectorize(inner)
                    loops = sch.get_loops(rv)  # the lanes' outer part is the last of lead
            if lead >= 1 and not serial and not fits(block_bytes(sch, rv)):
                parallel_leading(sch, loops[:lead], cores=limits.cores)
        except Exception as exc:  # TVM raises its own error types; the block stays plain
            log.debug("default schedule of %s: %s", block.name_hint, exc)


def block_bytes(sch: Any, rv: Any) -> int:
    """Bytes the block ``rv`` reads and writes, one element per buffer access and iteration
    of its loops (an upper bound: a reused element counts each time); a loop of unknown
    extent counts as unbounded."""
    import numpy as np
    from tvm import tirx

    block = sch.get(rv)
    extents = [sch.get(lv).extent for lv in sch.get_loops(rv)]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return sys.maxsize
    work = math.prod(int(e) for e in extents)
    accesses = list(block.reads) + list(block.writes)
    return work * sum(np.dtype(str(a.source.dtype)).itemsize for a in accesses)


def argument_bytes(func: Any) -> int:
    """Bytes of all of ``func``'s buffer arguments."""
    import numpy as np

    return sum(
        math.prod(int(d) for d in buf.shape) * np.dtype(str(buf.dtype)).itemsize
        for buf in func.params
        if hasattr(buf, "shape")  # TVM 0.27's PrimFunc takes its buffers as parameters
    )


def default_latency_ms(task: ModelTask, *, device: Any, repeats: int = 5) -> float:
    """Milliseconds of one call of ``task``'s function as an untuned build runs it: its
    space's untuned config (:meth:`~autosched.space.space.Space.untuned`), or
    :func:`default_schedule` where no family covers it (llvm; TVM's runtime, the
    device's threads), the median of ``repeats`` calls, each after the arguments but the
    first are flushed from the caches where the tuner flushes them
    (``Workload.flush_operands``: as in a model run). Inputs are random in [-1, 1)."""
    import numpy as np
    import tvm
    from tvm.s_tir import Schedule

    from autosched.measure.runner import FLUSH_ALL_BUT_FIRST
    from autosched.space.schedule import apply

    wl = task.workload
    device.use_in_this_process()
    sch = Schedule(wl.prim_func())
    space = space_of(wl, target="llvm", limits=device.limits)
    if space is None:
        default_schedule(sch, limits=device.limits)
    else:
        apply(sch, space, space.untuned())
    lib = tvm.compile(sch.mod, target=tvm.target.Target(device.tvm_target()))
    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    args = [
        tvm.runtime.tensor(rng.uniform(-1, 1, t.shape).astype(t.dtype), dev)
        for t in wl.tensor_specs()
    ]
    # As the tuner times a model's function: one call per sample, its weights flushed
    # (unless the run reads them again and again: FusedFunc.flush_operands).
    flush = FLUSH_ALL_BUT_FIRST if wl.flush_operands(device.limits) else ""
    timer = lib.mod.time_evaluator("main", dev, number=1, repeat=repeats, f_preproc=flush)
    return float(np.median(timer(*args).results)) * 1e3
