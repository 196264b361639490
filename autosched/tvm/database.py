"""A MetaSchedule database backed by autosched's records, and a Relax build that uses it.

``relax.transform.MetaScheduleApplyDatabase`` asks its database for a tuning record of
each fused PrimFunc. :class:`RecordsDatabase` recognises the autosched workload the
PrimFunc computes (:mod:`autosched.tvm.recognize`), looks up the config autosched's own
``compile`` would use (exact record, other driver, nearest tuned shape), applies it to
*that* PrimFunc with the tuner's schedule code, and returns the schedule's trace as a
``TuningRecord``. Functions it does not recognise, or has no record for, are left to
TVM's defaults. It is read-only: MetaSchedule cannot write into it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from autosched.compiler import find_config
from autosched.compiler.arguments import ANY, bind
from autosched.compiler.lookup import UNTUNED
from autosched.errors import InvalidInputError, ScheduleError
from autosched.measure.device import select_device
from autosched.ops import Workload
from autosched.ops.base import TensorSpec
from autosched.records.base import Database
from autosched.space.config import Config
from autosched.space.schedule import apply
from autosched.space.select import make_space
from autosched.space.space import DeviceLimits, Space
from autosched.tvm.recognize import normalized, recognize, row_nest

log = logging.getLogger(__name__)


def apply_to_prim_func(
    func, workload: Workload, config: Config, *, target: str, limits: DeviceLimits
):
    """Schedule ``func`` (another front end's PrimFunc computing ``workload``) with ``config``.

    Contractions: plain copies in ``func`` are inlined first (see
    :func:`autosched.tvm.recognize.normalized`). Knob names refer to the workload's own
    axes and inputs (``tile.<axis>``, ``stage.<input>``, ``fuse.<input>``) and so do
    knob values that name an axis (``tile_inner``); they are renamed, by position, to
    ``func``'s. Row-wise workloads: ``fuse.<stage>`` knobs are renamed by the stage's
    position. Returns the ``tvm.s_tir.Schedule`` (its trace replays it).

    Raises:
        ScheduleError: ``func``'s loop nest does not have the workload's structure, or
            TVM rejects the schedule.
    """
    space = make_space(workload, target=target, limits=limits)
    if space.family == "rowwise":
        return _apply_rowwise(func, space, config)
    sch, theirs = normalized(func)
    ours = space.nest
    if [(a.kind, a.extent) for a in ours.axes] != [(a.kind, a.extent) for a in theirs.axes] or (
        len(ours.inputs) != len(theirs.inputs) or len(ours.produced) != len(theirs.produced)
    ):
        raise ScheduleError(f"the PrimFunc's loop nest is not the one of {workload}")
    names = {a.name: b.name for a, b in zip(ours.axes, theirs.axes)}
    names.update({a.buffer: b.buffer for a, b in zip(ours.inputs, theirs.inputs)})

    return _apply_renamed(sch, space, theirs, config, names, rename_values=True)


def _apply_rowwise(func, space: Space, config: Config):
    """:func:`apply_to_prim_func` for a row-wise workload: stages are renamed by position."""
    from tvm.s_tir import Schedule

    theirs = row_nest(func)
    ours = space.nest
    shape = [(b.kind, b.output) for b in ours.blocks]
    if theirs is None or shape != [(b.kind, b.output) for b in theirs.blocks]:
        raise ScheduleError(f"the PrimFunc's stages are not the ones of {space.workload}")
    names = {a.name: b.name for a, b in zip(ours.blocks, theirs.blocks)}

    return _apply_renamed(Schedule(func), space, theirs, config, names, rename_values=False)


def _apply_renamed(sch, space: Space, theirs, config: Config, names, *, rename_values: bool):
    """Apply ``config`` to ``sch``, whose function has the nest ``theirs``: the names in
    knob names (``tile.<axis>``, ``fuse.<stage>``) and, with ``rename_values``, in string
    values (``tile_inner``) are translated by ``names``; the result is checked first."""

    def rename(key: str) -> str:
        head, _, tail = key.partition(".")
        return f"{head}.{names.get(tail, tail)}" if tail else key

    translated = Config(
        {
            rename(k): names.get(v, v) if rename_values and isinstance(v, str) else v
            for k, v in config.items()
        }
    )
    foreign = space.on_nest(theirs)
    reason = foreign.check(translated)
    if reason is not None:
        raise ScheduleError(f"the config of {space.workload} does not fit the PrimFunc: {reason}")
    apply(sch, foreign, translated)
    return sch


def _records_database_class():
    """Defined lazily: importing MetaSchedule costs a second."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class _RecordsDatabase(ms.database.PyDatabase):
        def __init__(self, owner: RecordsDatabase) -> None:
            super().__init__()
            self.owner = owner

        def has_workload(self, mod) -> bool:
            return False

        def commit_workload(self, mod):
            raise InvalidInputError("autosched's records database is read-only for MetaSchedule")

        def commit_tuning_record(self, record) -> None:
            raise InvalidInputError("autosched's records database is read-only for MetaSchedule")

        def get_top_k(self, workload, top_k: int) -> list:
            return []

        def get_all_tuning_records(self) -> list:
            return []

        def query_tuning_record(self, mod, target, workload_name):
            return self.owner.tuning_record(mod, target, workload_name)

        def __len__(self) -> int:
            return 0

    return _RecordsDatabase


@dataclass
class Applied:
    """One PrimFunc that got an autosched schedule."""

    function: str
    workload: Workload
    provenance: str
    record_id: int | None
    gflops: float | None


class RecordsDatabase:
    """autosched's records as a MetaSchedule database (use ``.ms_database`` with TVM).

    Args:
        target: ``"llvm"`` or ``"opencl"``; the records of that target are used.
        device: device or selector, as for ``autosched.compile``.
        db: the user's records database (a Database or an existing SQLite path).
        shipped: also consult the shipped records.
        untuned: also schedule recognised functions that have no record (with
            ``Space.default()``); off by default, leaving them to TVM.
    """

    def __init__(
        self,
        *,
        target: str = "llvm",
        device: Any = None,
        db: Database | str | os.PathLike[str] | None = None,
        shipped: bool = True,
        untuned: bool = False,
    ) -> None:
        self.target = target
        self.device = select_device(device, target=target)
        self.db = db
        self.shipped = shipped
        self.untuned = untuned
        self.applied: list[Applied] = []
        self.ms_database = _records_database_class()(self)

    def tuning_record(self, mod, target, workload_name: str):
        from tvm.s_tir import meta_schedule as ms

        funcs = list(mod.functions.values())
        if len(funcs) != 1:
            return None
        wl = recognize(funcs[0])
        if wl is None:
            log.info("%s: not an autosched workload; left to TVM", workload_name)
            return None
        found = find_config(
            wl, target=self.target, device=self.device, db=self.db, shipped=self.shipped
        )
        if found.provenance == UNTUNED and not self.untuned:
            log.warning("%s: %s has no record for this device; left to TVM", workload_name, wl)
            return None
        try:
            sch = apply_to_prim_func(
                funcs[0], wl, found.config, target=self.target, limits=self.device.limits
            )
        except ScheduleError as exc:  # a recogniser gap must not fail the whole build
            log.warning("%s: %s could not be scheduled (%s); left to TVM", workload_name, wl, exc)
            return None
        rec = found.record
        self.applied.append(
            Applied(
                workload_name,
                wl,
                found.provenance,
                rec.id if rec else None,
                rec.gflops if rec else None,
            )
        )
        log.info(
            "%s: %s scheduled from %s record %s",
            workload_name,
            wl,
            found.provenance,
            rec.id if rec else "-",
        )
        run_secs = [float(rec.latency_s)] if rec and rec.latency_s else None
        return ms.database.TuningRecord(
            sch.trace, ms.database.Workload(mod), run_secs=run_secs, target=target
        )


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


def legalize_and_fuse(mod):
    """The passes :func:`build` runs before applying records: FuseTransposeMatmul,
    LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR (see :func:`build`)."""
    import tvm
    from tvm import relax

    return tvm.transform.Sequential(
        [
            relax.transform.FuseTransposeMatmul(),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


def build(
    mod,
    target: str = "llvm",
    *,
    db: Database | str | os.PathLike[str] | None = None,
    device: Any = None,
    shipped: bool = True,
    untuned: bool = False,
) -> RelaxBuild:
    """Build a Relax module, applying autosched's tuned schedules to its fused PrimFuncs.

    Runs FuseTransposeMatmul (so that ``x @ W.T`` and ``relax.op.linear`` keep ``W`` in
    ``nn.Linear``'s layout and read it as the ``dense`` workload does, instead of
    transposing it in a kernel of its own), Relax's legalisation and fusion
    (LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR), then
    ``MetaScheduleApplyDatabase`` with :class:`RecordsDatabase`, then ``tvm.compile``.
    """
    import tvm
    from tvm import relax

    records = RecordsDatabase(target=target, device=device, db=db, shipped=shipped, untuned=untuned)
    if target == "llvm":
        tvm_target = tvm.target.Target(records.device.tvm_target())
    else:
        tvm_target = tvm.target.Target({"kind": "opencl"}).with_host(
            tvm.target.Target({"kind": "llvm"})
        )
    mod = legalize_and_fuse(mod)
    with tvm_target, records.ms_database:
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    executable = tvm.compile(mod, target=tvm_target)
    return RelaxBuild(executable=executable, module=mod, applied=records.applied, target=target)
