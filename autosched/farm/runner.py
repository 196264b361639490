"""The client side of a farm: a :class:`~autosched.tuning.runner.Runner` on Dask.

Each batch is one Dask task restricted to the resource of its device kind, so Dask's
scheduler places it on a worker that owns such a device and, when that worker dies
mid-batch, runs it again elsewhere; a batch that has killed ``allowed-failures``
workers comes back as ``KilledWorker``, passed on as a
:class:`~autosched.tuning.runner.PoisonBatch` that the job loop stores as error records.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Sequence
from concurrent.futures import CancelledError
from typing import Any

import dask
from distributed import Client, KilledWorker, Nanny, Scheduler, SpecCluster, wait

from autosched.farm.worker import describe, nanny_options, resource_name, run_batch
from autosched.ops import Workload
from autosched.space.space import Space
from autosched.tuning.runner import BatchRequest, LostBatch, PoisonBatch, Slot, device_space

log = logging.getLogger(__name__)


class DaskRunner:
    """Measures batches on the workers of a Dask cluster.

    When the scheduler goes away, the batches in flight come back as
    :class:`~autosched.tuning.runner.LostBatch` (never measured as far as the records
    know, so they are proposed again); Dask's client reconnects by itself within its
    timeout, and past that this runner connects anew whenever it is asked for devices.
    """

    def __init__(
        self,
        client: Client,
        *,
        address: str | None = None,
        security: Any = None,
        proposers: int | None = None,
    ) -> None:
        """``proposers``: threads the job's loop proposes batches in
        (:func:`autosched.tuning.loop.run_job`); default: with a farm's scheduler
        (``address``), this machine's cores up to 8; else 1 (an embedded cluster's
        devices measure on this machine's cores)."""
        self.client = client
        self.proposers = proposers or (min(8, os.cpu_count() or 1) if address else 1)
        self.address = address
        self.security = security
        self.workers_seen: set[str] = set()  # names of the workers that owned a device
        self.workers_now: set[str] = set()

    def _connected(self) -> bool:
        if self.client.status in ("running", "connecting"):
            return self.client.status == "running"
        if self.address is None:
            return False
        try:
            client = Client(self.address, timeout="5s", security=self.security)
        except OSError:
            return False
        log.warning("connected to the Dask scheduler at %s again", self.address)
        self.client.close()
        self.client = client
        return True

    def space(self, workload: Workload, *, target: str, slot: Slot) -> Space:
        return device_space(workload, target=target, slot=slot)

    def slots(self) -> list[Slot]:
        if not self._connected():
            return []
        try:
            by_worker = self.client.run(describe, on_error="ignore")
        except Exception as exc:  # the scheduler is away: no device for now
            log.warning("cannot list the farm's workers: %s", exc)
            return []
        try:
            names = {
                a: str(w.get("name", a)) for a, w in self.client.scheduler_info()["workers"].items()
            }
        except Exception:  # noqa: BLE001 - the names are for the report only
            names = {}
        self.workers_now = {names.get(a, a) for a, slots in by_worker.items() if slots}
        self.workers_seen |= self.workers_now
        kinds: dict[str, Slot] = {}
        counts: dict[str, int] = {}
        for slots in by_worker.values():
            for slot in slots or []:
                kinds.setdefault(slot.device_key, slot)
                counts[slot.device_key] = counts.get(slot.device_key, 0) + 1
        return [_with_count(s, counts[k]) for k, s in kinds.items()]

    def submit(self, slot: Slot, request: BatchRequest) -> Any:
        return self.client.submit(
            run_batch, request, resources={resource_name(slot.device_key): 1}, pure=False
        )

    def wait(self, handles: Sequence[Any], timeout_s: float) -> list[tuple[Any, Any]]:
        try:
            done, _ = wait(list(handles), timeout=timeout_s, return_when="FIRST_COMPLETED")
        except TimeoutError:
            return []
        except CancelledError:  # the scheduler went away: every future was cancelled
            done = [f for f in handles if f.cancelled()]
        out: list[tuple[Any, Any]] = []
        for fut in handles:
            if fut in done and (outcome := _outcome(fut)) is not _NOT_YET:
                out.append((fut, outcome))
        return out

    def cancel(self, handles: Sequence[Any]) -> None:
        self.client.cancel(list(handles))

    def close(self) -> None:
        pass


_NOT_YET = object()


def _outcome(fut: Any) -> Any:
    """A done future's batch: its records, its exception, or a LostBatch; ``_NOT_YET``
    when it is no longer done. A batch can finish and then lose its result with the
    worker that held it before anyone read it: Dask computes it again, and until then
    it is in flight as before (its status "lost" or "pending", not "finished")."""
    if fut.cancelled():
        return LostBatch(f"batch lost with the scheduler ({fut.key})")
    if fut.status == "error":
        return _poison(fut.exception())
    if fut.status != "finished":
        return _NOT_YET
    try:
        return fut.result()  # lost between the check and the read: Dask's gather waits
    except CancelledError:
        return LostBatch(f"batch lost with the scheduler ({fut.key})")
    except Exception as exc:  # noqa: BLE001 - the batch failed when it ran again
        return _poison(exc)


def _poison(exc: BaseException) -> BaseException:
    """The configs' fault where the batch killed every worker it reached; ``exc`` as it is
    (the device's or the harness's) otherwise."""
    if isinstance(exc, KilledWorker):
        return PoisonBatch(f"KilledWorker: {exc}")
    return exc


def _with_count(slot: Slot, count: int) -> Slot:
    from dataclasses import replace

    return replace(slot, count=count)


def local_devices(targets: Sequence[str]) -> dict[str, list[tuple[str, str | None]]]:
    """Workers for this machine: ``{worker name: [(target, selector), ...]}``.

    Every OpenCL or Vulkan device that is a GPU or accelerator gets a worker of its own.
    OpenCL CPU devices, a CPU Vulkan driver (lavapipe) and the llvm and iree-llvm-cpu
    targets all run on this machine's CPU, so they share one worker ("host"): it runs
    one batch at a time, and no two timings overlap there.
    """
    workers: dict[str, list[tuple[str, str | None]]] = {}
    if "opencl" in targets:
        from autosched.measure.device import list_devices

        for dev in list_devices():
            if dev.type == "cpu":
                workers.setdefault("host", []).append(("opencl", dev.selector))
            else:
                workers[f"opencl-{dev.index}"] = [("opencl", dev.selector)]
    if "llvm" in targets:
        workers.setdefault("host", []).append(("llvm", None))
    if "iree-llvm-cpu" in targets:
        workers.setdefault("host", []).append(("iree-llvm-cpu", None))
    if "iree-vulkan" in targets:
        from autosched.measure.iree_device import vulkan_devices

        for dev in vulkan_devices():  # a CPU driver (lavapipe) runs on the host's cores
            if dev.type == "cpu":
                workers.setdefault("host", []).append(("iree-vulkan", dev.selector))
            else:
                workers[f"vulkan-{dev.index}"] = [("iree-vulkan", dev.selector)]
    return workers


def local_cluster(targets: Sequence[str]) -> SpecCluster:
    """A real Dask cluster on loopback: a scheduler and one Nanny worker per local device
    group (see :func:`local_devices`). The embedded default of ``autosched job run``."""
    dask.config.set({"distributed.worker.daemon": False})
    specs = {
        name: {
            "cls": Nanny,
            "options": nanny_options(
                devs, name=f"{socket.gethostname()}-{name}", quiet=True, detach=True
            ),
        }
        for name, devs in local_devices(targets).items()
    }
    scheduler = {
        "cls": Scheduler,
        "options": {"host": "127.0.0.1", "port": 0, "dashboard": False},
    }
    _quiet_resource_tracker()
    # The workers are this process's children: Ctrl-C at a terminal is for this process,
    # which closes them in order. Started with SIGINT ignored, they inherit that.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return SpecCluster(workers=specs, scheduler=scheduler, silence_logs=logging.ERROR)
    finally:
        signal.signal(signal.SIGINT, previous)


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (shared with the spawned workers) with its
    leak warning off. Workers stopped on Ctrl-C or at a deadline may leave semaphores
    registered; the tracker unlinks them at exit either way, and its note about doing so
    would be a stray line after the job's last one."""
    import sys
    from multiprocessing import resource_tracker

    flag = "ignore::UserWarning:multiprocessing.resource_tracker"
    sys.warnoptions.append(flag)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(flag)
