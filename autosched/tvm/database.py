"""autosched's records applied to a Relax module's fused functions, and the Relax build.

:func:`build` runs the pass pipeline that task extraction runs
(:func:`autosched.tvm.tasks.fuse`), so each fused PrimFunc is the :class:`FusedFunc`
a model's tuning measured. :class:`RecordsDatabase` looks each one up by its key (the
function normalised the same way), applies the best record's config with the space's
own schedule code (:func:`autosched.space.schedule.apply`) and puts the scheduled
function in place of the original. A function with a space family and no record gets
the space's untuned config (``Space.untuned``); one no family covers gets
:func:`autosched.tvm.tasks.default_schedule` (llvm). Records tuned on a farm apply the
same way: the key is the same on every machine.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from autosched.compiler import find_config
from autosched.compiler.arguments import ANY, bind
from autosched.compiler.lookup import UNTUNED, Lookup, fallbacks
from autosched.errors import InvalidInputError, ScheduleError
from autosched.measure.device import select_device
from autosched.ops import Workload
from autosched.ops.base import TensorSpec
from autosched.ops.fused import FusedFunc
from autosched.records.base import Database
from autosched.space.schedule import apply
from autosched.tvm.tasks import default_schedule, fuse, space_of

log = logging.getLogger(__name__)

# Provenance of a function no space family covers, or whose space TVM refused every config
# of (llvm: it gets the default schedule).
FALLBACK = "default-schedule"


@dataclass
class Applied:
    """One fused PrimFunc that got an autosched schedule, and from what.

    ``provenance`` is the lookup's (``exact``, ``untuned``, ...) or :data:`FALLBACK`.
    """

    function: str
    workload: Workload
    provenance: str
    record_id: int | None
    gflops: float | None


class RecordsDatabase:
    """autosched's records as the schedules of a Relax module's fused functions.

    Args:
        target: ``"llvm"`` or ``"opencl"``; the records of that target are used.
        device: device or selector, as for ``autosched.compile``.
        db: the user's records database (a Database or an existing SQLite path).
        shipped: also consult the shipped records.
        untuned: also schedule functions that have no record: with their space's
            untuned config, or (llvm) the default schedule when no family covers them.
            Off: they are left to TVM (single-threaded loops on llvm).
        records: consult the databases at all. Off: the build is what ``untuned`` alone
            makes of the module (a baseline that no database, the user's default one
            included, can change, and no lookup warns about).
    """

    def __init__(
        self,
        *,
        target: str = "llvm",
        device: Any = None,
        db: Database | str | os.PathLike[str] | None = None,
        shipped: bool = True,
        untuned: bool = True,
        records: bool = True,
    ) -> None:
        self.target = target
        self.records = records
        self.device = select_device(device, target=target)
        self.db = db
        self.shipped = shipped
        self.untuned = untuned
        self.applied: list[Applied] = []
        # A build looks the same functions up more than once (choosing the convolutions'
        # forms builds the model twice): by structural hash and by workload key.
        self._workloads: dict[int, FusedFunc] = {}
        self._found: dict[str, Lookup] = {}

    def _workload(self, func: Any, name: str) -> FusedFunc:
        import tvm_ffi

        digest = tvm_ffi.structural_hash(func)
        if digest not in self._workloads:
            self._workloads[digest] = FusedFunc.of(func, name)
        known = self._workloads[digest]
        return FusedFunc(known.script, name=name, reused=known.reused)

    def _space(self, wl: FusedFunc) -> Any:
        return space_of(wl, target=self.target, limits=self.device.limits)  # kept per process

    def _lookup(self, wl: FusedFunc) -> Lookup:
        if wl.key not in self._found:
            self._found[wl.key] = find_config(
                wl, target=self.target, device=self.device, db=self.db, shipped=self.shipped
            )
        return self._found[wl.key]

    def has_space(self, func: Any, name: str) -> bool:
        """Whether a space family covers the fused PrimFunc ``func``."""
        return self._space(self._workload(func, name)) is not None

    def tuned_latency_s(self, func: Any, name: str) -> float | None:
        """Seconds of the fused PrimFunc ``func`` as its best record on this device
        measured it, or None without one (or with the records off)."""
        from autosched.compiler.lookup import EXACT

        if not self.records:
            return None
        wl = self._workload(func, name)
        if self._space(wl) is None:
            return None
        found = self._lookup(wl)
        if found.provenance != EXACT or found.record is None:
            return None
        return found.record.latency_s

    def schedule_function(self, func: Any, name: str) -> Any | None:
        """The scheduled replacement of the fused PrimFunc ``func`` (called ``name`` in its
        module), or None to leave it to TVM. A config TVM refuses is logged and the next
        one tried (:meth:`_apply`): one function must not fail the whole build."""
        from tvm.s_tir import Schedule

        wl = self._workload(func, name)
        try:
            space = self._space(wl)
        except Exception as exc:  # symbolic shapes, say: not a nest with known extents
            log.info("%s: no space (%s: %s); left to TVM", name, type(exc).__name__, exc)
            return None
        if space is not None:
            found = self._lookup(wl) if self.records else Lookup(space.untuned(), UNTUNED)
            if found.provenance == UNTUNED and not self.untuned:
                return None
            scheduled = self._apply(wl, space, found, name)
            if scheduled is not None:
                sch, found = scheduled
                rec = found.record
                self.applied.append(
                    Applied(
                        name,
                        wl,
                        found.provenance,
                        rec.id if rec else None,
                        rec.gflops if rec else None,
                    )
                )
                log.info(
                    "%s: scheduled from %s record %s",
                    name,
                    found.provenance,
                    rec.id if rec else "-",
                )
                return _replacement(sch)
        if not self.untuned or self.target != "llvm":
            return None
        sch = Schedule(wl.prim_func())
        default_schedule(sch, limits=self.device.limits)
        self.applied.append(Applied(name, wl, FALLBACK, None, None))
        return _replacement(sch)

    def _apply(
        self, wl: FusedFunc, space: Any, found: Lookup, name: str
    ) -> tuple[Any, Lookup] | None:
        """A schedule of ``wl`` with ``found``'s config, and the lookup it came from; where
        TVM refuses that config (a record written by another version of the schedule code,
        say), the space's untuned config, then its default (the one :func:`space_of`
        checked), each logged: a bad record costs that function its tuning, not the
        model its parallel loops. With ``untuned`` off only ``found`` is tried. None when
        TVM refuses every one tried."""
        from tvm.s_tir import Schedule

        for attempt in fallbacks(space, found) if self.untuned else [found]:
            sch = Schedule(wl.prim_func())
            try:
                apply(sch, space, attempt.config)
            except ScheduleError as exc:
                log.warning(
                    "%s: the %s config could not be applied (%s)", name, attempt.provenance, exc
                )
                continue
            return sch, attempt
        return None

    def apply_to(self, mod: Any) -> Any:
        """``mod`` (after :func:`autosched.tvm.tasks.fuse`) with every fused PrimFunc that
        gets a schedule replaced by the scheduled one."""
        from tvm import tirx

        funcs = [
            (gv, f)
            for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and not (f.attrs and "tirx.is_scheduled" in f.attrs)
        ]
        for gv, func in sorted(funcs, key=lambda kv: kv[0].name_hint):
            new = self.schedule_function(func, gv.name_hint)
            if new is not None:
                mod.update_func(gv, new)
        return mod


def choose_forms(mod: Any, records: RecordsDatabase, tvm_target: Any) -> tuple[Any, Any]:
    """``mod`` through :func:`autosched.tvm.tasks.fuse`, each convolution with both forms
    tuned on this device in the form that took less time inside the model
    (:mod:`autosched.tvm.forms`), the rest direct; with the records applied. Returns the
    module and, where it is one of the two builds the choice timed, its executable (else
    None); ``records.applied`` lists that module's functions."""
    from autosched.tvm import forms
    from autosched.tvm.winograd import call_signature, takes

    if records.target != "llvm" or not records.records:
        return records.apply_to(fuse(mod)), None

    applied: dict[int, list[Applied]] = {}

    def schedule(fused: Any) -> Any:
        before = len(records.applied)
        out = records.apply_to(fused)
        applied[id(out)] = records.applied[before:]
        return out

    direct, every = fuse(mod), fuse(mod, winograd=takes)
    sigs = forms.candidates((direct, every), records.tuned_latency_s, records.has_space)
    chosen, built = forms.choose(
        mod, direct=direct, every=every, schedule=schedule, target=tvm_target, sigs=sigs
    )
    records.applied.clear()
    if frozenset(chosen) in built:  # the form of every candidate is one build timed
        module, executable = built[frozenset(chosen)]
        records.applied.extend(applied[id(module)])
        return module, executable
    winograd = (lambda call: call_signature(call) in chosen) if chosen else None
    return records.apply_to(fuse(mod, winograd=winograd)), None


def _replacement(sch: Any) -> Any:
    """The scheduled function, private again (the normalised one is exported as main)."""
    return sch.mod["main"].without_attr("global_symbol").with_attr("tirx.is_scheduled", True)


@dataclass
class RelaxBuild:
    """A built Relax module and what autosched contributed to it.

    An llvm build is called like a function on numpy arrays: ``built(x, w, b=b)`` runs
    ``main`` in a Relax VM on the host CPU (see :meth:`__call__`).

    Attributes:
        executable: what ``tvm.compile`` returned (for ``relax.VirtualMachine``).
        module: the IRModule after the records were applied.
        applied: the fused PrimFuncs that got an autosched schedule, and from which record.
        target: ``"llvm"`` or ``"opencl"``.
    """

    executable: Any
    module: Any
    applied: list[Applied] = field(default_factory=list)
    target: str = "llvm"
    _vm: Any = field(default=None, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """``main``'s parameters in call order (name, shape, dtype); a dimension the
        module leaves symbolic is ``-1``.

        Raises:
            InvalidInputError: a parameter is not a tensor of known rank and dtype.
        """
        from tvm import relax

        specs = []
        for param in self.module["main"].params:
            ty = param.ty
            if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
                raise InvalidInputError(
                    f"main's parameter {param.name} is a {ty}, not a tensor of known "
                    "rank; call built.executable through a relax.VirtualMachine"
                )
            if isinstance(ty.shape, relax.ShapeExpr):
                shape = tuple(int(d) if hasattr(d, "value") else ANY for d in ty.shape.values)
            else:
                shape = (ANY,) * ty.ndim
            specs.append(TensorSpec(param.name, shape, str(ty.dtype), "input"))
        return tuple(specs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run ``main`` on the host CPU with numpy arrays: ``built(x, w)``, ``built(x=x, w=w)``.

        Arguments bind to ``main``'s parameters as a Python function's do: by position or
        by the parameter's name. The VM is made on the first call and reused.

        Returns:
            ``main``'s result as numpy: an array, or a tuple (nested as ``main``'s is).

        Raises:
            InvalidInputError: too many positional arguments, an unknown name, a parameter
                given twice or missing, a wrong shape or dtype (the message lists ``main``'s
                parameters with their shapes and dtypes); or a build for another target than
                llvm (TVM's Python package runs no OpenCL).
        """
        if self.target != "llvm":
            raise InvalidInputError(
                f"a Relax build for {self.target} is not run in this process (the tvm "
                "package has no OpenCL runtime); accepted: a build for llvm"
            )
        import tvm
        from tvm import relax

        arrays = bind(self.inputs, args, kwargs, what="main")
        dev = tvm.cpu()
        with self._lock:
            if self._vm is None:
                self._vm = relax.VirtualMachine(self.executable, dev)
            result = self._vm["main"](*(tvm.runtime.tensor(a, dev) for a in arrays.values()))
        return _to_numpy(result)


def _to_numpy(value: Any) -> Any:
    """A VM result as numpy: tensors become arrays, tuples (TVM arrays) tuples of them."""
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return tuple(_to_numpy(v) for v in value)
    return value


def build(
    mod,
    target: str = "llvm",
    *,
    db: Database | str | os.PathLike[str] | None = None,
    device: Any = None,
    shipped: bool = True,
    untuned: bool = True,
    records: bool = True,
    winograd: bool | None = None,
) -> RelaxBuild:
    """Build a Relax module, applying autosched's records to its fused PrimFuncs.

    Runs :func:`autosched.tvm.tasks.fuse` (the pipeline task extraction runs), then
    :meth:`RecordsDatabase.apply_to`, then ``tvm.compile`` for the device's target.

    ``winograd``: None (llvm with records) puts each 3x3 stride-1 convolution tuned in
    both forms in the one that ran faster inside the model on this device
    (:func:`choose_forms`); True (llvm) every one in Winograd form; False none.
    """
    import tvm

    records = RecordsDatabase(
        target=target, device=device, db=db, shipped=shipped, untuned=untuned, records=records
    )
    if target == "llvm":
        tvm_target = tvm.target.Target(records.device.tvm_target())
        # The built model runs in this process on the threads its records were measured on.
        records.device.use_in_this_process()
    else:
        tvm_target = tvm.target.Target({"kind": "opencl"}).with_host(
            tvm.target.Target({"kind": "llvm"})
        )
    executable = None
    if winograd is None:
        mod, executable = choose_forms(mod, records, tvm_target)
    else:
        from autosched.tvm.winograd import takes

        mod = records.apply_to(fuse(mod, winograd=takes if winograd else None))
    if executable is None:
        executable = tvm.compile(mod, target=tvm_target)
    return RelaxBuild(executable=executable, module=mod, applied=records.applied, target=target)
