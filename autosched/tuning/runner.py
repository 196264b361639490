"""Runners: where a batch of candidates is built and timed.

The job loop (:mod:`autosched.tuning.loop`) proposes batches and writes records; a
runner only measures. It lists the kinds of device it can reach (:class:`Slot`, one per
device fingerprint, with how many such devices are free to take a batch at once) and
measures a :class:`BatchRequest` on one of them. :class:`LocalRunner` measures on this
machine's device in the calling process; the farm's Dask runner
(:mod:`autosched.farm.runner`) sends the same request to a worker that owns such a
device. Both end in a :class:`DeviceSession`, the one piece of code that builds and
times a batch (in a killable measurement child) wherever it runs.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autosched.errors import DeviceError
from autosched.measure.cpu import HostCPU
from autosched.measure.device import Device
from autosched.measure.runner import TimingOptions
from autosched.ops import Workload, workload_from_json
from autosched.records.record import Record
from autosched.space.config import Config
from autosched.space.space import DeviceLimits, Space

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slot:
    """A kind of device a runner can measure on: one fingerprint, ``count`` devices."""

    target: str
    device_key: str
    family: str
    name: str
    limits: DeviceLimits
    fingerprint: dict = field(compare=False, hash=False)
    count: int = 1


@dataclass(frozen=True)
class BatchRequest:
    """Candidates of one workload to measure on one kind of device.

    ``rounds`` 0 measures each config once (a search batch); ``rounds`` > 0 re-measures
    them side by side, interleaved for that many rounds (the finalists at the end).
    """

    workload: dict[str, Any]
    target: str
    device_key: str
    configs: tuple[dict[str, Any], ...]
    seed: int = 0
    timeout_s: float = 30.0
    rounds: int = 0
    control: str = ""  # the key of the batch's control, a config measured before ("": none)


def device_failure(records: Sequence[Record], control: str) -> str | None:
    """The error of the control (its config key; "": the batch has none) where a batch
    came back without a single measurement, the control's failed too: the device failed,
    not the configs (:class:`DeviceSession`). None otherwise."""
    if not control or any(r.ok for r in records):
        return None
    return next((r.error or r.status for r in records if r.config_key == control), None)


def device_space(workload: Workload, *, target: str, slot: Slot) -> Space:
    """Every schedule of ``workload`` that fits the device of ``slot``."""
    from autosched.space.select import make_space

    return make_space(workload, target=target, limits=slot.limits)


class LostBatch(Exception):
    """A batch that never reached a device (its runner lost it); it is proposed again."""


class PoisonBatch(Exception):
    """A batch that brought down every process that measured it (on a farm, Dask's
    ``KilledWorker`` after its allowed failures): the configs' fault, so the loop stores
    them as run errors. Every other exception a batch ends with is the device's or the
    harness's, and the batch is proposed again (:mod:`autosched.tuning.loop`)."""


class Runner(Protocol):
    def slots(self) -> list[Slot]:
        """Device kinds reachable now (it may change: farm workers come and go)."""
        ...

    def space(self, workload: Workload, *, target: str, slot: Slot) -> Space:
        """The space a task's search gets on ``slot``: what this runner can measure there
        (:func:`device_space` for a real device; a replay's recorded configs only)."""
        ...

    def submit(self, slot: Slot, request: BatchRequest) -> Any:
        """Start measuring ``request`` on a device of kind ``slot``; returns a handle."""
        ...

    def wait(self, handles: Sequence[Any], timeout_s: float) -> list[tuple[Any, Any]]:
        """The handles that finished within ``timeout_s`` (at least one if any can),
        each with its ``list[Record]`` or the exception that ended it (:class:`LostBatch`
        for one that was never measured, :class:`PoisonBatch` for one whose configs
        brought down whatever measured them)."""
        ...

    def cancel(self, handles: Sequence[Any]) -> None:
        """Give up batches not yet measured."""
        ...

    def close(self) -> None: ...


class DeviceSession:
    """Builds and times batches on one device, with one measurement child and one build
    pool for every workload it is sent.

    The tuner of a workload (its space, test data and reference output) is kept for the
    last ``keep`` workloads, since a job returns to the same ones batch after batch: a
    model's tasks are tens of workloads interleaved by the task scheduler.
    """

    def __init__(
        self,
        device: Device | HostCPU,
        target: str,
        *,
        worker: str = "",
        keep: int = 32,
        timing: TimingOptions | None = None,
        on_record: Callable[[Record], None] | None = None,
    ) -> None:
        self.device = device
        self.target = target
        self.worker = worker
        self.keep = keep
        self.timing = timing
        self.on_record = on_record  # after each search-phase candidate, as it lands
        self._tuners: OrderedDict[tuple, Any] = OrderedDict()
        self._worker: Any = None  # the measurement child and build pool, on first use
        self._builders: Any = None
        self._closed = False

    def slot(self) -> Slot:
        return Slot(
            target=self.target,
            device_key=self.device.key(self.target),
            family=self.device.family(self.target),
            name=self.device.name,
            limits=self.device.limits,
            fingerprint=self.device.fingerprint(self.target),
        )

    def _tuner(self, request: BatchRequest):
        from autosched.measure.worker import MeasureWorker
        from autosched.tuner import BuildPool, Tuner, default_build_workers

        if self._worker is None:
            self._worker = MeasureWorker(self.device, timeout_s=request.timeout_s)
            self._builders = BuildPool(default_build_workers(), target=self.target)
        key = (canonical(request.workload), request.seed, request.timeout_s)
        tuner = self._tuners.pop(key, None)
        if tuner is None:
            tuner = Tuner(
                workload_from_json(request.workload),
                db=None,
                device=self.device,
                target=self.target,
                seed=request.seed,
                timeout_s=request.timeout_s,
                timing=self.timing,
                worker=self._worker,
                builders=self._builders,
            )
            if self.worker:  # a farm worker's name, as its operator gave it
                tuner.worker_name = self.worker
        self._tuners[key] = tuner
        while len(self._tuners) > self.keep:
            _, old = self._tuners.popitem(last=False)
            old.close()
        return tuner

    def run(self, request: BatchRequest) -> list[Record]:
        """Build and time ``request``'s batch.

        Raises:
            LostBatch: the session closed while the batch ran (Ctrl-C in a tune, a farm
                worker told to stop): its measurement child and build pool refuse to
                start again, so the batch ends there, and a job proposes it again.
        """
        try:
            return self._run(request)
        except Exception:
            if self._closed:
                raise LostBatch(
                    f"{self.device.name}: the session closed during the batch"
                ) from None
            raise

    def _run(self, request: BatchRequest) -> list[Record]:
        if request.target != self.target or request.device_key != self.device.key(self.target):
            raise ValueError(
                f"a batch for {request.target} device {request.device_key} reached "
                f"{self.target} device {self.device.key(self.target)}"
            )
        try:
            tuner = self._tuner(request)
        except OSError as exc:  # the host's: no folder for the measurement child
            raise DeviceError(f"{self.device.name} cannot measure: {_said(exc)}") from None
        configs = [Config.from_json(c) for c in request.configs]
        try:
            if request.rounds:
                return tuner.remeasure(configs, rounds=request.rounds)
            try:
                records = tuner.measure(configs, on_record=self.on_record, control=request.control)
                why = self._failure(records, request.control)
            except OSError as exc:  # the host's: a folder, a socket, a process not made
                why = _said(exc)
            if why is None:
                return records
            # A fresh child in a fresh folder cures what lives in the process (its
            # mappings, a lost folder, a driver context gone bad); the batch runs once
            # more there.
            log.warning(
                "%s measured nothing (%s); the batch runs again in a fresh measurement child",
                self.device.name,
                why,
            )
            try:
                self._worker.reset()
            except OSError as exc:
                raise DeviceError(
                    f"{self.device.name} measured nothing ({why}), and no fresh measurement "
                    f"child can start: {_said(exc)}"
                ) from None
            try:
                records = tuner.measure(configs, on_record=self.on_record, control=request.control)
            except OSError as exc:
                raise DeviceError(f"{self.device.name} cannot measure: {_said(exc)}") from None
            why = self._failure(records, request.control)
            if why is not None:
                raise DeviceError(
                    f"{self.device.name} measured nothing, twice, the second time in a fresh "
                    f"measurement child: {why}"
                )
            return records
        finally:
            if self.target == "iree-vulkan" and self._worker is not None:
                # IREE's Vulkan driver keeps two threads spinning while a device is open
                # (IREE 3.13 on lavapipe: 100% of a core each, measured). The child gives
                # them nice 19 (iree_runner.demote_spinning_threads), but even so they
                # would burn the host's idle cores between batches, beside its other
                # devices' measurements. The child starts again with the next batch.
                self._worker.stop()

    def _failure(self, records: Sequence[Record], control: str) -> str | None:
        """Why the device measured nothing of a batch, where the device failed rather than
        its configs: no measurement child could start, or the control failed too."""
        if any(r.ok for r in records):
            return None
        if self._worker.start_error:
            return f"cannot start the measurement child: {self._worker.start_error}"
        why = device_failure(records, control)
        return None if why is None else f"not even the control {control}, measured before: {why}"

    def close(self) -> None:
        self._closed = True
        while self._tuners:
            _, tuner = self._tuners.popitem()
            tuner.close()
        if self._worker is not None:
            self._worker.close()
            self._builders.close()
            self._worker = self._builders = None


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def canonical(data: Any) -> str:
    from autosched.records.record import canonical_json

    return canonical_json(data)


class LocalRunner:
    """Measures on one device of this machine, one batch at a time, in a thread of the
    calling process (the measurement itself runs in the session's killable child)."""

    def __init__(
        self,
        device: Device | HostCPU,
        target: str,
        *,
        timing: TimingOptions | None = None,
        on_record: Callable[[Record], None] | None = None,
        keep: int = 32,
    ) -> None:
        # keep: workloads whose space, test data and reference stay between batches (a
        # model's tasks take turns; a fused task's reference is built by TVM).
        self.session = DeviceSession(device, target, timing=timing, on_record=on_record, keep=keep)
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="autosched-measure")

    def slots(self) -> list[Slot]:
        return [self.session.slot()]

    def space(self, workload: Workload, *, target: str, slot: Slot) -> Space:
        return device_space(workload, target=target, slot=slot)

    def submit(self, slot: Slot, request: BatchRequest) -> cf.Future:
        return self._pool.submit(self.session.run, request)

    def wait(self, handles: Sequence[cf.Future], timeout_s: float) -> list[tuple[Any, Any]]:
        done, _ = cf.wait(handles, timeout=timeout_s, return_when=cf.FIRST_COMPLETED)
        return [(f, f.exception() or f.result()) for f in handles if f in done]

    def cancel(self, handles: Sequence[cf.Future]) -> None:
        for f in handles:
            f.cancel()

    def close(self) -> None:
        # Not waiting: on Ctrl-C the batch in flight ends when its measurement child is
        # killed by the session's close.
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.session.close()
