"""The worker side of a farm: a Dask worker (under a Nanny) that owns devices.

``autosched worker --scheduler ADDR --device D --target T`` starts one. Its devices are
opened in the worker process by :class:`DevicePlugin`; each is advertised as the Dask
resource ``dev-<device key>`` (the key is a hash of the device's full fingerprint), so a
batch for that kind of device runs only there. The worker runs one task at a time
(``nthreads=1``): two measurements never overlap on its devices. The measurement itself
runs in the session's killable child process, which is why the worker process must not
be daemonic (``distributed.worker.daemon: False``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from typing import Any

import dask
from distributed import Nanny, get_worker
from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin

from autosched.errors import DeviceError
from autosched.measure.device import select_device
from autosched.measure.lifeline import exit_with_parent
from autosched.records.record import Record
from autosched.tuning.loop import BROKEN_IN_A_ROW
from autosched.tuning.runner import BatchRequest, DeviceSession, Slot

log = logging.getLogger(__name__)

PLUGIN = "autosched-devices"


def tls_security(ca_file: str | None, cert: str | None, key: str | None) -> Any:
    """Dask ``Security`` for a farm that crosses a network: every connection is TLS,
    each side proves itself with a certificate signed by the farm's CA. ``None`` when no
    option is given; all three or none."""
    given = [x for x in (ca_file, cert, key) if x]
    if not given:
        return None
    if len(given) != 3:
        from autosched.errors import InvalidInputError

        raise InvalidInputError(
            "TLS needs --tls-ca-file, --tls-cert and --tls-key together; accepted: all three or none"
        )
    for path in given:
        with open(path):  # a missing file: one line naming it, not a traceback from ssl
            pass
    from distributed.security import Security

    return Security(
        tls_ca_file=ca_file,
        tls_client_cert=cert,
        tls_client_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        require_encryption=True,
    )


def resource_name(device_key: str) -> str:
    return f"dev-{device_key}"


class DevicePlugin(WorkerPlugin):
    """Opens the worker's devices when the worker starts and closes them when it stops.

    Args:
        devices: ``(target, selector)`` pairs, as ``select_device`` takes them.
    """

    name = PLUGIN
    idempotent = True

    def __init__(self, devices: Sequence[tuple[str, str | None]], *, detach: bool = False) -> None:
        self.devices = [tuple(d) for d in devices]
        self.detach = detach
        self.sessions: dict[str, DeviceSession] = {}
        self.failed: dict[str, int] = {}  # device key -> batches in a row it measured nothing of

    def setup(self, worker: Any) -> None:
        # Ctrl-C at a terminal reaches the whole process group: the job's client (or the
        # worker's nanny) owns it and closes this worker in order.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        logging.getLogger("distributed.worker").addFilter(ClosingHeartbeat(worker))
        if self.detach:
            # A local cluster's worker leaves the terminal's process group, so its build
            # and measurement children never see the terminal's Ctrl-C either (LLVM's
            # own SIGINT handler in this process means they would not inherit SIG_IGN),
            # and it exits if the job's process dies without closing it.
            os.setpgrp()
            exit_with_parent()
        for target, selector in self.devices:
            device = select_device(selector, target=target)
            session = DeviceSession(device, target, worker=str(worker.name))
            self.sessions[device.key(target)] = session
            log.info("worker %s owns %s (%s)", worker.name, device.name, target)

    def teardown(self, worker: Any) -> None:
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()

    def measured(self, worker: Any, key: str, error: DeviceError | None) -> None:
        """Count the batches in a row that device ``key`` measured nothing of (``error``,
        even in a fresh measurement child); after BROKEN_IN_A_ROW, stop taking its batches:
        its Dask resource goes to 0, so the scheduler sends them to the kind's other
        workers (the job gives the kind up only where none is left). A new worker process
        (a restart of ``autosched worker``) opens the device again."""
        self.failed[key] = self.failed.get(key, 0) + 1 if error is not None else 0
        if self.failed[key] < BROKEN_IN_A_ROW or key not in self.sessions:
            return
        session = self.sessions.pop(key)
        log.error(
            "worker %s gives up %s (%s): it measured nothing in %d batches in a row (%s); "
            "restart the worker to take it up again",
            worker.name,
            session.device.name,
            session.target,
            self.failed[key],
            error,
        )
        session.close()
        worker.loop.add_callback(worker.set_resources, **{resource_name(key): 0})


class ClosingHeartbeat(logging.Filter):
    """Drops the heartbeat failure that a worker logs when its own close cut the
    heartbeat's connection (Dask closes the worker's connections while a heartbeat may be
    in flight): on Ctrl-C or at a deadline that traceback is noise, not trouble. A
    heartbeat that fails while the worker still runs is logged as before."""

    MESSAGE = "Failed to communicate with scheduler during heartbeat"
    CLOSING = (Status.closing, Status.closed, Status.failed)

    def __init__(self, worker: Any) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        closing = self.worker.status in self.CLOSING
        return not (closing and record.getMessage().startswith(self.MESSAGE))


def run_batch(request: BatchRequest) -> list[Record]:
    """The Dask task: measure ``request`` on this worker's device of that kind."""
    plugin = get_worker().plugins.get(PLUGIN)
    session = plugin.sessions.get(request.device_key) if plugin else None
    if session is None:
        raise RuntimeError(f"this worker owns no device {request.device_key}")
    try:
        records = session.run(request)
    except DeviceError as exc:
        plugin.measured(get_worker(), request.device_key, exc)
        raise
    plugin.measured(get_worker(), request.device_key, None)
    return records


def describe(dask_worker: Any) -> list[Slot]:
    """Run on every worker by the client: the device kinds that worker owns."""
    plugin = dask_worker.plugins.get(PLUGIN)
    return [s.slot() for s in plugin.sessions.values()] if plugin else []


def resources_of(devices: Sequence[tuple[str, str | None]]) -> dict[str, float]:
    """Dask resources advertising ``devices`` (opened here to read their fingerprints)."""
    return {
        resource_name(select_device(selector, target=target).key(target)): 1
        for target, selector in devices
    }


def nanny_options(
    devices: Sequence[tuple[str, str | None]],
    *,
    name: str | None = None,
    security: Any = None,
    quiet: bool = False,
    detach: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of a ``Nanny`` whose worker owns ``devices``."""
    dask.config.set({"distributed.worker.daemon": False})
    options: dict[str, Any] = {
        "nthreads": 1,
        "resources": resources_of(devices),
        "plugins": {DevicePlugin(devices, detach=detach)},
        # The worker's children (measurement, builds) are started by spawn; they must
        # not inherit a daemonic parent.
        "env": {"DASK_DISTRIBUTED__WORKER__DAEMON": "False"},
        "memory_limit": 0,
    }
    if quiet:  # a local cluster's workers speak only of trouble
        options["silence_logs"] = logging.ERROR
    if name:
        options["name"] = name
    if security is not None:
        options["security"] = security
    return options


def serve(
    scheduler: str,
    devices: Sequence[tuple[str, str | None]],
    *,
    name: str | None = None,
    security: Any = None,
) -> int:
    """Run a worker until the scheduler goes away for good or SIGINT/SIGTERM arrives."""
    options = nanny_options(devices, name=name, security=security)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # A worker closes when its scheduler goes away; a farm's scheduler may be
        # restarted, so serve again until told to stop.
        while not stop.is_set():
            async with Nanny(scheduler, **options) as nanny:
                finished = asyncio.ensure_future(nanny.finished())
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({finished, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():
                    await nanny.close()
            if not stop.is_set():
                log.warning(
                    "the scheduler at %s went away; serving again when it is back", scheduler
                )
                try:
                    await asyncio.wait_for(stop.wait(), timeout=2.0)
                except TimeoutError:
                    pass

    asyncio.run(main())
    return 0
