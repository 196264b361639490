"""Replay: a runner that answers batches from recorded measurements, not from a device.

A replay cache is the records of one workload on one kind of device (``autosched
records export`` output, JSON Lines, optionally gzipped), typically a large random
sample of its space. :class:`ReplayRunner` offers the cache's device fingerprint as
its :class:`~autosched.tuning.runner.Slot`, gives each task the space restricted to
the recorded configs (:func:`autosched.space.view.restrict`), and answers every
:class:`~autosched.tuning.runner.BatchRequest` with the recorded record of each config.
So a strategy replays through exactly the loop live tuning runs
(:func:`autosched.tuning.loop.run_job`), with no device, no build and no clock: a
seeded replay is deterministic. A config that is not recorded is refused
(:class:`NotRecorded`), never measured, guessed or stored.

A config's figure in a cache is what the device measured with the machine's drift
taken out (:func:`autosched.records.drift.drift_free`): a replayed search sees each
config at its own speed, not at the speed of the minute it happened to be measured in,
as a live search does through its batch controls; a config measured several times (a
control, a finalist) carries the mean of its readings, not whichever came first.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from autosched.errors import AutoschedError, InvalidInputError
from autosched.ops import Workload, workload_from_json
from autosched.records.drift import drift_free
from autosched.records.files import numbered_lines, parse_line
from autosched.records.record import Record
from autosched.space.config import Config
from autosched.space.device import device_limits
from autosched.space.space import Space
from autosched.space.view import restrict
from autosched.tuning.runner import BatchRequest, Slot, device_space


class NotRecorded(AutoschedError, LookupError):
    """A batch asked for a config, workload or device that the replay cache lacks."""


def slot_of(record: Record) -> Slot:
    """The kind of device ``record`` was measured on."""
    return Slot(
        target=record.target,
        device_key=record.device_key,
        family=record.device_family,
        name=str(record.device.get("name", record.device_key)),
        limits=device_limits(record.device, record.target),
        fingerprint=record.device,
    )


@dataclass(frozen=True)
class ReplayCache:
    """The recorded measurement of each config of one workload on one kind of device.

    ``records`` maps config keys to one record of each config: its first, with the
    latencies and throughput of all its readings, each batch's drift taken out
    (:func:`~autosched.records.drift.drift_free`).
    """

    workload: Workload
    slot: Slot
    records: dict[str, Record]

    @property
    def target(self) -> str:
        return self.slot.target

    @property
    def configs(self) -> list[Config]:
        return [Config(r.config) for r in self.records.values()]

    @property
    def best_gflops(self) -> float:
        return max((r.gflops or 0.0 for r in self.records.values() if r.ok), default=0.0)

    def all_records(self) -> list[Record]:
        return list(self.records.values())


def read_records(path: str | os.PathLike[str]) -> list[Record]:
    """Every record of a JSON Lines file, plain or gzip
    (:func:`autosched.records.files.numbered_lines`); a bad line raises."""
    out = []
    for number, line in numbered_lines(path):
        if line is not None and not line.strip():
            continue
        try:
            if line is None:
                raise InvalidInputError("not UTF-8 text")
            out.append(parse_line(line))
        except InvalidInputError as exc:
            raise InvalidInputError(f"{os.fspath(path)} line {number}: {exc}") from None
    return out


def caches_from_records(records: Iterable[Record]) -> list[ReplayCache]:
    """One cache per (workload, target, device), in the order first met."""
    grouped: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        grouped.setdefault((r.workload_key, r.target, r.device_key), []).append(r)
    caches = []
    for recs in grouped.values():
        cache = ReplayCache(
            workload_from_json(recs[0].workload), slot_of(recs[0]), drift_free(recs)
        )
        caches.append(cache)
    return caches


def load_caches(path: str | os.PathLike[str]) -> list[ReplayCache]:
    """The replay caches of a records file (see :func:`read_records`)."""
    return caches_from_records(read_records(path))


class ReplayRunner:
    """A :class:`~autosched.tuning.runner.Runner` over replay caches (one device kind
    per distinct fingerprint among them); see the module docstring."""

    def __init__(
        self, caches: Sequence[ReplayCache], *, devices: int = 1, proposers: int = 1
    ) -> None:
        """``devices``: how many devices of each kind (a farm's workers): the loop keeps
        that many batches of a kind in flight, and :meth:`wait` hands back one batch at a
        time, the oldest, as devices that take alike long would finish them. So each
        batch after the first ``devices`` is proposed while ``devices - 1`` are measured.
        ``proposers``: threads the loop proposes in (:func:`~autosched.tuning.loop.run_job`)."""
        if devices < 1:
            raise ValueError(f"devices must be 1 or more, not {devices}")
        self.proposers = proposers
        self.caches = {(c.workload.key, c.target, c.slot.device_key): c for c in caches}
        self._slots = {
            c.slot.device_key: dataclasses.replace(c.slot, count=devices) for c in caches
        }
        self._done: dict[int, list[Record] | BaseException] = {}
        self._ids = itertools.count()
        self.answered = 0  # configs answered from the caches

    def _cache(self, workload_key: str, target: str, device_key: str) -> ReplayCache:
        cache = self.caches.get((workload_key, target, device_key))
        if cache is None:
            raise NotRecorded(
                f"no replay cache for workload {workload_key} on {target} device {device_key}"
            )
        return cache

    def slots(self) -> list[Slot]:
        return list(self._slots.values())

    def space(self, workload: Workload, *, target: str, slot: Slot) -> Space:
        """The device's space restricted to the configs recorded for ``workload``."""
        cache = self._cache(workload.key, target, slot.device_key)
        return restrict(device_space(workload, target=target, slot=slot), cache.configs)

    def answer(self, request: BatchRequest) -> list[Record]:
        """The recorded record of every config of ``request``.

        Raises:
            NotRecorded: a config (or the workload, or the device) is not in a cache;
                nothing of the batch is answered then.
        """
        wl = workload_from_json(request.workload)
        cache = self._cache(wl.key, request.target, request.device_key)
        keys = [Config.from_json(c).key for c in request.configs]
        missing = [k for k in keys if k not in cache.records]
        if missing:
            raise NotRecorded(
                f"{len(missing)} config(s) of the batch are not recorded for {wl} on "
                f"{cache.slot.name}, e.g. {missing[0]}; a replay proposes recorded configs only"
            )
        self.answered += len(keys)
        if request.rounds:
            # A side-by-side round: its records are one batch (one start), stored beside
            # the same configs' search records (another run id, so not taken for them).
            return [
                dataclasses.replace(
                    cache.records[k],
                    id=None,
                    run_id="replay-final",
                    started_at=float(self.answered),
                    rounds=request.rounds,
                )
                for k in keys
            ]
        return [dataclasses.replace(cache.records[k], id=None, run_id="replay") for k in keys]

    def submit(self, slot: Slot, request: BatchRequest) -> int:
        """Answers at once (a config not recorded raises :class:`NotRecorded` here, so it
        can never be stored as a measurement); the handle is for :meth:`wait`."""
        if request.device_key != slot.device_key:
            raise NotRecorded(f"a batch for device {request.device_key} reached {slot.device_key}")
        handle = next(self._ids)
        self._done[handle] = self.answer(request)
        return handle

    def wait(self, handles: Sequence[int], timeout_s: float) -> list[tuple[Any, Any]]:
        """The oldest batch of ``handles`` (one device finishes at a time)."""
        done = sorted(h for h in handles if h in self._done)
        return [(h, self._done.pop(h)) for h in done[:1]]

    def cancel(self, handles: Sequence[int]) -> None:
        for h in handles:
            self._done.pop(h, None)

    def close(self) -> None:
        self._done.clear()
